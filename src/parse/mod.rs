//! Pure parsers for what servers say about pacing: rate-limit headers and
//! robots.txt. No I/O, no clock (the current time is passed in), bounded
//! work on any input, and never a panic: malformed input means "no value".
//! The middleware in this crate uses them. They are private: the fuzz
//! targets (`fuzz/`) reach them through `crate::fuzzing` (feature
//! `fuzzing`), so their `pub` items are that feature's surface.
// Without the feature nothing outside the crate sees them.
#![cfg_attr(not(feature = "fuzzing"), allow(unreachable_pub))]

pub mod rate_limit_headers;
#[cfg(feature = "robots")]
pub mod robots_txt;
