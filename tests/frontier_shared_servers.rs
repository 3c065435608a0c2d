//! The frontier over names on shared servers: with `ip_scopes`, a request
//! is resolved before it is ordered, so the frontier orders it by its
//! server's scope too, and sends the names of one server so that they all
//! finish together: the server gets its whole allowance to the end of the
//! crawl, tail included, with paced names and the default ±50 % jitter.
//! Paused virtual time, an in-process inner service.

mod support;

use std::time::Duration;

use futures::StreamExt;
use support::{get, instants_by, Recorder, Sent};
use tower::ServiceBuilder;
use tower_throttle::frontier::FrontierBuilder;
use tower_throttle::ip::{FixedResolver, IpScopeLayer};
use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

const SERVERS: usize = 10;
const NAMES: usize = 20;

/// Name `index`'s pages: 5 for the first, 30 for the last, evenly in
/// between (341 a server, 8.5 s at the server's 40/s; a crawl's sites
/// differ in size). The largest name's own pace (29 gaps of 125–375 ms,
/// 7.25 s on average, 0.39 s standard deviation) leaves it room: with 35
/// pages (8.5 s ± 0.42 s against 9.8 s at the server's pace) a server's
/// tail was its largest name running late on its own jitter in one run of
/// a few, whatever the order.
fn pages(index: usize) -> usize {
    5 + index * 25 / (NAMES - 1)
}

