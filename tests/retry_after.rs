//! `RetryAfter` behind `Throttle`: what each rate-limit header does to the
//! next send of a scope.
//!
//! All but the last test run in paused virtual time with an in-process
//! inner service that answers scripted responses at once, so every instant
//! asserted is exact. The last one talks to a real hyper server over
//! loopback in real time, and asserts order and lower bounds only.

mod support;

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::join_all;
use http_body_util::Full;
use hyper::body::Bytes;
use support::{get, loopback_client, serve, Recorder};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_throttle::registry::{BackoffConfig, LimitSource};
use tower_throttle::{Registry, RetryAfter, RetryAfterLayer, ScopeConfig, Scopes, Throttle, ThrottleLayer};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// One lane, no delays, no jitter: any wait a test sees comes from a hold
/// or from pacing.
fn immediate() -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(1)
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
}

fn registry_with(default: ScopeConfig) -> Registry {
    Registry::builder().default_scope(default).build().unwrap()
}

fn respond(status: u16, headers: &[(&str, &str)]) -> http::Response<()> {
    let mut response = http::Response::builder().status(status);
    for (name, value) in headers {
        response = response.header(*name, http::HeaderValue::from_bytes(value.as_bytes()).unwrap());
    }
    response.body(()).unwrap()
}

/// An inner service that records each call and answers at once with what
/// `script` says for the request's path and the (virtual) time since the
/// service was made.
fn scripted<F>(
    recorder: &Recorder,
    script: F,
) -> impl Service<
    http::Request<()>,
    Response = http::Response<()>,
    Error = Infallible,
    Future = impl Future<Output = Result<http::Response<()>, Infallible>> + Send,
> + Clone
       + Send
where
    F: Fn(&str, Duration) -> http::Response<()> + Clone + Send + 'static,
{
    let recorder = recorder.clone();
    let start = Instant::now();
    tower::service_fn(move |request: http::Request<()>| {
        recorder.record(&request);
        let response = script(request.uri().path(), start.elapsed());
        std::future::ready(Ok::<_, Infallible>(response))
    })
}

/// Throttle outside, RetryAfter inside, as the docs recommend.
fn client<S>(registry: &Registry, layer: RetryAfterLayer, inner: S) -> Throttle<RetryAfter<S>> {
    ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(layer)
        .service(inner)
}

async fn send<S, B>(service: &mut S, request: http::Request<()>) -> http::Response<B>
where
    S: Service<http::Request<()>, Response = http::Response<B>>,
    B: Send + 'static,
    S::Error: std::fmt::Debug,
{
    service.ready().await.unwrap().call(request).await.unwrap()
}

/// Calls the service for each request in order, then waits for all the
/// responses (so the requests queue together).
async fn send_all<S, B>(service: &mut S, requests: Vec<http::Request<()>>)
where
    S: Service<http::Request<()>, Response = http::Response<B>>,
    B: Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + std::fmt::Debug + 'static,
{
    let mut handles = Vec::new();
    for request in requests {
        service.ready().await.unwrap();
        handles.push(tokio::spawn(support::dropped(service.call(request))));
    }
    for result in join_all(handles).await {
        result.unwrap().unwrap();
    }
}

fn with_scopes(uri: &str, scopes: Scopes) -> http::Request<()> {
    let mut request = get(uri);
    request.extensions_mut().insert(scopes);
    request
}

#[tokio::test(start_paused = true)]
async fn a_429_with_retry_after_30_holds_its_scope_exactly_30s_and_no_other() {
    let registry = registry_with(immediate());
    let recorder = Recorder::new();
    let inner = scripted(&recorder, |path, _| match path {
        "/first" => respond(429, &[("retry-after", "30")]),
        _ => respond(200, &[]),
    });
    let mut client = client(&registry, RetryAfterLayer::new(registry.clone()), inner);

    let response = send(&mut client, get("https://a.test/first")).await;
    assert_eq!(response.status(), 429, "the response passes through unchanged");
    assert_eq!(registry.scope_stats("a.test").unwrap().held_for, Some(secs(30)));
    drop(response);

    send_all(
        &mut client,
        vec![get("https://a.test/next"), get("https://b.test/next")],
    )
    .await;
    let sent = recorder.sent();
    let at = |host: &str, path: &str| {
        sent.iter()
            .find(|s| s.host == host && s.path == path)
            .map(|s| s.at)
            .unwrap()
    };
    assert_eq!(at("a.test", "/first"), Duration::ZERO);
    assert_eq!(at("a.test", "/next"), secs(30));
    assert_eq!(
        at("b.test", "/next"),
        Duration::ZERO,
        "another scope is sent at once"
    );
    assert_eq!(registry.scope_stats("b.test").unwrap().held_for, None);
}

