//! A load tool that measures politeness as the *server* sees it.
//!
//! It starts loopback HTTP/1 sites (hyper server), crawls them through
//! `ThrottleLayer` over a `hyper_util::client::legacy::Client`, and prints per
//! scenario how fast the crawl went, how close together each site saw its
//! requests arrive, and what CPU the client and the server spent.
//!
//! # Why arrivals are stamped at the server
//!
//! A site does not see when the throttle admits a request: it sees bytes
//! arrive. Between the two lie the client's connection pool, connection setup
//! (here a configurable *handshake cost*, standing in for TCP + TLS), task
//! scheduling on a loaded client and the kernel. So the server stamps every
//! request head the moment hyper hands it over (the `service_fn` entry), and
//! the accept instant of each new connection, with `std::time::Instant`; the
//! gaps between those stamps are what DESIGN §5 promises about.
//!
//! The client stamps too, on the same clock: a small service between the
//! throttle and the hyper-util client records the instant each request is
//! handed to hyper-util (the throttle's own departure, give or take a few
//! microseconds) and adds its frontier number as an `x-seq` header, which the
//! server reads. So a short gap at a site can be told apart: if the two
//! requests left the client at least the floor apart, the path (hyper-util's
//! pool and connection task, the client's runtime, the kernel, the server's
//! runtime) squeezed them; if they left closer, the scheduler did. The
//! scheduler stamps a send when the request's own future hands it to the
//! inner service, so the client-side gaps must never be below the floor.
//! Ours is a second stamp, a few microseconds later in the same poll; but a
//! thread preempted between the two (the machine may be shared) makes ours
//! late by a timeslice, and the gap after it short. So each request future
//! also notes when each of its polls began: the scheduler's stamp lies
//! between that instant and ours, and a client gap counts against the
//! scheduler only when it is below the floor even with the earlier stamp
//! moved back by that window.
//!
//! Every site is its own loopback address (`127.B.x.y`, all of 127.0.0.0/8 is
//! loopback on Linux), so each site has its own connection pool in the client,
//! as on the internet. Scenario (d) has 100 000 sites: they are host names
//! (`s12345.load.test`) that a custom resolver maps onto a bounded set of
//! listeners, so the scopes are distinct while the sockets stay bounded. The
//! server runs on a current-thread runtime in its own OS thread, so its CPU
//! time (read from `/proc/self/task/<tid>/stat`) can be told apart from the
//! client's (the rest of the process).
//!
//! # Running it
//!
//! ```text
//! cargo run --release --example loadtest -- [scenario...] [--quick] [--check]
//! ```
//!
//! Scenarios are named `a` to `e` (all by default); `--quick` shrinks the
//! counts for a smoke run; `--check` exits non-zero when any criterion fails.
//! Each scenario runs once per driving style: `stream` (one
//! `buffer_unordered` stream on a current-thread runtime, the crawler's main
//! loop) and `spawn` (one task per request on a two-worker runtime).
//!
//! # Reading the table
//!
//! - `req/s`: answered requests over the wall time of the run. `bound` is the
//!   politeness bound `Σ min(c / latency, 1 / delay)` over the sites (`c /
//!   latency` when the delay is 0), capped by `max_concurrency / latency`.
//! - `steady req/s`: the server's arrival rate between the instants when 10 %
//!   and 90 % of all requests had arrived, `0.8 N / (t90 − t10)`; `st/bd` is
//!   its ratio to the bound, and the "≥ 98 % of the bound" criterion of (a)
//!   is judged on it. The bound is a rate, and a finite run is not one: its
//!   wall-clock rate also counts the ramp-up (each site's first request, and
//!   with the cold-start rule the wait for its first answer before the
//!   second) and the tail, which with jitter is the slowest site, whose
//!   jittered gaps happened to add up longest (the longest of 1 000 random
//!   walks in (a)); a perfect client can end well below 100 % wall-clock,
//!   or slightly above it without jitter, as each site's first request comes
//!   free. The middle 80 % of arrivals has neither. `ach/bd` (wall-clock) is
//!   still printed, not judged. `site/bd` is `Σ (arrivals − 1) / (last −
//!   first arrival)` over the sites, the pace each site felt, against the
//!   bound.
//! - Gaps are between consecutive requests of one site, stamped twice:
//!   `server` when its server read the request head (the site's view: the
//!   criteria are on these), `client` when the request was handed to
//!   hyper-util below the throttle (the scheduler's view). `first` is the gap
//!   between a site's 1st and 2nd request, the one connection setup distorts;
//!   `later` are all the others. `floor` is `delay − 2 ms` without jitter,
//!   `delay × (1 − jitter) − 2 ms` with it; `<floor` counts gaps below it,
//!   which a polite client never produces.
//! - `path lag` is, per request matched by `x-seq`, the server's head-read
//!   instant minus the client's hand-over instant (p50, p99, max). For each
//!   server gap below the floor, a line tells whether the same two requests
//!   left the client below the floor too (the scheduler) or at least the
//!   floor apart (squeezed on the path: the earlier request lagged more).
//! - `conns` are connections the server accepted; `setup` is the mean time
//!   from a connection's accept to its first request head (the handshake
//!   cost plus scheduling).
//! - CPU is seconds per 1 000 answered requests: `server` is the server
//!   thread, `client` everything else in the process.
//! - Then one PASS/FAIL line per criterion of DESIGN §5, judged on the
//!   server's stamps, plus per throttled run with a delay "client: no
//!   departure gap below the floor", which the scheduler guarantees: it
//!   fails only for gaps below the floor even allowing for the stamp window
//!   (a scheduler bug, not the path); gaps only measured below it are
//!   counted in the same line and explained above the verdicts.
//! - (c) has 10 sites × 200 pages (about 10 s per run) so that "mean gap
//!   within 2 % of the delay" is tested over ~2 000 gaps: with jitter 0.5
//!   the standard error of the mean is then about 0.3 ms (0.6 %), where 390
//!   gaps gave 0.7 ms (1.4 %), too close to the 2 % allowed.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::Semaphore;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::{Registry, ScopeConfig, Throttle, ThrottleLayer};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Request = http::Request<Full<Bytes>>;
type HyperClient = Client<HttpConnector<ListenerResolver>, Full<Bytes>>;
/// The hyper-util client with departure stamps in front: what the throttle
/// (or the bare run's semaphore) hands requests to.
type LoadClient = StampDepartures<HyperClient>;

/// After this long a run stops, reports what it got, and fails.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// Loopback and the server's own stamping are not exact: DESIGN §5 allows 2 ms.
const GAP_TOLERANCE: Duration = Duration::from_millis(2);
/// The registry's `max_queued`, and so the most requests a stream keeps
/// admitted at once.
const MAX_QUEUED: usize = 10_000;
/// Listeners behind the 100 000 named sites of scenario (d).
const NAMED_SITE_LISTENERS: usize = 256;
/// Carries a request's [`Seq`] from the client's departure stamp to the
/// server's arrival stamp.
const SEQ_HEADER: &str = "x-seq";
/// The steady-state rate is taken between the instants when these shares of
/// all requests had arrived.
const STEADY_FROM: f64 = 0.1;
const STEADY_TO: f64 = 0.9;

/// What a scenario must show, from DESIGN §5 and the issue.
#[derive(Clone, Copy, PartialEq)]
enum Goal {
    /// ≥ 98 % of the politeness bound and no gap below the floor.
    BoundAndSpacing,
    /// The throttled client reaches ≥ 95 % of the bare client's requests/s.
    MatchBare,
    /// Mean gap within 2 % of the delay, and no gap below the floor.
    ExactMeanGap,
    /// Every request is answered.
    Completes,
    /// No gap below the floor, first gaps included.
    Spacing,
}

