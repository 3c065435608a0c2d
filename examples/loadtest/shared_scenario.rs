//! Scenario (h): names on shared servers, through IP scopes. Each server is
//! a loopback address of its own; its names (`n<j>.s<i>.load.test`) reach
//! it through two resolvers that agree: the `IpScopeLayer`'s
//! (`FixedResolver`: name → the server's address, so the name's requests
//! carry the server's scope `ip:…`) and hyper-util's (the loadtest's
//! `ListenerResolver`). Stack `IpScopeLayer` → `ThrottleLayer` → hyper-util,
//! 5 ms latency; the pages come **name by name** (all of a name's pages,
//! then the next name's), each server's names in turn. Two shapes:
//!
//! - `allowance`: 10 servers × 20 names; each name 1 lane, 250 ms, the
//!   default ±50 % jitter (4/s); each server 2 lanes, 25 ms, no jitter
//!   (40/s, half what its names ask). A name has 5 to 30 pages (341 a
//!   server), so names that are served in turn finish apart and leave
//!   the last ones alone below the server's allowance. Judged: every
//!   server ≥ 95 % of its 40/s over the whole crawl, its tail included
//!   (its arrivals after the first over the span from its first to its
//!   last, by kernel stamps), and no server gap below 25 − 2 ms.
//! - `end to end`: 100 servers × 10 names, 20 pages each (20 000
//!   requests); each name 1 lane, 250 ms, ±50 % jitter; each server 1
//!   lane, 100 ms, no jitter (10/s): the bound is 1 000/s. Judged: all
//!   requests over the run's wall-clock time ≥ 950/s, and the spacing.
//!
//! Drivers, from one run: the frontier with `ip_scopes` (names resolved
//! before they are ordered; judged), the frontier without it (the names'
//! scopes only: their requests wait for their server in the throttle),
//! `buffer_unordered(200)` and one task per request over the same order.
//! The last two stop after [`COMPARISON_TIMEOUT`]: their figures are for
//! what they answered by then.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use tower::{Layer, ServiceExt};
use tower_throttle::frontier::FrontierBuilder;
use tower_throttle::ip::{FixedResolver, IpScopeLayer};
use tower_throttle::throttle::ThrottledBody;
use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};

use super::{
    gap_floor, load_client, millis, optional, start_sites, AddressBlocks, Addressing, BoxError, Goal,
    RealtimeClock, Request, Scenario, ServerThread, Tally, Verdict,
};

const IN_FLIGHT: usize = 200;
/// How long `buffer_unordered` and one task per request run at most.
const COMPARISON_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a frontier run may take at most.
const FRONTIER_TIMEOUT: Duration = Duration::from_secs(60);
const SHARE: f64 = 0.95;

/// One shape of the scenario.
struct Shape {
    label: &'static str,
    servers: usize,
    names: usize,
    /// Name `j`'s pages.
    pages: fn(usize) -> usize,
    server_lanes: u32,
    server_delay: Duration,
}

impl Shape {
    fn requests_per_server(&self) -> usize {
        (0..self.names).map(self.pages).sum()
    }

    /// The servers' allowance, requests per second.
    fn server_allowance(&self) -> f64 {
        1.0 / self.server_delay.as_secs_f64()
    }

    fn bound(&self) -> f64 {
        self.server_allowance() * self.servers as f64
    }
}

fn shapes(quick: bool) -> [Shape; 2] {
    [
        Shape {
            label: "allowance",
            servers: if quick { 2 } else { 10 },
            names: 20,
            pages: |name| 5 + name * 25 / 19,
            server_lanes: 2,
            server_delay: Duration::from_millis(25),
        },
        Shape {
            label: "end to end",
            servers: if quick { 10 } else { 100 },
            names: 10,
            pages: |_| 20,
            server_lanes: 1,
            server_delay: Duration::from_millis(100),
        },
    ]
}

#[derive(Clone, Copy, PartialEq)]
enum Driver {
    Frontier { resolve_first: bool },
    Buffered,
    Spawn,
}

