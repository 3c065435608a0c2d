//! Scheduling behaviour of `Throttle`, in paused virtual time with an
//! in-process inner service, so every instant asserted is exact.

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::join_all;
use futures::FutureExt;
use std::future::Future;
use support::{at_head, get, Recorder};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::throttle::ThrottledBody;
use tower_throttle::{Priority, Registry, ScopeConfig, Scopes, Throttle, ThrottleLayer};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// A scope config without jitter, so instants are exact.
fn exact(concurrency: u32, delay: Duration, per_slot: Duration) -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(concurrency)
        .delay(delay)
        .delay_per_slot(per_slot)
        .jitter(0.0)
}

fn registry_with(default: ScopeConfig) -> Registry {
    Registry::builder().default_scope(default).build().unwrap()
}

/// Calls the service for each request in order (so arrival order is the
/// order given) and spawns the response futures.
async fn launch<S, B>(
    service: &mut S,
    requests: Vec<http::Request<()>>,
) -> Vec<JoinHandle<Result<http::Response<B>, S::Error>>>
where
    S: Service<http::Request<()>, Response = http::Response<ThrottledBody<B>>>,
    S::Future: Send + 'static,
    B: Send + 'static,
    S::Error: Send + std::fmt::Debug + 'static,
{
    let mut handles = Vec::new();
    for request in requests {
        service.ready().await.unwrap();
        handles.push(tokio::spawn(at_head(service.call(request))));
    }
    handles
}

async fn finish_all<T>(handles: Vec<JoinHandle<T>>) {
    for result in join_all(handles).await {
        result.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn seeds_worked_example_sends_at_0_then_300_then_1000_ms() {
    let registry = registry_with(exact(2, ms(300), ms(1000)));
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry).layer(recorder.service(Duration::ZERO));
    let requests = (1..=3)
        .map(|i| get(&format!("https://example.com/{i}")))
        .collect();
    finish_all(launch(&mut service, requests).await).await;
    assert_eq!(recorder.millis(), vec![0, 300, 1000]);
}

#[tokio::test(start_paused = true)]
async fn per_slot_delay_counts_from_the_previous_send_on_that_lane() {
    // One lane, responses take 700 ms: the next send waits for the lane
    // (700 ms), then for the per-slot delay (1000 ms after the first send).
    let registry = registry_with(exact(1, Duration::ZERO, ms(1000)));
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry).layer(recorder.service(ms(700)));
    let requests = (1..=3)
        .map(|i| get(&format!("https://example.com/{i}")))
        .collect();
    finish_all(launch(&mut service, requests).await).await;
    assert_eq!(recorder.millis(), vec![0, 1000, 2000]);
}

#[tokio::test(start_paused = true)]
async fn a_lane_stays_busy_until_the_response_arrives() {
    let registry = registry_with(exact(1, ms(100), Duration::ZERO));
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry).layer(recorder.service(ms(2500)));
    let requests = (1..=3)
        .map(|i| get(&format!("https://example.com/{i}")))
        .collect();
    finish_all(launch(&mut service, requests).await).await;
    // The first answer (at 2.5 s) ends the scope's cold start, so the
    // second send also waits the 100 ms delay after it; the third waits
    // only for the lane, its delay having long passed.
    assert_eq!(recorder.millis(), vec![0, 2600, 5100]);
}

/// An inner service that answers after a random latency and tracks, per
/// scope, the most requests it ever saw in flight at once.
#[derive(Clone)]
struct InFlightTracker {
    counts: Arc<Mutex<HashMap<String, (u32, u32)>>>,
    rng: Arc<Mutex<fastrand::Rng>>,
    sends: Arc<Mutex<Vec<(String, Instant)>>>,
    max_latency_ms: u64,
    /// Where the scopes of each request are read, as an inner layer does.
    registry: Registry,
}

impl InFlightTracker {
    fn new(registry: &Registry, seed: u64, max_latency_ms: u64) -> Self {
        InFlightTracker {
            registry: registry.clone(),
            counts: Arc::default(),
            rng: Arc::new(Mutex::new(fastrand::Rng::with_seed(seed))),
            sends: Arc::default(),
            max_latency_ms,
        }
    }

    fn peak(&self, scope: &str) -> u32 {
        self.counts.lock().unwrap().get(scope).map_or(0, |c| c.1)
    }

    fn sends_of(&self, scope: &str) -> Vec<Instant> {
        let sends = self.sends.lock().unwrap();
        sends
            .iter()
            .filter(|(s, _)| s == scope)
            .map(|(_, at)| *at)
            .collect()
    }
}

impl Service<http::Request<()>> for InFlightTracker {
    type Response = http::Response<()>;
    type Error = Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<()>) -> Self::Future {
        // The scopes the throttle is handing over with the request.
        let scopes: Vec<String> = self
            .registry
            .scopes_of(&request)
            .iter()
            .map(|(scope, _)| scope.to_string())
            .collect();
        let now = Instant::now();
        {
            let mut counts = self.counts.lock().unwrap();
            let mut sends = self.sends.lock().unwrap();
            for scope in &scopes {
                let entry = counts.entry(scope.clone()).or_default();
                entry.0 += 1;
                entry.1 = entry.1.max(entry.0);
                sends.push((scope.clone(), now));
            }
        }
        let latency = ms(self.rng.lock().unwrap().u64(0..=self.max_latency_ms));
        let counts = self.counts.clone();
        Box::pin(async move {
            tokio::time::sleep(latency).await;
            let mut counts = counts.lock().unwrap();
            for scope in &scopes {
                counts.get_mut(scope).unwrap().0 -= 1;
            }
            Ok(http::Response::new(()))
        })
    }
}

