//! The frontier feeds a throttled service in readiness order: any input
//! order reaches the politeness bound, held sites take no slot, dropping
//! it gives everything back. Paused virtual time with an in-process inner
//! service, so every instant asserted is exact.

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use futures::StreamExt;
use support::Recorder;
use tokio::time::Instant;
use tower::{Service, ServiceBuilder};
use tower_throttle::frontier::{Frontier, FrontierBuilder, FrontierHandle};
use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// One lane per site, `delay` between sends, no jitter.
fn polite(delay: Duration) -> Registry {
    Registry::builder()
        .max_concurrency(10_000)
        .default_scope(
            ScopeConfig::default()
                .concurrency(1)
                .delay(delay)
                .delay_per_slot(delay)
                .jitter(0.0),
        )
        .build()
        .unwrap()
}

/// An in-process site that records each request and answers after
/// `latency`.
#[derive(Clone)]
struct Site {
    recorder: Recorder,
    latency: Duration,
}

impl Service<http::Request<()>> for Site {
    type Response = http::Response<()>;
    type Error = Infallible;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<http::Response<()>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<()>) -> Self::Future {
        self.recorder.record(&request);
        let latency = self.latency;
        Box::pin(async move {
            tokio::time::sleep(latency).await;
            Ok(http::Response::new(()))
        })
    }
}

type Client = tower_throttle::Throttle<Site>;

/// The throttle around an in-process site that answers after `latency`.
fn client(registry: &Registry, recorder: &Recorder, latency: Duration) -> Client {
    ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .service(Site {
            recorder: recorder.clone(),
            latency,
        })
}

fn frontier(
    registry: &Registry,
    recorder: &Recorder,
    budget: usize,
) -> (Frontier<Client, ()>, FrontierHandle<()>) {
    FrontierBuilder::new(registry.clone())
        .in_flight(budget)
        .build(client(registry, recorder, ms(5)))
        .unwrap()
}

/// A scope's send instants at one lane, 100 ms apart, answers in 5 ms: the
/// cold scope's second send counts from the first answer.
fn cold_then_every_100_ms(pages: usize) -> Vec<u128> {
    (0..pages as u128)
        .map(|k| if k == 0 { 0 } else { k * 100 + 5 })
        .collect()
}

fn page(site: usize, page: usize) -> http::Request<()> {
    support::get(&format!("https://s{site}.test/{page}"))
}

/// Each host's send instants, in ms.
fn sends_by_host(recorder: &Recorder) -> HashMap<String, Vec<u128>> {
    let mut by_host: HashMap<String, Vec<u128>> = HashMap::new();
    for sent in recorder.sent() {
        by_host.entry(sent.host).or_default().push(sent.at.as_millis());
    }
    by_host
}

/// Drains `frontier`, returning how many results it gave; none of its
/// requests waited in the throttle (a response of one that did carries a
/// `Waited`).
async fn drain<S, B>(frontier: &mut Frontier<S, ()>) -> usize
where
    S: Service<http::Request<()>, Response = http::Response<B>> + Unpin,
    S::Error: std::fmt::Debug,
{
    let mut answered = 0;
    while let Some((uri, result)) = frontier.next().await {
        let response = result.unwrap();
        let waited = response.extensions().get::<tower_throttle::Waited>();
        assert!(waited.is_none(), "{uri} waited in the throttle: {waited:?}");
        answered += 1;
    }
    answered
}