#[tokio::test(start_paused = true)]
async fn a_200_with_ratelimit_r0_pauses_the_scope_until_the_reset_and_records_the_limits() {
    let registry = registry_with(immediate());
    let recorder = Recorder::new();
    let inner = scripted(&recorder, |path, _| match path {
        "/first" => respond(
            200,
            &[
                ("ratelimit", "\"default\";r=0;t=10"),
                ("ratelimit-policy", "\"default\";q=100;w=60"),
            ],
        ),
        _ => respond(200, &[]),
    });
    let mut client = client(&registry, RetryAfterLayer::new(registry.clone()), inner);
    let start = Instant::now();

    send(&mut client, get("https://api.test/first")).await;
    let stats = registry.scope_stats("api.test").unwrap();
    assert_eq!(stats.held_for, Some(secs(10)));
    let announced = stats.announced.expect("the server's limits are recorded");
    assert_eq!(announced.remaining, Some(0));
    assert_eq!(announced.reset_at, Some(start + secs(10)));
    assert_eq!((announced.quota, announced.window), (Some(100), Some(secs(60))));

    send(&mut client, get("https://api.test/second")).await;
    assert_eq!(recorder.millis(), vec![0, 10_000]);
}

#[tokio::test(start_paused = true)]
async fn retry_after_wins_over_the_ratelimit_reset_on_a_429() {
    let registry = registry_with(immediate());
    let recorder = Recorder::new();
    let inner = scripted(&recorder, |path, _| match path {
        "/first" => respond(
            429,
            &[("retry-after", "5"), ("ratelimit", "\"default\";r=0;t=50")],
        ),
        _ => respond(200, &[]),
    });
    let mut client = client(&registry, RetryAfterLayer::new(registry.clone()), inner);
    send(&mut client, get("https://api.test/first")).await;
    send(&mut client, get("https://api.test/second")).await;
    assert_eq!(recorder.millis(), vec![0, 5_000]);
}

#[tokio::test(start_paused = true)]
async fn a_403_with_x_ratelimit_remaining_0_and_an_epoch_reset_holds_until_that_epoch() {
    // The epoch is wall-clock time while tokio's clock is paused: the layer
    // reads the wall clock somewhere between `before` and `after`, so the
    // hold is exactly the ceiling of (epoch - that instant), which lies
    // between the two values computed from them.
    let before = SystemTime::now();
    let epoch = before.duration_since(UNIX_EPOCH).unwrap().as_secs() + 20;
    let registry = registry_with(immediate());
    let recorder = Recorder::new();
    let reset = epoch.to_string();
    let inner = scripted(&recorder, move |path, _| match path {
        "/first" => respond(
            403,
            &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", &reset)],
        ),
        _ => respond(200, &[]),
    });
    let mut client = client(&registry, RetryAfterLayer::new(registry.clone()), inner);
    send(&mut client, get("https://api.github.test/first")).await;
    let after = SystemTime::now();
    send(&mut client, get("https://api.github.test/second")).await;

    let wait_from = |now: SystemTime| {
        let left = secs(epoch) - now.duration_since(UNIX_EPOCH).unwrap();
        secs(left.as_secs() + u64::from(left.subsec_nanos() > 0))
    };
    let held = recorder.sent()[1].at;
    assert!(
        wait_from(after) <= held && held <= wait_from(before),
        "held {held:?}, expected between {:?} and {:?}",
        wait_from(after),
        wait_from(before)
    );
    assert_eq!(wait_from(before), secs(20));
}

#[tokio::test(start_paused = true)]
async fn a_403_with_x_ratelimit_remaining_0_and_a_delta_reset_holds_exactly_that_long() {
    let registry = registry_with(immediate());
    let recorder = Recorder::new();
    let inner = scripted(&recorder, |path, _| match path {
        "/first" => respond(
            403,
            &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "20")],
        ),
        _ => respond(200, &[]),
    });
    let mut client = client(&registry, RetryAfterLayer::new(registry.clone()), inner);
    send(&mut client, get("https://api.test/first")).await;
    send(&mut client, get("https://api.test/second")).await;
    assert_eq!(recorder.millis(), vec![0, 20_000]);
}