#[tokio::test(start_paused = true)]
async fn no_two_sends_of_a_scope_are_closer_than_its_delay_over_random_arrivals() {
    let registry = Registry::builder()
        .default_scope(exact(3, ms(100), Duration::ZERO))
        .max_concurrency(8)
        .build()
        .unwrap();
    let tracker = InFlightTracker::new(&registry, 1, 400);
    let mut service = ThrottleLayer::new(registry.clone()).layer(tracker.clone());
    let mut rng = fastrand::Rng::with_seed(42);
    let hosts = ["a.example", "b.example", "c.example", "d.example"];
    let mut handles = Vec::new();
    for i in 0..3000 {
        tokio::time::sleep(ms(rng.u64(0..40))).await;
        let host = hosts[rng.usize(..hosts.len())];
        service.ready().await.unwrap();
        handles.push(tokio::spawn(at_head(
            service.call(get(&format!("https://{host}/{i}"))),
        )));
    }
    finish_all(handles).await;
    let mut total = 0;
    for host in hosts {
        let sends = tracker.sends_of(host);
        total += sends.len();
        for pair in sends.windows(2) {
            assert!(
                pair[1] - pair[0] >= ms(100),
                "{host}: sends {:?} apart",
                pair[1] - pair[0]
            );
        }
        assert!(tracker.peak(host) <= 3);
    }
    assert_eq!(total, 3000);
    let stats = registry.stats();
    assert_eq!((stats.in_flight, stats.waiting), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn toscrape_parent_and_subdomain_limits_hold_together_without_deadlock() {
    // The seeds' example: toscrape.com 32 lanes, books 24, quotes 16;
    // books and quotes requests also count against toscrape.com.
    let registry = Registry::builder()
        .max_concurrency(64)
        .default_scope(exact(1, Duration::ZERO, Duration::ZERO))
        .scope("toscrape.com", exact(32, Duration::ZERO, Duration::ZERO))
        .scope("books.toscrape.com", exact(24, Duration::ZERO, Duration::ZERO))
        .scope("quotes.toscrape.com", exact(16, Duration::ZERO, Duration::ZERO))
        .build()
        .unwrap();
    let tracker = InFlightTracker::new(&registry, 7, 50);
    let mut service = ThrottleLayer::new(registry.clone()).layer(tracker.clone());
    let mut rng = fastrand::Rng::with_seed(3);
    let mut requests = Vec::new();
    for i in 0..900 {
        let mut request = get(&format!("https://toscrape.com/{i}"));
        let scopes = match rng.u8(0..3) {
            0 => Scopes::from(["books.toscrape.com", "toscrape.com"]),
            1 => Scopes::from(["quotes.toscrape.com", "toscrape.com"]),
            _ => Scopes::from(["toscrape.com"]),
        };
        request.extensions_mut().insert(scopes);
        requests.push(request);
    }
    let handles = launch(&mut service, requests).await;
    tokio::time::timeout(Duration::from_secs(3600), finish_all(handles))
        .await
        .expect("every request completes: no deadlock");
    assert_eq!(
        tracker.peak("toscrape.com"),
        32,
        "the parent limit is reached and held"
    );
    assert!(tracker.peak("books.toscrape.com") <= 24);
    assert!(tracker.peak("quotes.toscrape.com") <= 16);
    assert!(tracker.peak("books.toscrape.com") >= 8, "books did get lanes");
    let stats = registry.stats();
    assert_eq!((stats.in_flight, stats.waiting), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_slow_scope_never_delays_another_scope() {
    let registry = Registry::builder()
        .default_scope(exact(1, Duration::ZERO, Duration::ZERO))
        .scope("slow.example", exact(1, Duration::from_secs(10), Duration::ZERO))
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry).layer(recorder.service(Duration::ZERO));
    let mut requests: Vec<_> = (0..4)
        .map(|i| get(&format!("https://slow.example/slow{i}")))
        .collect();
    requests.extend((0..3).map(|i| get(&format!("https://fast.example/fast{i}"))));
    finish_all(launch(&mut service, requests).await).await;
    assert_eq!(recorder.millis_of("/fast"), vec![0, 0, 0]);
    assert_eq!(recorder.millis_of("/slow"), vec![0, 10_000, 20_000, 30_000]);
}

#[tokio::test(start_paused = true)]
async fn global_max_concurrency_is_counted_at_send_over_all_scopes() {
    let registry = Registry::builder()
        .max_concurrency(2)
        .default_scope(exact(4, Duration::ZERO, Duration::ZERO))
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry).layer(recorder.service(Duration::from_secs(1)));
    let requests = (0..6)
        .map(|i| get(&format!("https://site{}.example/{i}", i % 3)))
        .collect();
    finish_all(launch(&mut service, requests).await).await;
    assert_eq!(recorder.millis(), vec![0, 0, 1000, 1000, 2000, 2000]);
    // Arrival order is kept across scopes for the global permits.
    let paths: Vec<_> = recorder.sent().iter().map(|s| s.path.clone()).collect();
    assert_eq!(paths, vec!["/0", "/1", "/2", "/3", "/4", "/5"]);
}

#[tokio::test(start_paused = true)]
async fn higher_priority_waiters_go_first_and_equals_keep_arrival_order() {
    let registry = registry_with(exact(1, Duration::from_secs(1), Duration::ZERO));
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry).layer(recorder.service(Duration::ZERO));
    let mut requests = Vec::new();
    for (path, priority) in [("/first", 0), ("/low", -1), ("/a", 5), ("/b", 5), ("/normal", 0)] {
        let mut request = get(&format!("https://example.com{path}"));
        request.extensions_mut().insert(Priority(priority));
        requests.push(request);
    }
    finish_all(launch(&mut service, requests).await).await;
    let order: Vec<_> = recorder.sent().iter().map(|s| s.path.clone()).collect();
    assert_eq!(order, vec!["/first", "/a", "/b", "/normal", "/low"]);
    assert_eq!(recorder.millis(), vec![0, 1000, 2000, 3000, 4000]);
}

#[tokio::test(start_paused = true)]
async fn replacing_a_scope_config_at_runtime_lets_waiters_reevaluate_at_once() {
    let registry = registry_with(exact(1, Duration::from_secs(10), Duration::ZERO));
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
    let requests = (0..3).map(|i| get(&format!("https://example.com/{i}"))).collect();
    let handles = launch(&mut service, requests).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    registry
        .set_scope("example.com", exact(1, Duration::from_secs(2), Duration::ZERO))
        .unwrap();
    finish_all(handles).await;
    // The first waiter's 10 s gap became 2 s; it went as soon as that passed.
    assert_eq!(recorder.millis(), vec![0, 2000, 4000]);
    let err = registry
        .set_scope("example.com", ScopeConfig::default().concurrency(0))
        .unwrap_err();
    assert_eq!(err.field(), "scope \"example.com\" concurrency");
}

#[tokio::test(start_paused = true)]
async fn a_hold_pauses_only_its_scope_until_it_ends() {
    let registry = registry_with(exact(1, Duration::ZERO, Duration::ZERO));
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
    registry.hold("held.example", Duration::from_secs(30));
    assert_eq!(
        registry.scope_stats("held.example").unwrap().held_for,
        Some(Duration::from_secs(30))
    );
    let requests = vec![get("https://held.example/held"), get("https://free.example/free")];
    finish_all(launch(&mut service, requests).await).await;
    assert_eq!(recorder.millis_of("/free"), vec![0]);
    assert_eq!(recorder.millis_of("/held"), vec![30_000]);
    // A shorter hold does not shorten a longer one.
    registry.hold("held.example", Duration::from_secs(60));
    registry.hold("held.example", Duration::from_secs(5));
    assert_eq!(
        registry.scope_stats("held.example").unwrap().held_for,
        Some(Duration::from_secs(60))
    );
}

#[tokio::test(start_paused = true)]
async fn jitter_stays_within_bounds_and_keeps_the_mean_gap_at_the_delay() {
    let registry = Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .concurrency(1)
                .delay(ms(100))
                .delay_per_slot(Duration::ZERO)
                .jitter(0.5),
        )
        .jitter_seed(11)
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry).layer(recorder.service(Duration::ZERO));
    let requests = (0..10_000)
        .map(|i| get(&format!("https://example.com/{i}")))
        .collect();
    finish_all(launch(&mut service, requests).await).await;
    let sends: Vec<Duration> = recorder.sent().iter().map(|s| s.at).collect();
    let gaps: Vec<Duration> = sends.windows(2).map(|w| w[1] - w[0]).collect();
    // Timers have millisecond resolution: a gap may end up to 1 ms late.
    assert!(
        gaps.iter().all(|gap| *gap >= ms(50) && *gap <= ms(151)),
        "a gap outside [50, 151] ms"
    );
    let mean = gaps.iter().sum::<Duration>().as_secs_f64() / gaps.len() as f64;
    assert!(
        (mean - 0.1).abs() <= 0.002,
        "mean gap {mean} s is not within 2 % of 100 ms"
    );
}

