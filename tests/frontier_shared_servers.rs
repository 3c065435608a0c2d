//! The frontier over names on shared servers: with `ip_scopes`, a request
//! is resolved before it is ordered, so the frontier orders it by its
//! server's scope too, and sends the names of one server so that they all
//! finish together: the server gets its whole allowance to the end of the
//! crawl, tail included, with paced names and the default ±50 % jitter.
//! Paused virtual time, an in-process inner service.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
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
    names_on_shared_servers(ms(250), ScopeConfig::default())
}

/// Names of one lane, `delay` apart (`names`' jitter), on servers of two
/// lanes 25 ms apart, no jitter.
fn names_on_shared_servers(delay: Duration, names: ScopeConfig) -> Registry {
    Registry::builder()
        .max_concurrency(1_000)
        .default_scope(names.concurrency(1).delay(delay).delay_per_slot(Duration::ZERO))
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

fn at_once(_: &http::Request<()>) -> Duration {
    Duration::ZERO
}

fn slow_pages_in_26_ms(request: &http::Request<()>) -> Duration {
    match request.uri().path().starts_with("/slow") {
        true => ms(26),
        false => Duration::ZERO,
    }
}

/// IpScope (with `resolver`) → Throttle → an in-process service that
/// answers after `latency_of` the request and records each call; and the
/// IP scope layer.
fn stack(
    registry: &Registry,
    resolver: impl tower_throttle::ip::Resolve,
    recorder: &Recorder,
    latency_of: fn(&http::Request<()>) -> Duration,
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
        .service(recorder.service_by(latency_of));
    (ip_scopes, client)
}

/// Sends every page through a frontier (`in_flight(200)`) over
/// IpScope → Throttle → an in-process service that answers at once; with
/// `resolve_first`, the frontier resolves the names through the stack's
/// layer before ordering them.
async fn crawl(resolve_first: bool) -> (Vec<Sent>, Registry) {
    let registry = paced_names_on_shared_servers();
    let recorder = Recorder::new();
    let (ip_scopes, client) = stack(&registry, resolver(), &recorder, at_once);
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

/// A real client stamps a departure a little after the admission (its
/// hand-over). A name that asks for its server's next send before the
/// stamp is told the admission's instant plus the server's gap; one that
/// asks after it, the departure's: 0.1 ms later here. Both have come by
/// the time the frontier looks (its budget was full), and the one with
/// the most pending still goes first: the two instants are one. On
/// loopback, a server's largest name lost a server gap on most of its
/// pages without it, and the lowest server fell to 91.7 % of its
/// allowance (`loadtest h`).
#[tokio::test(start_paused = true)]
async fn a_name_that_asks_after_the_departure_stamp_still_goes_first_by_its_pending() {
    let registry = names_on_shared_servers(ms(1_000), ScopeConfig::default().jitter(0.0));
    let recorder = Recorder::new();
    let (ip_scopes, client) = stack(&registry, resolver(), &recorder, slow_pages_in_26_ms);
    let client = LateFirstPoll {
        inner: client,
        hand_over: Duration::from_micros(100),
    };
    let (frontier, pages) = FrontierBuilder::new(registry.clone())
        .in_flight(3)
        .ip_scopes(ip_scopes)
        .build(client)
        .unwrap();
    let push = |host: String, path: &'static str, count: usize| {
        let pages = pages.clone();
        async move {
            for page in 0..count {
                pages
                    .push(get(&format!("http://{host}{path}{page}")))
                    .await
                    .unwrap();
            }
        }
    };
    let (first, asks_before, other_server) = (name(0, 0), name(0, 1), name(1, 0));
    let (asks_after, third_server) = (name(0, 2), name(2, 0));
    let crawl = tokio::spawn(frontier.for_each(|(_, response)| {
        response.unwrap();
        std::future::ready(())
    }));
    // Server 0 answers once first (its gaps then run from its departures).
    push(name(0, 9), "/", 1).await;
    tokio::time::sleep(ms(30)).await;
    // At 30 ms: `first` goes on server 0 (answered at about 56 ms);
    // `asks_before` (2 pending) asks in the same pass, before the departure
    // is stamped; `other_server` takes a second slot.
    push(first.clone(), "/slow", 4).await;
    push(asks_before.clone(), "/", 2).await;
    push(other_server, "/slow", 1).await;
    // At 40 ms: `asks_after` (5 pending) asks, after the stamp; a request
    // of a third server fills the budget until `first` is answered.
    tokio::time::sleep(ms(10)).await;
    push(asks_after.clone(), "/", 5).await;
    push(third_server, "/slow", 1).await;
    drop(pages);
    crawl.await.unwrap();
    let on_server_0: Vec<Sent> = recorder
        .sent()
        .into_iter()
        .filter(|one| server_of(&one.host) == "s0.example")
        .collect();
    assert_eq!(on_server_0[1].host, first);
    assert_eq!(
        (on_server_0[2].host.as_str(), on_server_0[3].host.as_str()),
        (asks_after.as_str(), asks_before.as_str()),
        "server 0's next send goes to the name with more pending: {on_server_0:?}"
    );
    // `first` was its name's first request, which opens a connection of
    // its own: the server's next gap runs from its answer (26 ms after it
    // left, as the throttle saw it end), not from its departure. The next
    // send comes once that gap is over: 83.4 ms here, 2.3 ms after its
    // earliest instant, since the frontier looks again at the instant it
    // forecast, not when the answer comes.
    let first_answered = on_server_0[1].at + ms(26);
    assert!(
        on_server_0[2].at >= first_answered + ms(25) && on_server_0[2].at < first_answered + ms(28),
        "{on_server_0:?}"
    );
}

/// Pages under `/slow` take 100 ms; the others are answered at once.
fn slow_pages_in_100_ms(request: &http::Request<()>) -> Duration {
    match request.uri().path().starts_with("/slow") {
        true => ms(100),
        false => Duration::ZERO,
    }
}

/// A name's first request on a server opens a connection of its own, so
/// the server's next gap runs from its answer. Here the server is new (no
/// latency known) and the answer takes 100 ms: the server's other name
/// waits for it in the frontier, not in the throttle, and the frontier's
/// second slot goes meanwhile to another server's page, at once. Before,
/// the prediction said *now* once the gap from the send was over (25 ms):
/// the frontier handed the other name over, it waited 100 ms in the
/// throttle for the answer, and the other server's page waited for a slot
/// until 100 ms.
#[tokio::test(start_paused = true)]
async fn a_servers_other_names_wait_for_its_first_answer_in_the_frontier_not_in_a_slot() {
    let registry = names_on_shared_servers(ms(1_000), ScopeConfig::default().jitter(0.0));
    let recorder = Recorder::new();
    let (ip_scopes, client) = stack(&registry, resolver(), &recorder, slow_pages_in_100_ms);
    let (frontier, pages) = FrontierBuilder::new(registry.clone())
        .in_flight(2)
        .ip_scopes(ip_scopes)
        .build(client)
        .unwrap();
    let crawl = tokio::spawn(frontier.for_each(|(uri, response)| {
        let response = response.unwrap();
        let waited = response.extensions().get::<tower_throttle::Waited>();
        assert!(waited.is_none(), "{uri} waited in the throttle: {waited:?}");
        std::future::ready(())
    }));
    let (opens, other_name, other_server) = (name(0, 0), name(0, 1), name(1, 0));
    pages.push(get(&format!("http://{opens}/slow"))).await.unwrap();
    pages.push(get(&format!("http://{other_name}/"))).await.unwrap();
    tokio::time::sleep(ms(30)).await;
    pages.push(get(&format!("http://{other_server}/"))).await.unwrap();
    drop(pages);
    crawl.await.unwrap();
    let sent = recorder.sent();
    let at = |host: &str| sent.iter().find(|one| one.host == host).unwrap().at - sent[0].at;
    assert_eq!(
        (at(&opens), at(&other_server), at(&other_name)),
        (ms(0), ms(30), ms(125)),
        "{sent:?}"
    );
}

/// Polls the stack's future for the first time `hand_over` after the call
/// (the clock moved on by as much, as a real client's work moves it): the
/// departure is stamped then.
struct LateFirstPoll<S> {
    inner: S,
    hand_over: Duration,
}

type Answer<S> = Result<
    <S as tower::Service<http::Request<()>>>::Response,
    <S as tower::Service<http::Request<()>>>::Error,
>;

impl<S> tower::Service<http::Request<()>> for LateFirstPoll<S>
where
    S: tower::Service<http::Request<()>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Answer<S>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<()>) -> Self::Future {
        let future = self.inner.call(request);
        let hand_over = self.hand_over;
        Box::pin(async move {
            tokio::time::advance(hand_over).await;
            future.await
        })
    }
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
    let (ip_scopes, client) = stack(&registry, Slow(resolver()), &recorder, at_once);
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
    let (ip_scopes, client) = stack(&registry, resolver(), &recorder, at_once);
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