/// Collects what a `tracing` fmt subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test(start_paused = true)]
async fn zero_past_and_malformed_retry_after_values_mean_no_hold_and_a_debug_event() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // Another test's thread-local subscriber may have left this event's
    // callsite cached as disabled; look again now that ours is set.
    tracing::callsite::rebuild_interest_cache();

    let values = [
        "1.5",
        "-5",
        "nan",
        "0",
        "Sun, 06 Nov 1994 08:49:37 GMT",
        "²",
        "7s",
    ];
    let registry = registry_with(immediate());
    let recorder = Recorder::new();
    let inner = scripted(&recorder, move |path, _| match path.strip_prefix("/bad/") {
        Some(index) => respond(429, &[("retry-after", values[index.parse::<usize>().unwrap()])]),
        None => respond(200, &[]),
    });
    let mut client = client(&registry, RetryAfterLayer::new(registry.clone()), inner);
    for (index, value) in values.iter().enumerate() {
        let host = format!("v{index}.test");
        send(&mut client, get(&format!("https://{host}/bad/{index}"))).await;
        assert_eq!(registry.scope_stats(&host).unwrap().held_for, None, "{value:?}");
        send(&mut client, get(&format!("https://{host}/next"))).await;
    }
    assert!(
        recorder.millis().iter().all(|&at| at == 0),
        "nothing was held: {:?}",
        recorder.millis()
    );
    let log = captured.text();
    for (index, value) in values.iter().enumerate() {
        let line = log
            .lines()
            .find(|line| {
                line.contains(&format!("\"v{index}.test\"")) && line.contains("header=\"retry-after\"")
            })
            .unwrap_or_else(|| panic!("no debug event for {value:?} in:\n{log}"));
        assert!(line.contains("DEBUG"), "{line}");
        assert!(line.contains("no hold"), "{line}");
    }
}

/// "Come back in an hour" is honoured whole, past the backoff `max_delay`
/// (60 s here): only the registry's `max_hold` (1 h by default) caps a
/// hold, so a longer `Retry-After` waits that long and no longer.
#[tokio::test(start_paused = true)]
async fn retry_after_is_honoured_past_the_backoff_max_delay_up_to_max_hold() {
    for (max_hold, status, retry_after, held) in [
        (None, 429, "3600", 3_600),
        (None, 503, "3600", 3_600),
        (None, 429, "7200", 3_600),
        (Some(secs(3 * 3600)), 503, "7200", 7_200),
    ] {
        let mut builder = Registry::builder()
            .default_scope(immediate().backoff(BackoffConfig::default().max_delay(secs(60))));
        if let Some(max_hold) = max_hold {
            builder = builder.max_hold(max_hold);
        }
        let registry = builder.build().unwrap();
        let recorder = Recorder::new();
        let inner = scripted(&recorder, move |path, _| match path {
            "/first" => respond(status, &[("retry-after", retry_after)]),
            _ => respond(200, &[]),
        });
        let mut client = client(&registry, RetryAfterLayer::new(registry.clone()), inner);
        send(&mut client, get("https://slow.test/first")).await;
        assert_eq!(
            registry.scope_stats("slow.test").unwrap().held_for,
            Some(secs(held)),
            "{status} with Retry-After {retry_after}, max_hold {max_hold:?}"
        );
        send(&mut client, get("https://slow.test/second")).await;
        assert_eq!(recorder.millis(), vec![0, u128::from(held) * 1_000]);
    }
}

#[tokio::test(start_paused = true)]
async fn retry_after_on_a_redirect_is_capped_at_10s_by_default() {
    let registry = registry_with(immediate());
    let recorder = Recorder::new();
    let inner = scripted(&recorder, |path, _| match path {
        "/moved" => respond(302, &[("location", "/there"), ("retry-after", "60")]),
        "/soon" => respond(303, &[("location", "/there"), ("retry-after", "2")]),
        _ => respond(200, &[]),
    });
    let mut client = client(&registry, RetryAfterLayer::new(registry.clone()), inner);
    send(&mut client, get("https://site.test/moved")).await;
    send(&mut client, get("https://site.test/there")).await;
    send(&mut client, get("https://site.test/soon")).await;
    send(&mut client, get("https://site.test/there")).await;
    assert_eq!(recorder.millis(), vec![0, 10_000, 10_000, 12_000]);
}