#[tokio::test(start_paused = true)]
async fn poll_ready_is_pending_at_max_queued_and_wakes_when_a_place_frees() {
    let registry = Registry::builder()
        .max_queued(2)
        .default_scope(exact(1, Duration::from_secs(10), Duration::ZERO))
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry).layer(recorder.service(Duration::ZERO));
    // The first request is sent at once and frees its place; the next two
    // wait and keep theirs.
    let handles = launch(
        &mut service,
        (0..3).map(|i| get(&format!("https://example.com/{i}"))).collect(),
    )
    .await;
    let mut third_waiter = service.clone();
    assert!(third_waiter.ready().now_or_never().is_none(), "queue is full");
    let start = Instant::now();
    let ready_at = tokio::spawn(async move {
        third_waiter.ready().await.unwrap();
        Instant::now()
    });
    // At 10 s the second request is sent, which frees a place.
    assert_eq!(ready_at.await.unwrap() - start, Duration::from_secs(10));
    finish_all(handles).await;
}

#[tokio::test(start_paused = true)]
async fn dropping_a_waiter_that_keeps_the_scope_timer_hands_the_timer_on() {
    let registry = registry_with(exact(1, Duration::from_secs(1), Duration::ZERO));
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
    let mut handles = launch(
        &mut service,
        (0..3).map(|i| get(&format!("https://example.com/{i}"))).collect(),
    )
    .await;
    tokio::time::sleep(ms(500)).await;
    // /1 waits on the scope delay and keeps the scope's timer; /2 is behind.
    handles.remove(1).abort();
    finish_all(handles).await;
    assert_eq!(recorder.millis(), vec![0, 1000]);
    assert_eq!(recorder.sent()[1].path, "/2");
    let stats = registry.scope_stats("example.com").unwrap();
    assert_eq!((stats.in_flight, stats.queued, stats.sent), (0, 0, 2));
}