struct Scenario {
    name: &'static str,
    sites: usize,
    pages: usize,
    concurrency: u32,
    delay: Duration,
    jitters: Vec<f64>,
    latency: Duration,
    handshake: Duration,
    max_concurrency: u32,
    /// Sites are host names over [`NAMED_SITE_LISTENERS`] listeners, not one
    /// address each.
    named_sites: bool,
    goal: Goal,
}

impl Scenario {
    fn requests(&self) -> usize {
        self.sites * self.pages
    }

    /// `Σ min(c / latency, 1 / d)` over the sites, capped by
    /// `max_concurrency / latency`, in requests per second.
    fn politeness_bound(&self) -> f64 {
        let latency = self.latency.as_secs_f64();
        let by_lanes = f64::from(self.concurrency) / latency;
        let per_site = if self.delay.is_zero() {
            by_lanes
        } else {
            by_lanes.min(1.0 / self.delay.as_secs_f64())
        };
        (per_site * self.sites as f64).min(f64::from(self.max_concurrency) / latency)
    }

    /// The bare client's limit, equal to what the throttle allows in flight.
    fn bare_in_flight(&self) -> usize {
        (self.sites * self.concurrency as usize).min(self.max_concurrency as usize)
    }

    fn listeners(&self) -> usize {
        if self.named_sites {
            NAMED_SITE_LISTENERS
        } else {
            self.sites
        }
    }

    /// Connections are only worth keeping when a site gets several requests;
    /// 100 000 idle one-request connections would exhaust the file limit.
    fn reuses_connections(&self) -> bool {
        self.pages > 1
    }

    /// Listeners plus both ends of every connection that can be open at once.
    fn file_descriptors_needed(&self) -> usize {
        self.listeners() + 2 * self.bare_in_flight() + 64
    }
}

fn scenarios(quick: bool) -> Vec<Scenario> {
    let pick = |full: usize, smoke: usize| if quick { smoke } else { full };
    let (a_sites, d_sites) = (pick(1_000, 100), pick(100_000, 5_000));
    vec![
        Scenario {
            name: "a",
            sites: a_sites,
            pages: pick(20, 5),
            concurrency: 2,
            delay: Duration::from_millis(100),
            jitters: vec![0.0, 0.5],
            latency: Duration::from_millis(5),
            handshake: Duration::ZERO,
            max_concurrency: (a_sites as u32 * 2).max(16),
            named_sites: false,
            goal: Goal::BoundAndSpacing,
        },
        Scenario {
            name: "b",
            sites: 1,
            pages: pick(20_000, 2_000),
            concurrency: 64,
            delay: Duration::ZERO,
            jitters: vec![0.0],
            latency: Duration::from_millis(1),
            handshake: Duration::ZERO,
            max_concurrency: 64,
            named_sites: false,
            goal: Goal::MatchBare,
        },
        Scenario {
            name: "c",
            sites: 10,
            pages: pick(200, 10),
            concurrency: 1,
            delay: Duration::from_millis(50),
            jitters: vec![0.5],
            latency: Duration::from_millis(5),
            handshake: Duration::ZERO,
            max_concurrency: 16,
            named_sites: false,
            goal: Goal::ExactMeanGap,
        },
        Scenario {
            name: "d",
            sites: d_sites,
            pages: 1,
            concurrency: 1,
            delay: Duration::from_secs(1),
            jitters: vec![0.5],
            latency: Duration::from_millis(1),
            handshake: Duration::ZERO,
            // Not sites × c: every request in flight holds two sockets.
            max_concurrency: 1_000,
            named_sites: true,
            goal: Goal::Completes,
        },
        Scenario {
            name: "e",
            sites: pick(20, 5),
            pages: pick(10, 5),
            concurrency: 1,
            delay: Duration::from_millis(100),
            jitters: vec![0.0],
            latency: Duration::from_millis(5),
            handshake: Duration::from_millis(30),
            max_concurrency: 16,
            named_sites: false,
            goal: Goal::Spacing,
        },
    ]
}

// ---------------------------------------------------------------- command line

struct Options {
    names: Vec<String>,
    quick: bool,
    check: bool,
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        names: Vec::new(),
        quick: false,
        check: false,
    };
    for argument in std::env::args().skip(1) {
        match argument.as_str() {
            "--quick" => options.quick = true,
            "--check" => options.check = true,
            "a" | "b" | "c" | "d" | "e" => options.names.push(argument),
            other => {
                return Err(format!(
                    "unknown argument {other:?}; expected [a|b|c|d|e]... [--quick] [--check]"
                ))
            }
        }
    }
    Ok(options)
}

