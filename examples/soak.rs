//! A real-time soak over loopback: a hyper server and a hyper-util client
//! through the whole stack (BackoffRetry → RobotsDelay → Throttle →
//! RetryAfter → Backoff), on a multi-threaded runtime, as fast as the
//! machine goes, for a fixed time.
//!
//! Requests are spread over many scopes (a quarter of them with a small
//! delay and jitter, so timers are exercised too); 5 % of them are dropped
//! at a random instant (waiting, or in flight); the server answers 0.1 % of
//! them 503 (backoff, then a retry). At the end it checks:
//!
//! - no request ended in an error;
//! - no stuck waiter: every spawned request finishes after the run (a
//!   waiter is stuck when nothing at all finishes for 10 s while some
//!   remain);
//! - nothing in flight or waiting in the registry or any scope;
//! - resident memory (`VmRSS` of `/proc/self/status`) at the end is within
//!   1.5 × what it was after the warm-up (the first sixth of the run).
//!
//! It prints a summary and exits non-zero if a check failed.
//!
//! ```text
//! cargo run --release --example soak -- [--seconds N] [--scopes N] [--alive N]
//! ```
//!
//! Defaults: 60 s, 200 scopes, 256 requests alive at once.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::retry::RetryLayer;
use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::registry::BackoffConfig;
use tower_throttle::{
    BackoffLayer, Registry, RetryAfterLayer, RobotsDelayLayer, ScopeConfig, Scopes, ThrottleLayer,
};

struct Options {
    seconds: u64,
    scopes: usize,
    alive: usize,
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        seconds: 60,
        scopes: 200,
        alive: 256,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = |name: &str| -> Result<u64, String> {
            let value = args.next().ok_or(format!("{name} needs a value"))?;
            match value.parse() {
                Ok(number) if number > 0 => Ok(number),
                _ => Err(format!("{name}: expected a positive whole number, got {value:?}")),
            }
        };
        match flag.as_str() {
            "--seconds" => options.seconds = value("--seconds")?,
            "--scopes" => options.scopes = value("--scopes")? as usize,
            "--alive" => options.alive = value("--alive")? as usize,
            other => {
                return Err(format!(
                    "unknown flag {other:?} (try --seconds N, --scopes N, --alive N)"
                ))
            }
        }
    }
    Ok(options)
}

/// What the requests did.
#[derive(Default)]
struct Tally {
    spawned: AtomicU64,
    answered: AtomicU64,
    /// `answered` when the run's time was up (the rest came while draining).
    answered_in_run: AtomicU64,
    cancelled: AtomicU64,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl Tally {
    fn error(&self, error: &dyn std::fmt::Debug) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_error.lock().unwrap();
        if first.is_none() {
            // Debug shows the whole chain of sources.
            *first = Some(format!("{error:?}"));
        }
    }
}

fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("?".to_owned(), |bytes| {
        format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
    })
}

/// Answers every request at once, 0.1 % of them 503, and robots.txt 404.
async fn serve(listener: TcpListener) {
    let count = Arc::new(AtomicU64::new(0));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let count = count.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                let n = count.fetch_add(1, Ordering::Relaxed);
                let status = if request.uri().path() == "/robots.txt" {
                    404
                } else if n % 1000 == 999 {
                    503
                } else {
                    200
                };
                async move {
                    Ok::<_, Infallible>(
                        http::Response::builder()
                            .status(status)
                            .body(Full::new(Bytes::from_static(b"ok")))
                            .unwrap(),
                    )
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn registry(options: &Options) -> Registry {
    // Backoff at the soak's pace: a 503 slows its scope for milliseconds,
    // not the default seconds, so the run measures loss, not patience.
    let backoff = BackoffConfig::default()
        .min_delay(Duration::from_millis(10))
        .max_delay(Duration::from_millis(200))
        .window(Duration::from_secs(1));
    let free = ScopeConfig::default()
        .backoff(backoff.clone())
        .concurrency(8)
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0);
    let mut builder = Registry::builder()
        .max_concurrency(64)
        .max_queued(options.alive)
        .default_scope(free);
    for scope in (0..options.scopes).step_by(4) {
        let timed = ScopeConfig::default()
            .backoff(backoff.clone())
            .concurrency(2)
            .delay(Duration::from_millis(5))
            .delay_per_slot(Duration::ZERO)
            .jitter(0.5);
        builder = builder.scope(scope_name(scope), timed);
    }
    builder.build().expect("the soak's config is valid")
}

fn scope_name(index: usize) -> String {
    format!("site{index}.soak")
}

fn main() -> ExitCode {
    let options = match parse_options() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("soak: {message}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    if runtime.block_on(soak(options)) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs the soak and prints the summary; says whether every check passed.
async fn soak(options: Options) -> bool {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("a loopback listener");
    let address = listener.local_addr().unwrap();
    tokio::spawn(serve(listener));

    let registry = registry(&options);
    let http = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let backoff = BackoffLayer::new(registry.clone());
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(backoff.retry_policy(2)))
        .layer(RobotsDelayLayer::new(registry.clone()).user_agent("soak/1.0"))
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(RetryAfterLayer::new(registry.clone()))
        .layer(backoff)
        .service(http);

    let tally = Arc::new(Tally::default());
    let alive = Arc::new(Semaphore::new(options.alive));
    let started = Instant::now();
    let run_for = Duration::from_secs(options.seconds);
    let warm_up = run_for / 6;
    let mut rss_after_warm_up = None;
    let mut rng = fastrand::Rng::with_seed(1);
    while started.elapsed() < run_for {
        if rss_after_warm_up.is_none() && started.elapsed() >= warm_up {
            rss_after_warm_up = resident_bytes();
        }
        let permit = alive.clone().acquire_owned().await.unwrap();
        let mut request = http::Request::get(format!("http://{address}/page/{}", rng.u32(..)))
            .body(Empty::<Bytes>::new())
            .unwrap();
        request
            .extensions_mut()
            .insert(Scopes::from(scope_name(rng.usize(..options.scopes))));
        let cancel_after = (rng.u8(..100) < 5).then(|| Duration::from_micros(rng.u64(..2_000)));
        let response = client.clone().oneshot(request);
        let tally = tally.clone();
        tally.spawned.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let outcome = match cancel_after {
                Some(after) => tokio::time::timeout(after, response).await.ok(),
                None => Some(response.await),
            };
            match outcome {
                None => tally.cancelled.fetch_add(1, Ordering::Relaxed),
                Some(Ok(response)) => {
                    // Read the body so the connection goes back to the pool.
                    let _ = response.into_body().collect().await;
                    tally.answered.fetch_add(1, Ordering::Relaxed)
                }
                Some(Err(error)) => {
                    tally.error(&error);
                    0
                }
            };
            drop(permit);
        });
    }
    let ran_for = started.elapsed();
    tally
        .answered_in_run
        .store(tally.answered.load(Ordering::Relaxed), Ordering::Relaxed);
    let all_finished = drain(&alive, options.alive, &tally).await;
    let stuck = options.alive - alive.available_permits();
    // Let the runtime drop what finished tasks left behind.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss_at_end = resident_bytes();
    report(
        &options,
        &registry,
        &tally,
        ran_for,
        all_finished,
        stuck,
        rss_after_warm_up,
        rss_at_end,
    )
}

