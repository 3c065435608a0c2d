//! Scenario (g): a crawl that discovers its links. A made-up site graph
//! (`tests/support/site_graph.rs`) of 2 000 pages over 50 sites of uneven
//! sizes (20 to 60 pages), one loopback address per site, each page linking
//! 5 more: its site's next page, 3 more of its site at random and one page
//! of another site. The crawl starts from each site's first page and pushes
//! a page's links through the frontier's handle when its answer comes (the
//! crawler "parses" them from the graph), each page once, while the crawl
//! runs. Stack `ThrottleLayer` → hyper-util; 1 lane per site, delay 100 ms,
//! jitter 0, 5 ms latency; `in_flight(200)`.
//!
//! Judged: every page fetched exactly once (the sites' own count, by each
//! request's `x-seq`), no kernel-stamped site gap below `d − 2 ms`, and the
//! crawl's time within 5 % of the bound's: the busiest site's pages × the
//! delay, which no crawl of the graph can beat (its first page goes at 0,
//! its last `(pages − 1) × d` later, then answers). `--quick`: 400 pages
//! over 10 sites.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use tower::{Layer, ServiceExt};
use tower_throttle::frontier::FrontierBuilder;
use tower_throttle::throttle::ThrottledBody;
use tower_throttle::ThrottleLayer;

use super::{
    gap_floor, load_client, millis, optional, scenario_registry, spacing_verdict, start_sites, AddressBlocks,
    BoxError, BusyThreads, CpuSample, DepartureLog, Goal, Kind, Outcome, RealtimeClock, Request, RunReport,
    Scenario, Seq, ServerThread, Style, Verdict, RUN_TIMEOUT,
};

#[path = "../../tests/support/site_graph.rs"]
mod site_graph;
use site_graph::SiteGraph;

const IN_FLIGHT: usize = 200;
/// Links per page to its own site (one more goes to another site).
const OWN_LINKS: usize = 4;
/// How far past the bound's time the crawl may end.
const SLACK: f64 = 0.05;

fn scenario(graph: &SiteGraph) -> Scenario {
    Scenario {
        name: "g",
        sites: graph.sites(),
        pages: graph.busiest(),
        concurrency: 1,
        delay: Duration::from_millis(100),
        jitters: vec![0.0],
        latency: Duration::from_millis(5),
        handshake: Duration::ZERO,
        max_concurrency: 10_000,
        named_sites: false,
        goal: Goal::BoundAndSpacing,
    }
}

/// Runs scenario (g), prints its figures, and returns how many criteria
/// failed.
pub(super) fn run(
    server: &ServerThread,
    busy: &BusyThreads,
    quick: bool,
    blocks: &mut AddressBlocks,
) -> usize {
    let (sites, pages) = if quick { (10, 400) } else { (50, 2_000) };
    let graph = SiteGraph::new(sites, pages, OWN_LINKS, 52);
    let scenario = scenario(&graph);
    let bound = graph.bound(scenario.delay);
    println!(
        "\n== (g) a crawl that discovers its links: {} pages over {} sites (one loopback address each, {} to {} \
         pages), {} links a page, pushed as pages answer ==",
        graph.pages(),
        graph.sites(),
        (0..graph.sites())
            .map(|site| graph.seeds().get(site + 1).copied().unwrap_or(graph.pages()) - graph.seeds()[site])
            .min()
            .unwrap_or(0),
        graph.busiest(),
        OWN_LINKS + 1,
    );
    println!(
        "   concurrency 1, delay {} ms, jitter 0, latency {} ms; stack ThrottleLayer → hyper-util; frontier \
         in_flight {IN_FLIGHT}; the bound: the busiest site's {} pages × {} ms = {:.2} s",
        scenario.delay.as_millis(),
        scenario.latency.as_millis(),
        graph.busiest(),
        scenario.delay.as_millis(),
        bound.as_secs_f64(),
    );
    let label = format!("frontier N={IN_FLIGHT}");
    let (run, fetched) = match run_once(server, busy, &scenario, &graph, blocks.next()) {
        Ok(run) => run,
        Err(error) => {
            println!("  {label}: could not run: {error}");
            return 1;
        }
    };
    let outcome = &run.outcome;
    println!(
        "   {label}: {} pages answered ({} failed) in {:.3} s = {:.1} % of the bound's time; the sites saw {} \
         requests: {} pages once, {} more than once, {} never; client CPU {} s",
        outcome.answered,
        outcome.failed,
        outcome.elapsed.as_secs_f64(),
        100.0 * outcome.elapsed.as_secs_f64() / bound.as_secs_f64(),
        run.arrivals.requests,
        fetched.once,
        fetched.again,
        fetched.never,
        optional(run.client_cpu, |cpu| format!("{cpu:.2}")),
    );
    if let Some(all) = &run.arrivals.all {
        println!(
            "   {label}: site gaps by kernel stamps: {} gaps, min {} ms, p0.1 {} ms, mean {} ms, {} below the floor {} \
             ms",
            all.count,
            millis(all.min),
            millis(all.p0_1),
            millis(all.mean),
            run.arrivals.below_floor(),
            optional(run.arrivals.floor, millis),
        );
    }
    if let Some(error) = &outcome.first_error {
        println!("   {label}: first error: {error}");
    }
    let verdicts = [
        Verdict {
            pass: fetched.once == graph.pages() && fetched.again == 0 && !outcome.timed_out,
            text: format!(
                "{label}: every page fetched exactly once, at its site ({} of {}; {} more than once, {} never)",
                fetched.once,
                graph.pages(),
                fetched.again,
                fetched.never
            ),
        },
        spacing_verdict(&label, &run),
        Verdict {
            pass: outcome.elapsed.as_secs_f64() <= bound.as_secs_f64() * (1.0 + SLACK),
            text: format!(
                "{label}: the crawl ends within 5 % of the bound's time ({:.3} s of {:.3} s: {:+.1} %)",
                outcome.elapsed.as_secs_f64(),
                bound.as_secs_f64(),
                100.0 * (outcome.elapsed.as_secs_f64() / bound.as_secs_f64() - 1.0),
            ),
        },
    ];
    for verdict in &verdicts {
        println!(
            "  {} (g) {}",
            if verdict.pass { "PASS" } else { "FAIL" },
            verdict.text
        );
    }
    verdicts.iter().filter(|verdict| !verdict.pass).count()
}