fn main() -> ExitCode {
    let options = match parse_options() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    print_machine_header();
    let server = match ServerThread::start() {
        Ok(server) => server,
        Err(error) => {
            eprintln!("cannot start the server thread: {error}");
            return ExitCode::FAILURE;
        }
    };
    let started = Instant::now();
    let mut blocks = AddressBlocks::default();
    let mut failures = 0;
    for scenario in scenarios(options.quick) {
        if options.names.is_empty() || options.names.iter().any(|name| name == scenario.name) {
            failures += run_scenario(&server, &scenario, &mut blocks);
        }
    }
    println!(
        "\nall scenarios: {:.1} s, {failures} criterion(s) failed",
        started.elapsed().as_secs_f64()
    );
    if options.check && failures > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn print_machine_header() {
    let cores = std::thread::available_parallelism().map_or(0, |cores| cores.get());
    let command: Vec<String> = std::env::args().collect();
    println!("tower-throttle loadtest: politeness as the server sees it");
    println!("command: {}", command.join(" "));
    println!(
        "cores: {cores}; open-file limit: {}; clock ticks/s: {}; CPU: server = its thread, client = rest of the process",
        open_file_limit().map_or("unknown".to_owned(), |limit| limit.to_string()),
        clock_ticks_per_second(),
    );
}

// ---------------------------------------------------------------- scenarios

/// Runs every (style, jitter) of a scenario, prints its tables, and returns
/// how many criteria failed.
fn run_scenario(server: &ServerThread, scenario: &Scenario, blocks: &mut AddressBlocks) -> usize {
    print_scenario_header(scenario);
    let mut runs = Vec::new();
    for style in [Style::Stream, Style::Spawn] {
        for &jitter in &scenario.jitters {
            let mut kinds = vec![Kind::Throttled];
            if scenario.goal == Goal::MatchBare {
                kinds.push(Kind::Bare);
            }
            for kind in kinds {
                let label = run_label(style, kind, jitter);
                match run_once(server, scenario, blocks.next(), style, kind, jitter) {
                    Ok(report) => runs.push((label, report)),
                    Err(error) => {
                        println!("  {label}: could not run: {error}");
                        runs.push((label, RunReport::failed(scenario, style, kind)));
                    }
                }
            }
        }
    }
    print_throughput_table(scenario, &runs);
    print_gap_table(&runs);
    print_memory(scenario, &runs);
    let verdicts = verdicts(scenario, &runs);
    for verdict in &verdicts {
        println!(
            "  {} ({}) {}",
            if verdict.pass { "PASS" } else { "FAIL" },
            scenario.name,
            verdict.text
        );
    }
    verdicts.iter().filter(|verdict| !verdict.pass).count()
}

fn print_scenario_header(scenario: &Scenario) {
    let sites = if scenario.named_sites {
        format!(
            "{} named sites over {} listeners",
            scenario.sites, NAMED_SITE_LISTENERS
        )
    } else {
        let noun = if scenario.sites == 1 { "site" } else { "sites" };
        format!("{} {noun} (one loopback address each)", scenario.sites)
    };
    println!(
        "\n== ({}) {sites} × {} pages = {} requests, round-robin ==",
        scenario.name,
        scenario.pages,
        scenario.requests()
    );
    println!(
        "   concurrency {}, delay {} ms, delay_per_slot 0 (only `delay` spaces a site's sends), jitter {:?}, \
         latency {} ms, handshake {} ms, max_concurrency {}, max_queued {MAX_QUEUED}, stream in flight {}",
        scenario.concurrency,
        scenario.delay.as_millis(),
        scenario.jitters,
        scenario.latency.as_millis(),
        scenario.handshake.as_millis(),
        scenario.max_concurrency,
        scenario.requests().min(MAX_QUEUED),
    );
    let limit = open_file_limit();
    println!(
        "   file descriptors needed ≈ {} of limit {}; timeout {} s per run",
        scenario.file_descriptors_needed(),
        limit.map_or("unknown".to_owned(), |limit| limit.to_string()),
        RUN_TIMEOUT.as_secs(),
    );
}

#[derive(Clone, Copy, PartialEq)]
enum Style {
    /// One `buffer_unordered` stream on a current-thread runtime.
    Stream,
    /// One task per request on a two-worker runtime.
    Spawn,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Throttled,
    /// The same client without the throttle, limited to the same requests in
    /// flight so that it does not open a socket per request.
    Bare,
}

fn run_label(style: Style, kind: Kind, jitter: f64) -> String {
    let style = match style {
        Style::Stream => "stream",
        Style::Spawn => "spawn",
    };
    match kind {
        Kind::Throttled => format!("{style} j={jitter}"),
        Kind::Bare => format!("{style} bare"),
    }
}

/// Everything one run measured.
struct RunReport {
    kind: Kind,
    style: Style,
    delay: Duration,
    outcome: Outcome,
    arrivals: ArrivalSummary,
    client_cpu: Option<f64>,
    server_cpu: Option<f64>,
    rss_before: Option<u64>,
    rss_after: Option<u64>,
    scopes: usize,
}

impl RunReport {
    fn failed(scenario: &Scenario, style: Style, kind: Kind) -> Self {
        RunReport {
            kind,
            style,
            delay: scenario.delay,
            outcome: Outcome {
                requests: scenario.requests(),
                answered: 0,
                failed: 0,
                elapsed: Duration::ZERO,
                timed_out: true,
                first_error: Some("the run could not start".to_owned()),
            },
            arrivals: ArrivalSummary::default(),
            client_cpu: None,
            server_cpu: None,
            rss_before: None,
            rss_after: None,
            scopes: 0,
        }
    }

    fn requests_per_second(&self) -> f64 {
        let seconds = self.outcome.elapsed.as_secs_f64();
        if seconds > 0.0 {
            self.outcome.answered as f64 / seconds
        } else {
            0.0
        }
    }
}

fn run_once(
    server: &ServerThread,
    scenario: &Scenario,
    block: u8,
    style: Style,
    kind: Kind,
    jitter: f64,
) -> Result<RunReport, BoxError> {
    let sites = start_sites(server, scenario, block)?;
    let rss_before = resident_bytes();
    let cpu_before = CpuSample::take(server);
    let registry = Registry::builder()
        .max_concurrency(scenario.max_concurrency)
        .max_queued(MAX_QUEUED)
        .default_scope(
            ScopeConfig::default()
                .concurrency(scenario.concurrency)
                .delay(scenario.delay)
                .delay_per_slot(Duration::ZERO)
                .jitter(jitter),
        )
        .build()?;
    let departures = Arc::new(DepartureLog::default());
    let stamps = (!scenario.named_sites).then(|| departures.clone());
    let client = load_client(&sites.addressing, scenario.reuses_connections(), stamps);
    let target = match kind {
        Kind::Throttled => Target::Throttled(ThrottleLayer::new(registry.clone()).layer(client)),
        Kind::Bare => Target::Bare {
            client,
            permits: Arc::new(Semaphore::new(scenario.bare_in_flight())),
        },
    };
    let requests = round_robin_requests(scenario, sites.addressing.clone());
    let outcome = drive(style, target, requests, scenario.requests())?;
    let cpu_after = CpuSample::take(server);
    let rss_after = resident_bytes();
    let scopes = registry.stats().scopes_tracked;
    let departures = std::mem::take(&mut *departures.departures.lock().unwrap());
    let arrivals = sites.summary(departures, gap_floor(scenario.delay, jitter));
    Ok(RunReport {
        kind,
        style,
        delay: scenario.delay,
        outcome,
        arrivals,
        client_cpu: cpu_after.client_since(&cpu_before),
        server_cpu: cpu_after.server_since(&cpu_before),
        rss_before,
        rss_after,
        scopes,
    })
}

/// A crawler's frontier: page 0 of every site, then page 1 of every site, ...
/// Request `page × sites + site` carries that number as its [`Seq`].
fn round_robin_requests(scenario: &Scenario, addressing: Addressing) -> impl Iterator<Item = Request> {
    let sites = scenario.sites;
    (0..scenario.pages).flat_map(move |page| {
        let addressing = addressing.clone();
        (0..sites).map(move |site| {
            let uri = format!("http://{}/page/{page}", addressing.authority(site));
            let seq = u32::try_from(page * sites + site).expect("fewer than 2³² requests");
            let mut request = http::Request::get(uri)
                .body(Full::new(Bytes::new()))
                .expect("a valid request");
            request.extensions_mut().insert(Seq(seq));
            request
        })
    })
}

// ---------------------------------------------------------------- driving

/// The service a run drives: the throttled client or the bare one.
#[derive(Clone)]
enum Target {
    Throttled(Throttle<LoadClient>),
    Bare {
        client: LoadClient,
        permits: Arc<Semaphore>,
    },
}

impl Target {
    /// Sends `request` and reads the whole body, so the connection goes back
    /// to the pool.
    async fn fetch(self, request: Request) -> Result<(), BoxError> {
        let response = match self {
            Target::Throttled(throttle) => MarkPolls::new(throttle.oneshot(request)).await?,
            Target::Bare { client, permits } => {
                // Held until the response head, as a throttle lane is.
                let _permit = permits.acquire_owned().await?;
                MarkPolls::new(client.oneshot(request)).await?
            }
        };
        response.into_body().collect().await?;
        Ok(())
    }
}

/// What the client saw of a run.
struct Outcome {
    requests: usize,
    answered: usize,
    failed: usize,
    elapsed: Duration,
    timed_out: bool,
    first_error: Option<String>,
}

/// Counts results from any task.
#[derive(Default)]
struct Tally {
    answered: AtomicUsize,
    failed: AtomicUsize,
    first_error: Mutex<Option<String>>,
}

impl Tally {
    fn add(&self, result: Result<(), BoxError>) {
        match result {
            Ok(()) => {
                self.answered.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                self.first_error
                    .lock()
                    .unwrap()
                    .get_or_insert_with(|| error_chain(&*error));
            }
        }
    }
}

fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

fn drive(
    style: Style,
    target: Target,
    requests: impl Iterator<Item = Request>,
    count: usize,
) -> std::io::Result<Outcome> {
    let tally = Arc::new(Tally::default());
    let runtime = match style {
        Style::Stream => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        Style::Spawn => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?,
    };
    let start = Instant::now();
    let timed_out = runtime.block_on(async {
        let work = async {
            match style {
                Style::Stream => drive_stream(target, requests, count.min(MAX_QUEUED), &tally).await,
                Style::Spawn => drive_tasks(target, requests, &tally).await,
            }
        };
        tokio::time::timeout(RUN_TIMEOUT, work).await.is_err()
    });
    let elapsed = start.elapsed();
    // Closes the client's connections (their tasks live on this runtime).
    runtime.shutdown_timeout(Duration::from_secs(2));
    let first_error = tally.first_error.lock().unwrap().take();
    Ok(Outcome {
        requests: count,
        answered: tally.answered.load(Ordering::Relaxed),
        failed: tally.failed.load(Ordering::Relaxed),
        elapsed,
        timed_out,
        first_error,
    })
}

async fn drive_stream(
    target: Target,
    requests: impl Iterator<Item = Request>,
    in_flight: usize,
    tally: &Tally,
) {
    stream::iter(requests)
        .map(|request| target.clone().fetch(request))
        .buffer_unordered(in_flight)
        .for_each(|result| {
            tally.add(result);
            std::future::ready(())
        })
        .await;
}

async fn drive_tasks(target: Target, requests: impl Iterator<Item = Request>, tally: &Arc<Tally>) {
    // Dropping the set on timeout aborts whatever is still running.
    let mut tasks = tokio::task::JoinSet::new();
    for request in requests {
        let (target, tally) = (target.clone(), tally.clone());
        tasks.spawn(async move { tally.add(target.fetch(request).await) });
    }
    while tasks.join_next().await.is_some() {}
}

// ---------------------------------------------------------------- client

/// Resolves `s<N>.load.test` to listener `N mod listeners`. Sites that are
/// loopback addresses never reach it (hyper-util parses IP literals itself).
#[derive(Clone)]
struct ListenerResolver {
    listeners: Arc<[SocketAddr]>,
}

impl Service<Name> for ListenerResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let listener = named_site_number(name.as_str())
            .filter(|_| !self.listeners.is_empty())
            .map(|site| self.listeners[site % self.listeners.len()]);
        std::future::ready(match listener {
            Some(address) => Ok(vec![address].into_iter()),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{name} is not a load-test site"),
            )),
        })
    }
}

