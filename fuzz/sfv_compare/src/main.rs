//! The sfv evaluation of issue 14: the crate's hand-written RFC 8941 List
//! parser (`parse_ratelimit`, `parse_ratelimit_policy`) against the same
//! contract built on `sfv` 0.15 in RFC 8941 mode, two ways (its parsed types,
//! and its visitor API, which allocates no map), on the same inputs:
//!
//! * the `RateLimit` and `RateLimit-Policy` table rows of
//!   `src/parse/rate_limit_headers.rs` (`rows.rs`);
//! * every file of the directories given as arguments (the fuzz corpus),
//!   whole, line by line, and each line without its first byte, as the fuzz
//!   target feeds them.
//!
//! It prints every input on which the answers differ, then the CPU time per
//! header of each parser (thread CPU time, best of 15 interleaved rounds:
//! on a shared machine wall time mostly measures the other processes).
//!
//!     cargo run --release -- ../corpus/rate_limit_headers

use std::hint::black_box;
use std::time::Duration;

use sfv::{BareItem, ListEntry, Parser, Version};

/// The crate's parser, compiled here from its source (it is private to the
/// crate and depends on nothing of it).
#[path = "../../../src/parse/rate_limit_headers.rs"]
#[allow(dead_code)]
mod rate_limit_headers;

use rate_limit_headers::{parse_ratelimit, parse_ratelimit_policy, MAX_HEADER_VALUE_LEN};

mod rows;
mod visit;

/// A policy name and its two parameters, already checked non-negative.
type Member = (String, [Option<u64>; 2]);

/// How a List is parsed: the hand parser's contract on top of one sfv API.
type ListParser = fn(&[u8], [&str; 2]) -> Option<Vec<Member>>;

fn trim_ows(value: &[u8]) -> &[u8] {
    let start = value
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|&b| b != b' ' && b != b'\t')
        .map_or(start, |i| i + 1);
    &value[start..end]
}

/// What the hand parser does around the syntax: the length bound, OWS
/// (RFC 8941 only strips SP) and an empty value meaning no field.
fn with_contract(value: &[u8], keys: [&str; 2], list: ListParser) -> Option<Vec<Member>> {
    if value.len() > MAX_HEADER_VALUE_LEN {
        return None;
    }
    let value = trim_ows(value);
    if value.is_empty() {
        return None;
    }
    list(value, keys)
}

fn parsed_types(value: &[u8], keys: [&str; 2]) -> Option<Vec<Member>> {
    let list: sfv::List = Parser::new(value)
        .with_version(Version::Rfc8941)
        .parse_list()
        .ok()?;
    list.into_iter()
        .map(|entry| {
            let ListEntry::Item(item) = entry else { return None };
            let name = match item.bare_item {
                BareItem::String(s) => s.as_str().to_owned(),
                BareItem::Token(t) => t.as_str().to_owned(),
                _ => return None,
            };
            let mut found = [None, None];
            for (slot, key) in found.iter_mut().zip(keys) {
                *slot = match item.params.get(key) {
                    Some(BareItem::Integer(n)) => Some(u64::try_from(i64::from(*n)).ok()?),
                    _ => None,
                };
            }
            Some((name, found))
        })
        .collect()
}

/// The hand parser's answer as members, to compare with sfv's.
fn hand_members<T>(items: Option<Vec<T>>, member: fn(T) -> Member) -> Option<Vec<Member>> {
    Some(items?.into_iter().map(member).collect())
}

const SFV_PARSERS: [(&str, ListParser); 2] =
    [("sfv parsed types", parsed_types), ("sfv visitor", visit::parse)];