impl Driver {
    fn label(self) -> &'static str {
        match self {
            Driver::Frontier { resolve_first: true } => "frontier, ip_scopes",
            Driver::Frontier { resolve_first: false } => "frontier, names only",
            Driver::Buffered => "buffered N=200",
            Driver::Spawn => "spawn",
        }
    }
}

/// What one run measured.
struct Measured {
    answered: usize,
    failed: usize,
    elapsed: Duration,
    timed_out: bool,
    first_error: Option<String>,
    /// Each server's rate over the whole crawl by kernel stamps, lowest
    /// first.
    server_rates: Vec<f64>,
    /// Server gaps by kernel stamps: the closest, and how many below the
    /// floor.
    closest: Option<Duration>,
    below_floor: usize,
}

/// Runs scenario (h), prints its figures, and returns how many criteria
/// failed.
pub(super) fn run(server: &ServerThread, quick: bool, blocks: &mut AddressBlocks) -> usize {
    let mut failures = 0;
    for shape in shapes(quick) {
        println!(
            "\n== (h) {}: {} servers (one loopback address each) × {} names, {} requests a server, name by name, \
             through IP scopes ==",
            shape.label,
            shape.servers,
            shape.names,
            shape.requests_per_server(),
        );
        println!(
            "   names: 1 lane, 250 ms, jitter ±50 %; servers: {} lane(s), {} ms, jitter 0 ({:.0}/s each, {:.0}/s in \
             all); latency 5 ms; stack IpScopeLayer → ThrottleLayer → hyper-util; buffered and spawn stop after {} s",
            shape.server_lanes,
            shape.server_delay.as_millis(),
            shape.server_allowance(),
            shape.bound(),
            COMPARISON_TIMEOUT.as_secs(),
        );
        let drivers = [
            Driver::Frontier { resolve_first: true },
            Driver::Frontier { resolve_first: false },
            Driver::Buffered,
            Driver::Spawn,
        ];
        let mut judged = None;
        for driver in drivers {
            match run_once(server, &shape, driver, blocks.next()) {
                Ok(measured) => {
                    print_run(&shape, driver, &measured);
                    if driver == (Driver::Frontier { resolve_first: true }) {
                        judged = Some(measured);
                    }
                }
                Err(error) => println!("   {}: could not run: {error}", driver.label()),
            }
        }
        let label = Driver::Frontier { resolve_first: true }.label();
        let verdicts = verdicts(&shape, label, judged.as_ref());
        for verdict in &verdicts {
            println!(
                "  {} (h) {}",
                if verdict.pass { "PASS" } else { "FAIL" },
                verdict.text
            );
        }
        failures += verdicts.iter().filter(|verdict| !verdict.pass).count();
    }
    println!(
        "   (the frontier without ip_scopes, buffered and spawn are printed for comparison, not judged)"
    );
    failures
}

fn print_run(shape: &Shape, driver: Driver, measured: &Measured) {
    let rate = measured.answered as f64 / measured.elapsed.as_secs_f64().max(1e-9);
    let rates = &measured.server_rates;
    println!(
        "   {:<20} {} answered, {} failed in {:.2} s{}: {rate:.0}/s = {:.1} % of {:.0}/s; servers over the whole \
         crawl (of {:.0}/s): min {}, median {}, max {}; server gaps: closest {} ms, {} below the floor",
        driver.label(),
        measured.answered,
        measured.failed,
        measured.elapsed.as_secs_f64(),
        if measured.timed_out { " (stopped)" } else { "" },
        100.0 * rate / shape.bound(),
        shape.bound(),
        shape.server_allowance(),
        optional(rates.first(), |rate| format!("{rate:.1}")),
        optional(rates.get(rates.len() / 2), |rate| format!("{rate:.1}")),
        optional(rates.last(), |rate| format!("{rate:.1}")),
        optional(measured.closest, millis),
        measured.below_floor,
    );
    if let Some(error) = &measured.first_error {
        println!("   {:<20} first error: {error}", driver.label());
    }
}

