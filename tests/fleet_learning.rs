//! A fleet that learns together (issue 24, part 1): four workers, each its
//! own registry, sharing one `MemoryStore`, run rampup against a server
//! that refuses (429) any request closer than 50 ms to the last one it
//! served (20 requests a second). Paused virtual time.
//!
//! With the search shared, the fleet finds the rate as one client would;
//! with each worker searching alone (`fleet_learning(false)`, the behaviour
//! before), the workers' paces drift apart and the fleet is refused often.

mod support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_throttle::registry::RampupConfig;
use tower_throttle::store::MemoryStore;
use tower_throttle::{BackoffLayer, Registry, ScopeConfig, ThrottleLayer};

const RATE: f64 = 20.0;
const WINDOW: Duration = Duration::from_secs(60);
const WINDOWS: u32 = 30;
const WORKERS: usize = 4;

/// What the server saw: (arrival since the start, served).
type Arrivals = Arc<Mutex<Vec<(Duration, bool)>>>;

struct Server {
    last_served: Option<Instant>,
}

fn worker(store: &MemoryStore, learn_together: bool) -> Registry {
    let config = ScopeConfig::default()
        .concurrency(1)
        .delay(Duration::from_secs(1))
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
        .rampup(RampupConfig::default().window(WINDOW));
    Registry::builder()
        .default_scope(config)
        .store(store.clone())
        .fleet_learning(learn_together)
        .build()
        .unwrap()
}

