//! Feeds arbitrary bodies, user agents and paths to `RobotsRules`.
//!
//! Beyond "no panic", it checks what the documentation of
//! `parse::robots_txt` promises:
//!
//! * the body bound: bytes past `MAX_ROBOTS_TXT_BYTES` change nothing;
//! * the Crawl-delay: a plain non-negative decimal gives that many seconds
//!   (to `f32` precision), saturating at `Duration::MAX` when too large for a
//!   `Duration`, and anything else gives no delay;
//! * only the product token of the user agent counts, case-insensitively;
//! * `/robots.txt` is always allowed, `""` and `?q` are taken relative to
//!   `/`, and non-ASCII characters match their percent-encoded form;
//! * `allow_all` allows every path, `disallow_all` only `/robots.txt`.

#![no_main]

use std::fmt::Write as _;
use std::time::Duration;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

/// The crate's parser, compiled here from its source (it is private to the
/// crate and depends on nothing of it but `texting_robots`).
#[path = "../../src/parse/robots_txt.rs"]
#[allow(dead_code)]
mod robots_txt;

use robots_txt::{RobotsRules, MAX_ROBOTS_TXT_BYTES};

#[derive(Debug, Arbitrary)]
struct Input {
    agent: String,
    paths: Vec<String>,
    /// A value written after `Crawl-delay:` in a well-formed group.
    delay_value: String,
    body: Vec<u8>,
}

fuzz_target!(|input: Input| {
    let rules = RobotsRules::parse(&input.body, &input.agent);
    check_paths(&rules, &input.paths);

    check_agent_token(&input);
    check_crawl_delay(&input.agent, &input.delay_value);
    if checks_the_bound(&input.body) {
        check_body_bound(&input);
    }

    for path in &input.paths {
        assert!(RobotsRules::allow_all().is_allowed(path));
        assert_eq!(
            RobotsRules::disallow_all().is_allowed(path),
            path == "/robots.txt"
        );
    }
    assert_eq!(RobotsRules::allow_all().crawl_delay(), None);
    assert_eq!(RobotsRules::disallow_all().crawl_delay(), None);
});

/// The path-level promises of `is_allowed`, which hold for any rules.
fn check_paths(rules: &RobotsRules, paths: &[String]) {
    assert!(rules.is_allowed("/robots.txt"));
    assert_eq!(rules.is_allowed(""), rules.is_allowed("/"));
    for path in paths {
        let allowed = rules.is_allowed(path);
        if let Some(query) = path.strip_prefix('?') {
            assert_eq!(allowed, rules.is_allowed(&format!("/?{query}")), "{path:?}");
        }
        if path.starts_with('/') {
            let encoded = percent_encode_non_ascii(path);
            assert_eq!(allowed, rules.is_allowed(&encoded), "{path:?} vs {encoded:?}");
        }
    }
}

fn percent_encode_non_ascii(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut buf = [0; 4];
            for byte in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{byte:02X}");
            }
        }
    }
    out
}

/// `mybot`, `MYBOT/2.0 (x)` and `  mybot extra` are the same crawler.
fn check_agent_token(input: &Input) {
    let variant = format!("{}/9.9 (fuzz)", swap_ascii_case(&input.agent));
    let rules = RobotsRules::parse(&input.body, &input.agent);
    let same = RobotsRules::parse(&input.body, &variant);
    assert_eq!(rules.crawl_delay(), same.crawl_delay(), "{variant:?}");
    for path in input.paths.iter().map(String::as_str).chain(["/", "/x"]) {
        assert_eq!(
            rules.is_allowed(path),
            same.is_allowed(path),
            "{variant:?} {path:?}"
        );
    }
}

fn swap_ascii_case(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_lowercase() {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect()
}

/// Compares the delay parsed from `Crawl-delay: {value}` with an oracle
/// built on `str::parse::<f64>`.
fn check_crawl_delay(agent: &str, value: &str) {
    // Kept to one line of printable ASCII without a comment, so that the
    // whole value reaches the Crawl-delay directive.
    if !value
        .bytes()
        .all(|b| b == b' ' || b == b'\t' || (b.is_ascii_graphic() && b != b'#'))
    {
        return;
    }
    let body = format!("User-agent: *\nCrawl-delay: {value}\n");
    let got = RobotsRules::parse(body.as_bytes(), agent).crawl_delay();
    let Some(expected) = oracle_seconds(value.trim_matches([' ', '\t'])) else {
        assert_eq!(got, None, "Crawl-delay: {value:?}");
        return;
    };
    let got = got.unwrap_or_else(|| panic!("Crawl-delay: {value:?} gave no delay, want {expected}"));
    // The value passes through an `f32` (seven significant digits) and
    // ends as whole nanoseconds.
    let tolerance = expected * 1e-6 + 1e-9;
    let beyond_duration = 18_446_744_073_709_551_616.0; // 2^64 s
    if got == Duration::MAX {
        assert!(
            expected >= beyond_duration * (1.0 - 1e-6),
            "Crawl-delay: {value:?} saturated"
        );
    } else {
        assert!(
            (got.as_secs_f64() - expected).abs() <= tolerance,
            "Crawl-delay: {value:?} gave {got:?}, want {expected}"
        );
    }
}

/// The seconds a plain non-negative decimal denotes, `None` for anything else.
fn oracle_seconds(value: &str) -> Option<f64> {
    let allowed = |b: u8| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-');
    if value.is_empty() || value.starts_with('-') || !value.bytes().all(allowed) {
        return None;
    }
    value.parse::<f64>().ok()
}

/// Whether to also parse this body pushed past the size bound. That
/// parses half a megabyte twice, hundreds of times slower than the rest,
/// so it is done for one body in 256. The choice is a hash of the body
/// rather than a byte of the input: libFuzzer learns the constants a
/// target compares bytes with and would soon pick the slow path every time.
fn checks_the_bound(body: &[u8]) -> bool {
    let hash = body.iter().fold(0x811C_9DC5_u32, |hash, &b| {
        (hash ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    hash % 256 == 0
}

/// The same body with arbitrary bytes placed past the bound must give the
/// same rules: nothing there is read.
fn check_body_bound(input: &Input) {
    if input.body.len() >= MAX_ROBOTS_TXT_BYTES {
        return;
    }
    // A line break first, so the filler never joins the body's last line,
    // and one last, so the kept part ends exactly at the bound.
    let mut within = input.body.clone();
    within.push(b'\n');
    within.resize(MAX_ROBOTS_TXT_BYTES - 1, b'#');
    within.push(b'\n');
    let mut beyond = within.clone();
    beyond.extend_from_slice(&input.body);
    beyond.extend_from_slice(b"\nUser-agent: *\nDisallow: /\nCrawl-delay: 7\n");

    let kept = RobotsRules::parse(&within, &input.agent);
    let cut = RobotsRules::parse(&beyond, &input.agent);
    assert_eq!(kept.crawl_delay(), cut.crawl_delay());
    for path in input.paths.iter().map(String::as_str).chain(["/", "/x"]) {
        assert_eq!(kept.is_allowed(path), cut.is_allowed(path), "{path:?}");
    }
}