fn named_site_number(host: &str) -> Option<usize> {
    host.strip_prefix('s')?.strip_suffix(".load.test")?.parse().ok()
}

/// A request's number in the frontier, sent as `x-seq` so the server's
/// arrival stamp can be matched with the client's departure stamp.
#[derive(Clone, Copy)]
struct Seq(u32);

thread_local! {
    /// When the poll of the request future running on this thread began.
    static POLL_STARTED: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

pin_project_lite::pin_project! {
    /// Notes when each poll of the throttle's (or the bare client's) future
    /// begins. The scheduler stamps a departure inside the very poll that
    /// hands the request on, so its stamp lies between that instant and
    /// ours: the difference bounds how late our stamp can be (a preempted
    /// thread, say).
    struct MarkPolls<F> {
        #[pin]
        inner: F,
    }
}

impl<F> MarkPolls<F> {
    fn new(inner: F) -> Self {
        MarkPolls { inner }
    }
}

impl<F: std::future::Future> std::future::Future for MarkPolls<F> {
    type Output = F::Output;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        POLL_STARTED.set(Some(Instant::now()));
        let output = self.project().inner.poll(cx);
        POLL_STARTED.set(None);
        output
    }
}

/// One client-side departure stamp.
#[derive(Clone, Copy)]
struct Departure {
    seq: u32,
    /// When the request was handed to hyper-util.
    at: Instant,
    /// How long before `at` the poll that handed it over began: the
    /// scheduler's own departure stamp lies in `[at − window, at]`.
    window: Duration,
}

/// Client-side departure stamps, in the order they were taken.
#[derive(Default)]
struct DepartureLog {
    departures: Mutex<Vec<Departure>>,
}

/// Sits between the throttle and the hyper-util client: stamps the instant
/// each request is handed to the client (the throttle's own departure, give
/// or take a few microseconds) and adds the `x-seq` header.
#[derive(Clone)]
struct StampDepartures<S> {
    inner: S,
    /// `None` where the server does not record either (scenario (d)).
    log: Option<Arc<DepartureLog>>,
}

impl<S, B> Service<http::Request<B>> for StampDepartures<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if let Some(log) = &self.log {
            if let Some(Seq(seq)) = request.extensions().get::<Seq>().copied() {
                request
                    .headers_mut()
                    .insert(SEQ_HEADER, http::HeaderValue::from(seq));
                let at = Instant::now();
                let window = POLL_STARTED
                    .get()
                    .map_or(Duration::ZERO, |started| at.saturating_duration_since(started));
                log.departures.lock().unwrap().push(Departure { seq, at, window });
            }
        }
        self.inner.call(request)
    }
}

fn load_client(
    addressing: &Addressing,
    reuse_connections: bool,
    log: Option<Arc<DepartureLog>>,
) -> LoadClient {
    let mut connector = HttpConnector::new_with_resolver(ListenerResolver {
        listeners: addressing.named_listeners(),
    });
    connector.set_nodelay(true);
    let mut builder = Client::builder(TokioExecutor::new());
    if !reuse_connections {
        builder.pool_max_idle_per_host(0);
    }
    StampDepartures {
        inner: builder.build(connector),
        log,
    }
}

// ---------------------------------------------------------------- server