/// Runs the fleet for `WINDOWS` windows; the server's arrivals.
async fn crawl(learn_together: bool) -> Vec<(Duration, bool)> {
    let store = MemoryStore::new();
    let arrivals = Arrivals::default();
    let server = Arc::new(Mutex::new(Server { last_served: None }));
    let start = Instant::now();
    let end = start + WINDOW * WINDOWS;
    let mut tasks = Vec::new();
    let mut registries = Vec::new();
    for _ in 0..WORKERS {
        let registry = worker(&store, learn_together);
        registries.push(registry.clone());
        let (arrivals, server) = (arrivals.clone(), server.clone());
        let site = tower::service_fn(move |_request: http::Request<()>| {
            let now = Instant::now();
            let mut server = server.lock().unwrap();
            let served = server
                .last_served
                .is_none_or(|last| now - last >= Duration::from_secs_f64(1.0 / RATE));
            if served {
                server.last_served = Some(now);
            }
            arrivals.lock().unwrap().push((now - start, served));
            let status = if served { 200 } else { 429 };
            let response = http::Response::builder().status(status).body(()).unwrap();
            async move { Ok::<_, Infallible>(response) }
        });
        let client = ServiceBuilder::new()
            .layer(ThrottleLayer::new(registry.clone()).store_errors())
            .layer(BackoffLayer::new(registry))
            .service(site);
        // Four requests at a time per worker, as long as the run lasts.
        for _ in 0..4 {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let request = http::Request::get("http://api.test/").body(()).unwrap();
                    client.clone().oneshot(request).await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    for registry in &registries {
        let stats = registry.scope_stats("api.test").unwrap();
        println!(
            "worker: rampup delay {:?}, windows {}, concurrency {}, delay {:?} by {:?}",
            stats.rampup_delay, stats.rampup_windows, stats.concurrency, stats.delay, stats.delay_limited_by
        );
    }
    let arrivals = arrivals.lock().unwrap().clone();
    arrivals
}

/// Over the second half of the run: served per second, and the share of
/// arrivals refused.
fn settled(arrivals: &[(Duration, bool)]) -> (f64, f64) {
    let half = WINDOW * WINDOWS / 2;
    let late: Vec<bool> = arrivals
        .iter()
        .filter(|(at, _)| *at >= half && *at < WINDOW * WINDOWS)
        .map(|(_, served)| *served)
        .collect();
    let served = late.iter().filter(|served| **served).count();
    let refused = late.len() - served;
    (
        served as f64 / half.as_secs_f64(),
        refused as f64 / late.len().max(1) as f64,
    )
}

#[tokio::test(start_paused = true)]
async fn four_workers_learning_together_find_the_rate_as_one_client_would() {
    let (rate, refused) = settled(&crawl(true).await);
    println!(
        "learning together: {rate:.2} served per second, {:.2} % refused",
        refused * 100.0
    );
    assert!(rate >= 0.9 * RATE, "{rate:.2} per second");
    assert!(refused <= 0.02, "{:.2} % refused", refused * 100.0);
}

/// The counter-test: the same fleet with each worker searching alone (the
/// behaviour before, `fleet_learning(false)`): a reservation spaces the
/// fleet's sends by the reserving worker's own pace, the paces drift
/// apart, and the fleet gets a fraction of the rate.
#[tokio::test(start_paused = true)]
async fn four_workers_learning_alone_get_a_fraction_of_the_rate() {
    let (rate, refused) = settled(&crawl(false).await);
    println!(
        "learning alone: {rate:.2} served per second, {:.2} % refused",
        refused * 100.0
    );
    assert!(rate < 0.5 * RATE, "{rate:.2} per second");
}

/// A store that shares learning but cannot read or write it (as when Redis
/// is unreachable for those calls): everything else goes to a `MemoryStore`.
#[derive(Debug)]
struct LearningFails(MemoryStore);

crate::memory_store_but!(LearningFails {
    fn learnt(
        &self,
        _scope: tower_throttle::Scope,
    ) -> tower_throttle::store::backend::StoreFuture<Option<tower_throttle::store::backend::Learnt>> {
        Box::pin(async {
            Err(tower_throttle::store::StoreError::unexpected(
                "learnt: unreachable",
            ))
        })
    }

    fn shares_learning(&self) -> bool {
        true
    }
});

/// When the fleet's search cannot be reached, a worker's own copy takes its
/// backoffs, as if it searched alone: rampup still slows down.
#[tokio::test(start_paused = true)]
async fn a_worker_that_cannot_reach_the_fleets_search_learns_alone() {
    use tower_throttle::registry::Feedback;
    use tower_throttle::Scopes;
    let config = ScopeConfig::default()
        .delay(Duration::from_millis(200))
        .jitter(0.0)
        .rampup(RampupConfig::default());
    let registry = Registry::builder()
        .default_scope(config)
        .store(LearningFails(MemoryStore::new()))
        .build()
        .unwrap();
    let scope = Scopes::from("api.test");
    // Two backoffs at a pace believed safe: 5 % slower.
    registry.feedback(&scope, Feedback::backoff());
    tokio::time::sleep(Duration::from_millis(1)).await;
    registry.feedback(&scope, Feedback::backoff());
    tokio::time::sleep(Duration::from_millis(1)).await;
    let delay = registry.scope_stats("api.test").unwrap().rampup_delay.unwrap();
    assert!(
        delay.abs_diff(Duration::from_millis(210)) < Duration::from_micros(10),
        "{delay:?}"
    );
}

/// AutoThrottle through a fleet (issue 24, part 1): one delay for the
/// fleet, moved by every worker's responses. Worker A sees a response
/// 2 s slow; worker B, which saw none, then spaces its requests by the
/// fleet's delay, and its own fast response moves that same delay.
async fn autothrottle_sends_of_b(learn_together: bool) -> (Vec<Duration>, Duration, Duration) {
    use tower_throttle::registry::AutoThrottleConfig;
    let store = MemoryStore::new();
    let config = ScopeConfig::default()
        .concurrency(1)
        .delay(Duration::from_millis(100))
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
        .autothrottle(AutoThrottleConfig::default().start_delay(Duration::ZERO));
    let worker = || support::fleet_worker(&config, &store, learn_together);
    let (a, b) = (worker(), worker());
    let start = Instant::now();
    let client = |registry: &Registry, latency: Duration, sends: Arc<Mutex<Vec<Duration>>>| {
        ServiceBuilder::new()
            .layer(ThrottleLayer::new(registry.clone()).store_errors())
            .service(tower::service_fn(move |_request: http::Request<()>| {
                let sends = sends.clone();
                async move {
                    sends.lock().unwrap().push(start.elapsed());
                    tokio::time::sleep(latency).await;
                    Ok::<_, Infallible>(http::Response::new(()))
                }
            }))
    };
    let get = || http::Request::get("http://api.test/").body(()).unwrap();
    let sends_of_a = Arc::default();
    client(&a, Duration::from_secs(2), sends_of_a)
        .oneshot(get())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let sends_of_b = Arc::new(Mutex::new(Vec::new()));
    let b_client = client(&b, Duration::ZERO, sends_of_b.clone());
    b_client.clone().oneshot(get()).await.unwrap();
    b_client.oneshot(get()).await.unwrap();
    // Let the background store calls land.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let delay = |registry: &Registry| {
        registry
            .scope_stats("api.test")
            .unwrap()
            .autothrottle_delay
            .unwrap()
    };
    let sends = sends_of_b.lock().unwrap().clone();
    (sends, delay(&a), delay(&b))
}

#[tokio::test(start_paused = true)]
async fn a_fleet_has_one_autothrottle_delay_moved_by_every_workers_responses() {
    let (sends, delay_a, delay_b) = autothrottle_sends_of_b(true).await;
    // A's 2 s response: the fleet's delay is max(2, (0.1 + 2) / 2) = 2 s.
    // B's first request (at 3 s) learns it with its reservation; B's own
    // response, at once: max(0, (2 + 0) / 2) = 1 s. B's second request
    // goes 1 s after its first.
    assert_eq!(sends, [Duration::from_secs(3), Duration::from_secs(4)]);
    // B's second response: (1 + 0) / 2 = 0.5 s, the fleet's delay, which B
    // holds; A, idle since, learns it with its next reservation.
    assert_eq!(
        (delay_a, delay_b),
        (Duration::from_secs(2), Duration::from_millis(500))
    );
}

#[tokio::test(start_paused = true)]
async fn workers_learning_alone_each_have_their_own_autothrottle_delay() {
    let (sends, delay_a, delay_b) = autothrottle_sends_of_b(false).await;
    // B knows nothing of A's slow response: its own fast one sets its
    // delay to the configured 100 ms.
    assert_eq!(sends, [Duration::from_secs(3), Duration::from_millis(3_100)]);
    assert_eq!(
        (delay_a, delay_b),
        (Duration::from_secs(2), Duration::from_millis(100))
    );
}

/// The built-in backoff through a fleet (issue 24, part 1): one level for
/// the fleet, stepped up in the store by every worker's backoff feedback.
/// Worker A sees a backoff, then worker B: the fleet is at level 2 (2 s),
/// as one client seeing both would be, and A's next requests keep 2 s.
async fn backoff_of_a_fleet(learn_together: bool) -> (Vec<(u32, u32)>, Vec<Duration>) {
    use tower_throttle::registry::Feedback;
    use tower_throttle::Scopes;
    let store = MemoryStore::new();
    let config = ScopeConfig::default()
        .concurrency(1)
        .delay(Duration::from_millis(100))
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
        .backoff(tower_throttle::registry::BackoffConfig::default().jitter(0.0));
    let worker = || support::fleet_worker(&config, &store, learn_together);
    let (a, b) = (worker(), worker());
    let scope = Scopes::from("api.test");
    a.feedback(&scope, Feedback::backoff());
    tokio::time::sleep(Duration::from_millis(1)).await;
    b.feedback(&scope, Feedback::backoff());
    tokio::time::sleep(Duration::from_millis(1)).await;
    let level = |registry: &Registry| registry.scope_stats("api.test").unwrap().backoff_level;
    let mut levels = vec![(level(&a), level(&b))];
    let start = Instant::now();
    let sends = Arc::new(Mutex::new(Vec::new()));
    let recorded = sends.clone();
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(a.clone()).store_errors())
        .service(tower::service_fn(move |_request: http::Request<()>| {
            recorded.lock().unwrap().push(start.elapsed());
            async { Ok::<_, Infallible>(http::Response::new(())) }
        }));
    for _ in 0..3 {
        let request = http::Request::get("http://api.test/").body(()).unwrap();
        client.clone().oneshot(request).await.unwrap();
    }
    // One quiet window (60 s) after B's step, one step back; after two,
    // none.
    tokio::time::sleep_until(start + Duration::from_millis(60_000)).await;
    levels.push((level(&a), level(&b)));
    tokio::time::sleep_until(start + Duration::from_millis(120_000)).await;
    levels.push((level(&a), level(&b)));
    let sends = sends.lock().unwrap().clone();
    (levels, sends)
}

