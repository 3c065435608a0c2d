//! Scenario (f): a crawl fed **site by site** (all of site 1's pages, then
//! site 2's, ...), as a crawler's links come, through three drivers from
//! one run, each over the same loopback sites and the same throttled
//! stack (`ThrottleLayer` → `RetryAfterLayer` → hyper-util):
//!
//! - `frontier N=200`: `tower_throttle::frontier::Frontier` with
//!   `in_flight(200)`, the requests given as its source stream. Judged:
//!   steady-state rate ≥ 95 % of the politeness bound, no kernel-stamped
//!   site gap below `d − 2 ms`.
//! - `frontier N=20`: the same with `in_flight(20)`, where the budget
//!   binds: judged ≥ 95 % of `N / latency`, and the same spacing.
//! - `frontier held`: N = 200, and every 20th site (5 %) answers its first
//!   page with `429` and `Retry-After: 3600`, which `RetryAfterLayer`
//!   turns into an hour's hold. Judged: the other sites' steady-state rate
//!   ≥ 95 % of their bound (the held sites' one arrival each left out of
//!   it), the spacing, and that held sites take no in-flight slot: no
//!   request waited in the throttle (no response carries a `Waited`, the
//!   registry never had a waiter at any result), each held site saw one
//!   request, and once the others are done the frontier has nothing in
//!   flight and the held sites' pages pending. The run ends there: the
//!   held pages would go an hour later.
//! - `buffered N=200`: `buffer_unordered(200)` over the same order, and
//!   `spawn`: one task per request, as `Style::Spawn`. Printed, not judged.
//!
//! 1 000 sites × 20 pages, 1 lane each, delay 100 ms, jitter 0, 5 ms
//! latency (`--quick`: 100 sites × 5 pages): the politeness bound is
//! 10 000 requests/s.
//!
//! Besides the tables the other scenarios print, each frontier run says
//! how long a request spent in the service on average (the frontier's
//! `call` to the body's end) and its steady rate against `N /` that time,
//! which tells, where the budget binds, the frontier's share from the
//! latency the loopback path and both runtimes add; and the frontier runs
//! and `buffer_unordered` say how many requests were called per poll of
//! the future driving them: on one thread hyper-util writes them only
//! after that poll, so the first of a long run leaves late after its
//! hand-over, which shortens its site's next gap when departures are
//! stamped at the hand-over (the default; `--socket-stamps` changes it).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use http_body_util::BodyExt;
use hyper::body::Bytes;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::frontier::FrontierBuilder;
use tower_throttle::{Registry, RetryAfter, RetryAfterLayer, Throttle, ThrottleLayer, Waited};

use super::{
    gap_floor, load_client, optional, print_gap_table, print_site_gap_summary, print_throughput_table,
    resident_bytes, scenario_registry, spacing_verdict, start_sites, AddressBlocks, Addressing, BoxError,
    BusyThreads, CpuSample, Departure, DepartureLog, Goal, Kind, MarkPolls, Outcome, RealtimeClock, Request,
    RunReport, Scenario, Seq, ServerThread, Style, Tally, Verdict, MAX_QUEUED, RUN_TIMEOUT,
};
use http_body_util::Full;

/// The frontier's budget, and `buffer_unordered`'s.
const IN_FLIGHT: usize = 200;
/// The small budget, where `N / latency` binds.
const SMALL_IN_FLIGHT: usize = 20;
/// Every 20th site is held: 5 %.
const HOLD_EVERY: usize = 20;
/// The share of its bound a judged run must reach.
const SHARE: f64 = 0.95;

fn scenario(quick: bool) -> Scenario {
    let pick = |full: usize, smoke: usize| if quick { smoke } else { full };
    let sites = pick(1_000, 100);
    Scenario {
        name: "f",
        sites,
        pages: pick(20, 5),
        concurrency: 1,
        delay: Duration::from_millis(100),
        jitters: vec![0.0],
        latency: Duration::from_millis(5),
        handshake: Duration::ZERO,
        // Lanes bind, not the global cap.
        max_concurrency: sites as u32,
        named_sites: false,
        // Judged here, by `verdicts` below.
        goal: Goal::BoundAndSpacing,
    }
}

/// How a run feeds the requests to the stack.
#[derive(Clone, Copy, PartialEq)]
enum Driver {
    /// A `Frontier` with this budget; `held`: 5 % of the sites are held.
    Frontier { in_flight: usize, held: bool },
    /// `buffer_unordered(IN_FLIGHT)` on a current-thread runtime.
    Buffered,
    /// One task per request on a multi-thread runtime (`Style::Spawn`).
    Spawn,
}