/// How many times the sites saw each page.
#[derive(Default)]
struct Fetched {
    once: usize,
    again: usize,
    never: usize,
}

fn run_once(
    server: &ServerThread,
    busy: &BusyThreads,
    scenario: &Scenario,
    graph: &SiteGraph,
    block: u8,
) -> Result<(RunReport, Fetched), BoxError> {
    let sites = start_sites(server, scenario, block, (0, true))?;
    let cpu_before = CpuSample::take(server, busy);
    // One lane a site (the scenario's), the default queue bound.
    let registry = scenario_registry(scenario, 0.0)?;
    let clock = RealtimeClock::sample();
    let departures = Arc::new(DepartureLog::default());
    let client = load_client(&sites.addressing, true, Some(departures.clone()));
    let service = ThrottleLayer::new(registry.clone())
        .layer(client)
        .map_err(BoxError::from)
        .and_then(
            |response: http::Response<ThrottledBody<hyper::body::Incoming>>| async move {
                // The whole body, so the connection goes back to the pool.
                response.into_body().collect().await?;
                Ok::<_, BoxError>(())
            },
        );
    let addressing = sites.addressing.clone();
    let request = |id: usize| -> Request {
        let page = graph.page(id);
        let uri = format!("http://{}/page/{}", addressing.authority(page.site), page.index);
        let mut request = http::Request::get(uri)
            .body(Full::new(Bytes::new()))
            .expect("a valid request");
        request.extensions_mut().insert(Seq(graph.seq(id)));
        request
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let start = Instant::now();
    let (answered, failed, first_error, timed_out) = runtime.block_on(async {
        let (mut frontier, pages) = FrontierBuilder::new(registry.clone())
            .in_flight(IN_FLIGHT)
            .build(service)
            .expect("a budget of at least 1");
        let mut seen = HashSet::new();
        for id in graph.seeds() {
            seen.insert(id);
            pages.try_push_tagged(request(id), id).expect("room for the seeds");
        }
        let (mut answered, mut failed, mut first_error) = (0, 0, None);
        let crawl = async {
            let mut pages = Some(pages);
            while let Some((id, result)) = frontier.next().await {
                match result {
                    Ok(()) => answered += 1,
                    Err(error) => {
                        failed += 1;
                        first_error.get_or_insert_with(|| error.to_string());
                    }
                }
                // The page's links, each pushed once, while the crawl runs.
                if let Some(handle) = &pages {
                    for &link in graph.links(id) {
                        if seen.insert(link) {
                            handle.try_push_tagged(request(link), link).expect("room for every page");
                        }
                    }
                }
                if seen.len() == graph.pages() {
                    // Every page is known: the stream ends when they are done.
                    pages = None;
                }
            }
        };
        let timed_out = tokio::time::timeout(RUN_TIMEOUT, crawl).await.is_err();
        if timed_out {
            let stats = registry.stats();
            first_error.get_or_insert_with(|| {
                format!(
                    "timed out with {} pages known: frontier in flight {}, pending {}; registry in flight {}, \
                     waiting {}",
                    seen.len(),
                    frontier.in_flight(),
                    frontier.pending(),
                    stats.in_flight,
                    stats.waiting
                )
            });
        }
        (answered, failed, first_error, timed_out)
    });
    let elapsed = start.elapsed();
    runtime.shutdown_timeout(Duration::from_secs(2));
    let cpu_after = CpuSample::take(server, busy);
    let mut counts = vec![0usize; graph.pages()];
    let mut by_seq = std::collections::HashMap::new();
    for id in 0..graph.pages() {
        by_seq.insert(graph.seq(id), id);
    }
    for site in sites.log.sites.lock().unwrap().iter() {
        for arrival in &site.heads {
            if let Some(&id) = arrival.seq.and_then(|seq| by_seq.get(&seq)) {
                counts[id] += 1;
            }
        }
    }
    let fetched = Fetched {
        once: counts.iter().filter(|&&count| count == 1).count(),
        again: counts.iter().filter(|&&count| count > 1).count(),
        never: counts.iter().filter(|&&count| count == 0).count(),
    };
    let departures = std::mem::take(&mut *departures.departures.lock().unwrap());
    let clock_after = RealtimeClock::sample();
    let arrivals = sites.summary(departures, gap_floor(scenario.delay, 0.0), &clock, &clock_after);
    let report = RunReport {
        kind: Kind::Throttled,
        style: Style::Stream,
        delay: scenario.delay,
        jitter: 0.0,
        outcome: Outcome {
            requests: graph.pages(),
            answered,
            failed,
            elapsed,
            timed_out,
            first_error,
        },
        arrivals,
        client_cpu: cpu_after.client_since(&cpu_before),
        server_cpu: cpu_after.server_since(&cpu_before),
        rss_before: None,
        rss_after: None,
        scopes: registry.stats().scopes_tracked,
        bound: None,
    };
    Ok((report, fetched))
}