/// The server's own OS thread and current-thread runtime, so its CPU time is
/// one thread's.
struct ServerThread {
    runtime: tokio::runtime::Handle,
    thread_id: Option<u32>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServerThread {
    fn start() -> std::io::Result<Self> {
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("loadtest-server".to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a server runtime");
                let _ = started_tx.send((runtime.handle().clone(), current_thread_id()));
                // Every listener and connection is a task on this runtime.
                let _ = runtime.block_on(stopped);
            })?;
        let (runtime, thread_id) = started_rx
            .recv()
            .map_err(|_| std::io::Error::other("the server thread died"))?;
        Ok(ServerThread {
            runtime,
            thread_id,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    fn cpu_seconds(&self) -> Option<f64> {
        let thread_id = self.thread_id?;
        cpu_seconds_of(&format!("/proc/self/task/{thread_id}/stat"))
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The calling thread's kernel id: `/proc/thread-self` links to
/// `<pid>/task/<tid>`.
fn current_thread_id() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// How a run's sites are reached.
#[derive(Clone)]
enum Addressing {
    /// Site `i` is listener `i`.
    OneListenerEach(Arc<[SocketAddr]>),
    /// Site `i` is `s<i>.load.test:port`, served by a listener the resolver
    /// picks; every listener has the same port.
    Named { port: u16, listeners: Arc<[SocketAddr]> },
}

impl Addressing {
    fn authority(&self, site: usize) -> String {
        match self {
            Addressing::OneListenerEach(listeners) => listeners[site].to_string(),
            Addressing::Named { port, .. } => format!("s{site}.load.test:{port}"),
        }
    }

    fn named_listeners(&self) -> Arc<[SocketAddr]> {
        match self {
            Addressing::OneListenerEach(_) => Arc::from(Vec::new()),
            Addressing::Named { listeners, .. } => listeners.clone(),
        }
    }
}

/// Hands out a fresh `127.B.0.0/16` block per run, so no run meets the
/// sockets another left in TIME_WAIT.
struct AddressBlocks {
    next: u8,
}

impl Default for AddressBlocks {
    fn default() -> Self {
        AddressBlocks { next: 10 }
    }
}

impl AddressBlocks {
    fn next(&mut self) -> u8 {
        let block = self.next;
        self.next = self.next.checked_add(1).unwrap_or(10);
        block
    }
}

/// Listener `index` of `block`: `127.block.x.y`, skipping `.0` and `.255`.
fn listener_ip(block: u8, index: usize) -> Ipv4Addr {
    let (high, low) = (index / 250, index % 250);
    Ipv4Addr::new(
        127,
        block,
        u8::try_from(high).expect("at most 64 000 listeners"),
        1 + low as u8,
    )
}

/// What the server does per request.
#[derive(Clone, Copy)]
struct ServerBehaviour {
    latency: Duration,
    handshake: Duration,
    /// Off for scenario (d): its sites get one request each, and the records
    /// would inflate the memory it measures.
    record: bool,
}

/// Every request head and connection a listener saw.
#[derive(Default)]
struct SiteArrivals {
    /// Request head instants, with the request's `x-seq` when it had one.
    heads: Vec<(Instant, Option<u32>)>,
    /// Accept instant to first request head, per connection.
    setups: Vec<Duration>,
}

struct ArrivalLog {
    sites: Mutex<Vec<SiteArrivals>>,
    connections: AtomicUsize,
}

impl ArrivalLog {
    fn record(&self, site: usize, head: Instant, seq: Option<u32>, accepted: Option<Instant>) {
        let mut sites = self.sites.lock().unwrap();
        let arrivals = &mut sites[site];
        arrivals.heads.push((head, seq));
        if let Some(accepted) = accepted {
            arrivals.setups.push(head - accepted);
        }
    }
}

/// A run's listeners; dropping it stops them.
struct RunningSites {
    addressing: Addressing,
    log: Arc<ArrivalLog>,
    accept_loops: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for RunningSites {
    fn drop(&mut self) {
        for accept_loop in &self.accept_loops {
            accept_loop.abort();
        }
    }
}

fn start_sites(server: &ServerThread, scenario: &Scenario, block: u8) -> std::io::Result<RunningSites> {
    let listeners = if scenario.named_sites {
        bind_on_one_port(block, NAMED_SITE_LISTENERS)?
    } else {
        (0..scenario.sites)
            .map(|index| std::net::TcpListener::bind((listener_ip(block, index), 0)))
            .collect::<std::io::Result<Vec<_>>>()?
    };
    let addresses = listeners
        .iter()
        .map(|listener| listener.local_addr())
        .collect::<std::io::Result<Vec<_>>>()?;
    let addressing = if scenario.named_sites {
        Addressing::Named {
            port: addresses[0].port(),
            listeners: addresses.into(),
        }
    } else {
        Addressing::OneListenerEach(addresses.into())
    };
    let log = Arc::new(ArrivalLog {
        sites: Mutex::new((0..listeners.len()).map(|_| SiteArrivals::default()).collect()),
        connections: AtomicUsize::new(0),
    });
    let behaviour = ServerBehaviour {
        latency: scenario.latency,
        handshake: scenario.handshake,
        record: !scenario.named_sites,
    };
    let mut accept_loops = Vec::with_capacity(listeners.len());
    for (site, listener) in listeners.into_iter().enumerate() {
        listener.set_nonblocking(true)?;
        let log = log.clone();
        accept_loops.push(server.runtime.spawn(accept_loop(listener, site, behaviour, log)));
    }
    Ok(RunningSites {
        addressing,
        log,
        accept_loops,
    })
}

/// Binds `count` listeners on distinct addresses sharing one port (a URI
/// carries one port, whichever address the resolver picks).
fn bind_on_one_port(block: u8, count: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    let mut last_error = None;
    for _attempt in 0..10 {
        let first = std::net::TcpListener::bind((listener_ip(block, 0), 0))?;
        let port = first.local_addr()?.port();
        let rest: std::io::Result<Vec<_>> = (1..count)
            .map(|index| std::net::TcpListener::bind((listener_ip(block, index), port)))
            .collect();
        match rest {
            Ok(rest) => return Ok(std::iter::once(first).chain(rest).collect()),
            // Another socket holds that port on some address: try another.
            Err(error) => last_error = Some(error),
        }
    }
    Err(last_error.expect("at least one attempt"))
}

async fn accept_loop(
    listener: std::net::TcpListener,
    site: usize,
    behaviour: ServerBehaviour,
    log: Arc<ArrivalLog>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("listener {site}: {error}");
            return;
        }
    };
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let accepted = Instant::now();
                log.connections.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(serve_connection(stream, site, accepted, behaviour, log.clone()));
            }
            // Out of file descriptors, say: the client sees it as slowness.
            Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
        }
    }
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    site: usize,
    accepted: Instant,
    behaviour: ServerBehaviour,
    log: Arc<ArrivalLog>,
) {
    let _ = stream.set_nodelay(true);
    if !behaviour.handshake.is_zero() {
        // Stands in for TCP + TLS setup: the request is read only after it.
        tokio::time::sleep(behaviour.handshake).await;
    }
    let first_request = AtomicBool::new(true);
    let service = hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
        // Stamped before anything else: this is when the site sees the request.
        let head = Instant::now();
        if behaviour.record {
            let seq = request
                .headers()
                .get(SEQ_HEADER)
                .and_then(|value| value.to_str().ok())
                .and_then(|text| text.parse().ok());
            let accept = first_request.swap(false, Ordering::Relaxed).then_some(accepted);
            log.record(site, head, seq, accept);
        }
        answer_after(behaviour.latency)
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn answer_after(latency: Duration) -> Result<http::Response<Full<Bytes>>, Infallible> {
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    Ok(http::Response::new(Full::new(Bytes::from_static(b"ok"))))
}

// ---------------------------------------------------------------- gaps

/// The gaps between one kind of consecutive arrivals.
struct GapStats {
    count: usize,
    min: Duration,
    p0_1: Duration,
    mean: Duration,
    /// Standard error of the mean: how far the mean may stray by chance.
    mean_error: Duration,
    below_floor: usize,
}

fn gap_stats(mut gaps: Vec<Duration>, floor: Option<Duration>) -> Option<GapStats> {
    if gaps.is_empty() {
        return None;
    }
    gaps.sort_unstable();
    let count = gaps.len();
    let seconds: Vec<f64> = gaps.iter().map(Duration::as_secs_f64).collect();
    let mean = seconds.iter().sum::<f64>() / count as f64;
    let variance = seconds.iter().map(|gap| (gap - mean).powi(2)).sum::<f64>() / (count.max(2) - 1) as f64;
    Some(GapStats {
        count,
        min: gaps[0],
        p0_1: gaps[(count - 1) / 1000],
        mean: Duration::from_secs_f64(mean),
        mean_error: Duration::from_secs_f64((variance / count as f64).sqrt()),
        below_floor: floor.map_or(0, |floor| gaps.iter().take_while(|gap| **gap < floor).count()),
    })
}

/// The closest two arrivals of a site may be: `delay × (1 − jitter) − 2 ms`.
fn gap_floor(delay: Duration, jitter: f64) -> Option<Duration> {
    let floor = delay.as_secs_f64() * (1.0 - jitter) - GAP_TOLERANCE.as_secs_f64();
    (floor > 0.0).then(|| Duration::from_secs_f64(floor))
}

/// What the server (and the client's departure stamps) saw in one run.
#[derive(Default)]
struct ArrivalSummary {
    requests: usize,
    connections: usize,
    mean_setup: Option<Duration>,
    /// `Σ (arrivals − 1) / (last − first arrival)` over the sites: the pace
    /// each site felt, without the run's start-up and its slowest site's tail.
    site_rate: Option<f64>,
    /// Arrivals per second between the instants when 10 % and 90 % of all
    /// requests had arrived.
    steady_rate: Option<f64>,
    /// Server side: gaps between request heads as each site read them.
    first: Option<GapStats>,
    later: Option<GapStats>,
    all: Option<GapStats>,
    /// Client side: gaps between the instants requests of one site were
    /// handed to hyper-util.
    client_first: Option<GapStats>,
    client_later: Option<GapStats>,
    path_lag: Option<LagStats>,
    squeezes: Squeezes,
    client_short: ClientShortGaps,
    floor: Option<Duration>,
}

/// Client-side gaps below the floor, against how late our stamps may be.
#[derive(Default)]
struct ClientShortGaps {
    /// Measured below the floor.
    measured: usize,
    /// Below the floor even if the earlier request's stamp was as late as
    /// its window allows: the scheduler's own gap was below it.
    proven: usize,
    /// The largest window of the earlier request among the measured ones.
    max_window: Duration,
}

impl ClientShortGaps {
    fn find(sites: &[Vec<Departure>], floor: Duration) -> Self {
        let mut short = ClientShortGaps::default();
        for pair in sites.iter().flat_map(|site| site.windows(2)) {
            let (earlier, later) = (pair[0], pair[1]);
            let gap = later.at - earlier.at;
            if gap >= floor {
                continue;
            }
            short.measured += 1;
            short.max_window = short.max_window.max(earlier.window);
            // The scheduler's stamps: the later one at most `later.at`, the
            // earlier one at least `earlier.at − earlier.window`.
            if gap + earlier.window < floor {
                short.proven += 1;
            }
        }
        short
    }
}

/// Path lag: server head-read instant minus client departure instant, over
/// the requests matched by `x-seq`.
struct LagStats {
    matched: usize,
    median: Duration,
    p99: Duration,
    max: Duration,
}

/// Where the server-side gaps below the floor came from, by what the client
/// stamped for the same two requests.
#[derive(Default)]
struct Squeezes {
    /// The two requests also left the client less than the floor apart.
    client_side: usize,
    /// They left at least the floor apart: the path made the gap shorter.
    path_side: usize,
    /// Path lag of the earlier and of the later request, per path-side gap.
    path_lags: Vec<(Duration, Duration)>,
    /// They reached the site in the other order than they left the client.
    reordered: usize,
    /// One of them has no departure stamp.
    unmatched: usize,
}

fn steady_rate(mut heads: Vec<Instant>) -> Option<f64> {
    heads.sort_unstable();
    let count = heads.len();
    let (from, to) = (
        (count as f64 * STEADY_FROM) as usize,
        ((count as f64 * STEADY_TO) as usize).min(count.saturating_sub(1)),
    );
    let span = (*heads.get(to)? - *heads.get(from)?).as_secs_f64();
    (span > 0.0).then(|| (to - from) as f64 / span)
}

fn lag_stats(mut lags: Vec<Duration>) -> Option<LagStats> {
    lags.sort_unstable();
    let count = lags.len();
    Some(LagStats {
        matched: count,
        median: *lags.get(count / 2)?,
        p99: lags[(count - 1) * 99 / 100],
        max: lags[count - 1],
    })
}

/// First and later gaps of each site's sorted instants.
fn split_gaps<'a>(
    sites: impl Iterator<Item = &'a [Instant]>,
    floor: Option<Duration>,
) -> (Option<GapStats>, Option<GapStats>) {
    let (mut first, mut later) = (Vec::new(), Vec::new());
    for instants in sites {
        let mut gaps = instants.windows(2).map(|pair| pair[1] - pair[0]);
        first.extend(gaps.next());
        later.extend(gaps);
    }
    (gap_stats(first, floor), gap_stats(later, floor))
}

impl RunningSites {
    /// Gaps per site between consecutive request heads (server side) and
    /// between consecutive departures (client side), split into first and
    /// later gaps, and the path lag between the two.
    fn summary(&self, departures: Vec<Departure>, floor: Option<Duration>) -> ArrivalSummary {
        let sites = std::mem::take(&mut *self.log.sites.lock().unwrap());
        let site_count = sites.len().max(1);
        // Departure instant by seq, and each site's departures in order.
        let mut departed_at: Vec<Option<Instant>> = Vec::new();
        let mut client_stamps: Vec<Vec<Departure>> = vec![Vec::new(); site_count];
        for &departure in &departures {
            let seq = departure.seq as usize;
            if departed_at.len() <= seq {
                departed_at.resize(seq + 1, None);
            }
            departed_at[seq] = Some(departure.at);
            client_stamps[seq % site_count].push(departure);
        }
        for site in &mut client_stamps {
            site.sort_unstable_by_key(|departure| departure.at);
        }
        let client_sites: Vec<Vec<Instant>> = client_stamps
            .iter()
            .map(|site| site.iter().map(|departure| departure.at).collect())
            .collect();
        let client_short = floor.map_or_else(ClientShortGaps::default, |floor| {
            ClientShortGaps::find(&client_stamps, floor)
        });
        let departure =
            |seq: Option<u32>| seq.and_then(|seq| departed_at.get(seq as usize).copied().flatten());

        let (mut setups, mut requests, mut site_rate) = (Vec::new(), 0, None);
        let (mut all_heads, mut lags, mut squeezes) = (Vec::new(), Vec::new(), Squeezes::default());
        let mut server_sites: Vec<Vec<Instant>> = Vec::with_capacity(sites.len());
        for mut site in sites {
            requests += site.heads.len();
            setups.extend(site.setups);
            site.heads.sort_unstable_by_key(|(head, _)| *head);
            if let (Some((earliest, _)), Some((latest, _))) = (site.heads.first(), site.heads.last()) {
                let span = (*latest - *earliest).as_secs_f64();
                if span > 0.0 {
                    *site_rate.get_or_insert(0.0) += (site.heads.len() - 1) as f64 / span;
                }
            }
            for &(head, seq) in &site.heads {
                if let Some(departed) = departure(seq) {
                    lags.push(head.saturating_duration_since(departed));
                }
            }
            if let Some(floor) = floor {
                for pair in site.heads.windows(2) {
                    let ((head_a, seq_a), (head_b, seq_b)) = (pair[0], pair[1]);
                    if head_b - head_a >= floor {
                        continue;
                    }
                    match (departure(seq_a), departure(seq_b)) {
                        (Some(left_a), Some(left_b)) if left_b < left_a => squeezes.reordered += 1,
                        (Some(left_a), Some(left_b)) if left_b - left_a < floor => squeezes.client_side += 1,
                        (Some(left_a), Some(left_b)) => {
                            squeezes.path_side += 1;
                            squeezes.path_lags.push((head_a - left_a, head_b - left_b));
                        }
                        _ => squeezes.unmatched += 1,
                    }
                }
            }
            let heads: Vec<Instant> = site.heads.iter().map(|(head, _)| *head).collect();
            all_heads.extend_from_slice(&heads);
            server_sites.push(heads);
        }
        let mean_setup = (!setups.is_empty()).then(|| setups.iter().sum::<Duration>() / setups.len() as u32);
        let (first, later) = split_gaps(server_sites.iter().map(Vec::as_slice), floor);
        let all_gaps: Vec<Duration> = server_sites
            .iter()
            .flat_map(|heads| heads.windows(2).map(|pair| pair[1] - pair[0]))
            .collect();
        let (client_first, client_later) = split_gaps(client_sites.iter().map(Vec::as_slice), floor);
        ArrivalSummary {
            requests,
            connections: self.log.connections.load(Ordering::Relaxed),
            mean_setup,
            site_rate,
            steady_rate: steady_rate(all_heads),
            first,
            later,
            all: gap_stats(all_gaps, floor),
            client_first,
            client_later,
            path_lag: lag_stats(lags),
            squeezes,
            client_short,
            floor,
        }
    }
}

impl ArrivalSummary {
    fn below_floor(&self) -> usize {
        [&self.first, &self.later]
            .into_iter()
            .flatten()
            .map(|stats| stats.below_floor)
            .sum()
    }
}

// ---------------------------------------------------------------- tables

fn millis(duration: Duration) -> String {
    format!("{:.1}", duration.as_secs_f64() * 1e3)
}

fn optional<T>(value: Option<T>, show: impl FnOnce(T) -> String) -> String {
    value.map_or_else(|| "-".to_owned(), show)
}

fn cpu_per_thousand(cpu_seconds: Option<f64>, answered: usize) -> String {
    optional(cpu_seconds.filter(|_| answered > 0), |seconds| {
        format!("{:.3}", seconds * 1000.0 / answered as f64)
    })
}

/// One line of the throughput table, header or run.
fn throughput_row(cells: [&str; 13]) -> String {
    let [run, answered, seconds, rate, bound, achieved, steady, steady_achieved, site_achieved, connections, setup, client, server] =
        cells;
    format!(
        "   {run:<14} {answered:>15} {seconds:>8} {rate:>9} {bound:>9} {achieved:>7} {steady:>9} {steady_achieved:>7} \
         {site_achieved:>7} {connections:>7} {setup:>8} {client:>10} {server:>10}"
    )
}

fn percent(part: f64, whole: f64) -> String {
    format!("{:.1}%", 100.0 * part / whole)
}

fn print_throughput_table(scenario: &Scenario, runs: &[(String, RunReport)]) {
    let bound = scenario.politeness_bound();
    println!();
    println!(
        "{}",
        throughput_row([
            "run",
            "answered",
            "seconds",
            "req/s",
            "bound",
            "ach/bd",
            "steady",
            "st/bd",
            "site/bd",
            "conns",
            "setup ms",
            "client CPU",
            "server CPU"
        ])
    );
    println!(
        "{}",
        throughput_row(["", "", "", "", "", "", "req/s", "", "", "", "", "s/1k req", "s/1k req"])
    );
    for (label, run) in runs {
        let outcome = &run.outcome;
        let rate = run.requests_per_second();
        println!(
            "{}",
            throughput_row([
                label,
                &format!("{}/{}", outcome.answered, outcome.requests),
                &format!("{:.2}", outcome.elapsed.as_secs_f64()),
                &format!("{rate:.1}"),
                &format!("{bound:.1}"),
                &percent(rate, bound),
                &optional(run.arrivals.steady_rate, |steady| format!("{steady:.1}")),
                &optional(run.arrivals.steady_rate, |steady| percent(steady, bound)),
                &optional(run.arrivals.site_rate, |site_rate| percent(site_rate, bound)),
                &run.arrivals.connections.to_string(),
                &optional(run.arrivals.mean_setup, millis),
                &cpu_per_thousand(run.client_cpu, outcome.answered),
                &cpu_per_thousand(run.server_cpu, outcome.answered),
            ])
        );
        if outcome.failed > 0 || outcome.timed_out {
            println!(
                "   {:<14} {} failed, {}; first error: {}",
                "",
                outcome.failed,
                if outcome.timed_out {
                    "timed out"
                } else {
                    "finished"
                },
                outcome.first_error.as_deref().unwrap_or("none"),
            );
        }
        if run.arrivals.requests != outcome.answered && !scenario.named_sites {
            println!(
                "   {:<14} the server recorded {} request heads",
                "", run.arrivals.requests
            );
        }
    }
}

fn print_gap_table(runs: &[(String, RunReport)]) {
    if runs.iter().all(|(_, run)| run.arrivals.all.is_none()) {
        println!("\n   no site got two requests: no gaps to show");
        return;
    }
    println!("\n   gaps between one site's consecutive requests, by where they were stamped:");
    println!("     server = request head read by the site (the site's view; the criteria are on these)");
    println!("     client = handed to hyper-util below the throttle (the scheduler's view)");
    println!(
        "   {:<14} {:<6} {:<6} {:>7} {:>8} {:>8} {:>8} {:>7} {:>7} {:>8} {:>7}",
        "gaps (ms)", "stamp", "kind", "n", "min", "p0.1%", "mean", "±s.e.", "mean/d", "floor", "<floor"
    );
    for (label, run) in runs {
        let delay = Some(run.delay).filter(|delay| !delay.is_zero());
        let arrivals = &run.arrivals;
        let rows = [
            ("server", "first", &arrivals.first),
            ("server", "later", &arrivals.later),
            ("client", "first", &arrivals.client_first),
            ("client", "later", &arrivals.client_later),
        ];
        let mut label = label.as_str();
        for (stamp, kind, stats) in rows {
            let Some(stats) = stats else { continue };
            println!(
                "   {label:<14} {stamp:<6} {kind:<6} {:>7} {:>8} {:>8} {:>8} {:>7} {:>7} {:>8} {:>7}",
                stats.count,
                millis(stats.min),
                millis(stats.p0_1),
                millis(stats.mean),
                millis(stats.mean_error),
                optional(delay, |delay| format!(
                    "{:.3}",
                    stats.mean.as_secs_f64() / delay.as_secs_f64()
                )),
                optional(arrivals.floor, millis),
                stats.below_floor,
            );
            label = "";
        }
    }
    print_path_lag(runs);
}

/// Path lag per run, and where the server-side gaps below the floor came
/// from.
fn print_path_lag(runs: &[(String, RunReport)]) {
    if runs.iter().all(|(_, run)| run.arrivals.path_lag.is_none()) {
        return;
    }
    println!("\n   path lag = server head read − client hand-over, per request matched by x-seq");
    println!(
        "   {:<14} {:>7} {:>8} {:>8} {:>8}",
        "path lag (ms)", "matched", "p50", "p99", "max"
    );
    for (label, run) in runs {
        let Some(lag) = &run.arrivals.path_lag else {
            continue;
        };
        println!(
            "   {label:<14} {:>7} {:>8} {:>8} {:>8}",
            lag.matched,
            millis(lag.median),
            millis(lag.p99),
            millis(lag.max)
        );
    }
    for (label, run) in runs {
        let short = &run.arrivals.client_short;
        if short.measured > 0 {
            println!(
                "   {label}: {} client gaps measured below the floor; the earlier request's stamp came up to {} ms \
                 after the start of the poll in which the scheduler stamped it, which explains {} of them; {} remain \
                 (the scheduler's)",
                short.measured,
                millis(short.max_window),
                short.measured - short.proven,
                short.proven,
            );
        }
    }
    for (label, run) in runs {
        let below = run.arrivals.below_floor();
        if below == 0 {
            continue;
        }
        let squeezes = &run.arrivals.squeezes;
        let mut text = format!(
            "   {label}: of the {below} server gaps below the floor, {} left the client below it too, \
             {} left at least the floor apart and were squeezed on the path",
            squeezes.client_side, squeezes.path_side
        );
        if !squeezes.path_lags.is_empty() {
            let count = squeezes.path_lags.len() as u32;
            let earlier: Vec<Duration> = squeezes.path_lags.iter().map(|(earlier, _)| *earlier).collect();
            let later: Vec<Duration> = squeezes.path_lags.iter().map(|(_, later)| *later).collect();
            let _ = write!(
                text,
                " (path lag of the earlier request mean {} ms, max {} ms; of the later one mean {} ms)",
                millis(earlier.iter().sum::<Duration>() / count),
                millis(earlier.iter().copied().max().unwrap_or_default()),
                millis(later.iter().sum::<Duration>() / count),
            );
        }
        let _ = write!(
            text,
            ", {} reached the site in the other order, {} unmatched",
            squeezes.reordered, squeezes.unmatched
        );
        println!("{text}");
    }
}

fn print_memory(scenario: &Scenario, runs: &[(String, RunReport)]) {
    if !scenario.named_sites {
        return;
    }
    for (label, run) in runs {
        let (Some(before), Some(after)) = (run.rss_before, run.rss_after) else {
            println!("   {label}: resident memory unknown (no /proc/self/status)");
            continue;
        };
        let per_scope = after.saturating_sub(before) as f64 / scenario.sites as f64;
        println!(
            "   {label}: memory per scope (RSS delta / scopes) {per_scope:.0} bytes: RSS {:.1} → {:.1} MiB over {} scopes \
             (the registry holds {}), measured after the client and its runtime are gone; an upper bound, \
             as it includes freed memory the allocator keeps",
            before as f64 / 1048576.0,
            after as f64 / 1048576.0,
            scenario.sites,
            run.scopes,
        );
    }
}

// ---------------------------------------------------------------- verdicts

struct Verdict {
    pass: bool,
    text: String,
}

fn verdicts(scenario: &Scenario, runs: &[(String, RunReport)]) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    for (label, run) in runs {
        let outcome = &run.outcome;
        verdicts.push(Verdict {
            pass: outcome.answered == outcome.requests && !outcome.timed_out,
            text: format!(
                "{label}: all {} requests answered within {} s ({} answered, {} failed)",
                outcome.requests,
                RUN_TIMEOUT.as_secs(),
                outcome.answered,
                outcome.failed
            ),
        });
        if run.kind == Kind::Bare {
            continue;
        }
        match scenario.goal {
            Goal::BoundAndSpacing => {
                let bound = scenario.politeness_bound();
                let steady = run.arrivals.steady_rate.map(|steady| steady / bound);
                verdicts.push(Verdict {
                    pass: steady.is_some_and(|ratio| ratio >= 0.98),
                    text: format!(
                        "{label}: steady-state rate (arrivals between 10 % and 90 % of all requests) \
                         ≥ 98 % of the politeness bound ({}; wall-clock {:.1} %, not judged)",
                        optional(steady, |ratio| format!("{:.1} %", 100.0 * ratio)),
                        100.0 * run.requests_per_second() / bound
                    ),
                });
                verdicts.push(spacing_verdict(label, run));
            }
            Goal::MatchBare => verdicts.extend(bare_verdict(label, run, runs)),
            Goal::ExactMeanGap => {
                verdicts.push(mean_gap_verdict(label, run, scenario.delay));
                verdicts.push(spacing_verdict(label, run));
            }
            Goal::Completes => {}
            Goal::Spacing => verdicts.push(spacing_verdict(label, run)),
        }
        // Scenario (d) stamps nothing (and its sites get one request each).
        if run.arrivals.floor.is_some() && !scenario.named_sites {
            verdicts.push(client_spacing_verdict(label, run));
        }
    }
    verdicts
}