impl Driver {
    fn label(self) -> String {
        match self {
            Driver::Frontier { held: true, .. } => "frontier held".to_owned(),
            Driver::Frontier { in_flight, .. } => format!("frontier N={in_flight}"),
            Driver::Buffered => format!("buffered N={IN_FLIGHT}"),
            Driver::Spawn => "spawn".to_owned(),
        }
    }

    fn holds(self) -> bool {
        matches!(self, Driver::Frontier { held: true, .. })
    }
}

/// What a frontier run saw besides the common report.
#[derive(Default)]
struct FrontierFacts {
    /// Responses that carried a `Waited`: their request waited in the
    /// throttle, holding a slot.
    waited: usize,
    /// The mean time from the frontier's `call` to the body's end: the
    /// latency a slot of the budget really spends per request.
    mean_service: Duration,
    /// The most requests the registry had waiting, sampled at each result.
    max_registry_waiting: usize,
    /// At the end: the frontier's requests in the service and pending, the
    /// registry's in flight and waiting.
    end_in_flight: usize,
    end_pending: usize,
    end_registry_in_flight: u32,
    end_registry_waiting: usize,
    /// Held sites, how many of them saw exactly one request, and how many
    /// the registry holds at the end.
    held_sites: usize,
    /// The held sites' pages after the first: what must be pending at
    /// the end.
    held_pages: usize,
    held_one_arrival: usize,
    held_in_registry: usize,
}

/// Runs scenario (f), prints its tables, and returns how many criteria
/// failed.
pub(super) fn run(
    server: &ServerThread,
    busy: &BusyThreads,
    quick: bool,
    blocks: &mut AddressBlocks,
) -> usize {
    let scenario = scenario(quick);
    print_header(&scenario);
    let drivers = [
        Driver::Frontier {
            in_flight: IN_FLIGHT,
            held: false,
        },
        Driver::Frontier {
            in_flight: SMALL_IN_FLIGHT,
            held: false,
        },
        Driver::Frontier {
            in_flight: IN_FLIGHT,
            held: true,
        },
        Driver::Buffered,
        Driver::Spawn,
    ];
    let mut runs = Vec::new();
    let mut facts = Vec::new();
    let mut calls = Vec::new();
    for driver in drivers {
        let label = driver.label();
        match run_once(server, busy, &scenario, blocks.next(), driver) {
            Ok((report, fact, calls_per_poll)) => {
                runs.push((label, report));
                facts.push((driver, fact));
                calls.push(calls_per_poll);
            }
            Err(error) => {
                println!("  {label}: could not run: {error}");
                let mut report = RunReport::failed(&scenario, Style::Stream, Kind::Throttled, 0.0);
                report.bound = Some(bound_of(&scenario, driver));
                runs.push((label, report));
                facts.push((driver, None));
                calls.push(None);
            }
        }
    }
    print_throughput_table(&scenario, &runs);
    println!(
        "   bounds: the politeness bound {:.0}/s; frontier N={SMALL_IN_FLIGHT}: N / latency = {:.0}/s; frontier \
         held: the {} sites not held, {:.0}/s (their steady rate, the held sites' arrivals left out)",
        scenario.politeness_bound(),
        bound_of(
            &scenario,
            Driver::Frontier {
                in_flight: SMALL_IN_FLIGHT,
                held: false
            }
        ),
        scenario.sites - held_sites(&scenario),
        bound_of(
            &scenario,
            Driver::Frontier {
                in_flight: IN_FLIGHT,
                held: true
            }
        ),
    );
    print_gap_table(&runs);
    print_site_gap_summary(&runs);
    for ((label, run), (driver, fact)) in runs.iter().zip(&facts) {
        if let (Driver::Frontier { .. }, Some(fact)) = (driver, fact) {
            print_facts(label, *driver, fact, run.arrivals.steady_rate);
        }
    }
    println!(
        "   requests called per poll of the driving future (on one thread, hyper-util's connection tasks write them \
         only after that poll):"
    );
    for ((label, _), calls) in runs.iter().zip(&calls) {
        if let Some(calls) = calls {
            println!(
                "   {label:<14} mean {:.1}, p99 {}, max {} (over the {} polls that called any)",
                calls.mean, calls.p99, calls.max, calls.polls
            );
        }
    }
    let verdicts = verdicts(&runs, &facts);
    for verdict in &verdicts {
        println!(
            "  {} (f) {}",
            if verdict.pass { "PASS" } else { "FAIL" },
            verdict.text
        );
    }
    println!("   (buffered and spawn are printed for comparison, not judged)");
    verdicts.iter().filter(|verdict| !verdict.pass).count()
}

