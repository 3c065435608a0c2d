//! AutoThrottle through Throttle, in paused virtual time, against a real
//! hyper server on an in-memory pipe whose latency changes over time.

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{duplex_service, full_request, full_status, get};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::registry::{AutoThrottleConfig, LimitSource};
use tower_throttle::scope::AutoThrottleExempt;
use tower_throttle::{Registry, ScopeConfig, Scopes, ThrottleLayer};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

fn autothrottled(target_concurrency: f64) -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(16)
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
        .autothrottle(AutoThrottleConfig::default().target_concurrency(target_concurrency))
}

/// Time-weighted count of requests the server is working on.
#[derive(Default)]
struct InFlightMeter {
    current: u32,
    since: Option<Instant>,
    /// (instant, count in force from then on)
    changes: Vec<(Instant, u32)>,
}

impl InFlightMeter {
    fn change(&mut self, delta: i32) {
        self.current = (self.current as i32 + delta) as u32;
        let now = Instant::now();
        self.since.get_or_insert(now);
        self.changes.push((now, self.current));
    }

    /// Mean in-flight count over `[from, to)`.
    fn mean(&self, from: Instant, to: Instant) -> f64 {
        let mut total = 0.0;
        let mut count = 0;
        let mut at = from;
        for &(instant, next) in &self.changes {
            if instant >= to {
                break;
            }
            if instant > at {
                total += f64::from(count) * (instant - at).as_secs_f64();
                at = instant;
            }
            count = next;
        }
        total += f64::from(count) * (to - at).as_secs_f64();
        total / (to - from).as_secs_f64()
    }
}

#[tokio::test(start_paused = true)]
async fn the_delay_follows_latency_steps_and_in_flight_settles_near_the_target() {
    let latency_ms = Arc::new(AtomicU64::new(100));
    let meter = Arc::new(Mutex::new(InFlightMeter::default()));
    let (server_latency, server_meter) = (latency_ms.clone(), meter.clone());
    let server = duplex_service(move |_request| {
        let latency = ms(server_latency.load(Ordering::SeqCst));
        let meter = server_meter.clone();
        async move {
            meter.lock().unwrap().change(1);
            tokio::time::sleep(latency).await;
            meter.lock().unwrap().change(-1);
            full_status(200)
        }
    });
    let registry = Registry::builder()
        .default_scope(autothrottled(4.0))
        .build()
        .unwrap();
    let mut client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .service(server);
    let start = Instant::now();
    let phases = [(100, 120), (1000, 300), (100, 420)]; // (latency ms, phase ends at s)
    let mut delays_at_phase_end = Vec::new();
    let mut handles = Vec::new();
    for (latency, end) in phases {
        latency_ms.store(latency, Ordering::SeqCst);
        let end = start + Duration::from_secs(end);
        while Instant::now() < end {
            client.ready().await.unwrap();
            handles.push(tokio::spawn(client.call(full_request("http://site.example/"))));
            if handles.len() > 64 {
                handles.remove(0).await.unwrap().unwrap();
            }
        }
        let stats = registry.scope_stats("site.example").unwrap();
        assert_eq!(stats.delay_limited_by, LimitSource::AutoThrottle);
        delays_at_phase_end.push(stats.autothrottle_delay.unwrap());
    }
    for handle in handles {
        handle.await.unwrap().unwrap();
    }
    eprintln!("autothrottle delay at the end of each phase: {delays_at_phase_end:?}");
    // delay → latency / target_concurrency.
    let expected = [ms(25), ms(250), ms(25)];
    for (delay, expected) in delays_at_phase_end.iter().zip(expected) {
        let error = delay.as_secs_f64() / expected.as_secs_f64() - 1.0;
        assert!(error.abs() < 0.05, "delay {delay:?}, expected about {expected:?}");
    }
    // Once settled (the last minute of each phase), about 4 in flight.
    let meter = meter.lock().unwrap();
    for end in [120, 300, 420] {
        let to = start + Duration::from_secs(end);
        let mean = meter.mean(to - Duration::from_secs(60), to);
        eprintln!("latency phase ending at {end} s: mean in flight {mean:.3}");
        assert!(
            (3.5..=4.5).contains(&mean),
            "mean in flight {mean:.2} before {end} s"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_delay_starts_at_the_start_delay_and_exempt_requests_do_not_adjust_it() {
    let registry = Registry::builder()
        .default_scope(autothrottled(1.0))
        .build()
        .unwrap();
    let inner = tower::service_fn(|_request: http::Request<()>| async {
        tokio::time::sleep(ms(200)).await;
        Ok::<_, Infallible>(http::Response::new(()))
    });
    let mut client = ThrottleLayer::new(registry.clone()).layer_on(inner);
    let mut exempt = get("https://site.example/export");
    exempt.extensions_mut().insert(AutoThrottleExempt);
    (&mut client).oneshot(exempt).await.unwrap();
    let stats = registry.scope_stats("site.example").unwrap();
    assert_eq!(
        stats.autothrottle_delay,
        Some(Duration::from_secs(5)),
        "start delay, not adjusted"
    );
    (&mut client)
        .oneshot(get("https://site.example/page"))
        .await
        .unwrap();
    // max(0.2, (5 + 0.2) / 2) = 2.6 s.
    let stats = registry.scope_stats("site.example").unwrap();
    assert_eq!(stats.autothrottle_delay, Some(ms(2600)));
    assert_eq!(stats.latency, Some(ms(200)));
}

#[tokio::test(start_paused = true)]
async fn a_request_with_several_scopes_adjusts_each_of_them() {
    let registry = Registry::builder()
        .default_scope(autothrottled(1.0))
        .build()
        .unwrap();
    let inner = tower::service_fn(|_request: http::Request<()>| async {
        tokio::time::sleep(ms(1000)).await;
        Ok::<_, Infallible>(http::Response::new(()))
    });
    let client = ThrottleLayer::new(registry.clone()).layer_on(inner);
    let mut request = get("https://api.example/users");
    request.extensions_mut().insert(Scopes::from(["api", "users"]));
    client.oneshot(request).await.unwrap();
    for scope in ["api", "users"] {
        // max(1, (5 + 1) / 2) = 3 s.
        assert_eq!(
            registry.scope_stats(scope).unwrap().autothrottle_delay,
            Some(Duration::from_secs(3))
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_non_200_response_never_lowers_the_delay() {
    let registry = Registry::builder()
        .default_scope(autothrottled(1.0))
        .build()
        .unwrap();
    let inner = tower::service_fn(|_request: http::Request<()>| async {
        let response = http::Response::builder().status(500).body(()).unwrap();
        Ok::<_, Infallible>(response)
    });
    let client = ThrottleLayer::new(registry.clone()).layer_on(inner);
    client.oneshot(get("https://site.example/")).await.unwrap();
    let stats = registry.scope_stats("site.example").unwrap();
    assert_eq!(stats.autothrottle_delay, Some(Duration::from_secs(5)));
}

#[test]
fn target_concurrency_must_be_finite_and_positive() {
    for bad in [0.0, -2.0, f64::NAN, f64::INFINITY] {
        let err = Registry::builder()
            .scope("api", autothrottled(bad))
            .build()
            .unwrap_err();
        assert_eq!(err.field(), "scope \"api\" autothrottle target_concurrency");
    }
}

trait LayerOn {
    fn layer_on<S>(&self, inner: S) -> tower_throttle::Throttle<S>;
}

impl LayerOn for ThrottleLayer {
    fn layer_on<S>(&self, inner: S) -> tower_throttle::Throttle<S> {
        tower::Layer::layer(self, inner)
    }
}