fn verdicts(shape: &Shape, label: &str, measured: Option<&Measured>) -> Vec<Verdict> {
    let Some(measured) = measured else {
        return vec![Verdict {
            pass: false,
            text: format!("{label}: the run could not start"),
        }];
    };
    let requests = shape.servers * shape.requests_per_server();
    let mut verdicts = vec![Verdict {
        pass: measured.answered == requests && !measured.timed_out,
        text: format!(
            "{label}: all {requests} answered ({} answered, {} failed)",
            measured.answered, measured.failed
        ),
    }];
    let allowance = shape.server_allowance();
    if shape.server_lanes > 1 {
        let lowest = measured.server_rates.first().copied();
        verdicts.push(Verdict {
            pass: lowest.is_some_and(|rate| rate >= SHARE * allowance),
            text: format!(
                "{label}: every server ≥ 95 % of its {allowance:.0}/s over the whole crawl, tail included (lowest {})",
                optional(lowest, |rate| format!("{rate:.1}/s = {:.1} %", 100.0 * rate / allowance)),
            ),
        });
    } else {
        let rate = measured.answered as f64 / measured.elapsed.as_secs_f64().max(1e-9);
        verdicts.push(Verdict {
            pass: rate >= SHARE * shape.bound(),
            text: format!(
                "{label}: end to end ≥ 95 % of {:.0}/s: {rate:.0}/s ({:.1} %)",
                shape.bound(),
                100.0 * rate / shape.bound()
            ),
        });
    }
    verdicts.push(Verdict {
        pass: measured.below_floor == 0,
        text: format!(
            "{label}: no server gap below {} ms by kernel stamps ({} below)",
            millis(shape.server_delay - super::GAP_TOLERANCE),
            measured.below_floor
        ),
    });
    verdicts
}

fn boxed(error: tower_throttle::Error) -> BoxError {
    Box::new(error)
}

