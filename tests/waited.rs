//! Why a request waited (`Waited`, issue 25): each scenario in paused
//! virtual time, so every figure is exact to the nanosecond.

use std::convert::Infallible;
use std::time::Duration;

use futures::future::join;
use tokio::time::{sleep, Instant};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_throttle::registry::LimitSource;
use tower_throttle::waited::{WaitCause, Waited};
use tower_throttle::{Registry, RetryAfterLayer, ScopeConfig, Scopes, ThrottleLayer};

const MS: Duration = Duration::from_millis(1);

/// No delay, no jitter, lanes to spare: every wait a test sees is the one
/// it sets up.
fn plain() -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(8)
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
}

/// An inner service that answers after the latency in the request's
/// `x-latency-ms` header (0 without), with the status in `x-status`
/// (200 without) and a `Retry-After` of `x-retry-after` when given.
fn answering() -> impl Service<
    http::Request<()>,
    Response = http::Response<()>,
    Error = Infallible,
    Future = impl std::future::Future<Output = Result<http::Response<()>, Infallible>> + Send,
> + Clone
       + Send {
    tower::service_fn(|request: http::Request<()>| async move {
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let latency = header("x-latency-ms").map_or(0, |ms| ms.parse().unwrap());
        sleep(Duration::from_millis(latency)).await;
        let mut response =
            http::Response::builder().status(header("x-status").map_or(200, |s| s.parse().unwrap()));
        if let Some(seconds) = header("x-retry-after") {
            response = response.header("retry-after", seconds);
        }
        // `x-respond-<name>: <value>` asks for a `<name>: <value>` header.
        for (name, value) in request.headers() {
            if let Some(name) = name.as_str().strip_prefix("x-respond-") {
                response = response.header(name, value.clone());
            }
        }
        Ok::<_, Infallible>(response.body(()).unwrap())
    })
}

fn get(uri: &str) -> http::Request<()> {
    http::Request::get(uri).body(()).unwrap()
}

/// Sends `request` and drops its response as it comes: its lane and permit
/// are free at once.
async fn send_and_drop<S: Service<http::Request<()>>>(
    client: S,
    request: http::Request<()>,
) -> Result<(), S::Error> {
    client.oneshot(request).await.map(drop)
}

fn slow_get(uri: &str, latency_ms: u64) -> http::Request<()> {
    http::Request::get(uri)
        .header("x-latency-ms", latency_ms.to_string())
        .body(())
        .unwrap()
}

/// Sends one quick request through `client`, then lets `delay` pass: the
/// scope is warm (a cold scope times its second gap from its first
/// answer, not its first send) and free.
async fn warm<S, B>(client: &S, uri: &str, delay: Duration)
where
    S: Service<http::Request<()>, Response = http::Response<B>> + Clone,
    B: Send + 'static,
    S::Error: std::fmt::Debug,
{
    client.clone().oneshot(get(uri)).await.unwrap();
    sleep(delay).await;
}

fn parts(waited: &Waited) -> Vec<(WaitCause, Option<LimitSource>, Duration)> {
    waited.causes().collect()
}

#[tokio::test(start_paused = true)]
async fn a_request_sent_at_once_carries_no_record_and_reads_as_no_wait() {
    let registry = Registry::builder().default_scope(plain()).build().unwrap();
    let client = ThrottleLayer::new(registry).layer(answering());
    let response = client.oneshot(get("http://a.test/")).await.unwrap();
    assert!(response.extensions().get::<Waited>().is_none());
    let waited = Waited::from_extensions(response.extensions());
    assert_eq!(waited.total(), Duration::ZERO);
    assert_eq!(waited.causes().count(), 0);
    assert_eq!(waited.attempts(), 1);
}

#[tokio::test(start_paused = true)]
async fn one_scope_with_a_delay_of_one_second_the_second_request_waits_one_second_of_config_delay() {
    let registry = Registry::builder()
        .default_scope(plain().delay(Duration::from_secs(1)))
        .build()
        .unwrap();
    let client = ThrottleLayer::new(registry).layer(answering());
    let start = Instant::now();
    // Each response gives its record and is dropped: its lane is free.
    let waited_for = |uri| {
        let client = client.clone();
        async move {
            client
                .oneshot(get(uri))
                .await
                .map(|response| Waited::from_extensions(response.extensions()))
        }
    };
    let (first, second) = join(waited_for("http://a.test/1"), waited_for("http://a.test/2")).await;
    assert_eq!(first.unwrap().total(), Duration::ZERO);
    let waited = second.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(waited.total(), Duration::from_secs(1));
    assert_eq!(
        parts(&waited),
        [(
            WaitCause::Delay,
            Some(LimitSource::Config),
            Duration::from_secs(1)
        )]
    );
}