/// Each name: one lane, 250 ms apart with the default ±50 % jitter (4/s);
/// each server: two lanes, 25 ms apart, no jitter (40/s, half what its
/// twenty names ask).
fn paced_names_on_shared_servers() -> Registry {
    Registry::builder()
        .max_concurrency(1_000)
        .default_scope(
            ScopeConfig::default()
                .concurrency(1)
                .delay(ms(250))
                .delay_per_slot(Duration::ZERO),
        )
        .ip_scopes(
            ScopeConfig::default()
                .concurrency(2)
                .delay(ms(25))
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()
        .unwrap()
}

fn name(server: usize, name: usize) -> String {
    format!("n{name}.s{server}.example")
}

fn resolver() -> FixedResolver {
    let resolver = FixedResolver::new();
    for server in 0..SERVERS {
        for index in 0..NAMES {
            resolver.set(&name(server, index), [[10, 0, 0, server as u8]]);
        }
    }
    resolver
}

/// Every page, name by name (all of a name's pages, then the next name's),
/// each server's names in turn.
fn site_by_site() -> Vec<String> {
    let mut uris = Vec::new();
    for index in 0..NAMES {
        for server in 0..SERVERS {
            for page in 0..pages(index) {
                uris.push(format!("http://{}/{page}", name(server, index)));
            }
        }
    }
    uris
}

/// IpScope (with `resolver`) → Throttle → an in-process service that
/// answers at once and records each call; and the IP scope layer.
fn stack(
    registry: &Registry,
    resolver: impl tower_throttle::ip::Resolve,
    recorder: &Recorder,
) -> (
    IpScopeLayer,
    impl tower::Service<
            http::Request<()>,
            Response = http::Response<tower_throttle::throttle::ThrottledBody<()>>,
            Error = tower_throttle::Error,
            Future = impl Send,
        > + Unpin,
) {
    let ip_scopes = IpScopeLayer::builder(registry.clone())
        .resolver(resolver)
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(ip_scopes.clone())
        .layer(ThrottleLayer::new(registry.clone()))
        .service(recorder.service(Duration::ZERO));
    (ip_scopes, client)
}

/// Sends every page through a frontier (`in_flight(200)`) over
/// IpScope → Throttle → an in-process service that answers at once; with
/// `resolve_first`, the frontier resolves the names through the stack's
/// layer before ordering them.
async fn crawl(resolve_first: bool) -> (Vec<Sent>, Registry) {
    let registry = paced_names_on_shared_servers();
    let recorder = Recorder::new();
    let (ip_scopes, client) = stack(&registry, resolver(), &recorder);
    let mut builder = FrontierBuilder::new(registry.clone()).in_flight(200);
    if resolve_first {
        builder = builder.ip_scopes(ip_scopes);
    }
    let (mut frontier, pages) = builder.build(client).unwrap();
    for uri in site_by_site() {
        pages.push(get(&uri)).await.unwrap();
    }
    drop(pages);
    while let Some((_, response)) = frontier.next().await {
        response.unwrap();
    }
    (recorder.sent(), registry)
}

fn server_of(host: &str) -> String {
    host.split_once('.').unwrap().1.to_owned()
}

/// Each server's rate over the whole crawl: its requests after the first
/// over the time from its first send to its last.
fn server_rates(sent: &[Sent]) -> Vec<f64> {
    let mut rates: Vec<f64> = instants_by(sent, |one| server_of(&one.host))
        .values()
        .map(|instants| {
            let span = *instants.last().unwrap() - instants[0];
            (instants.len() - 1) as f64 / span.as_secs_f64()
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    rates
}

/// 200 names on 10 servers, fed name by name: every server gets at least
/// 95 % of its 40/s over the whole crawl, its tail included, and no limit
/// is broken (each name's sends at least the jitter's floor apart, each
/// server's at least 25 ms).
#[tokio::test(start_paused = true)]
async fn names_resolved_first_keep_every_server_at_its_allowance_to_the_end() {
    let (sent, registry) = crawl(true).await;
    assert_eq!(sent.len(), SERVERS * (0..NAMES).map(pages).sum::<usize>());
    for (name, instants) in instants_by(&sent, |one| one.host.clone()) {
        for gap in instants.windows(2) {
            assert!(gap[1] - gap[0] >= ms(125), "{name}: {gap:?} closer than 125 ms");
        }
    }
    for (server, instants) in instants_by(&sent, |one| server_of(&one.host)) {
        for gap in instants.windows(2) {
            assert!(gap[1] - gap[0] >= ms(25), "{server}: {gap:?} closer than 25 ms");
        }
    }
    let rates = server_rates(&sent);
    eprintln!("servers' rates over the whole crawl, names resolved first (of 40/s): {rates:.1?}");
    assert!(
        rates[0] >= 38.0,
        "a server got {:.1}/s of 40/s: {rates:.1?}",
        rates[0]
    );
    // The frontier sent only requests every scope admitted: none waited
    // in the throttle.
    let stats = registry.stats();
    assert_eq!((stats.in_flight, stats.waiting), (0, 0));
}

/// Without resolving first, the frontier sees only the names' scopes: it
/// sends every name's page as soon as the name may go, and the requests
/// wait for their server inside the throttle, in the order they came. The
/// figure is printed beside the test above's (not asserted: the order
/// inside the throttle is its own business).
#[tokio::test(start_paused = true)]
async fn without_resolving_first_the_servers_order_is_the_throttles() {
    let (sent, _) = crawl(false).await;
    assert_eq!(sent.len(), SERVERS * (0..NAMES).map(pages).sum::<usize>());
    let rates = server_rates(&sent);
    eprintln!("servers' rates over the whole crawl, names not resolved first (of 40/s): {rates:.1?}");
}

/// A lookup that takes 100 ms.
#[derive(Debug)]
struct Slow(FixedResolver);

impl tower_throttle::ip::Resolve for Slow {
    fn resolve(&self, host: &str) -> tower_throttle::ip::Lookup {
        let lookup = self.0.resolve(host);
        Box::pin(async move {
            tokio::time::sleep(ms(100)).await;
            lookup.await
        })
    }
}

/// A request whose name is being looked up waits for it in the frontier,
/// counted as pending; once the name is known it is queued with its
/// server's scope, and the server spaces the two names' requests (one
/// lane, 25 ms between sends: here, each name's only page).
#[tokio::test(start_paused = true)]
async fn a_request_waits_for_its_names_lookup_in_the_frontier_then_goes_with_its_servers_scope() {
    let registry = paced_names_on_shared_servers();
    let recorder = Recorder::new();
    let (ip_scopes, client) = stack(&registry, Slow(resolver()), &recorder);
    let (mut frontier, pages) = FrontierBuilder::new(registry.clone())
        .ip_scopes(ip_scopes)
        .build(client)
        .unwrap();
    for index in 0..3 {
        pages
            .push(get(&format!("http://{}/", name(0, index))))
            .await
            .unwrap();
    }
    assert_eq!(pages.pending(), 3, "all three wait for their lookups");
    drop(pages);
    let mut answered = 0;
    while let Some((_, response)) = frontier.next().await {
        response.unwrap();
        answered += 1;
    }
    assert_eq!(answered, 3);
    // The lookups end at 100 ms; the server (two lanes, 25 ms apart) then
    // sends one name's page at once and the others 25 ms after each other.
    let at: Vec<u128> = recorder.sent().iter().map(|one| one.at.as_millis()).collect();
    assert_eq!(at, [100, 125, 150]);
    assert_eq!(registry.scope_stats("ip:10.0.0.0").unwrap().sent, 3);
}

/// A name the resolver does not know: its lookup fails, its request is
/// queued as it is, and the stack's layer fails it (a DNS error) without
/// sending it; the other name's request goes.
#[tokio::test(start_paused = true)]
async fn a_request_whose_lookup_failed_fails_in_the_stack_and_is_never_sent() {
    let registry = paced_names_on_shared_servers();
    let recorder = Recorder::new();
    let (ip_scopes, client) = stack(&registry, resolver(), &recorder);
    let (mut frontier, pages) = FrontierBuilder::new(registry.clone())
        .ip_scopes(ip_scopes)
        .build(client)
        .unwrap();
    pages.push(get("http://unknown.example/")).await.unwrap();
    pages.push(get(&format!("http://{}/", name(0, 0)))).await.unwrap();
    drop(pages);
    let mut results = Vec::new();
    while let Some((uri, response)) = frontier.next().await {
        results.push((uri.host().unwrap().to_owned(), response.map(drop)));
    }
    results.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(results.len(), 2);
    assert!(results[0].1.is_ok(), "{results:?}");
    assert!(
        results[1].1.as_ref().is_err_and(tower_throttle::Error::is_dns),
        "{results:?}"
    );
    let sent: Vec<String> = recorder.sent().into_iter().map(|one| one.host).collect();
    assert_eq!(sent, [name(0, 0)]);
}