fn print_header(scenario: &Scenario) {
    println!(
        "\n== (f) {} sites (one loopback address each) × {} pages = {} requests, site by site ==",
        scenario.sites,
        scenario.pages,
        scenario.requests()
    );
    println!(
        "   concurrency {}, delay {} ms, delay_per_slot 0, jitter 0, latency {} ms, max_concurrency {}, max_queued \
         {MAX_QUEUED}; stack ThrottleLayer → RetryAfterLayer → hyper-util; frontier in_flight {IN_FLIGHT} and \
         {SMALL_IN_FLIGHT}, buffer_unordered({IN_FLIGHT}), one task per request; held: every {HOLD_EVERY}th site \
         answers its first page 429 + Retry-After {}; timeout {} s per run",
        scenario.concurrency,
        scenario.delay.as_millis(),
        scenario.latency.as_millis(),
        scenario.max_concurrency,
        super::HELD_RETRY_AFTER,
        RUN_TIMEOUT.as_secs(),
    );
}

fn held_sites(scenario: &Scenario) -> usize {
    scenario.sites.div_ceil(HOLD_EVERY)
}

/// The rate a run is judged against (requests/s).
fn bound_of(scenario: &Scenario, driver: Driver) -> f64 {
    let bound = scenario.politeness_bound();
    match driver {
        Driver::Frontier { held: true, .. } => {
            let open = scenario.sites - held_sites(scenario);
            bound * open as f64 / scenario.sites as f64
        }
        Driver::Frontier { in_flight, .. } => bound.min(in_flight as f64 / scenario.latency.as_secs_f64()),
        Driver::Buffered | Driver::Spawn => bound,
    }
}

/// All of site 0's pages, then site 1's, ... Request `page × sites + site`
/// carries that number as its [`Seq`], as in the round-robin scenarios.
fn site_by_site_requests(
    scenario: &Scenario,
    addressing: Addressing,
) -> impl Iterator<Item = Request> + Send + 'static {
    let (sites, pages) = (scenario.sites, scenario.pages);
    (0..sites).flat_map(move |site| {
        let authority = addressing.authority(site);
        (0..pages).map(move |page| {
            let uri = format!("http://{authority}/page/{page}");
            let seq = u32::try_from(page * sites + site).expect("fewer than 2³² requests");
            let mut request = http::Request::get(uri)
                .body(Full::new(Bytes::new()))
                .expect("a valid request");
            request.extensions_mut().insert(Seq(seq));
            request
        })
    })
}

type Stack = Throttle<RetryAfter<super::LoadClient>>;

/// The throttled stack, reading each whole body (so the connection goes
/// back to the pool) and counting the responses whose request waited in
/// the throttle.
#[derive(Clone)]
struct Fetch {
    stack: Stack,
    waited: Arc<AtomicUsize>,
    /// Microseconds from `call` to the body's end, summed over requests.
    service_micros: Arc<AtomicUsize>,
    /// Requests called so far.
    calls: Arc<AtomicUsize>,
}

impl Service<Request> for Fetch {
    type Response = http::StatusCode;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<http::StatusCode, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.stack.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let called = Instant::now();
        let response = MarkPolls::new(self.stack.call(request));
        let (waited, service_micros) = (self.waited.clone(), self.service_micros.clone());
        Box::pin(async move {
            let response = response.await?;
            if response.extensions().get::<Waited>().is_some() {
                waited.fetch_add(1, Ordering::Relaxed);
            }
            let status = response.status();
            response.into_body().collect().await?;
            let micros = usize::try_from(called.elapsed().as_micros()).unwrap_or(usize::MAX);
            service_micros.fetch_add(micros, Ordering::Relaxed);
            Ok(status)
        })
    }
}

pin_project_lite::pin_project! {
    /// Counts the requests [`Fetch`] is called with in each poll of the
    /// driving future. On a current-thread runtime hyper-util's connection
    /// tasks run only between two such polls, so the requests called in
    /// one poll are written to their sockets only after it ends.
    struct CountCalls<F> {
        #[pin]
        inner: F,
        calls: Arc<AtomicUsize>,
        per_poll: Arc<std::sync::Mutex<Vec<usize>>>,
    }
}