/// Reads the whole body, so the connection goes back to the pool.
async fn read_body(response: http::Response<ThrottledBody<hyper::body::Incoming>>) -> Result<(), BoxError> {
    match response.into_body().collect().await {
        Ok(_) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

fn name(server: usize, name: usize) -> String {
    format!("n{name}.s{server}.load.test")
}

fn run_once(server: &ServerThread, shape: &Shape, driver: Driver, block: u8) -> Result<Measured, BoxError> {
    let scenario = Scenario {
        name: "h",
        sites: shape.servers,
        pages: 1,
        concurrency: 1,
        delay: shape.server_delay,
        jitters: vec![0.0],
        latency: Duration::from_millis(5),
        handshake: Duration::ZERO,
        max_concurrency: 10_000,
        named_sites: false,
        goal: Goal::Spacing,
    };
    let sites = start_sites(server, &scenario, block, (0, true))?;
    let Addressing::OneListenerEach(listeners) = sites.addressing.clone() else {
        unreachable!("one listener per server")
    };
    let registry = Registry::builder()
        .max_concurrency(10_000)
        .default_scope(
            ScopeConfig::default()
                .concurrency(1)
                .delay(Duration::from_millis(250))
                .delay_per_slot(Duration::ZERO),
        )
        .ip_scopes(
            ScopeConfig::default()
                .concurrency(shape.server_lanes)
                .delay(shape.server_delay)
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()?;
    let resolver = FixedResolver::new();
    for server in 0..shape.servers {
        for index in 0..shape.names {
            resolver.set(&name(server, index), [listeners[server].ip()]);
        }
    }
    let ip_scopes = IpScopeLayer::builder(registry.clone())
        .resolver(resolver)
        .build()?;
    let clock = RealtimeClock::sample();
    // hyper-util resolves `…s<i>.load.test` to listener `i`; the port is
    // the URI's.
    let named = Addressing::Named {
        port: 0,
        listeners: listeners.clone(),
    };
    let client = load_client(&named, true, None);
    let service = ip_scopes
        .layer(ThrottleLayer::new(registry.clone()).layer(client))
        .map_err(boxed)
        .and_then(read_body);
    // Name by name, each server's names in turn.
    let mut requests = Vec::new();
    for index in 0..shape.names {
        for server in 0..shape.servers {
            for page in 0..(shape.pages)(index) {
                let uri = format!(
                    "http://{}:{}/{page}",
                    name(server, index),
                    listeners[server].port()
                );
                let request: Request = http::Request::get(uri).body(Full::new(Bytes::new()))?;
                requests.push(request);
            }
        }
    }
    let tally = Arc::new(Tally::default());
    let runtime = match driver {
        Driver::Spawn => tokio::runtime::Builder::new_multi_thread().enable_all().build()?,
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
    };
    let start = Instant::now();
    let timed_out = runtime.block_on(async {
        match driver {
            Driver::Frontier { resolve_first } => {
                let mut builder = FrontierBuilder::new(registry.clone()).in_flight(IN_FLIGHT);
                if resolve_first {
                    builder = builder.ip_scopes(ip_scopes.clone());
                }
                let (frontier, handle) = builder.build(service).expect("a budget of at least 1");
                drop(handle);
                let mut frontier =
                    frontier.with_source(stream::iter(requests.into_iter().map(|request| (request, ()))));
                let work = async {
                    while let Some(((), result)) = frontier.next().await {
                        tally.add(result);
                    }
                };
                tokio::time::timeout(FRONTIER_TIMEOUT, work).await.is_err()
            }
            Driver::Buffered => {
                let work = stream::iter(requests)
                    .map(|request| service.clone().oneshot(request))
                    .buffer_unordered(IN_FLIGHT)
                    .for_each(|result| {
                        tally.add(result);
                        std::future::ready(())
                    });
                tokio::time::timeout(COMPARISON_TIMEOUT, work).await.is_err()
            }
            Driver::Spawn => {
                let work = async {
                    let mut tasks = tokio::task::JoinSet::new();
                    for request in requests {
                        let (service, tally) = (service.clone(), tally.clone());
                        tasks.spawn(async move { tally.add(service.oneshot(request).await) });
                    }
                    while tasks.join_next().await.is_some() {}
                };
                tokio::time::timeout(COMPARISON_TIMEOUT, work).await.is_err()
            }
        }
    });
    let elapsed = start.elapsed();
    runtime.shutdown_timeout(Duration::from_secs(2));
    let floor = gap_floor(shape.server_delay, 0.0);
    let (mut server_rates, mut closest, mut below_floor) = (Vec::new(), None::<Duration>, 0);
    for site in sites.log.sites.lock().unwrap().iter() {
        let mut instants: Vec<Instant> = site
            .heads
            .iter()
            .map(|arrival| {
                arrival
                    .kernel
                    .map_or(arrival.head, |since_epoch| clock.instant(since_epoch))
            })
            .collect();
        instants.sort_unstable();
        if let (Some(first), Some(last)) = (instants.first(), instants.last()) {
            let span = (*last - *first).as_secs_f64();
            if span > 0.0 {
                server_rates.push((instants.len() - 1) as f64 / span);
            }
        }
        for pair in instants.windows(2) {
            let gap = pair[1] - pair[0];
            closest = Some(closest.map_or(gap, |closest| closest.min(gap)));
            below_floor += usize::from(floor.is_some_and(|floor| gap < floor));
        }
    }
    server_rates.sort_by(f64::total_cmp);
    let answered = tally.answered.load(std::sync::atomic::Ordering::Relaxed);
    let failed = tally.failed.load(std::sync::atomic::Ordering::Relaxed);
    let first_error = tally.first_error.lock().unwrap().take();
    Ok(Measured {
        answered,
        failed,
        elapsed,
        timed_out,
        first_error,
        server_rates,
        closest,
        below_floor,
    })
}
