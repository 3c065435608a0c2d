//! The scheduler under real parallelism: a multi-threaded runtime, many
//! scopes (some requests with several), random latencies, random
//! cancellations. Asserts the invariants, not instants: no scope ever
//! exceeds its lanes, the global limit holds, every request that is not
//! cancelled completes, and everything is released at the end.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower::{Service, ServiceExt};
use tower_throttle::{Registry, ScopeConfig, Scopes, ThrottleLayer};

#[derive(Clone)]
struct Limits {
    shape: Shape,
    in_flight: Arc<Mutex<HashMap<String, u32>>>,
    global: Arc<AtomicU32>,
    violations: Arc<AtomicU32>,
    completed: Arc<AtomicU32>,
    /// The most requests the inner service saw in flight at once.
    peak: Arc<AtomicU32>,
}

/// Counts a request in flight from its first poll until it completes or
/// is dropped (a cancelled request frees its lane too).
struct InFlight {
    limits: Limits,
    scopes: Vec<String>,
}

impl InFlight {
    fn enter(limits: Limits, scopes: Vec<String>) -> Self {
        {
            let mut in_flight = limits.in_flight.lock().unwrap();
            for scope in &scopes {
                let count = in_flight.entry(scope.clone()).or_default();
                *count += 1;
                if *count > limits.shape.lanes {
                    limits.violations.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        let global = limits.global.fetch_add(1, Ordering::SeqCst) + 1;
        limits.peak.fetch_max(global, Ordering::SeqCst);
        if global > limits.shape.max_concurrency {
            limits.violations.fetch_add(1, Ordering::SeqCst);
        }
        InFlight { limits, scopes }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.limits.global.fetch_sub(1, Ordering::SeqCst);
        let mut in_flight = self.limits.in_flight.lock().unwrap();
        for scope in &self.scopes {
            *in_flight.get_mut(scope).unwrap() -= 1;
        }
    }
}

/// The limits a stress runs under, and how many sites its requests go to.
#[derive(Clone, Copy, Debug)]
struct Shape {
    lanes: u32,
    max_concurrency: u32,
    sites: u8,
    /// The inner service answers in up to this many microseconds.
    latency_us: u64,
    /// Whether one request in four also names a group scope.
    groups: bool,
    /// Whether busy plain scopes may admit on their lock-free words (else
    /// every request goes through the lock).
    words: bool,
}

/// Three lanes per site, eight permits, six sites: every limit binds.
const SMALL: Shape = Shape {
    lanes: 3,
    max_concurrency: 8,
    sites: 6,
    latency_us: 2_000,
    groups: true,
    words: true,
};

/// Many permits, fewer than the busy sites' lanes, so the global limit
/// binds while requests on words on several threads take and give back
/// permits without the lock.
fn large_global_limit() -> Shape {
    Shape {
        lanes: 1_024,
        max_concurrency: 256,
        sites: 2,
        // Long enough for the requests to fill every permit.
        latency_us: 20_000,
        // One scope each: the sites' words stay open unless requests wait.
        groups: false,
        words: true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_requests_with_cancellations_keep_every_limit_and_release_everything() {
    stress(SMALL, Duration::from_micros(200), false).await;
}

/// The same with delay 0: the scopes are plain, so busy ones admit and
/// end on their lock-free words (see `lock_free_plain_scopes`), and a
/// disturber closes words with requests in flight at random instants (a
/// config that adds a delay, a lane fewer, a short hold, the plain config
/// back), so the scheduler adopts them while other threads admit and end
/// on the words. Random interleavings of open, close, adoption and the
/// global limit, on four worker threads; the invariants as above.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plain_scopes_on_their_lock_free_words_keep_every_limit_while_closed_at_random() {
    stress(SMALL, Duration::ZERO, true).await;
}

/// [`plain_scopes_on_their_lock_free_words_keep_every_limit_while_closed_at_random`]
/// over forty sites, more than a thread's cache of words holds: requests
/// find their words in the registry's directory, while the disturber
/// closes them at random and the scheduler makes, opens and retires them.
/// The invariants as above.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn words_found_in_the_directory_keep_every_limit_while_closed_at_random() {
    let shape = Shape {
        sites: 40,
        max_concurrency: 64,
        ..SMALL
    };
    stress(shape, Duration::ZERO, true).await;
}

/// Two busy plain sites on their words under a large global limit,
/// smaller than the sites' lanes: requests on four worker threads take
/// permits without the lock, the limit fills, requests wait for it in the
/// scheduler while permits come back, and the words admit again once
/// nobody waits. The global limit holds (counted by the inner service),
/// every request ends, everything is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_large_global_limit_holds_on_busy_words() {
    stress(large_global_limit(), Duration::ZERO, false).await;
}

/// [`a_large_global_limit_holds_on_busy_words`] with every request
/// admitted and ended under the scheduler's lock (no words) over sixteen
/// sites: the scheduler takes and gives back permits on the one count,
/// and the limit, its use and every release hold as on words.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_large_global_limit_holds_under_the_lock() {
    let shape = Shape {
        sites: 16,
        words: false,
        ..large_global_limit()
    };
    stress(shape, Duration::ZERO, false).await;
}

/// The plain config of the stress scopes, with `delay`.
fn stress_config(lanes: u32, delay: Duration) -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(lanes)
        .delay(delay)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.5)
}

