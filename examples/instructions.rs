//! Instructions per request of `Throttle` and its peers, counted by
//! callgrind: the reproducible form of the overhead figures of
//! docs/performance.md.
//!
//! # What it measures
//!
//! The same variants as the criterion bench `benches/overhead.rs`, with the
//! same registry (delay 0, lanes to spare: pure bookkeeping) and the same
//! request (a pre-parsed URI cloned into a new `http::Request`), each driven
//! through `ready` + `call` + the response future on a current-thread tokio
//! runtime: the bare service, `tower::limit::ConcurrencyLimit` (1 000), a
//! `governor` keyed check on the lower-cased host (1 key), and `Throttle`
//! with one scope, with one scope and `record_scopes(true)`, and with
//! 100 000 scopes visited round-robin (created by a warm-up pass first).
//! Then `frontier_1_scope`: a request pushed into a
//! `frontier::Frontier` around `throttle_1_scope`'s service (the same
//! registry: admitted at once) and taken out of its stream, one at a time;
//! its target is at most 1.5 × `throttle_1_scope`, taken between whole
//! requests (the frontier's own work over the throttle's whole cost; the
//! ratio of overheads over bare is printed beside it).
//! Bounded waits: `throttle_bounded` is the one-scope variant with a
//! `max_wait` (admitted at once, as without), `throttle_refused` the same
//! with its scope held, so every request fails at once for its bound
//! (the target: at most 2 × the cost of one admitted at once).
//! Then requests that wait, as the bench's `backlog` group drives them:
//! backlogs of 2 000 requests spawned at once against 64 lanes, through a
//! tokio semaphore (`backlog_semaphore`) and through `Throttle`
//! (`backlog_throttle`: one scope of 64 lanes, delay 0, queue places for
//! half the backlog).
//!
//! # Why instructions rather than time
//!
//! Wall-clock ratios from criterion vary 2× between runs on a shared VM.
//! The number of instructions executed is the same from run to run (to a few
//! per request), so a change of 5 % is visible and a figure can be compared
//! across machines and days. It is a proxy: it does not see cache misses,
//! branch mispredictions or lock contention, which the criterion bench (and
//! its `scaling` group) still has to show.
//!
//! # Running it
//!
//! ```text
//! cargo run --release --example instructions
//! cargo run --release --example instructions -- --small 1000 --large 6000   # quicker
//! ```
//!
//! With no arguments the example is the driver: for each variant it runs
//! itself twice under `valgrind --tool=callgrind`, with `--small` (2 000)
//! and `--large` (22 000) requests, reads the `Collected : <instructions>`
//! line valgrind prints, and reports `(I(large) − I(small)) / (large −
//! small)`, which cancels everything both runs share: the first requests'
//! one-off work and, for the 100 000-scope variant, the warm-up pass that
//! creates the scopes. Callgrind counts only inside `measured` (the
//! `block_on` that drives the requests, `--toggle-collect`), because the
//! set-up before it does not always run the same instructions twice:
//! governor's clock calibrates the TSC for as long as it takes, which
//! moved its figure between 1 200 and 1 570 per request from run to run
//! (1 504 every time with the toggle). With arguments `<variant> <n>` it drives
//! `n` requests through one variant and exits (that is what valgrind runs).
//! It needs valgrind (`apt-get install valgrind`); without it, it says so
//! and exits.
//!
//! # Reading the table
//!
//! `Ir/request` is the whole cost of one request, `overhead` that minus the
//! bare service's: the cost of the layer. The ratios below the table are the
//! ones the crate sets targets for (at most 2 × governor's keyed check),
//! taken between overheads, and for a backlog at most 2.9 × the semaphore
//! (no regression: a waiting request keeps its `Waited` record), taken
//! between whole requests.
//!
//! # Caveat
//!
//! The crate's dev-dependencies turn on tokio's `test-util` feature, and
//! examples build with dev-dependencies, so here `tokio::time::Instant::now()`
//! first checks whether the clock is paused: it costs a little more than in
//! a user's build. Throttle reads the clock; the peers (other than
//! `governor`, which has its own clock) do not.

use std::hint::black_box;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tower::Layer;
use tower_throttle::frontier::{Frontier, FrontierBuilder, FrontierHandle};
use tower_throttle::ThrottleLayer;

const VARIANTS: [&str; 11] = [
    "bare",
    "concurrency_limit",
    "governor_keyed",
    "throttle_1_scope",
    "throttle_1_scope_recorded",
    "throttle_100k_scopes",
    "frontier_1_scope",
    "backlog_semaphore",
    "backlog_throttle",
    "throttle_bounded",
    "throttle_refused",
];