impl<F> CountCalls<F> {
    fn new(inner: F, calls: &Arc<AtomicUsize>, per_poll: &Arc<std::sync::Mutex<Vec<usize>>>) -> Self {
        CountCalls {
            inner,
            calls: calls.clone(),
            per_poll: per_poll.clone(),
        }
    }
}

impl<F: Future> Future for CountCalls<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let before = this.calls.load(Ordering::Relaxed);
        let output = this.inner.poll(cx);
        let called = this.calls.load(Ordering::Relaxed) - before;
        if called > 0 {
            this.per_poll.lock().unwrap().push(called);
        }
        output
    }
}

/// How many requests were called per poll of the driving future (the
/// polls that called any): mean, p99 and max.
struct CallsPerPoll {
    polls: usize,
    mean: f64,
    p99: usize,
    max: usize,
}

impl CallsPerPoll {
    fn of(mut per_poll: Vec<usize>) -> Option<Self> {
        per_poll.sort_unstable();
        let polls = per_poll.len();
        Some(CallsPerPoll {
            polls,
            mean: per_poll.iter().sum::<usize>() as f64 / polls.max(1) as f64,
            p99: *per_poll.get(polls.checked_sub(1)? * 99 / 100)?,
            max: *per_poll.last()?,
        })
    }
}

fn run_once(
    server: &ServerThread,
    busy: &BusyThreads,
    scenario: &Scenario,
    block: u8,
    driver: Driver,
) -> Result<(RunReport, Option<FrontierFacts>, Option<CallsPerPoll>), BoxError> {
    let hold_every = if driver.holds() { HOLD_EVERY } else { 0 };
    let sites = start_sites(server, scenario, block, (hold_every, true))?;
    let rss_before = resident_bytes();
    let cpu_before = CpuSample::take(server, busy);
    let registry = scenario_registry(scenario, 0.0)?;
    let clock = RealtimeClock::sample();
    let departures = Arc::new(DepartureLog::default());
    let client = load_client(&sites.addressing, true, Some(departures.clone()));
    let fetch = Fetch {
        stack: ThrottleLayer::new(registry.clone())
            .layer(RetryAfterLayer::new(registry.clone()).layer(client)),
        waited: Arc::new(AtomicUsize::new(0)),
        service_micros: Arc::new(AtomicUsize::new(0)),
        calls: Arc::new(AtomicUsize::new(0)),
    };
    let requests = site_by_site_requests(scenario, sites.addressing.clone());
    let held = if driver.holds() { held_sites(scenario) } else { 0 };
    // A held site answers one page; the run ends when every other page is
    // answered.
    let expected = scenario.requests() - held * (scenario.pages - 1);
    let (outcome, mut facts, calls_per_poll) = drive(driver, fetch, &registry, requests, expected)?;
    let cpu_after = CpuSample::take(server, busy);
    let rss_after = resident_bytes();
    let scopes = registry.stats().scopes_tracked;
    let departures: Vec<Departure> = std::mem::take(&mut *departures.departures.lock().unwrap());
    let clock_after = RealtimeClock::sample();
    let mut held_arrivals = 0;
    if let Some(facts) = facts.as_mut().filter(|_| held > 0) {
        facts.held_sites = held;
        facts.held_pages = held * (scenario.pages - 1);
        let mut log = sites.log.sites.lock().unwrap();
        for site in (0..scenario.sites).step_by(HOLD_EVERY) {
            let arrivals = std::mem::take(&mut log[site].heads);
            facts.held_one_arrival += usize::from(arrivals.len() == 1);
            held_arrivals += arrivals.len();
            let key = sites.addressing.authority(site);
            let host = key.rsplit_once(':').map_or(key.as_str(), |(host, _)| host);
            let stats = registry.scope_stats(host);
            facts.held_in_registry += usize::from(stats.is_some_and(|stats| stats.held_for.is_some()));
        }
    }
    let mut arrivals = sites.summary(departures, gap_floor(scenario.delay, 0.0), &clock, &clock_after);
    // Left out of the rates and gaps above, counted here.
    arrivals.requests += held_arrivals;
    let report = RunReport {
        kind: Kind::Throttled,
        style: if driver == Driver::Spawn {
            Style::Spawn
        } else {
            Style::Stream
        },
        delay: scenario.delay,
        jitter: 0.0,
        outcome,
        arrivals,
        client_cpu: cpu_after.client_since(&cpu_before),
        server_cpu: cpu_after.server_since(&cpu_before),
        rss_before,
        rss_after,
        scopes,
        bound: Some(bound_of(scenario, driver)),
    };
    Ok((report, facts, calls_per_poll))
}