#[tokio::test(start_paused = true)]
async fn a_429_with_retry_after_5_holds_the_next_request_5_seconds() {
    let registry = Registry::builder().default_scope(plain()).build().unwrap();
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(RetryAfterLayer::new(registry))
        .service(answering());
    let refused = http::Request::get("http://a.test/1")
        .header("x-status", "429")
        .header("x-retry-after", "5")
        .body(())
        .unwrap();
    let response = client.clone().oneshot(refused).await.unwrap();
    assert_eq!(response.status(), 429);
    let waited = Waited::from_extensions(client.oneshot(get("http://a.test/2")).await.unwrap().extensions());
    assert_eq!(waited.total(), Duration::from_secs(5));
    assert_eq!(
        parts(&waited),
        [(WaitCause::Hold, Some(LimitSource::Hold), Duration::from_secs(5))]
    );
}

#[tokio::test(start_paused = true)]
async fn lanes_busy_for_300_ms_then_the_delay_left_of_200_ms() {
    // One lane, 500 ms between sends: the first request holds the lane for
    // 300 ms, and the delay since its send runs 200 ms more.
    let registry = Registry::builder()
        .default_scope(plain().concurrency(1).delay(500 * MS))
        .build()
        .unwrap();
    let client = ThrottleLayer::new(registry).layer(answering());
    warm(&client, "http://a.test/", 500 * MS).await;
    // The first response is dropped as it comes: its lane and permit free.
    let (_, second) = join(
        send_and_drop(client.clone(), slow_get("http://a.test/1", 300)),
        client.clone().oneshot(get("http://a.test/2")),
    )
    .await;
    let waited = Waited::from_extensions(second.unwrap().extensions());
    assert_eq!(
        parts(&waited),
        [
            (WaitCause::Lanes, Some(LimitSource::Config), 300 * MS),
            (WaitCause::Delay, Some(LimitSource::Config), 200 * MS),
        ]
    );
    assert_eq!(waited.total(), 500 * MS);
    // The time on one cause, without summing the parts by hand.
    assert_eq!(waited.of_cause(WaitCause::Lanes), 300 * MS);
    assert_eq!(waited.of_cause(WaitCause::Delay), 200 * MS);
    assert_eq!(waited.of_cause(WaitCause::Hold), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_multi_scope_request_held_by_its_second_scope_is_attributed_to_that_scopes_cause() {
    let registry = Registry::builder()
        .default_scope(plain())
        .scope("slow", plain().delay(Duration::from_secs(2)))
        .build()
        .unwrap();
    let client = ThrottleLayer::new(registry).layer(answering());
    let with_scopes = |scopes: &[&str]| {
        let mut request = get("http://a.test/");
        request.extensions_mut().insert(Scopes::from(scopes.to_vec()));
        request
    };
    client.clone().oneshot(with_scopes(&["slow"])).await.unwrap();
    let waited = Waited::from_extensions(
        client
            .oneshot(with_scopes(&["fast", "slow"]))
            .await
            .unwrap()
            .extensions(),
    );
    assert_eq!(
        parts(&waited),
        [(
            WaitCause::Delay,
            Some(LimitSource::Config),
            Duration::from_secs(2)
        )]
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_behind_a_full_global_limit_waits_on_global_concurrency() {
    let registry = Registry::builder()
        .max_concurrency(1)
        .default_scope(plain())
        .build()
        .unwrap();
    let client = ThrottleLayer::new(registry).layer(answering());
    // The first response is dropped as it comes: its lane and permit free.
    let (_, second) = join(
        send_and_drop(client.clone(), slow_get("http://a.test/", 700)),
        client.clone().oneshot(get("http://b.test/")),
    )
    .await;
    assert_eq!(
        parts(&Waited::from_extensions(second.unwrap().extensions())),
        [(
            WaitCause::GlobalConcurrency,
            Some(LimitSource::MaxConcurrency),
            700 * MS
        )]
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_without_a_queue_place_waits_on_the_queue_then_on_its_scope() {
    // One queue place, one request per second. The first is sent at once;
    // the second takes the place and waits until 1 s; the third waits for
    // the place until then, and then for the delay until 2 s.
    let registry = Registry::builder()
        .max_queued(1)
        .default_scope(plain().concurrency(1).delay(Duration::from_secs(1)))
        .build()
        .unwrap();
    let client = ThrottleLayer::new(registry).layer(answering());
    warm(&client, "http://a.test/", Duration::from_secs(1)).await;
    let start = Instant::now();
    // The spawned requests drop their responses: their lanes are free.
    let send = |request| {
        let client = client.clone();
        tokio::spawn(async move { client.oneshot(request).await.map(drop) })
    };
    let first = send(slow_get("http://a.test/1", 100));
    tokio::task::yield_now().await;
    let second = send(get("http://a.test/2"));
    tokio::task::yield_now().await;
    let third = client.clone().oneshot(get("http://a.test/3")).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    let waited = Waited::from_extensions(third.extensions());
    assert_eq!(
        parts(&waited),
        [
            (WaitCause::Queue, None, Duration::from_secs(1)),
            (
                WaitCause::Delay,
                Some(LimitSource::Config),
                Duration::from_secs(1)
            ),
        ]
    );
    assert_eq!(waited.total(), Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn a_quota_spent_holds_the_next_request_until_its_window_ends() {
    let registry = Registry::builder()
        .default_scope(plain().quota(1.0).window(Duration::from_secs(10)))
        .build()
        .unwrap();
    let client = ThrottleLayer::new(registry).layer(answering());
    client.clone().oneshot(get("http://a.test/1")).await.unwrap();
    sleep(Duration::from_secs(4)).await;
    let waited = Waited::from_extensions(client.oneshot(get("http://a.test/2")).await.unwrap().extensions());
    assert_eq!(
        parts(&waited),
        [(WaitCause::Quota, Some(LimitSource::Quota), Duration::from_secs(6))]
    );
}

#[tokio::test(start_paused = true)]
async fn the_fifth_request_behind_a_delay_waits_on_the_delay_for_all_four_gaps() {
    let registry = Registry::builder()
        .default_scope(plain().concurrency(1).delay(Duration::from_secs(1)))
        .build()
        .unwrap();
    let client = ThrottleLayer::new(registry).layer(answering());
    // Each response gives its record and is dropped: its lane is free.
    let records = futures::future::join_all((0..5).map(|i| {
        let client = client.clone();
        async move {
            let response = client.oneshot(get(&format!("http://a.test/{i}"))).await;
            Waited::from_extensions(response.unwrap().extensions())
        }
    }))
    .await;
    let totals: Vec<Duration> = records.iter().map(Waited::total).collect();
    assert_eq!(totals, (0..5).map(Duration::from_secs).collect::<Vec<_>>());
    let last = &records[4];
    assert_eq!(
        parts(last),
        [(
            WaitCause::Delay,
            Some(LimitSource::Config),
            Duration::from_secs(4)
        )]
    );
}

#[tokio::test(start_paused = true)]
async fn a_retried_request_tells_its_attempts_and_the_time_of_the_earlier_ones() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tower::retry::RetryLayer;
    use tower_throttle::BackoffLayer;

    let registry = Registry::builder().default_scope(plain()).build().unwrap();
    let backoff = BackoffLayer::new(registry.clone());
    let calls = Arc::new(AtomicUsize::new(0));
    // The first attempt is answered after 100 ms with a 429 and
    // `Retry-After: 2`; the second at once with a 200.
    let inner = tower::service_fn(move |_request: http::Request<()>| {
        let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            if first {
                sleep(100 * MS).await;
                let response = http::Response::builder().status(429).header("retry-after", "2");
                return Ok::<_, Infallible>(response.body(()).unwrap());
            }
            Ok(http::Response::new(()))
        }
    });
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(backoff.retry_policy(3)))
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(RetryAfterLayer::new(registry))
        .layer(backoff)
        .service(inner);
    let response = client.oneshot(get("http://a.test/")).await.unwrap();
    assert_eq!(response.status(), 200);
    let waited = Waited::from_extensions(response.extensions());
    assert_eq!(waited.attempts(), 2);
    assert_eq!(waited.earlier_attempts(), 100 * MS);
    // The last attempt waited for the hold the 429 set, from its answer.
    assert_eq!(
        parts(&waited),
        [(WaitCause::Hold, Some(LimitSource::Hold), Duration::from_secs(2))]
    );
}

#[tokio::test(start_paused = true)]
async fn a_cold_scope_waits_for_its_first_answer_then_for_the_delay() {
    // A cold scope times its second gap from its first answer (the first
    // request pays for the connection after its send). Delay 100 ms, first
    // answer at 300 ms: the delay from the first send holds the second
    // request until 100 ms, then it waits for that answer (200 ms), then
    // for the delay from the answer (100 ms more).
    let registry = Registry::builder()
        .default_scope(plain().delay(100 * MS))
        .build()
        .unwrap();
    let client = ThrottleLayer::new(registry).layer(answering());
    // The first response is dropped as it comes: its lane and permit free.
    let (_, second) = join(
        send_and_drop(client.clone(), slow_get("http://a.test/1", 300)),
        client.clone().oneshot(get("http://a.test/2")),
    )
    .await;
    assert_eq!(
        parts(&Waited::from_extensions(second.unwrap().extensions())),
        [
            (WaitCause::Delay, Some(LimitSource::Config), 200 * MS),
            (WaitCause::Departure, None, 200 * MS),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn pacing_to_an_announced_policy_is_its_own_cause() {
    let registry = Registry::builder().default_scope(plain()).build().unwrap();
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(RetryAfterLayer::new(registry.clone()).pace_to_policy(true))
        .service(answering());
    // 720 requests an hour: one every 5 s.
    let announcing = http::Request::get("http://api.test/1")
        .header("x-respond-ratelimit-policy", "\"hourly\";q=720;w=3600")
        .body(())
        .unwrap();
    client.clone().oneshot(announcing).await.unwrap();
    let pacing = registry
        .scope_stats("api.test")
        .unwrap()
        .pacing_delay
        .expect("paced");
    let waited = Waited::from_extensions(
        client
            .oneshot(get("http://api.test/2"))
            .await
            .unwrap()
            .extensions(),
    );
    assert_eq!(
        parts(&waited),
        [(WaitCause::Pacing, Some(LimitSource::RateLimitPolicy), pacing)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_worker_held_by_the_fleets_store_waits_on_the_store() {
    use tower_throttle::store::MemoryStore;
    // Two workers, one store, one send a second between them: the second
    // worker's scopes admit it at once, the store makes it wait.
    let store = MemoryStore::new();
    let worker = || {
        let registry = Registry::builder()
            .default_scope(plain().concurrency(1).delay(Duration::from_secs(1)))
            .store(store.clone())
            .build()
            .unwrap();
        ThrottleLayer::new(registry).store_errors().layer(answering())
    };
    let (one, two) = (worker(), worker());
    one.oneshot(get("http://site.test/1")).await.unwrap();
    let waited = Waited::from_extensions(two.oneshot(get("http://site.test/2")).await.unwrap().extensions());
    assert_eq!(waited.total(), Duration::from_secs(1));
    assert_eq!(
        parts(&waited),
        [(WaitCause::Store, Some(LimitSource::Fleet), Duration::from_secs(1))]
    );
}

#[tokio::test(start_paused = true)]
async fn requests_pass_a_waiter_another_scope_holds_without_waiting() {
    // `x` needs scopes `a` and `b`; `b` just sent and has a 1 s delay.
    // Requests for `a` alone pass `x`, as many as come, while `b` holds it
    // (it could not go anyway): none of them waits.
    let registry = Registry::builder()
        .default_scope(plain().concurrency(64))
        .scope("b", plain().concurrency(1).delay(Duration::from_secs(1)))
        .build()
        .unwrap();
    let client = ThrottleLayer::new(registry).layer(answering());
    let with_scopes = |scopes: &[&str]| {
        let mut request = get("http://a.test/");
        request.extensions_mut().insert(Scopes::from(scopes.to_vec()));
        request
    };
    client.clone().oneshot(with_scopes(&["b"])).await.unwrap();
    let x = tokio::spawn(client.clone().oneshot(with_scopes(&["a", "b"])));
    tokio::task::yield_now().await;
    // Each response gives its wait and is dropped: its lane and permit
    // are free.
    let passing: Vec<_> = (0..40)
        .map(|_| {
            let client = client.clone();
            let request = with_scopes(&["a"]);
            async move {
                let response = client.oneshot(request).await.unwrap();
                Waited::from_extensions(response.extensions()).total()
            }
        })
        .collect();
    let waits: Vec<Duration> = futures::future::join_all(passing).await;
    assert_eq!(waits, [Duration::ZERO; 40]);
    // `x` itself waited on `b`'s delay.
    assert_eq!(
        parts(&Waited::from_extensions(x.await.unwrap().unwrap().extensions())),
        [(
            WaitCause::Delay,
            Some(LimitSource::Config),
            Duration::from_secs(1)
        )]
    );
}