#[tokio::test(start_paused = true)]
async fn dropping_a_queued_waiter_behind_the_head_leaks_nothing() {
    let registry = Registry::builder()
        .max_queued(3)
        .default_scope(exact(1, Duration::from_secs(1), Duration::ZERO))
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
    let mut handles = launch(
        &mut service,
        (0..4).map(|i| get(&format!("https://example.com/{i}"))).collect(),
    )
    .await;
    handles.remove(2).abort();
    tokio::task::yield_now().await;
    // The dropped waiter's queue place is back: two more fit.
    let more = launch(
        &mut service,
        (4..6).map(|i| get(&format!("https://example.com/{i}"))).collect(),
    )
    .await;
    handles.extend(more);
    finish_all(handles).await;
    let paths: Vec<_> = recorder.sent().iter().map(|s| s.path.clone()).collect();
    assert_eq!(paths, vec!["/0", "/1", "/3", "/4", "/5"]);
    assert_eq!(recorder.millis(), vec![0, 1000, 2000, 3000, 4000]);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_waiter_blocked_on_a_busy_lane_then_the_request_in_flight_frees_the_lane() {
    let registry = registry_with(exact(1, Duration::ZERO, Duration::ZERO));
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::from_secs(60)));
    let mut handles = launch(
        &mut service,
        (0..3).map(|i| get(&format!("https://example.com/{i}"))).collect(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    handles.remove(1).abort(); // waiting on the lane
    tokio::time::sleep(Duration::from_secs(1)).await;
    handles.remove(0).abort(); // in flight
    finish_all(handles).await;
    assert_eq!(recorder.millis(), vec![0, 2000]);
    assert_eq!(recorder.sent()[1].path, "/2");
    let stats = registry.stats();
    assert_eq!((stats.in_flight, stats.waiting), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_multi_scope_request_is_not_starved_by_single_scope_traffic() {
    // `both` needs scopes a and b. Each has a steady stream of its own
    // requests (a's take 1 s, b's 1.5 s), so the two are never free at the
    // same instant. The streams may pass `both` while it waits (no
    // head-of-line blocking), but only a bounded number of times; then it
    // keeps its place and goes once both scopes are free.
    let registry = registry_with(exact(1, Duration::ZERO, Duration::ZERO));
    let sent: Arc<Mutex<Vec<(String, Duration)>>> = Arc::default();
    let start = Instant::now();
    let log = sent.clone();
    let inner = tower::service_fn(move |request: http::Request<()>| {
        let path = request.uri().path().to_owned();
        log.lock().unwrap().push((path.clone(), start.elapsed()));
        let latency = if path.starts_with("/b") {
            ms(1500)
        } else {
            ms(1000)
        };
        async move {
            tokio::time::sleep(latency).await;
            Ok::<_, Infallible>(http::Response::new(()))
        }
    });
    let mut service = ThrottleLayer::new(registry).layer(inner);
    let with_scopes = |path: &str, scopes: Scopes| {
        let mut request = get(&format!("https://x.example{path}"));
        request.extensions_mut().insert(scopes);
        request
    };
    let mut requests = vec![
        with_scopes("/a0", Scopes::from("a")),
        with_scopes("/b0", Scopes::from("b")),
        with_scopes("/both", Scopes::from(["a", "b"])),
    ];
    for i in 1..=40 {
        requests.push(with_scopes(&format!("/a{i}"), Scopes::from("a")));
        requests.push(with_scopes(&format!("/b{i}"), Scopes::from("b")));
    }
    finish_all(launch(&mut service, requests).await).await;
    let sent = sent.lock().unwrap();
    let both_at = sent.iter().find(|(path, _)| path == "/both").unwrap().1;
    let passed_before = sent.iter().filter(|(_, at)| *at < both_at).count();
    assert!(
        passed_before > 2,
        "single-scope traffic passed the waiting request"
    );
    // Without the bound it would wait for both streams to end (about 61 s).
    assert!(
        both_at <= Duration::from_secs(15),
        "the multi-scope request went at {both_at:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn fixed_scope_poll_ready_waits_for_admission_and_call_sends_at_once() {
    let registry = registry_with(exact(1, Duration::from_secs(2), Duration::ZERO));
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone())
        .fixed_scope("api")
        .layer(recorder.service(Duration::ZERO));
    let start = Instant::now();
    for i in 0..3 {
        service.ready().await.unwrap();
        let ready_at = start.elapsed();
        // The future is already in flight: it resolves without waiting.
        let response = service.call(get(&format!("https://anything.example/{i}")));
        response.await.unwrap();
        assert_eq!(ready_at, Duration::from_secs(2 * i));
    }
    assert_eq!(recorder.millis(), vec![0, 2000, 4000]);
    assert_eq!(registry.scope_stats("api").unwrap().sent, 3);
    assert!(registry.scope_stats("anything.example").is_none());
}

#[tokio::test(start_paused = true)]
async fn dropping_a_fixed_scope_service_after_poll_ready_releases_its_admission() {
    let registry = registry_with(exact(1, Duration::ZERO, Duration::ZERO));
    let recorder = Recorder::new();
    let mut service: Throttle<_> = ThrottleLayer::new(registry.clone())
        .fixed_scope("api")
        .layer(recorder.service(Duration::ZERO));
    service.ready().await.unwrap();
    assert_eq!(registry.scope_stats("api").unwrap().in_flight, 1);
    drop(service);
    assert_eq!(registry.scope_stats("api").unwrap().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn throttle_records_the_resolved_scopes_in_the_extensions_when_asked() {
    let registry = Registry::default();
    let seen: Arc<Mutex<Option<Scopes>>> = Arc::default();
    let seen_inner = seen.clone();
    let inner = tower::service_fn(move |request: http::Request<()>| {
        *seen_inner.lock().unwrap() = request.extensions().get::<Scopes>().cloned();
        async { Ok::<_, Infallible>(http::Response::new(())) }
    });
    let service = ThrottleLayer::new(registry).record_scopes(true).layer(inner);
    service
        .oneshot(get("https://Books.ToScrape.com:8080/x"))
        .await
        .unwrap();
    assert_eq!(*seen.lock().unwrap(), Some(Scopes::from("books.toscrape.com")));
}

#[tokio::test(start_paused = true)]
async fn registry_defaults_and_errors_name_the_field() {
    let err = Registry::builder().max_concurrency(0).build().unwrap_err();
    assert_eq!(err.to_string(), "invalid max_concurrency = 0: must be at least 1");
    let err = Registry::builder().max_queued(0).build().unwrap_err();
    assert_eq!(err.field(), "max_queued");
    let err = Registry::builder()
        .default_scope(ScopeConfig::default().jitter(f64::NAN))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "default scope jitter");
    let registry = Registry::default();
    assert_eq!(registry.stats().max_concurrency, 16);
}

#[tokio::test(start_paused = true)]
async fn jitter_never_shortens_a_gap_below_the_robots_crawl_delay() {
    let registry = Registry::builder()
        .default_scope(ScopeConfig::default().delay_per_slot(Duration::ZERO).jitter(0.5))
        .jitter_seed(3)
        .build()
        .unwrap();
    registry.set_robots_delay("example.com", Some(Duration::from_secs(3)));
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
    let requests = (0..50)
        .map(|i| get(&format!("https://example.com/{i}")))
        .collect();
    finish_all(launch(&mut service, requests).await).await;
    let sends: Vec<Duration> = recorder.sent().iter().map(|s| s.at).collect();
    let gaps: Vec<Duration> = sends.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.iter().all(|gap| *gap >= ms(3000) && *gap <= ms(4501)),
        "{gaps:?}"
    );
    assert!(
        gaps.iter().any(|gap| *gap > ms(3000)),
        "jitter still lengthens gaps"
    );
}

#[tokio::test(start_paused = true)]
async fn robots_yields_only_to_the_limits_a_scope_config_sets() {
    let registry = Registry::builder()
        .scope("lanes.example", ScopeConfig::default().concurrency(2))
        .scope("paced.example", ScopeConfig::default().delay(ms(500)))
        .build()
        .unwrap();
    for scope in ["lanes.example", "paced.example", "default.example"] {
        registry.set_robots_delay(scope, Some(Duration::from_secs(3)));
    }
    let lanes = registry.scope_stats("lanes.example").unwrap();
    assert_eq!(
        (lanes.concurrency, lanes.concurrency_limited_by),
        (2, tower_throttle::registry::LimitSource::Config)
    );
    assert_eq!(
        (lanes.delay, lanes.delay_limited_by),
        (
            Duration::from_secs(3),
            tower_throttle::registry::LimitSource::Robots
        )
    );
    assert!(lanes.robots_delay_applies);
    let paced = registry.scope_stats("paced.example").unwrap();
    assert_eq!(
        (paced.delay, paced.delay_limited_by),
        (ms(500), tower_throttle::registry::LimitSource::Config)
    );
    assert_eq!(paced.concurrency, 1);
    let default = registry.scope_stats("default.example").unwrap();
    assert_eq!(
        (default.delay, default.delay_limited_by),
        (
            Duration::from_secs(3),
            tower_throttle::registry::LimitSource::Robots
        )
    );
}

/// Without the extension (the default), an inner layer's `call` learns the
/// scopes the throttle decided through `Registry::scopes_of`, even when
/// the resolver would say otherwise (a fixed scope), whether the request
/// was sent at once or waited; outside that call nothing is handed over.
#[tokio::test(start_paused = true)]
async fn inner_layers_learn_the_throttles_scopes_during_its_call_without_an_extension() {
    let registry = registry_with(exact(1, ms(100), Duration::ZERO));
    let seen: Arc<Mutex<Vec<(Scopes, bool)>>> = Arc::default();
    let (seen_inner, inner_registry) = (seen.clone(), registry.clone());
    let inner = tower::service_fn(move |request: http::Request<()>| {
        let has_extension = request.extensions().get::<Scopes>().is_some();
        seen_inner
            .lock()
            .unwrap()
            .push((inner_registry.scopes_of(&request), has_extension));
        async { Ok::<_, Infallible>(http::Response::new(())) }
    });
    let mut service = ThrottleLayer::new(registry.clone())
        .fixed_scope("api")
        .layer(inner);
    let requests = (0..2).map(|i| get(&format!("https://example.com/{i}"))).collect();
    finish_all(launch(&mut service, requests).await).await;
    let api = (Scopes::from("api"), false);
    assert_eq!(*seen.lock().unwrap(), vec![api.clone(), api]);
    assert_eq!(
        registry.scopes_of(&get("https://example.com/")),
        Scopes::from("example.com"),
        "outside the throttle's call, the resolver answers"
    );
}

#[tokio::test(start_paused = true)]
async fn without_recorded_scopes_inner_layers_resolve_the_same_scopes_themselves() {
    let registry = registry_with(exact(1, Duration::ZERO, Duration::ZERO));
    let seen: Arc<Mutex<Option<Scopes>>> = Arc::default();
    let seen_inner = seen.clone();
    let inner = tower::service_fn(move |request: http::Request<()>| {
        *seen_inner.lock().unwrap() = request.extensions().get::<Scopes>().cloned();
        async {
            let response = http::Response::builder().status(429).body(()).unwrap();
            Ok::<_, Infallible>(response)
        }
    });
    let service = tower::ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()).record_scopes(false))
        .layer(tower_throttle::BackoffLayer::new(registry.clone()))
        .service(inner);
    service.oneshot(get("https://example.com/")).await.unwrap();
    assert_eq!(*seen.lock().unwrap(), None, "nothing inserted");
    assert_eq!(
        registry.scope_stats("example.com").unwrap().backoff_level,
        1,
        "backoff found the scope"
    );
}

#[tokio::test(start_paused = true)]
async fn host_and_parents_resolver_applies_the_toscrape_limits_by_itself() {
    let registry = Registry::builder()
        .resolver(tower_throttle::scope::HostAndParentsResolver)
        .max_concurrency(64)
        .default_scope(exact(1, Duration::ZERO, Duration::ZERO))
        .scope("toscrape.com", exact(32, Duration::ZERO, Duration::ZERO))
        .scope("books.toscrape.com", exact(24, Duration::ZERO, Duration::ZERO))
        .scope("quotes.toscrape.com", exact(16, Duration::ZERO, Duration::ZERO))
        .build()
        .unwrap();
    let tracker = InFlightTracker::new(&registry, 11, 50);
    let mut service = ThrottleLayer::new(registry.clone()).layer(tracker.clone());
    let hosts = ["books.toscrape.com", "quotes.toscrape.com", "toscrape.com"];
    let requests = (0..600)
        .map(|i| get(&format!("https://{}/{i}", hosts[i % 3])))
        .collect();
    let handles = launch(&mut service, requests).await;
    tokio::time::timeout(Duration::from_secs(3600), finish_all(handles))
        .await
        .expect("no deadlock");
    assert_eq!(tracker.peak("toscrape.com"), 32);
    assert!(tracker.peak("books.toscrape.com") <= 24);
    assert!(tracker.peak("quotes.toscrape.com") <= 16);
    assert_eq!(registry.scope_stats("books.toscrape.com").unwrap().sent, 200);
    assert_eq!(registry.scope_stats("toscrape.com").unwrap().sent, 600);
}

#[tokio::test(start_paused = true)]
async fn a_freed_queue_place_reaches_a_live_waiter_when_the_first_one_gave_up() {
    let registry = Registry::builder()
        .max_queued(1)
        .default_scope(exact(1, Duration::from_secs(10), Duration::ZERO))
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry).layer(recorder.service(Duration::ZERO));
    // /0 goes at once; /1 waits for the delay and holds the only place.
    let handles = launch(
        &mut service,
        vec![get("https://example.com/0"), get("https://example.com/1")],
    )
    .await;
    let mut stays = service.clone();
    let start = Instant::now();
    let stayer = tokio::spawn(async move {
        stays.ready().await.unwrap();
        Instant::now()
    });
    tokio::task::yield_now().await;
    let mut gives_up = service.clone();
    let quitter = tokio::spawn(async move {
        gives_up.ready().await.unwrap();
    });
    tokio::task::yield_now().await;
    quitter.abort();
    // At 10 s /1 is sent and frees the place: the remaining waiter gets it.
    let ready_at = tokio::time::timeout(Duration::from_secs(60), stayer)
        .await
        .expect("the freed place was not lost")
        .unwrap();
    assert_eq!(ready_at - start, Duration::from_secs(10));
    finish_all(handles).await;
}