#[tokio::test(start_paused = true)]
async fn redirect_max_delay_sets_the_cap_of_redirect_holds() {
    let registry = registry_with(immediate());
    let recorder = Recorder::new();
    let inner = scripted(&recorder, |path, _| match path {
        "/moved" => respond(307, &[("location", "/there"), ("retry-after", "30")]),
        _ => respond(200, &[]),
    });
    let layer = RetryAfterLayer::new(registry.clone()).redirect_max_delay(secs(3));
    let mut client = client(&registry, layer, inner);
    send(&mut client, get("https://site.test/moved")).await;
    send(&mut client, get("https://site.test/there")).await;
    assert_eq!(recorder.millis(), vec![0, 3_000]);
}

#[tokio::test(start_paused = true)]
async fn retry_after_holds_only_on_the_scopes_backoff_statuses() {
    // This scope backs off on 503 only: its 429 is not a backoff response.
    let registry = registry_with(immediate().backoff(BackoffConfig::default().http_codes([503])));
    let recorder = Recorder::new();
    let inner = scripted(&recorder, |path, _| match path {
        "/429" => respond(429, &[("retry-after", "30")]),
        "/200" => respond(200, &[("retry-after", "30")]),
        "/503" => respond(503, &[("retry-after", "30")]),
        _ => respond(200, &[]),
    });
    let mut client = client(&registry, RetryAfterLayer::new(registry.clone()), inner);
    for path in ["/429", "/200", "/503", "/after"] {
        send(&mut client, get(&format!("https://picky.test{path}"))).await;
    }
    assert_eq!(recorder.millis(), vec![0, 0, 0, 30_000]);
}

#[tokio::test(start_paused = true)]
async fn a_hold_applies_to_every_scope_of_the_request() {
    let registry = registry_with(immediate());
    let recorder = Recorder::new();
    let inner = scripted(&recorder, |path, _| match path {
        "/both" => respond(429, &[("retry-after", "7")]),
        _ => respond(200, &[]),
    });
    let mut client = client(&registry, RetryAfterLayer::new(registry.clone()), inner);
    send(
        &mut client,
        with_scopes("https://x.test/both", Scopes::from(["api", "users"])),
    )
    .await;
    send_all(
        &mut client,
        vec![
            with_scopes("https://x.test/api", Scopes::from("api")),
            with_scopes("https://x.test/users", Scopes::from("users")),
            with_scopes("https://x.test/other", Scopes::from("other")),
        ],
    )
    .await;
    assert_eq!(recorder.millis_of("/api"), vec![7_000]);
    assert_eq!(recorder.millis_of("/users"), vec![7_000]);
    assert_eq!(recorder.millis_of("/other"), vec![0]);
}

/// A server whose window of 5 units resets at 20 s: each answer says how
/// many are left (`r`) and how long until the reset (`t`).
fn counting_down(_path: &str, at: Duration) -> http::Response<()> {
    let used = at.as_secs() / 5;
    let header = format!(
        "\"default\";r={};t={}",
        4 - used.min(4),
        20 - at.as_secs().min(19)
    );
    respond(200, &[("ratelimit", &header)])
}

#[tokio::test(start_paused = true)]
async fn pace_to_policy_spreads_r4_t20_into_5s_gaps() {
    let registry = registry_with(immediate());
    let recorder = Recorder::new();
    let layer = RetryAfterLayer::new(registry.clone()).pace_to_policy(true);
    let mut client = client(&registry, layer, scripted(&recorder, counting_down));
    send(&mut client, get("https://api.test/0")).await;
    let stats = registry.scope_stats("api.test").unwrap();
    assert_eq!(stats.pacing_delay, Some(secs(5)));
    assert_eq!(
        (stats.delay, stats.delay_limited_by),
        (secs(5), LimitSource::RateLimitPolicy)
    );
    let rest = (1..5).map(|i| get(&format!("https://api.test/{i}"))).collect();
    send_all(&mut client, rest).await;
    assert_eq!(recorder.millis(), vec![0, 5_000, 10_000, 15_000, 20_000]);
}

