//! The README's quick start (`examples/quick_start.rs`, compiled in here:
//! a frontier over the throttled reqwest stack) run against three loopback
//! sites, one per address (127.0.0.2 to .4), so each is a scope of its own,
//! their pages pushed site by site, as a new user would run it. Real sockets
//! and real time: the tests assert what each site saw (every page once, in
//! order, never two closer than the jitter's floor, no page sooner than a
//! `Retry-After` allows), lower bounds measured at the site, not exact
//! instants.
//!
//! `cargo test --features reqwest --test quick_start -- --nocapture` shows
//! what the example prints.

#![allow(dead_code)]

mod support;

#[path = "../examples/quick_start.rs"]
mod quick_start;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::KernelArrival;

/// The quick start's scopes: 500 ms apart with ±50 % jitter.
const JITTER_FLOOR: Duration = Duration::from_millis(250);
/// Loopback adds scheduling noise between the client's send and the site's
/// receipt; gaps are asserted with this much slack.
const SOCKET_SLACK: Duration = Duration::from_millis(10);
const PAGES: usize = 4;

type Arrivals = Arc<Mutex<HashMap<String, Vec<(String, Instant)>>>>;

/// Starts one loopback site per address 127.0.0.2 to .4; each logs the
/// path and kernel arrival of every request, by host, and answers with
/// `answer(site, path)`: `Some(seconds)` for a 429 with that `Retry-After`.
fn start_sites(arrivals: &Arrivals, answer: fn(u8, &str) -> Option<u32>) -> (Vec<SocketAddr>, Vec<String>) {
    let mut sites = Vec::new();
    for last in 2..=4 {
        let log = arrivals.clone();
        let address = support::serve_at(
            SocketAddr::from(([127, 0, 0, last], 0)),
            move |request: http::Request<hyper::body::Incoming>| {
                let host = request.headers()[http::header::HOST].to_str().unwrap().to_owned();
                let arrival = KernelArrival::of(&request);
                let path = request.uri().path().to_owned();
                let retry_after = answer(last, &path);
                log.lock().unwrap().entry(host).or_default().push((path, arrival));
                async move {
                    match retry_after {
                        None => support::text("a page"),
                        Some(seconds) => {
                            let mut response = support::text("slow down");
                            *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
                            response
                                .headers_mut()
                                .insert(http::header::RETRY_AFTER, seconds.into());
                            response
                        }
                    }
                }
            },
        )
        .expect("a loopback address of its own (Linux answers on all of 127.0.0.0/8)");
        sites.push(address);
    }
    // Site by site, as a crawler finds its links: the frontier still
    // crawls the sites side by side.
    let urls = sites
        .iter()
        .flat_map(|site| (1..=PAGES).map(move |page| format!("http://{site}/page/{page}/")))
        .collect();
    (sites, urls)
}

/// Every site saw every page once, in the order asked, and never two of
/// them closer than the jitter's floor.
fn assert_polite(arrivals: &HashMap<String, Vec<(String, Instant)>>, sites: usize) {
    assert_eq!(arrivals.len(), sites, "{arrivals:?}");
    for (host, pages) in arrivals.iter() {
        let paths: Vec<&str> = pages.iter().map(|(path, _)| path.as_str()).collect();
        let expected: Vec<String> = (1..=PAGES).map(|page| format!("/page/{page}/")).collect();
        assert_eq!(paths, expected, "{host}: every page once, in the order asked");
        for pair in pages.windows(2) {
            let gap = pair[1].1.duration_since(pair[0].1);
            assert!(
                gap + SOCKET_SLACK >= JITTER_FLOOR,
                "{host}: {} and {} arrived {gap:?} apart",
                pair[0].0,
                pair[1].0
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_start_crawls_loopback_sites_each_at_its_own_pace() {
    let arrivals = Arrivals::default();
    let (sites, urls) = start_sites(&arrivals, |_, _| None);

    quick_start::crawl(urls).await.expect("every page answered");

    let arrivals = arrivals.lock().unwrap();
    assert_polite(&arrivals, sites.len());
    // Pushed site by site, the sites are still crawled side by side: each
    // one's first page arrived before any site's second.
    let last_first = arrivals.values().map(|pages| pages[0].1).max().unwrap();
    let first_second = arrivals.values().map(|pages| pages[1].1).min().unwrap();
    assert!(last_first < first_second, "{arrivals:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_start_waits_as_long_as_a_429_retry_after_says_before_that_sites_next_page() {
    let arrivals = Arrivals::default();
    // The site on 127.0.0.3 answers its second page with 429 and
    // `Retry-After: 2`; the others answer every page.
    let (sites, urls) = start_sites(&arrivals, |site, path| {
        (site == 3 && path == "/page/2/").then_some(2)
    });

    quick_start::crawl(urls)
        .await
        .expect("every page answered (a 429 is an answer)");

    let arrivals = arrivals.lock().unwrap();
    assert_polite(&arrivals, sites.len());
    let limited = &arrivals[&sites[1].to_string()];
    let after_429 = limited[2].1.duration_since(limited[1].1);
    assert!(
        after_429 >= Duration::from_secs(2),
        "the page after the 429 arrived {after_429:?} after it, before its Retry-After of 2 s"
    );
}