/// Waits for every spawned request to finish. Requests of a backed-off
/// scope may legitimately wait a while, so a waiter counts as stuck only
/// when nothing at all finishes for 10 s while some remain.
async fn drain(alive: &Semaphore, capacity: usize, tally: &Tally) -> bool {
    let finished = || {
        tally.answered.load(Ordering::Relaxed)
            + tally.cancelled.load(Ordering::Relaxed)
            + tally.errors.load(Ordering::Relaxed)
    };
    let mut last = finished();
    let mut quiet = Duration::ZERO;
    while alive.available_permits() < capacity {
        if quiet >= Duration::from_secs(10) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = finished();
        quiet = if now == last {
            quiet + Duration::from_millis(100)
        } else {
            Duration::ZERO
        };
        last = now;
    }
    true
}

#[allow(clippy::too_many_arguments)]
fn report(
    options: &Options,
    registry: &Registry,
    tally: &Tally,
    ran_for: Duration,
    all_finished: bool,
    stuck: usize,
    rss_after_warm_up: Option<u64>,
    rss_at_end: Option<u64>,
) -> bool {
    let stats = registry.stats();
    let busy: Vec<_> = registry
        .all_scope_stats()
        .into_iter()
        .filter(|scope| scope.in_flight != 0 || scope.queued != 0)
        .collect();
    let busy_scopes = busy.len();
    for scope in busy.iter().take(5) {
        println!(
            "busy: {} in flight {}, queued {}, delay {:?} ({:?}), concurrency {}, held back by {:?}",
            scope.scope.as_str(),
            scope.in_flight,
            scope.queued,
            scope.delay,
            scope.delay_limited_by,
            scope.concurrency,
            scope.held_back_by
        );
    }
    let answered = tally.answered.load(Ordering::Relaxed);
    let errors = tally.errors.load(Ordering::Relaxed);
    println!(
        "soak: {:.1} s, {} scopes, {} alive at once, {} worker threads",
        ran_for.as_secs_f64(),
        options.scopes,
        options.alive,
        std::thread::available_parallelism().map_or(0, usize::from)
    );
    println!(
        "requests: {} spawned, {answered} answered ({:.0}/s during the run), {} cancelled, {errors} errors",
        tally.spawned.load(Ordering::Relaxed),
        tally.answered_in_run.load(Ordering::Relaxed) as f64 / ran_for.as_secs_f64(),
        tally.cancelled.load(Ordering::Relaxed),
    );
    if let Some(error) = tally.first_error.lock().unwrap().as_deref() {
        println!("first error: {error}");
    }
    println!(
        "at the end: {stuck} stuck, registry {} in flight, {} waiting, {busy_scopes} busy scopes, {} scopes tracked",
        stats.in_flight, stats.waiting, stats.scopes_tracked
    );
    let memory_stable = match (rss_after_warm_up, rss_at_end) {
        (Some(warm), Some(end)) => end as f64 <= warm as f64 * 1.5,
        _ => true,
    };
    println!(
        "resident memory: {} after warm-up, {} at the end",
        mib(rss_after_warm_up),
        mib(rss_at_end)
    );
    let checks = [
        ("no error", errors == 0),
        ("no stuck waiter", all_finished && stuck == 0),
        (
            "stats at zero",
            stats.in_flight == 0 && stats.waiting == 0 && busy_scopes == 0,
        ),
        ("memory within 1.5x of warm-up", memory_stable),
    ];
    for (name, passed) in checks {
        println!("{}: {name}", if passed { "PASS" } else { "FAIL" });
    }
    checks.iter().all(|(_, passed)| *passed)
}