/// Scope `slow.example` has a 10 s delay; every other scope has none.
fn slow_and_fast_registry() -> Registry {
    Registry::builder()
        .default_scope(exact(1, Duration::ZERO, Duration::ZERO))
        .scope("slow.example", exact(1, Duration::from_secs(10), Duration::ZERO))
        .build()
        .unwrap()
}

/// Sends two requests of the slow scope, then two of a fast one, through
/// `ThrottleLayer` over `inner` (an inner service with a limit of one).
/// The second slow request waits 10 s for its scope; it must not keep the
/// inner service's only permit meanwhile, so the fast ones go at once.
async fn slow_waiter_leaves_the_inner_service_to_others<S, B>(inner: S, recorder: &Recorder)
where
    S: Service<http::Request<()>, Response = http::Response<B>> + Clone + Send + 'static,
    B: Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + std::fmt::Debug + 'static,
{
    let mut service = ThrottleLayer::new(slow_and_fast_registry()).layer(inner);
    let requests = vec![
        get("https://slow.example/slow0"),
        get("https://slow.example/slow1"),
        get("https://fast.example/fast0"),
        get("https://fast.example/fast1"),
    ];
    finish_all(launch(&mut service, requests).await).await;
    assert_eq!(recorder.millis_of("/fast"), vec![0, 0]);
    assert_eq!(recorder.millis_of("/slow"), vec![0, 10_000]);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_request_holds_no_permit_of_an_inner_concurrency_limit() {
    let recorder = Recorder::new();
    let inner = tower::limit::ConcurrencyLimit::new(recorder.service(Duration::ZERO), 1);
    slow_waiter_leaves_the_inner_service_to_others(inner, &recorder).await;
}

#[tokio::test(start_paused = true)]
async fn a_waiting_request_holds_no_place_in_an_inner_buffer() {
    let recorder = Recorder::new();
    let inner = tower::buffer::Buffer::new(recorder.service(Duration::ZERO), 1);
    slow_waiter_leaves_the_inner_service_to_others(inner, &recorder).await;
}

#[tokio::test(start_paused = true)]
async fn a_fixed_scope_service_waiting_for_admission_holds_no_inner_permit() {
    let recorder = Recorder::new();
    let inner = tower::limit::ConcurrencyLimit::new(recorder.service(Duration::ZERO), 1);
    let registry = slow_and_fast_registry();
    let mut slow = ThrottleLayer::new(registry.clone())
        .fixed_scope("slow.example")
        .layer(inner.clone());
    let mut fast = ThrottleLayer::new(registry)
        .fixed_scope("fast.example")
        .layer(inner);
    slow.ready().await.unwrap();
    slow.call(get("https://slow.example/slow0")).await.unwrap();
    // The second slow admission waits 10 s in `poll_ready`.
    let slow_task = tokio::spawn(async move {
        slow.ready().await.unwrap();
        slow.call(get("https://slow.example/slow1")).await.unwrap();
    });
    tokio::task::yield_now().await;
    for i in 0..2 {
        fast.ready().await.unwrap();
        fast.call(get(&format!("https://fast.example/fast{i}")))
            .await
            .unwrap();
    }
    slow_task.await.unwrap();
    assert_eq!(recorder.millis_of("/fast"), vec![0, 0]);
    assert_eq!(recorder.millis_of("/slow"), vec![0, 10_000]);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_admitted_at_t_and_first_polled_40_ms_later_pushes_the_next_send_to_its_departure() {
    let registry = registry_with(exact(3, ms(100), Duration::ZERO));
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry).layer(recorder.service(Duration::ZERO));
    finish_all(launch(&mut service, vec![get("https://example.com/a")]).await).await;
    // /b waits for the delay (until 100 ms) in a future nobody polls for a
    // while, as in a busy crawler.
    service.ready().await.unwrap();
    let mut late = std::pin::pin!(service.call(get("https://example.com/b")));
    assert!(late.as_mut().now_or_never().is_none());
    tokio::time::sleep(ms(100)).await;
    // /c arrives at 100 ms: its enqueue admits /b, which departs only when
    // its own future runs, 40 ms later.
    let next = launch(&mut service, vec![get("https://example.com/c")]).await;
    tokio::time::sleep(ms(40)).await;
    late.await.unwrap();
    finish_all(next).await;
    // The site sees /b at 140 ms, so /c may not come before 240 ms.
    assert_eq!(recorder.millis(), vec![0, 140, 240]);
}

#[tokio::test(start_paused = true)]
async fn a_cold_scope_waits_the_delay_after_its_first_response_not_its_first_send() {
    // Two lanes and a 100 ms delay; the first answer takes 30 ms (a new
    // connection's setup). The second request goes 100 ms after that answer,
    // later ones 100 ms after the previous send as usual.
    let registry = registry_with(exact(2, ms(100), Duration::ZERO));
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry).layer(recorder.service(ms(30)));
    let requests = (0..4).map(|i| get(&format!("https://example.com/{i}"))).collect();
    finish_all(launch(&mut service, requests).await).await;
    assert_eq!(recorder.millis(), vec![0, 130, 230, 330]);
}