#[path = "../benches/variants/mod.rs"]
mod variants;

use variants::backlog::{backlog_semaphore, backlog_throttle, drive_backlog};
use variants::{bare, drive, governor_keyed, unthrottled_registry, uris};

const MANY_SCOPES: usize = 100_000;

/// The depth of each backlog of the `backlog_*` variants: that many
/// requests spawned at once, against 64 lanes (`n` requests are `n /
/// BACKLOG_DEPTH` backlogs in turn).
const BACKLOG_DEPTH: usize = 2_000;

const VALGRIND_ARGS: [&str; 3] = [
    "--tool=callgrind",
    "--callgrind-out-file=/dev/null",
    "--toggle-collect=*instructions::measured*",
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [help] if help == "-h" || help == "--help" => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        [variant, n] if !variant.starts_with("--") => match n.parse() {
            Ok(n) => run_variant(variant, n),
            Err(_) => usage(&format!("not a request count: {n}")),
        },
        flags => match parse_counts(flags) {
            Ok((small, large)) => measure(small, large),
            Err(message) => usage(&message),
        },
    }
}

const USAGE: &str = "\
usage: instructions [--small N] [--large N]   (driver, runs valgrind)
       instructions <variant> <n>             (one variant, n requests)
       instructions --help
";

fn usage(message: &str) -> ExitCode {
    eprintln!("{message}");
    eprint!("{USAGE}");
    eprintln!("variants: {}", VARIANTS.join(", "));
    ExitCode::from(2)
}

fn parse_counts(flags: &[String]) -> Result<(u64, u64), String> {
    let (mut small, mut large) = (2_000, 22_000);
    let mut flags = flags.iter();
    while let Some(flag) = flags.next() {
        let target = match flag.as_str() {
            "--small" => &mut small,
            "--large" => &mut large,
            other => return Err(format!("unknown argument: {other}")),
        };
        let value = flags.next().ok_or(format!("{flag} needs a value"))?;
        *target = value
            .parse()
            .map_err(|_| format!("{flag}: not a count: {value}"))?;
    }
    if large <= small {
        return Err(format!("--large ({large}) must be above --small ({small})"));
    }
    Ok((small, large))
}

// ---- One variant: what valgrind runs ----

fn run_variant(variant: &str, n: u64) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let one = uris(1);
    match variant {
        "bare" => measured(&runtime, drive(&mut bare(), &one, n)),
        "concurrency_limit" => {
            let mut service = tower::limit::ConcurrencyLimit::new(bare(), 1_000);
            measured(&runtime, drive(&mut service, &one, n));
        }
        "governor_keyed" => measured(&runtime, drive(&mut governor_keyed(), &one, n)),
        "throttle_1_scope" => {
            let mut service = ThrottleLayer::new(unthrottled_registry()).layer(bare());
            measured(&runtime, drive(&mut service, &one, n));
        }
        "throttle_1_scope_recorded" => {
            let layer = ThrottleLayer::new(unthrottled_registry()).record_scopes(true);
            measured(&runtime, drive(&mut layer.layer(bare()), &one, n));
        }
        "throttle_100k_scopes" => {
            let many = uris(MANY_SCOPES);
            let mut service = ThrottleLayer::new(unthrottled_registry()).layer(bare());
            // Every run, whatever its n, first creates all the scopes,
            // outside what callgrind counts: the hash of scope names is
            // seeded at random per process, so what creating them costs
            // differs from run to run, and the driver's subtraction would
            // keep that difference.
            runtime.block_on(drive(&mut service, &many, MANY_SCOPES as u64));
            measured(&runtime, drive(&mut service, &many, n));
        }
        "frontier_1_scope" => {
            let registry = unthrottled_registry();
            let service = ThrottleLayer::new(registry.clone()).layer(bare());
            // The frontier's timer needs the runtime's.
            let _runtime = runtime.enter();
            let (frontier, handle) = FrontierBuilder::new(registry).build(service).unwrap();
            measured(&runtime, through_frontier(frontier, handle, &one, n));
        }
        "throttle_bounded" => {
            let mut service = ThrottleLayer::new(bounded_registry())
                .crate_errors()
                .layer(bare());
            measured(&runtime, drive(&mut service, &one, n));
        }
        "throttle_refused" => {
            let registry = bounded_registry();
            registry.hold(one[0].host().unwrap(), Duration::from_secs(3600));
            let mut service = ThrottleLayer::new(registry).crate_errors().layer(bare());
            measured(&runtime, drive_refused(&mut service, &one, n));
        }
        "backlog_semaphore" => measured(&runtime, backlogs(&backlog_semaphore(), n)),
        "backlog_throttle" => {
            measured(&runtime, backlogs(&backlog_throttle(BACKLOG_DEPTH), n));
        }
        other => return usage(&format!("unknown variant: {other}")),
    }
    ExitCode::SUCCESS
}