#[tokio::test(start_paused = true)]
async fn a_fleet_has_one_backoff_level_stepped_by_every_workers_feedback() {
    let (levels, sends) = backoff_of_a_fleet(true).await;
    // A stepped the fleet to level 1 (1 s), B from there to level 2 (2 s).
    // A learns level 2 with its first reservation: its requests go 2 s
    // apart (its first one at once: the last send was before the steps).
    assert_eq!(levels[0], (1, 2));
    assert_eq!(
        sends,
        [Duration::ZERO, Duration::from_secs(2), Duration::from_secs(4)]
    );
    // Both step back together: level 1 after one quiet window, none after
    // two.
    assert_eq!(levels[1..], [(1, 1), (0, 0)]);
}

#[tokio::test(start_paused = true)]
async fn workers_learning_alone_each_have_their_own_backoff_level() {
    let (levels, sends) = backoff_of_a_fleet(false).await;
    // Each worker at its own level 1, and B's 1 s replaced nothing longer:
    // A's requests go 1 s apart.
    assert_eq!(levels[0], (1, 1));
    assert_eq!(
        sends,
        [Duration::ZERO, Duration::from_secs(1), Duration::from_secs(2)]
    );
}

/// A store that shares rampup's search but keeps no backoff level (its
/// `step_backoff` is the trait's default): everything else goes to a
/// `MemoryStore`.
#[derive(Debug)]
struct NoBackoffLevel(MemoryStore);