fn differences(inputs: &[Vec<u8>]) -> Vec<String> {
    let mut diffs = Vec::new();
    for input in inputs {
        let shown = String::from_utf8_lossy(input);
        let fields = [
            (
                "RateLimit",
                ["r", "t"],
                hand_members(parse_ratelimit(input), |i| {
                    (i.policy, [i.remaining, i.reset.map(|t| t.as_secs())])
                }),
            ),
            (
                "RateLimit-Policy",
                ["q", "w"],
                hand_members(parse_ratelimit_policy(input), |i| {
                    (i.policy, [i.quota, i.window.map(|w| w.as_secs())])
                }),
            ),
        ];
        for (label, list) in SFV_PARSERS {
            for (field, keys, hand) in &fields {
                let sfv = with_contract(input, *keys, list);
                if *hand != sfv {
                    diffs.push(format!("{field}, {label}, {shown:?}: hand {hand:?}, sfv {sfv:?}"));
                }
            }
        }
    }
    diffs
}

/// This thread's CPU time.
fn cpu_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

type Parse = fn(&[u8]) -> bool;

fn run(inputs: &[Vec<u8>], rounds: usize, parse: Parse) -> Duration {
    let start = cpu_now();
    for _ in 0..rounds {
        for input in inputs {
            black_box(parse(black_box(input)));
        }
    }
    cpu_now() - start
}

/// Best of 15 rounds, the parsers interleaved within each round.
fn compare(inputs: &[Vec<u8>], parsers: &[(&str, Parse)]) {
    let mut rounds = 1;
    while run(inputs, rounds, parsers[0].1) < Duration::from_millis(50) {
        rounds *= 2;
    }
    let mut best = vec![Duration::MAX; parsers.len()];
    for _ in 0..15 {
        for (slot, (_, parse)) in best.iter_mut().zip(parsers) {
            *slot = (*slot).min(run(inputs, rounds, *parse));
        }
    }
    for ((label, _), time) in parsers.iter().zip(best) {
        let ns = time.as_nanos() as f64 / (rounds * inputs.len()) as f64;
        println!("  {label}: {ns:.1} ns/header");
    }
}

fn corpus(dirs: impl Iterator<Item = String>) -> Vec<Vec<u8>> {
    let mut inputs = Vec::new();
    for dir in dirs {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|err| panic!("{dir}: {err}")) {
            let data = std::fs::read(entry.expect("directory entry").path()).expect("corpus file");
            for line in data.split(|&b| b == b'\n') {
                inputs.push(line.to_vec());
                if let Some((_, rest)) = line.split_first() {
                    inputs.push(rest.to_vec());
                }
            }
            inputs.push(data);
        }
    }
    inputs
}

fn main() {
    let table = rows::rows();
    let corpus = corpus(std::env::args().skip(1));
    let mut same = true;
    for (name, inputs) in [("table rows", &table), ("corpus", &corpus)] {
        let valid = inputs
            .iter()
            .filter(|i| parse_ratelimit(i).is_some() || parse_ratelimit_policy(i).is_some())
            .count();
        let diffs = differences(inputs);
        println!(
            "{name}: {} inputs, {valid} valid for either field, {} differences",
            inputs.len(),
            diffs.len()
        );
        for diff in &diffs {
            println!("  {diff}");
        }
        same &= diffs.is_empty();
    }
    let valid = |inputs: &[Vec<u8>]| -> Vec<Vec<u8>> {
        inputs
            .iter()
            .filter(|i| parse_ratelimit(i).is_some())
            .cloned()
            .collect()
    };
    let (valid_table, valid_corpus) = (valid(&table), valid(&corpus));
    let parsers: [(&str, Parse); 3] = [
        ("hand", |i| parse_ratelimit(i).is_some()),
        ("sfv parsed types", |i| {
            with_contract(i, ["r", "t"], parsed_types).is_some()
        }),
        ("sfv visitor", |i| {
            with_contract(i, ["r", "t"], visit::parse).is_some()
        }),
    ];
    for (name, inputs) in [
        ("table rows", &table),
        ("table rows, valid RateLimit only", &valid_table),
        ("corpus", &corpus),
        ("corpus, valid RateLimit only", &valid_corpus),
    ] {
        if !inputs.is_empty() {
            println!("RateLimit, {name} ({} inputs):", inputs.len());
            compare(inputs, &parsers);
        }
    }
    std::process::exit(if same { 0 } else { 1 });
}