fn spacing_verdict(label: &str, run: &RunReport) -> Verdict {
    let below = run.arrivals.below_floor();
    let first_below = run.arrivals.first.as_ref().map_or(0, |stats| stats.below_floor);
    Verdict {
        pass: below == 0,
        text: format!(
            "{label}: no gap below the floor {} ms, first gaps included ({below} below, {first_below} of them first gaps)",
            optional(run.arrivals.floor, millis),
        ),
    }
}

/// The scheduler's own guarantee: no two departures of a site closer than
/// the floor. Exact, so a failure is a scheduler bug.
fn client_spacing_verdict(label: &str, run: &RunReport) -> Verdict {
    let arrivals = &run.arrivals;
    let stamped = [&arrivals.client_first, &arrivals.client_later]
        .into_iter()
        .flatten()
        .map(|stats| stats.count)
        .sum::<usize>();
    let min = [&arrivals.client_first, &arrivals.client_later]
        .into_iter()
        .flatten()
        .map(|stats| stats.min)
        .min();
    let short = &arrivals.client_short;
    Verdict {
        pass: stamped > 0 && short.proven == 0,
        text: format!(
            "{label}: client: no departure gap below the floor {} ms ({} below even allowing for the stamp window; \
             {} measured below of {stamped}, min {} ms; a failure is a scheduler bug)",
            optional(arrivals.floor, millis),
            short.proven,
            short.measured,
            optional(min, millis),
        ),
    }
}