/// Changes the sites' limits at random instants until `stop`.
fn disturb(
    registry: Registry,
    shape: Shape,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<u32> {
    tokio::spawn(async move {
        let mut rng = fastrand::Rng::with_seed(99);
        let mut changes = 0;
        while !stop.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_micros(rng.u64(100..800))).await;
            let site = format!("site{}.example", rng.u8(0..shape.sites));
            let config = match rng.u8(0..4) {
                0 => stress_config(shape.lanes, Duration::from_micros(300)),
                1 => stress_config(shape.lanes, Duration::ZERO).concurrency(1),
                2 => {
                    registry.hold(site.as_str(), Duration::from_micros(500));
                    changes += 1;
                    continue;
                }
                _ => stress_config(shape.lanes, Duration::ZERO),
            };
            registry.set_scope(site.as_str(), config).unwrap();
            changes += 1;
        }
        // Every site plain again, so the last requests end on open words.
        for site in 0..shape.sites {
            registry
                .set_scope(
                    format!("site{site}.example"),
                    stress_config(shape.lanes, Duration::ZERO),
                )
                .unwrap();
        }
        changes
    })
}

/// Requests from eight producers (each site asked for twice first, one at
/// a time, so the plain sites' words are open when the crowd comes), some
/// cancelled, some with a group scope beside their site (when the shape
/// says), against an inner service that counts what it sees in flight;
/// with `disturbed`, the sites' limits change at random meanwhile.
async fn stress(shape: Shape, delay: Duration, disturbed: bool) {
    let registry = Registry::builder()
        .max_concurrency(shape.max_concurrency)
        .max_queued(200)
        .lock_free_plain_scopes(shape.words)
        .default_scope(stress_config(shape.lanes, delay))
        .build()
        .unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let disturber = disturbed.then(|| disturb(registry.clone(), shape, stop.clone()));
    let limits = Limits {
        shape,
        in_flight: Arc::default(),
        global: Arc::default(),
        violations: Arc::default(),
        completed: Arc::default(),
        peak: Arc::default(),
    };
    let inner_limits = limits.clone();
    let inner_registry = registry.clone();
    let inner = tower::service_fn(move |request: http::Request<()>| {
        let limits = inner_limits.clone();
        // The scopes the throttle hands over with the request, as an inner
        // layer reads them (on whichever worker thread the call runs).
        let scopes: Vec<String> = inner_registry
            .scopes_of(&request)
            .iter()
            .map(|(scope, _)| scope.to_string())
            .collect();
        let latency = Duration::from_micros(fastrand::u64(0..shape.latency_us));
        async move {
            let _in_flight = InFlight::enter(limits, scopes);
            tokio::time::sleep(latency).await;
            Ok::<_, Infallible>(http::Response::new(()))
        }
    });
    let service = ThrottleLayer::new(registry.clone()).layer_on(inner);
    // Each site asked for twice in a row, one request at a time: the plain
    // ones open their words before the crowd comes.
    for site in 0..shape.sites {
        for _ in 0..2 {
            let request = http::Request::get(format!("https://site{site}.example/"))
                .body(())
                .unwrap();
            service.clone().oneshot(request).await.unwrap();
        }
    }

    let mut producers = Vec::new();
    for producer in 0..8u64 {
        let service = service.clone();
        let completed = limits.completed.clone();
        producers.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(producer);
            let mut handles = Vec::new();
            for i in 0..400 {
                let mut request =
                    http::Request::get(format!("https://site{}.example/{i}", rng.u8(0..shape.sites)))
                        .body(())
                        .unwrap();
                if shape.groups && rng.u8(0..4) == 0 {
                    let scopes = [
                        format!("site{}.example", rng.u8(0..shape.sites)),
                        format!("group{}", rng.u8(0..2)),
                    ];
                    request.extensions_mut().insert(Scopes::from(scopes));
                }
                let mut service = service.clone();
                let cancel = rng.u8(0..5) == 0;
                let completed = completed.clone();
                let handle = tokio::spawn(async move {
                    service.ready().await.unwrap().call(request).await.unwrap();
                    completed.fetch_add(1, Ordering::SeqCst);
                });
                if cancel {
                    tokio::time::sleep(Duration::from_micros(rng.u64(0..500))).await;
                    handle.abort();
                } else {
                    handles.push(handle);
                }
            }
            let mut kept = 0;
            for handle in handles {
                handle.await.unwrap();
                kept += 1;
            }
            kept
        }));
    }
    let mut kept = 0;
    let all = async {
        for producer in producers {
            kept += producer.await.unwrap();
        }
    };
    let finished = tokio::time::timeout(Duration::from_secs(20), all).await;
    stop.store(true, Ordering::SeqCst);
    if let Some(disturber) = disturber {
        let changes = disturber.await.unwrap();
        assert!(changes > 10, "the disturber changed the limits {changes} times");
    }
    if finished.is_err() {
        let stats = registry.stats();
        let busy: Vec<_> = registry
            .all_scope_stats()
            .iter()
            .filter(|s| s.in_flight > 0 || s.queued > 0)
            .map(|s| (s.scope.to_string(), s.in_flight, s.queued))
            .collect();
        panic!(
            "stuck: in flight {}, waiting {}, busy scopes {busy:?}",
            stats.in_flight, stats.waiting
        );
    }

    assert_eq!(
        limits.violations.load(Ordering::SeqCst),
        0,
        "a limit was exceeded"
    );
    // The requests drew on the global limit hard.
    let peak = limits.peak.load(Ordering::SeqCst);
    assert!(
        peak * 2 >= shape.max_concurrency,
        "only {peak} of {} permits ever in use at once",
        shape.max_concurrency
    );
    assert!(limits.completed.load(Ordering::SeqCst) >= kept);
    // Aborted tasks are dropped asynchronously; give them a moment.
    for _ in 0..100 {
        let stats = registry.stats();
        if stats.in_flight == 0 && stats.waiting == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = registry.stats();
    assert_eq!((stats.in_flight, stats.waiting), (0, 0), "everything released");
    assert!(registry
        .all_scope_stats()
        .iter()
        .all(|scope| scope.in_flight == 0 && scope.queued == 0));
    // The queue places are all back: a fresh handle is ready at once.
    let mut fresh = service.clone();
    tokio::time::timeout(Duration::from_secs(1), fresh.ready())
        .await
        .expect("queue places released")
        .unwrap();
}