#[tokio::test(start_paused = true)]
async fn a_cold_scope_whose_first_request_fails_waits_the_delay_after_the_failure() {
    let registry = registry_with(exact(2, ms(100), Duration::ZERO));
    let recorder = Recorder::new();
    let calls = recorder.clone();
    let failing_first = tower::service_fn(move |request: http::Request<()>| {
        calls.record(&request);
        let fail = request.uri().path() == "/0";
        async move {
            tokio::time::sleep(ms(50)).await;
            if fail {
                Err("connection refused")
            } else {
                Ok(http::Response::new(()))
            }
        }
    });
    let mut service = ThrottleLayer::new(registry).layer(failing_first);
    let mut handles = Vec::new();
    for i in 0..3 {
        service.ready().await.unwrap();
        handles.push(tokio::spawn(at_head(
            service.call(get(&format!("https://example.com/{i}"))),
        )));
    }
    let results: Vec<bool> = join_all(handles)
        .await
        .into_iter()
        .map(|r| r.unwrap().is_ok())
        .collect();
    assert_eq!(results, vec![false, true, true]);
    assert_eq!(recorder.millis(), vec![0, 150, 250]);
}

#[tokio::test(start_paused = true)]
async fn the_cold_start_rule_leaves_scopes_without_a_delay_alone() {
    let registry = registry_with(exact(2, Duration::ZERO, Duration::ZERO));
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry).layer(recorder.service(ms(30)));
    let requests = (0..4).map(|i| get(&format!("https://example.com/{i}"))).collect();
    finish_all(launch(&mut service, requests).await).await;
    assert_eq!(recorder.millis(), vec![0, 0, 30, 30]);
}

