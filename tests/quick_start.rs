//! The README's quick start (`examples/quick_start.rs`, compiled in here)
//! run against three loopback sites, one per address (127.0.0.2 to .4), so
//! each is a scope of its own. Real sockets and real time: the test asserts
//! what each site saw (every page once, in order, never two closer than the
//! jitter's floor), not exact instants.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_start_crawls_loopback_sites_each_at_its_own_pace() {
    let arrivals = Arrivals::default();
    let mut urls = Vec::new();
    let mut sites = Vec::new();
    for last in 2..=4 {
        let log = arrivals.clone();
        let address = support::serve_at(
            SocketAddr::from(([127, 0, 0, last], 0)),
            move |request: http::Request<hyper::body::Incoming>| {
                let host = request.headers()[http::header::HOST].to_str().unwrap().to_owned();
                let arrival = KernelArrival::of(&request);
                log.lock()
                    .unwrap()
                    .entry(host)
                    .or_default()
                    .push((request.uri().path().to_owned(), arrival));
                async { support::text("a page") }
            },
        )
        .expect("a loopback address of its own (Linux answers on all of 127.0.0.0/8)");
        sites.push(address);
    }
    for page in 1..=PAGES {
        for site in &sites {
            urls.push(format!("http://{site}/page/{page}/"));
        }
    }

    quick_start::crawl(urls).await.expect("every page answered");

    let arrivals = arrivals.lock().unwrap();
    assert_eq!(arrivals.len(), sites.len(), "{arrivals:?}");
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
    // The sites are crawled side by side: each one's first page arrived
    // before any site's second.
    let last_first = arrivals.values().map(|pages| pages[0].1).max().unwrap();
    let first_second = arrivals.values().map(|pages| pages[1].1).min().unwrap();
    assert!(last_first < first_second, "{arrivals:?}");
}