crate::memory_store_but!(NoBackoffLevel {
    fn learnt(
        &self,
        scope: tower_throttle::Scope,
    ) -> tower_throttle::store::backend::StoreFuture<Option<tower_throttle::store::backend::Learnt>> {
        self.0.learnt(scope)
    }

    fn swap_learnt(
        &self,
        scope: tower_throttle::Scope,
        version: u64,
        state: String,
        ttl: Duration,
    ) -> tower_throttle::store::backend::StoreFuture<Option<u64>> {
        self.0.swap_learnt(scope, version, state, ttl)
    }

    fn shares_learning(&self) -> bool {
        true
    }
});

/// With a store that keeps no backoff level, a worker steps its own level
/// (and writes its delay, as before levels), and the store's answers, which
/// show no level, do not take that step away.
#[tokio::test(start_paused = true)]
async fn a_store_without_backoff_levels_leaves_each_worker_its_own() {
    use tower_throttle::registry::Feedback;
    use tower_throttle::Scopes;
    let registry = Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .delay(Duration::from_millis(100))
                .jitter(0.0),
        )
        .store(NoBackoffLevel(MemoryStore::new()))
        .build()
        .unwrap();
    registry.feedback(&Scopes::from("api.test"), Feedback::backoff());
    tokio::time::sleep(Duration::from_millis(1)).await;
    let client = ThrottleLayer::new(registry.clone())
        .store_errors()
        .layer(tower::service_fn(|_request: http::Request<()>| async {
            Ok::<_, Infallible>(http::Response::new(()))
        }));
    let request = http::Request::get("http://api.test/").body(()).unwrap();
    client.oneshot(request).await.unwrap();
    let stats = registry.scope_stats("api.test").unwrap();
    assert_eq!(
        (stats.backoff_level, stats.backoff_delay),
        (1, Some(Duration::from_secs(1)))
    );
}