/// Drives the requests as `driver` says, until `expected` results are in
/// (or [`RUN_TIMEOUT`]).
fn drive(
    driver: Driver,
    fetch: Fetch,
    registry: &Registry,
    requests: impl Iterator<Item = Request> + Send + 'static,
    expected: usize,
) -> std::io::Result<(Outcome, Option<FrontierFacts>, Option<CallsPerPoll>)> {
    let tally = Arc::new(Tally::default());
    let runtime = match driver {
        Driver::Spawn => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(std::thread::available_parallelism().map_or(1, |cores| cores.get()))
            .enable_all()
            .build()?,
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
    };
    let (waited, service_micros) = (fetch.waited.clone(), fetch.service_micros.clone());
    let per_poll = Arc::new(std::sync::Mutex::new(Vec::new()));
    let calls = fetch.calls.clone();
    let start = Instant::now();
    let (timed_out, facts) = runtime.block_on(async {
        match driver {
            Driver::Frontier { in_flight, .. } => {
                let (frontier, handle) = FrontierBuilder::new(registry.clone())
                    .in_flight(in_flight)
                    .build(fetch)
                    .expect("a budget of at least 1");
                drop(handle);
                let source = stream::iter(requests).map(|request| {
                    let seq = request.extensions().get::<Seq>().map_or(0, |seq| seq.0);
                    (request, seq)
                });
                let mut frontier = frontier.with_source(source);
                let mut facts = FrontierFacts::default();
                let work = async {
                    let mut results = 0;
                    while results < expected {
                        let Some((_, result)) = frontier.next().await else {
                            break;
                        };
                        results += 1;
                        tally.add(result.map(drop));
                        facts.max_registry_waiting = facts.max_registry_waiting.max(registry.stats().waiting);
                    }
                };
                let timed_out = tokio::time::timeout(RUN_TIMEOUT, CountCalls::new(work, &calls, &per_poll))
                    .await
                    .is_err();
                let stats = registry.stats();
                facts.end_in_flight = frontier.in_flight();
                facts.end_pending = frontier.pending();
                facts.end_registry_in_flight = stats.in_flight;
                facts.end_registry_waiting = stats.waiting;
                (timed_out, Some(facts))
            }
            Driver::Buffered => {
                let work = stream::iter(requests)
                    .map(|request| fetch.clone().oneshot(request))
                    .buffer_unordered(IN_FLIGHT)
                    .for_each(|result| {
                        tally.add(result.map(drop));
                        std::future::ready(())
                    });
                let work = CountCalls::new(work, &calls, &per_poll);
                (tokio::time::timeout(RUN_TIMEOUT, work).await.is_err(), None)
            }
            Driver::Spawn => {
                let work = async {
                    // Dropping the set on timeout aborts whatever still runs.
                    let mut tasks = tokio::task::JoinSet::new();
                    for request in requests {
                        let (fetch, tally) = (fetch.clone(), tally.clone());
                        tasks.spawn(async move { tally.add(fetch.oneshot(request).await.map(drop)) });
                    }
                    while tasks.join_next().await.is_some() {}
                };
                (tokio::time::timeout(RUN_TIMEOUT, work).await.is_err(), None)
            }
        }
    });
    let elapsed = start.elapsed();
    runtime.shutdown_timeout(Duration::from_secs(2));
    let facts = facts.map(|mut facts: FrontierFacts| {
        facts.waited = waited.load(Ordering::Relaxed);
        let answered = tally.answered.load(Ordering::Relaxed).max(1);
        facts.mean_service =
            Duration::from_micros((service_micros.load(Ordering::Relaxed) / answered) as u64);
        facts
    });
    let first_error = tally.first_error.lock().unwrap().take();
    // One task per request is not driven by one future.
    let per_poll = std::mem::take(&mut *per_poll.lock().unwrap());
    let calls_per_poll = CallsPerPoll::of(per_poll).filter(|_| driver != Driver::Spawn);
    Ok((
        Outcome {
            requests: expected,
            answered: tally.answered.load(Ordering::Relaxed),
            failed: tally.failed.load(Ordering::Relaxed),
            elapsed,
            timed_out,
            first_error,
        },
        facts,
        calls_per_poll,
    ))
}