trait LayerOn {
    fn layer_on<S>(&self, inner: S) -> tower_throttle::Throttle<S>;
}

impl LayerOn for ThrottleLayer {
    fn layer_on<S>(&self, inner: S) -> tower_throttle::Throttle<S> {
        tower::Layer::layer(self, inner)
    }
}

#[cfg(feature = "robots")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_first_requests_with_cancellations_fetch_each_robots_txt_exactly_once() {
    use http_body_util::Full;
    use hyper::body::Bytes;
    use tower::ServiceBuilder;
    use tower_throttle::RobotsDelayLayer;

    let registry = Registry::builder()
        .max_concurrency(32)
        .default_scope(
            ScopeConfig::default()
                .concurrency(4)
                .delay(Duration::ZERO)
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()
        .unwrap();
    let fetches: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let counted = fetches.clone();
    let site = tower::service_fn(move |request: http::Request<Full<Bytes>>| {
        let host = request.uri().host().unwrap_or_default().to_owned();
        let robots = request.uri().path() == "/robots.txt";
        if robots {
            *counted.lock().unwrap().entry(host.clone()).or_default() += 1;
        }
        let latency = Duration::from_micros(fastrand::u64(0..3_000));
        async move {
            tokio::time::sleep(latency).await;
            let body = if robots && host.starts_with("site1") {
                "User-agent: *\nDisallow:\n"
            } else {
                "ok"
            };
            let status = if robots && host.starts_with("site2") {
                404
            } else {
                200
            };
            let mut response = http::Response::new(Full::new(Bytes::from(body)));
            *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
            Ok::<_, Infallible>(response)
        }
    });
    let client = ServiceBuilder::new()
        .layer(RobotsDelayLayer::new(registry.clone()))
        .layer(ThrottleLayer::new(registry.clone()))
        .service(site);

    let mut kept = Vec::new();
    let mut rng = fastrand::Rng::with_seed(9);
    for i in 0..2_000 {
        let request = http::Request::get(format!("https://site{}.example/{i}", rng.u8(0..10)))
            .body(Full::default())
            .unwrap();
        let client = client.clone();
        let handle = tokio::spawn(async move { client.oneshot(request).await.map(|r| r.status()) });
        if rng.u8(0..5) == 0 {
            handle.abort();
        } else {
            kept.push(handle);
        }
    }
    let all = async {
        for handle in kept {
            assert!(handle.await.unwrap().unwrap().is_success());
        }
    };
    tokio::time::timeout(Duration::from_secs(30), all)
        .await
        .expect("every request that was not cancelled completes");
    let fetches = fetches.lock().unwrap();
    assert!(
        fetches.values().all(|&count| count == 1),
        "one fetch per origin: {fetches:?}"
    );
    assert_eq!(fetches.len(), 10);
}