/// `n` requests through `frontier`, one at a time: each pushed through
/// `handle`, then taken out of the frontier's stream with its response.
async fn through_frontier<S, B>(
    mut frontier: Frontier<S, (), ()>,
    handle: FrontierHandle<(), ()>,
    uris: &[http::Uri],
    n: u64,
) -> Duration
where
    S: tower::Service<http::Request<()>, Response = http::Response<B>> + Unpin,
    S::Error: std::fmt::Debug,
{
    let start = Instant::now();
    for i in 0..n as usize {
        let request = variants::request(&uris[i % uris.len()]);
        handle.try_push_tagged(request, ()).unwrap();
        let (_, response) = frontier.next().await.expect("the pushed request's result");
        black_box(response.unwrap());
    }
    start.elapsed()
}

/// The registry of `throttle_1_scope` with a bound on every wait
/// (`max_wait`, 1 s): `throttle_bounded` admits at once as
/// `throttle_1_scope` does; `throttle_refused`, its scope held, fails
/// every request at once for its bound.
fn bounded_registry() -> tower_throttle::Registry {
    variants::unthrottled_builder()
        .default_scope(variants::unthrottled_scope().max_wait(Duration::from_secs(1)))
        .build()
        .unwrap()
}

/// `count` requests through `service`, each failed at once (it would
/// wait past its bound).
async fn drive_refused<S>(service: &mut S, uris: &[http::Uri], count: u64) -> Duration
where
    S: tower::Service<http::Request<()>, Error = tower_throttle::Error>,
{
    let start = Instant::now();
    for i in 0..count as usize {
        let request = variants::request(&uris[i % uris.len()]);
        let failed = tower::ServiceExt::ready(&mut *service)
            .await
            .unwrap()
            .call(request)
            .await
            .is_err_and(|error| error.is_would_wait());
        black_box(failed);
    }
    start.elapsed()
}

/// `n` requests through `service` as backlogs of [`BACKLOG_DEPTH`], one
/// after the other.
async fn backlogs<S, B>(service: &S, n: u64) -> Duration
where
    S: tower::Service<http::Request<()>, Response = http::Response<B>> + Clone + 'static,
    B: Send + 'static,
    S::Error: std::fmt::Debug,
{
    let uri = &uris(1)[0];
    let mut elapsed = Duration::ZERO;
    for _ in 0..n.div_ceil(BACKLOG_DEPTH as u64) {
        elapsed += drive_backlog(service, uri, BACKLOG_DEPTH).await;
    }
    elapsed
}

/// Where callgrind counts (`--toggle-collect`): the requests, not the
/// set-up before them, which is not the same from run to run (governor's
/// clock calibrates the TSC against the system clock for a while).
#[inline(never)]
fn measured(runtime: &tokio::runtime::Runtime, requests: impl std::future::Future<Output = Duration>) {
    black_box(runtime.block_on(requests));
}

// ---- The driver ----