/// What a frontier run saw besides the tables; `steady` is its steady
/// rate, set beside what its budget allows at the time a request really
/// spent in the service (the nominal latency plus the loopback path and
/// both runtimes): where the budget binds, the frontier's own share.
fn print_facts(label: &str, driver: Driver, facts: &FrontierFacts, steady: Option<f64>) {
    if let Driver::Frontier { in_flight, .. } = driver {
        let by_budget = in_flight as f64 / facts.mean_service.as_secs_f64().max(1e-9);
        println!(
            "   {label}: a request's time in the service (call to body end) {:.2} ms on average: N / that = \
             {by_budget:.0}/s{} (not judged)",
            facts.mean_service.as_secs_f64() * 1e3,
            optional(steady, |steady| format!(
                ", and the steady rate {:.1} % of it",
                100.0 * steady / by_budget
            )),
        );
    }
    println!(
        "   {label}: {} responses waited in the throttle; registry waiters at most {} (sampled at each result); at \
         the end: frontier in flight {}, pending {}; registry in flight {}, waiting {}",
        facts.waited,
        facts.max_registry_waiting,
        facts.end_in_flight,
        facts.end_pending,
        facts.end_registry_in_flight,
        facts.end_registry_waiting,
    );
    if driver.holds() {
        println!(
            "   {label}: {} held sites: {} saw exactly one request (their 429), {} held in the registry at the end; \
             their arrivals are left out of the rates and gaps",
            facts.held_sites, facts.held_one_arrival, facts.held_in_registry,
        );
    }
}

fn verdicts(runs: &[(String, RunReport)], facts: &[(Driver, Option<FrontierFacts>)]) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    for ((label, run), (driver, fact)) in runs.iter().zip(facts) {
        let Driver::Frontier { held, .. } = *driver else {
            continue;
        };
        let outcome = &run.outcome;
        verdicts.push(Verdict {
            pass: outcome.answered == outcome.requests && !outcome.timed_out,
            text: format!(
                "{label}: all {} results in within {} s ({} answered, {} failed)",
                outcome.requests,
                RUN_TIMEOUT.as_secs(),
                outcome.answered,
                outcome.failed
            ),
        });
        let bound = run.bound.unwrap_or_default();
        let steady = run.arrivals.steady_rate.map(|steady| steady / bound);
        verdicts.push(Verdict {
            pass: steady.is_some_and(|ratio| ratio >= SHARE),
            text: format!(
                "{label}: steady-state rate ≥ 95 % of {} ({bound:.0}/s): {} ({}/s; wall-clock {:.1} %, not judged)",
                match driver {
                    Driver::Frontier { held: true, .. } => "the bound of the sites not held",
                    Driver::Frontier { in_flight, .. } if *in_flight == SMALL_IN_FLIGHT => {
                        "N / latency (or the politeness bound, if lower)"
                    }
                    _ => "the politeness bound",
                },
                optional(steady, |ratio| format!("{:.1} %", 100.0 * ratio)),
                optional(run.arrivals.steady_rate, |rate| format!("{rate:.0}")),
                100.0 * run.requests_per_second() / bound,
            ),
        });
        verdicts.push(spacing_verdict(label, run));
        if held {
            let pass = fact.as_ref().is_some_and(|facts| {
                facts.waited == 0
                    && facts.max_registry_waiting == 0
                    && facts.end_in_flight == 0
                    && facts.end_registry_in_flight == 0
                    && facts.held_one_arrival == facts.held_sites
                    && facts.end_pending == facts.held_pages
            });
            verdicts.push(Verdict {
                pass,
                text: format!(
                    "{label}: held sites take no in-flight slot (no request waited in the throttle, each held site \
                     saw one request, and with the others done nothing is in flight while their pages wait in the \
                     frontier){}",
                    optional(fact.as_ref(), |facts| format!(
                        ": {} waited, {} of {} held sites saw one request, in flight {} / registry {}, pending {}",
                        facts.waited,
                        facts.held_one_arrival,
                        facts.held_sites,
                        facts.end_in_flight,
                        facts.end_registry_in_flight,
                        facts.end_pending,
                    )),
                ),
            });
        }
    }
    verdicts
}
