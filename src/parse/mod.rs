//! Pure parsers for what servers say about pacing: rate-limit headers and
//! robots.txt. No I/O, no clock (the current time is passed in), bounded
//! work on any input, and never a panic: malformed input means "no value".
//! The middleware in this crate uses them. They are private: the fuzz
//! targets (`fuzz/`) compile these files into their own crate by path, so
//! each file depends on nothing of this crate.

pub(crate) mod rate_limit_headers;
#[cfg(feature = "robots")]
pub(crate) mod robots_txt;