fn mean_gap_verdict(label: &str, run: &RunReport, delay: Duration) -> Verdict {
    let Some(all) = &run.arrivals.all else {
        return Verdict {
            pass: false,
            text: format!("{label}: mean gap within 2 % of the delay (no gaps seen)"),
        };
    };
    let ratio = all.mean.as_secs_f64() / delay.as_secs_f64();
    Verdict {
        pass: (ratio - 1.0).abs() <= 0.02,
        text: format!(
            "{label}: mean gap within 2 % of the delay ({} ms ± {} s.e. over {} gaps = {ratio:.3} × delay)",
            millis(all.mean),
            millis(all.mean_error),
            all.count,
        ),
    }
}

/// The throttled run against the bare run of the same style.
fn bare_verdict(label: &str, run: &RunReport, runs: &[(String, RunReport)]) -> Option<Verdict> {
    let (_, bare) = runs
        .iter()
        .find(|(_, other)| other.kind == Kind::Bare && other.style == run.style)?;
    let ratio = run.requests_per_second() / bare.requests_per_second();
    Some(Verdict {
        pass: ratio >= 0.95,
        text: format!(
            "{label}: throttled ≥ 0.95 × bare requests/s ({:.1} / {:.1} = {ratio:.3})",
            run.requests_per_second(),
            bare.requests_per_second(),
        ),
    })
}