/// An inner service that is not ready during `[closed_from, reopens_at)`,
/// like a pool that has run out of connections for a while.
struct GatedService {
    recorder: Recorder,
    closed_from: Instant,
    reopens_at: Instant,
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl Clone for GatedService {
    /// A clone is a fresh handle: it shares the gate, not the timer.
    fn clone(&self) -> Self {
        GatedService {
            recorder: self.recorder.clone(),
            closed_from: self.closed_from,
            reopens_at: self.reopens_at,
            sleep: None,
        }
    }
}

impl Service<http::Request<()>> for GatedService {
    type Response = http::Response<()>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<http::Response<()>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        let now = Instant::now();
        if now < self.closed_from || now >= self.reopens_at {
            return std::task::Poll::Ready(Ok(()));
        }
        let reopens_at = self.reopens_at;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(reopens_at)));
        sleep.as_mut().poll(cx).map(|()| Ok(()))
    }

    fn call(&mut self, request: http::Request<()>) -> Self::Future {
        self.recorder.record(&request);
        std::future::ready(Ok(http::Response::new(())))
    }
}

#[tokio::test(start_paused = true)]
async fn an_admitted_request_whose_inner_service_is_not_ready_holds_the_scope_until_it_leaves() {
    let registry = registry_with(exact(3, ms(100), Duration::ZERO));
    let recorder = Recorder::new();
    let start = Instant::now();
    let inner = GatedService {
        recorder: recorder.clone(),
        closed_from: start + ms(50),
        reopens_at: start + ms(250),
        sleep: None,
    };
    let mut service = ThrottleLayer::new(registry).layer(inner);
    let requests = ["a", "b", "c"]
        .iter()
        .map(|path| get(&format!("https://example.com/{path}")))
        .collect();
    // /b is admitted at 100 ms but cannot leave before the inner service
    // reopens at 250 ms; /c's gap runs from /b's departure.
    finish_all(launch(&mut service, requests).await).await;
    assert_eq!(recorder.millis(), vec![0, 250, 350]);
}