fn measure(small: u64, large: u64) -> ExitCode {
    let version = match Command::new("valgrind").arg("--version").output() {
        Ok(output) if output.status.success() => String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        _ => {
            println!("valgrind not found: this measurement counts instructions with callgrind.");
            println!("Install it (Debian/Ubuntu: `apt-get install valgrind`) and run again.");
            return ExitCode::SUCCESS;
        }
    };
    let exe = std::env::current_exe().expect("the path of this executable");
    if cfg!(debug_assertions) {
        println!("warning: a debug build; the figures mean something only with --release");
    }
    println!("{version}");
    println!(
        "command: valgrind {} {} <variant> <n>",
        VALGRIND_ARGS.join(" "),
        exe.display()
    );
    println!(
        "n = {small} and {large}; Ir/request = (I({large}) - I({small})) / {}",
        large - small
    );
    println!();
    println!(
        "{:<28} {:>15} {:>15} {:>11} {:>9}",
        "variant",
        format!("I({small})"),
        format!("I({large})"),
        "Ir/request",
        "overhead"
    );

    let started = Instant::now();
    let mut per_request = Vec::new();
    for variant in VARIANTS {
        let count = |n: u64| -> Result<u64, String> {
            let output = Command::new("valgrind")
                .args(VALGRIND_ARGS)
                .arg(&exe)
                .arg(variant)
                .arg(n.to_string())
                .output()
                .map_err(|error| format!("cannot run valgrind: {error}"))?;
            let stderr = String::from_utf8_lossy(&output.stderr);
            if !output.status.success() {
                return Err(format!("{variant} {n} failed ({}):\n{stderr}", output.status));
            }
            collected(&stderr).ok_or_else(|| format!("no `Collected :` line in:\n{stderr}"))
        };
        let (low, high) = match count(small).and_then(|low| Ok((low, count(large)?))) {
            Ok(counts) => counts,
            Err(message) => {
                eprintln!("{message}");
                return ExitCode::FAILURE;
            }
        };
        let cost = (high as f64 - low as f64) / (large - small) as f64;
        let overhead = cost - per_request.first().map_or(cost, |&(_, bare)| bare);
        println!("{variant:<28} {low:>15} {high:>15} {cost:>11.1} {overhead:>9.1}");
        per_request.push((variant, cost));
    }

    let cost = |name: &str| {
        per_request
            .iter()
            .find(|(variant, _)| *variant == name)
            .unwrap()
            .1
    };
    // The layers' ratios are of overheads over bare; a backlog's are of
    // whole requests (the inner service's yield and the task's spawn are
    // part of what waiting costs), as the `backlog` bench's times are, and
    // so is the frontier's against the throttle's (the frontier is no
    // layer: what it adds is measured against a whole request through the
    // throttle). A `whole:` prefix asks for a whole request's cost.
    let measure = |name: &str| match name.strip_prefix("whole:") {
        Some(name) => cost(name),
        None if name.starts_with("backlog_") => cost(name),
        None => cost(name) - cost("bare"),
    };
    println!();
    println!("target ratios (of overheads over bare; backlogs, the frontier and failing at once: of whole requests):");
    // `None`: printed for reference, no target (ConcurrencyLimit does no
    // keyed work, so it is no peer for a keyed limiter).
    for (label, numerator, denominator, target) in [
        (
            "throttle 1 scope / governor keyed",
            "throttle_1_scope",
            "governor_keyed",
            Some(2.0),
        ),
        (
            "throttle 100k / governor keyed",
            "throttle_100k_scopes",
            "governor_keyed",
            Some(2.0),
        ),
        (
            "frontier 1 scope / throttle 1 scope",
            "whole:frontier_1_scope",
            "whole:throttle_1_scope",
            Some(1.5),
        ),
        (
            "backlog: throttle / semaphore",
            "backlog_throttle",
            "backlog_semaphore",
            Some(2.9),
        ),
        (
            "throttle failing at once / admitted at once",
            "throttle_refused",
            "throttle_1_scope",
            Some(2.0),
        ),
        (
            "throttle bounded / throttle 1 scope",
            "throttle_bounded",
            "throttle_1_scope",
            None,
        ),
        (
            "throttle 1 scope / concurrency_limit",
            "throttle_1_scope",
            "concurrency_limit",
            None,
        ),
        (
            "throttle 100k / throttle 1 scope",
            "throttle_100k_scopes",
            "throttle_1_scope",
            None,
        ),
        (
            "frontier / throttle 1 scope, overheads",
            "frontier_1_scope",
            "throttle_1_scope",
            None,
        ),
    ] {
        let (numerator, denominator) = match numerator {
            // Whole requests: a request failed at once never calls the
            // inner service, whose cost the one admitted at once includes.
            "throttle_refused" => (cost(numerator), cost(denominator)),
            _ => (measure(numerator), measure(denominator)),
        };
        if denominator <= 0.0 {
            println!("  {label:<38} n/a (denominator {denominator:.1})");
            continue;
        }
        let ratio = numerator / denominator;
        match target {
            Some(target) => {
                let verdict = if ratio <= target { "PASS" } else { "MISS" };
                println!("  {label:<38} {ratio:>6.2}  (target <= {target})  {verdict}");
            }
            None => println!("  {label:<38} {ratio:>6.2}  (reference)"),
        }
    }
    println!();
    println!("measured in {:.0?}", started.elapsed());
    ExitCode::SUCCESS
}

/// The instruction count in valgrind's `==PID== Collected : 12345` line.
fn collected(stderr: &str) -> Option<u64> {
    stderr.lines().find_map(|line| {
        let (_, after) = line.split_once("Collected :")?;
        after.trim().parse().ok()
    })
}