// ---------------------------------------------------------------- /proc

/// Process and server-thread CPU time at one instant.
struct CpuSample {
    process: Option<f64>,
    server: Option<f64>,
}

impl CpuSample {
    fn take(server: &ServerThread) -> Self {
        CpuSample {
            process: cpu_seconds_of("/proc/self/stat"),
            server: server.cpu_seconds(),
        }
    }

    fn server_since(&self, before: &CpuSample) -> Option<f64> {
        Some(self.server? - before.server?)
    }

    fn client_since(&self, before: &CpuSample) -> Option<f64> {
        Some(self.process? - before.process? - self.server_since(before)?)
    }
}

/// utime + stime (fields 14 and 15) of a `/proc/.../stat` file, in seconds.
fn cpu_seconds_of(path: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The command name (field 2) may hold spaces; fields 3.. follow its ')'.
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let user: u64 = fields.nth(14 - 3)?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((user + system) as f64 / clock_ticks_per_second() as f64)
}

fn clock_ticks_per_second() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|output| String::from_utf8(output.stdout).ok())
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(100)
    })
}

/// VmRSS from `/proc/self/status`, in bytes.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The soft open-file limit, from `/proc/self/limits` (no libc here).
fn open_file_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|line| line.starts_with("Max open files"))?;
    line.strip_prefix("Max open files")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