#[tokio::test(start_paused = true)]
async fn without_pace_to_policy_the_remaining_quota_goes_at_once() {
    let registry = registry_with(immediate());
    let recorder = Recorder::new();
    let mut client = client(
        &registry,
        RetryAfterLayer::new(registry.clone()),
        scripted(&recorder, counting_down),
    );
    let requests = (0..5).map(|i| get(&format!("https://api.test/{i}"))).collect();
    send_all(&mut client, requests).await;
    assert_eq!(recorder.millis(), vec![0, 0, 0, 0, 0]);
    assert_eq!(registry.scope_stats("api.test").unwrap().pacing_delay, None);
}

#[tokio::test(start_paused = true)]
async fn pace_to_policy_without_a_remaining_count_paces_at_the_policy_rate() {
    let registry = registry_with(immediate());
    let recorder = Recorder::new();
    let inner = scripted(&recorder, |_, _| {
        respond(
            200,
            &[("ratelimit-policy", "\"burst\";q=10;w=1, \"hourly\";q=720;w=3600")],
        )
    });
    let layer = RetryAfterLayer::new(registry.clone()).pace_to_policy(true);
    let mut client = client(&registry, layer, inner);
    let requests = (0..3).map(|i| get(&format!("https://api.test/{i}"))).collect();
    send_all(&mut client, requests).await;
    // 720 per hour binds over 10 per second: one send every 5 s.
    assert_eq!(recorder.millis(), vec![0, 5_000, 10_000]);
}

#[tokio::test(start_paused = true)]
async fn inner_errors_pass_through_unchanged_and_hold_nothing() {
    let registry = registry_with(immediate());
    let inner = tower::service_fn(|_request: http::Request<()>| async {
        Err::<http::Response<()>, _>(io::Error::new(io::ErrorKind::ConnectionReset, "reset by peer"))
    });
    let client = client(&registry, RetryAfterLayer::new(registry.clone()), inner);
    let error = client.oneshot(get("https://down.test/")).await.unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::ConnectionReset);
    let stats = registry.scope_stats("down.test").unwrap();
    assert_eq!((stats.in_flight, stats.held_for), (0, None));
}

#[tokio::test(start_paused = true)]
async fn without_throttle_the_scopes_come_from_the_registry_resolver() {
    let registry = registry_with(immediate());
    let recorder = Recorder::new();
    let inner = scripted(&recorder, |_, _| respond(429, &[("retry-after", "30")]));
    let service = RetryAfterLayer::new(registry.clone()).layer(inner);
    service.oneshot(get("https://Solo.TEST:8443/x")).await.unwrap();
    assert_eq!(
        registry.scope_stats("solo.test").unwrap().held_for,
        Some(secs(30))
    );
}

#[tokio::test]
async fn over_loopback_a_429_with_retry_after_1_delays_the_next_arrival_by_at_least_1s() {
    let arrivals: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let log = arrivals.clone();
    let addr = serve(move |_request: http::Request<hyper::body::Incoming>| {
        let first = {
            let mut arrivals = log.lock().unwrap();
            arrivals.push(Instant::now());
            arrivals.len() == 1
        };
        async move {
            let mut response = support::text("ok");
            if first {
                *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
                response
                    .headers_mut()
                    .insert("retry-after", http::HeaderValue::from_static("1"));
            }
            response
        }
    })
    .await;
    let registry = registry_with(immediate());
    let mut client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(RetryAfterLayer::new(registry.clone()))
        .service(loopback_client());
    let uri = format!("http://limited.test:{}/", addr.port());
    let request = || http::Request::get(&uri).body(Full::new(Bytes::new())).unwrap();

    let called = Instant::now();
    let response = client.ready().await.unwrap().call(request()).await.unwrap();
    assert_eq!(response.status(), 429);
    let stats = registry.scope_stats("limited.test").unwrap();
    // The hold started after `called`; if it is no longer shown, it ended,
    // which takes a full second from then.
    assert!(
        stats.held_for.is_some_and(|left| left <= secs(1)) || called.elapsed() >= secs(1),
        "the hold shows in stats: {stats:?}"
    );
    drop(response);

    let response = client.ready().await.unwrap().call(request()).await.unwrap();
    assert_eq!(response.status(), 200);
    let arrivals = arrivals.lock().unwrap();
    assert_eq!(arrivals.len(), 2);
    assert!(
        arrivals[1] - arrivals[0] >= secs(1),
        "second arrival {:?} after the first",
        arrivals[1] - arrivals[0]
    );
    // The lane is free once the response is gone.
    drop(response);
    let stats = registry.scope_stats("limited.test").unwrap();
    assert_eq!((stats.sent, stats.in_flight), (2, 0));
}
