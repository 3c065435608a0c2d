//! Pure parsers for what servers say about pacing: rate-limit headers and
//! robots.txt. No I/O, no clock (the current time is passed in), bounded
//! work on any input, and never a panic: malformed input means "no value".
//! The middleware in this crate uses them; they are public so you can use
//! them in your own layers, and so they can be fuzzed (`fuzz/`).

pub mod rate_limit_headers;
pub mod robots_txt;
