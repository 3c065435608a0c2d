//! Feeds arbitrary bytes to every rate-limit header parser, and to
//! `RateLimitHeaders::from_headers` through a header map built from them.
//!
//! Beyond "no panic", it checks the invariants callers rely on: no parser
//! reports a zero wait, delta forms are read exactly, and the summary's holds
//! are consistent with its fields.

#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;

/// The crate's parser, compiled here from its source (it is private to the
/// crate and depends on nothing of it).
#[path = "../../src/parse/rate_limit_headers.rs"]
#[allow(dead_code)]
mod rate_limit_headers;

use rate_limit_headers::{
    parse_delta_seconds, parse_ratelimit, parse_ratelimit_policy, parse_remaining, parse_retry_after,
    parse_x_ratelimit_reset, RateLimitHeaders, HEADER_NAMES, MAX_HEADER_VALUE_LEN,
};

/// Tue, 14 Nov 2023 22:13:20 GMT: fixed so that every crash reproduces.
const NOW_SECS: u64 = 1_700_000_000;

/// Every header the parsers read, and one they do not.
fn name(index: usize) -> &'static str {
    HEADER_NAMES.get(index).copied().unwrap_or("x-unrelated")
}

const NAME_COUNT: usize = HEADER_NAMES.len() + 1;

/// The value as a plain decimal number, when that is what it is.
fn digits(data: &[u8]) -> Option<u64> {
    if data.len() > MAX_HEADER_VALUE_LEN {
        return None;
    }
    let s = std::str::from_utf8(data).ok()?.trim_matches([' ', '\t']);
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fuzz_target!(|data: &[u8]| {
    let now = UNIX_EPOCH + Duration::from_secs(NOW_SECS);
    let number = digits(data);
    let positive = number.filter(|&n| n > 0).map(Duration::from_secs);

    let retry_after = parse_retry_after(data, now);
    assert_ne!(retry_after, Some(Duration::ZERO));
    if number.is_some() {
        assert_eq!(retry_after, positive);
    }
    assert_eq!(parse_delta_seconds(data), positive);
    assert_eq!(parse_remaining(data), number);
    // Epoch if after now, else a past epoch from 1e9 on, else a delta.
    let x_expected = number.filter(|&n| n > 0).and_then(|n| {
        if n > NOW_SECS {
            Some(n - NOW_SECS)
        } else if n >= 1_000_000_000 {
            None
        } else {
            Some(n)
        }
    });
    assert_eq!(
        parse_x_ratelimit_reset(data, now),
        x_expected.map(Duration::from_secs)
    );
    if let Some(items) = parse_ratelimit(data) {
        assert!(!items.is_empty());
    }
    if let Some(items) = parse_ratelimit_policy(data) {
        assert!(!items.is_empty());
    }

    // The whole input as the value of every header, once and twice, so that
    // both the single-line and the combined-lines paths run.
    if let Ok(value) = HeaderValue::from_bytes(data) {
        for copies in 1..=2 {
            let mut headers = HeaderMap::new();
            for header in (0..NAME_COUNT).map(name) {
                for _ in 0..copies {
                    headers.append(header, value.clone());
                }
            }
            let summary = RateLimitHeaders::from_headers(&headers, now);
            assert_eq!(summary.retry_after, retry_after);
            if number.is_some() {
                assert_eq!(summary.remaining, number);
                assert_eq!(summary.reset, positive);
            }
            check_summary(&summary);
        }
    }

    // Each line as a separate header line whose first byte picks the name,
    // so that mixes of headers (and of valid and invalid lines) are explored.
    let mut headers = HeaderMap::new();
    for line in data.split(|&b| b == b'\n') {
        let Some((&selector, value)) = line.split_first() else {
            continue;
        };
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.append(name(usize::from(selector) % NAME_COUNT), value);
        }
    }
    check_summary(&RateLimitHeaders::from_headers(&headers, now));
});

fn check_summary(summary: &RateLimitHeaders) {
    assert_ne!(summary.retry_after, Some(Duration::ZERO));
    assert_ne!(summary.reset, Some(Duration::ZERO));
    assert_eq!(summary.backoff_hold(), summary.retry_after.or(summary.reset));
    match summary.remaining {
        Some(0) => assert_eq!(summary.exhausted_hold(), summary.reset),
        _ => assert_eq!(summary.exhausted_hold(), None),
    }
}