/// A lazy inner service, as hyper-util's client and reqwest are: `call`
/// only builds a future, and the request goes out when that future is
/// first polled. It records that instant.
fn lazy_service(
    recorder: &Recorder,
) -> impl Service<http::Request<()>, Response = http::Response<()>, Error = Infallible, Future: Send> + Clone + Send
{
    let recorder = recorder.clone();
    tower::service_fn(move |request: http::Request<()>| {
        let recorder = recorder.clone();
        async move {
            recorder.record(&request);
            Ok::<_, Infallible>(http::Response::new(()))
        }
    })
}

/// The departure is stamped after the hand-over (the inner future's first
/// poll), not at admission: a request admitted in its own `call` whose
/// future first runs 30 ms later (a task preempted on a busy machine)
/// leaves at 130 ms, and the next request of the scope keeps its gap to
/// that instant, whether it arrived before the departure (and waited for
/// it) or after.
#[tokio::test(start_paused = true)]
async fn a_request_admitted_in_its_call_and_first_polled_30_ms_later_times_the_next_gap_from_then() {
    for next_arrives_at in [110, 140] {
        let registry = registry_with(exact(2, ms(100), Duration::ZERO));
        let recorder = Recorder::new();
        let mut service = ThrottleLayer::new(registry).layer(lazy_service(&recorder));
        // Warm the scope: its first request holds it until it ends.
        finish_all(launch(&mut service, vec![get("https://example.com/a")]).await).await;
        tokio::time::sleep(ms(100)).await;
        service.ready().await.unwrap();
        // Admitted now, at 100 ms (its delay has passed), but not yet sent.
        let late = service.call(get("https://example.com/b"));
        let mut next = Vec::new();
        if next_arrives_at < 130 {
            tokio::time::sleep(ms(next_arrives_at - 100)).await;
            next = launch(&mut service, vec![get("https://example.com/c")]).await;
            tokio::time::sleep(ms(130 - next_arrives_at)).await;
        } else {
            tokio::time::sleep(ms(30)).await;
        }
        let late = tokio::spawn(late);
        tokio::task::yield_now().await;
        if next.is_empty() {
            tokio::time::sleep(ms(next_arrives_at - 130)).await;
            next = launch(&mut service, vec![get("https://example.com/c")]).await;
        }
        late.await.unwrap().unwrap();
        finish_all(next).await;
        assert_eq!(
            recorder.millis(),
            vec![0, 130, 230],
            "the next request arriving at {next_arrives_at} ms"
        );
    }
}