#[tokio::test(start_paused = true)]
async fn pages_fed_site_by_site_go_at_every_sites_own_pace() {
    const SITES: usize = 50;
    const PAGES: usize = 10;
    let registry = polite(ms(100));
    let recorder = Recorder::new();
    let (mut frontier, handle) = frontier(&registry, &recorder, SITES);
    for site in 0..SITES {
        for number in 0..PAGES {
            handle.push(page(site, number)).await.unwrap();
        }
    }
    drop(handle);
    let start = Instant::now();
    assert_eq!(drain(&mut frontier).await, SITES * PAGES);
    // The politeness bound: 10 pages 100 ms apart (the second 100 ms
    // after the first answer, as the throttle times a cold scope's first
    // gap), the last answered 5 ms after its send.
    assert_eq!(start.elapsed(), ms(910));
    let by_host = sends_by_host(&recorder);
    assert_eq!(by_host.len(), SITES);
    for (host, sends) in by_host {
        assert_eq!(sends, cold_then_every_100_ms(PAGES), "{host}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_same_pages_through_buffer_unordered_crawl_at_a_fraction_of_the_bound() {
    // The loop the frontier replaces, for contrast: slots spent on one
    // site's pages sitting out its delay.
    use tower::ServiceExt;
    const SITES: usize = 50;
    const PAGES: usize = 10;
    let registry = polite(ms(100));
    let recorder = Recorder::new();
    let client = client(&registry, &recorder, ms(5));
    let start = Instant::now();
    let requests = (0..SITES).flat_map(|site| (0..PAGES).map(move |number| page(site, number)));
    let answered = futures::stream::iter(requests)
        .map(|request| client.clone().oneshot(request))
        .buffer_unordered(20)
        .count()
        .await;
    assert_eq!(answered, SITES * PAGES);
    assert!(
        start.elapsed() > ms(910) * 5,
        "buffer_unordered took {:?}",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_small_budget_is_used_whole_and_only_on_requests_that_go() {
    // 1 000 sites of 2 pages, budget 4: the budget binds (4 slots of
    // 5 ms: 800 requests/s), so 2 000 requests take 2.5 s.
    let registry = polite(ms(100));
    let recorder = Recorder::new();
    let (mut frontier, handle) = frontier(&registry, &recorder, 4);
    for site in 0..1_000 {
        for number in 0..2 {
            handle.push(page(site, number)).await.unwrap();
        }
    }
    drop(handle);
    let start = Instant::now();
    assert_eq!(drain(&mut frontier).await, 2_000);
    assert_eq!(start.elapsed(), ms(2_500));
    for (host, sends) in sends_by_host(&recorder) {
        assert!(sends[1] - sends[0] >= 100, "{host}: {sends:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_budget_above_max_concurrency_parks_no_request_in_the_throttle() {
    let registry = Registry::builder()
        .max_concurrency(2)
        .default_scope(
            ScopeConfig::default()
                .concurrency(1)
                .delay(ms(100))
                .delay_per_slot(ms(100))
                .jitter(0.0),
        )
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let (mut frontier, handle) = frontier(&registry, &recorder, 8);
    for site in 0..6 {
        handle.push(page(site, 0)).await.unwrap();
    }
    drop(handle);
    // `drain` checks that no response waited (for a global permit, say).
    assert_eq!(drain(&mut frontier).await, 6);
    // Two at a time, each answered in 5 ms; the frontier looks again
    // when one of its own ends.
    assert_eq!(recorder.millis(), vec![0, 0, 5, 5, 10, 10]);
}

#[tokio::test(start_paused = true)]
async fn a_held_site_takes_no_slot_while_the_others_go() {
    let registry = polite(ms(100));
    registry.hold("s0.test", Duration::from_secs(3600));
    let recorder = Recorder::new();
    let start = Instant::now();
    let (mut frontier, handle) = frontier(&registry, &recorder, 2);
    for site in 0..3 {
        for number in 0..5 {
            handle.push(page(site, number)).await.unwrap();
        }
    }
    let mut answered = 0;
    while answered < 10 {
        let (uri, result) = frontier.next().await.unwrap();
        result.unwrap();
        assert_ne!(uri.host(), Some("s0.test"));
        answered += 1;
        assert!(frontier.in_flight() <= 2);
    }
    assert_eq!(start.elapsed(), ms(410));
    assert_eq!(
        frontier.pending(),
        5,
        "the held site's pages wait in the frontier"
    );
    assert_eq!(frontier.in_flight(), 0, "and take no slot");
    assert_eq!(registry.stats().in_flight, 0);
    drop(frontier);
    assert!(
        handle.push(page(9, 0)).await.is_err(),
        "a push after the drop fails"
    );
}

#[tokio::test(start_paused = true)]
async fn within_a_scope_priority_goes_first_then_arrival() {
    let registry = polite(ms(100));
    let recorder = Recorder::new();
    let (mut frontier, handle) = frontier(&registry, &recorder, 4);
    for (path, priority) in [("/a", 0), ("/b", 0), ("/urgent", 5), ("/c", 0)] {
        let mut request = support::get(&format!("https://one.test{path}"));
        request
            .extensions_mut()
            .insert(tower_throttle::Priority(priority));
        handle.push(request).await.unwrap();
    }
    drop(handle);
    assert_eq!(drain(&mut frontier).await, 4);
    let paths: Vec<String> = recorder.sent().into_iter().map(|sent| sent.path).collect();
    assert_eq!(paths, ["/urgent", "/a", "/b", "/c"]);
    assert_eq!(recorder.millis(), cold_then_every_100_ms(4));
}

#[tokio::test(start_paused = true)]
async fn links_pushed_while_the_crawl_runs_are_fetched_once_each() {
    // A site graph: page n of a site links to pages 2n+1 and 2n+2, up to
    // 30 pages a site; 4 sites. Each link is pushed when its page answers.
    let registry = polite(ms(100));
    let recorder = Recorder::new();
    let (mut frontier, handle) = frontier(&registry, &recorder, 8);
    for site in 0..4 {
        handle.push(page(site, 0)).await.unwrap();
    }
    let mut handle = Some(handle);
    let mut fetched = 0;
    let mut outstanding = 4;
    while let Some((uri, result)) = frontier.next().await {
        let response = result.unwrap();
        assert!(response.extensions().get::<tower_throttle::Waited>().is_none());
        fetched += 1;
        outstanding -= 1;
        let number: usize = uri.path().trim_start_matches('/').parse().unwrap();
        let site: usize = uri.host().unwrap()[1..]
            .trim_end_matches(".test")
            .parse()
            .unwrap();
        for link in [2 * number + 1, 2 * number + 2] {
            if link < 30 {
                handle.as_ref().unwrap().push(page(site, link)).await.unwrap();
                outstanding += 1;
            }
        }
        if outstanding == 0 {
            handle = None;
        }
    }
    assert_eq!(fetched, 4 * 30);
    for (host, sends) in sends_by_host(&recorder) {
        assert_eq!(sends.len(), 30, "{host}");
        assert!(
            sends.windows(2).all(|pair| pair[1] - pair[0] >= 100),
            "{host}: {sends:?}"
        );
        // Never idle while a link was known: one page each 100 ms.
        assert_eq!(sends, cold_then_every_100_ms(30), "{host}");
    }
}

#[tokio::test(start_paused = true)]
async fn dropping_the_frontier_mid_crawl_gives_every_lane_and_place_back() {
    let registry = polite(ms(100));
    let recorder = Recorder::new();
    let (mut frontier, handle) = FrontierBuilder::new(registry.clone())
        .in_flight(8)
        .build(client(&registry, &recorder, ms(1_000)))
        .unwrap();
    for site in 0..20 {
        for number in 0..3 {
            handle.push(page(site, number)).await.unwrap();
        }
    }
    // Start the crawl: 8 requests in the service, answered in 1 s.
    let first = tokio::time::timeout(ms(10), frontier.next()).await;
    assert!(first.is_err(), "nothing answered within 10 ms");
    assert_eq!(frontier.in_flight(), 8);
    assert_eq!(registry.stats().in_flight, 8);
    drop(frontier);
    let stats = registry.stats();
    assert_eq!((stats.in_flight, stats.waiting), (0, 0));
    drop(handle);
}

#[tokio::test(start_paused = true)]
async fn max_pending_makes_a_push_wait_for_room() {
    let registry = polite(ms(100));
    let recorder = Recorder::new();
    let (frontier, handle) = FrontierBuilder::new(registry.clone())
        .in_flight(1)
        .max_pending(2)
        .build(client(&registry, &recorder, ms(5)))
        .unwrap();
    handle.push(page(0, 0)).await.unwrap();
    handle.push(page(0, 1)).await.unwrap();
    assert!(handle
        .try_push_tagged(page(0, 2), page(0, 2).uri().clone())
        .is_err());
    let third = tokio::time::timeout(ms(50), handle.push(page(0, 2))).await;
    assert!(third.is_err(), "the push waits while the frontier is full");
    let mut frontier = frontier;
    let (uri, _) = frontier.next().await.unwrap();
    assert_eq!(uri.path(), "/0");
    handle.push(page(0, 2)).await.unwrap();
    assert_eq!(handle.pending(), 2);
}

#[test]
fn a_budget_of_zero_is_a_config_error_that_names_it() {
    let registry = Registry::default();
    let service =
        tower::service_fn(|_: http::Request<()>| async { Ok::<_, Infallible>(http::Response::new(())) });
    let error = FrontierBuilder::new(registry)
        .in_flight(0)
        .build::<_, (), http::Uri>(service)
        .unwrap_err();
    assert!(error.to_string().contains("in_flight"), "{error}");
}

/// Redirects followed through the frontier: each hop waits its turn in its
/// own scope, in the frontier rather than in a slot.
#[cfg(feature = "follow-redirect")]
mod redirects {
    use super::*;
    use tower::BoxError;
    use tower_throttle::redirect::RedirectError;

    /// A site whose `/hop/N` redirects to `/hop/N+1` until `/hop/3`, whose
    /// `/loop/a` and `/loop/b` redirect to each other, and whose other
    /// pages answer 200; `other.test/...` redirects to `r.test`.
    #[derive(Clone)]
    struct Redirecting(Recorder);

    impl Service<http::Request<()>> for Redirecting {
        type Response = http::Response<()>;
        type Error = BoxError;
        type Future = std::future::Ready<Result<http::Response<()>, BoxError>>;

        fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), BoxError>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<()>) -> Self::Future {
            self.0.record(&request);
            let path = request.uri().path().to_owned();
            let location = match (request.uri().host(), path.as_str()) {
                (Some("other.test"), _) => Some("https://r.test/hop/2".to_owned()),
                (_, "/loop/a") => Some("/loop/b".to_owned()),
                (_, "/loop/b") => Some("/loop/a".to_owned()),
                (_, hop) if hop.starts_with("/hop/") && hop != "/hop/3" => {
                    let number: u32 = hop[5..].parse().unwrap();
                    Some(format!("/hop/{}", number + 1))
                }
                _ => None,
            };
            let response = match location {
                Some(location) => http::Response::builder()
                    .status(301)
                    .header(http::header::LOCATION, location)
                    .body(())
                    .unwrap(),
                None => http::Response::new(()),
            };
            std::future::ready(Ok(response))
        }
    }

    fn following(
        registry: &Registry,
        recorder: &Recorder,
        max: usize,
    ) -> (
        Frontier<tower_throttle::Throttle<Redirecting>, ()>,
        FrontierHandle<()>,
    ) {
        let client = ServiceBuilder::new()
            .layer(ThrottleLayer::new(registry.clone()))
            .service(Redirecting(recorder.clone()));
        let (frontier, handle) = FrontierBuilder::new(registry.clone())
            .in_flight(4)
            .build(client)
            .unwrap();
        (frontier.follow_redirects(max), handle)
    }

    #[tokio::test(start_paused = true)]
    async fn each_hop_waits_its_turn_in_its_scope_and_the_chain_answers_with_its_first_tag() {
        let registry = polite(ms(100));
        let recorder = Recorder::new();
        let (mut frontier, handle) = following(&registry, &recorder, 10);
        handle.push(support::get("https://r.test/hop/0")).await.unwrap();
        handle
            .push(support::get("https://other.test/start"))
            .await
            .unwrap();
        drop(handle);
        let mut answers = Vec::new();
        while let Some((uri, result)) = frontier.next().await {
            let response = result.unwrap();
            assert_eq!(response.status(), 200);
            assert!(
                response.extensions().get::<tower_throttle::Waited>().is_none(),
                "{uri} waited"
            );
            answers.push(uri.to_string());
        }
        answers.sort();
        assert_eq!(answers, ["https://other.test/start", "https://r.test/hop/0"]);
        // r.test: /hop/0 at 0, then its hops and other.test's hop to
        // /hop/2, one lane 100 ms apart (hops answer at once: no cold gap).
        let r_sends: Vec<(String, u128)> = recorder
            .sent()
            .into_iter()
            .filter(|sent| sent.host == "r.test")
            .map(|sent| (sent.path, sent.at.as_millis()))
            .collect();
        let instants: Vec<u128> = r_sends.iter().map(|(_, at)| *at).collect();
        assert_eq!(instants, [0, 100, 200, 300, 400, 500]);
        assert_eq!(r_sends.len(), 6, "{r_sends:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_loop_or_a_chain_past_the_limit_is_an_error() {
        let registry = polite(ms(10));
        let recorder = Recorder::new();
        let (mut frontier, handle) = following(&registry, &recorder, 2);
        handle.push(support::get("https://r.test/loop/a")).await.unwrap();
        handle.push(support::get("https://s.test/hop/0")).await.unwrap();
        drop(handle);
        let mut errors = HashMap::new();
        while let Some((uri, result)) = frontier.next().await {
            let error = result.unwrap_err();
            let error = error
                .downcast_ref::<RedirectError>()
                .expect("a redirect error")
                .clone();
            errors.insert(uri.to_string(), error);
        }
        assert_eq!(
            errors["https://r.test/loop/a"],
            RedirectError::Loop("https://r.test/loop/a".parse().unwrap())
        );
        assert_eq!(errors["https://s.test/hop/0"], RedirectError::TooMany(2));
    }
}

#[test]
fn a_frontier_can_be_built_outside_a_runtime() {
    let registry = polite(ms(100));
    let recorder = Recorder::new();
    let (frontier, handle): (Frontier<Client, ()>, FrontierHandle<()>) =
        FrontierBuilder::new(registry.clone())
            .build(client(&registry, &recorder, ms(5)))
            .unwrap();
    drop((frontier, handle));
}
