//! Backoff steps, recovery, rampup and the retry policy, in paused virtual
//! time with in-process services, so instants are exact.

mod support;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_throttle::throttle::ThrottledBody;

use futures::future::join_all;
use support::{duplex_service, full_request, full_status, get};
use tokio::time::Instant;
use tower::retry::RetryLayer;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_throttle::backoff::TryCloneBody;
use tower_throttle::registry::{BackoffConfig, Feedback, LimitSource, RampupConfig};
use tower_throttle::{BackoffLayer, Registry, ScopeConfig, ThrottleLayer};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// No delay, no jitter, and backoff without jitter: exact instants.
fn exact(concurrency: u32) -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(concurrency)
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
        .backoff(BackoffConfig::default().jitter(0.0))
}

/// Answers each call with the next scripted status (200 once the script is
/// exhausted) and records when each call came.
#[derive(Clone)]
struct Scripted {
    statuses: Arc<Mutex<VecDeque<u16>>>,
    sent: Arc<Mutex<Vec<Duration>>>,
    start: Instant,
}

impl Scripted {
    fn new(statuses: impl IntoIterator<Item = u16>) -> Self {
        Scripted {
            statuses: Arc::new(Mutex::new(statuses.into_iter().collect())),
            sent: Arc::default(),
            start: Instant::now(),
        }
    }

    fn sent(&self) -> Vec<Duration> {
        self.sent.lock().unwrap().clone()
    }
}

impl<B> Service<http::Request<B>> for Scripted {
    type Response = http::Response<()>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<http::Response<()>, Infallible>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: http::Request<B>) -> Self::Future {
        self.sent.lock().unwrap().push(self.start.elapsed());
        let code = self.statuses.lock().unwrap().pop_front().unwrap_or(200);
        let response = http::Response::builder().status(code).body(()).unwrap();
        std::future::ready(Ok(response))
    }
}

fn client(
    registry: &Registry,
    inner: Scripted,
) -> impl Service<
    http::Request<()>,
    Response = http::Response<ThrottledBody<()>>,
    Error = Infallible,
    Future: Send,
> + Clone {
    ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(BackoffLayer::new(registry.clone()))
        .service(inner)
}

async fn send_all<S, B>(service: &mut S, count: usize)
where
    S: Service<http::Request<()>, Response = http::Response<B>, Error = Infallible>,
    B: Send + 'static,
    S::Future: Send + 'static,
{
    let mut handles = Vec::new();
    for i in 0..count {
        service.ready().await.unwrap();
        handles.push(tokio::spawn(support::dropped(
            service.call(get(&format!("https://site.example/{i}"))),
        )));
    }
    for handle in join_all(handles).await {
        handle.unwrap().unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn three_429s_at_once_set_the_delay_to_1_then_2_then_4_seconds() {
    let registry = Registry::builder().default_scope(exact(3)).build().unwrap();
    let inner = Scripted::new([429, 429, 429]);
    let mut service = client(&registry, inner.clone());
    send_all(&mut service, 3).await;
    let stats = registry.scope_stats("site.example").unwrap();
    assert_eq!(inner.sent(), vec![Duration::ZERO; 3], "all three went at t=0");
    assert_eq!((stats.backoff_level, stats.backoff_delay), (3, Some(secs(4))));
    assert_eq!(
        (stats.delay, stats.delay_limited_by),
        (secs(4), LimitSource::Backoff)
    );
    assert_eq!(stats.backoff_feedbacks, 3);
    // Concurrency 3 halves per step with a floor of 1.
    assert_eq!(
        (stats.concurrency, stats.concurrency_limited_by),
        (1, LimitSource::Backoff)
    );
    // The next request waits the backed-off delay.
    send_all(&mut service, 1).await;
    assert_eq!(inner.sent()[3], secs(4));
}

#[tokio::test(start_paused = true)]
async fn consecutive_429s_step_the_delay_between_sends() {
    let registry = Registry::builder().default_scope(exact(1)).build().unwrap();
    let inner = Scripted::new([429, 429, 429]);
    let mut service = client(&registry, inner.clone());
    send_all(&mut service, 4).await;
    // Sent at 0; 429 → 1 s; sent at 1; 429 → 2 s; sent at 3; 429 → 4 s; sent at 7.
    assert_eq!(inner.sent(), vec![secs(0), secs(1), secs(3), secs(7)]);
}

#[tokio::test(start_paused = true)]
async fn factor_10_with_max_5_caps_the_delay_at_5_seconds() {
    let config = exact(1).delay(secs(1)).backoff(
        BackoffConfig::default()
            .jitter(0.0)
            .delay_factor(10.0)
            .max_delay(secs(5)),
    );
    let registry = Registry::builder().default_scope(config).build().unwrap();
    let mut service = client(&registry, Scripted::new([429]));
    send_all(&mut service, 1).await;
    assert_eq!(
        registry.scope_stats("site.example").unwrap().backoff_delay,
        Some(secs(5))
    );
}

#[tokio::test(start_paused = true)]
async fn per_scope_min_5_and_factor_3_give_5_then_15_seconds() {
    let registry = Registry::builder()
        .default_scope(exact(1))
        .scope(
            "site.example",
            exact(1).backoff(
                BackoffConfig::default()
                    .jitter(0.0)
                    .min_delay(secs(5))
                    .delay_factor(3.0),
            ),
        )
        .build()
        .unwrap();
    let inner = Scripted::new([429, 429]);
    let mut service = client(&registry, inner.clone());
    send_all(&mut service, 1).await;
    assert_eq!(
        registry.scope_stats("site.example").unwrap().backoff_delay,
        Some(secs(5))
    );
    send_all(&mut service, 1).await;
    assert_eq!(
        registry.scope_stats("site.example").unwrap().backoff_delay,
        Some(secs(15))
    );
    assert_eq!(inner.sent(), vec![secs(0), secs(5)]);
    // Another scope keeps the default backoff.
    assert_eq!(registry.scope_config("other.example"), exact(1));
}

#[tokio::test(start_paused = true)]
async fn quiet_windows_step_back_once_then_return_to_the_configured_limits() {
    let registry = Registry::builder().default_scope(exact(8)).build().unwrap();
    let mut service = client(&registry, Scripted::new([429, 429]));
    send_all(&mut service, 2).await;
    let start = Instant::now();
    let at = |offset: u64| {
        let registry = registry.clone();
        async move {
            tokio::time::sleep_until(start + secs(offset)).await;
            let stats = registry.scope_stats("site.example").unwrap();
            (stats.backoff_level, stats.delay, stats.concurrency)
        }
    };
    // Two steps: delay 1 s then 2 s, concurrency 8 → 4 → 2.
    assert_eq!(at(0).await, (2, secs(2), 2));
    assert_eq!(at(59).await, (2, secs(2), 2));
    assert_eq!(
        at(60).await,
        (1, secs(1), 4),
        "one step back after a quiet window"
    );
    assert_eq!(at(119).await, (1, secs(1), 4));
    let back = at(120).await;
    assert_eq!(
        back,
        (0, Duration::ZERO, 8),
        "configured limits after the second window"
    );
    assert_eq!(
        registry.scope_stats("site.example").unwrap().delay_limited_by,
        LimitSource::Config
    );
}

#[tokio::test(start_paused = true)]
async fn a_success_during_a_window_does_not_end_it_early() {
    let registry = Registry::builder().default_scope(exact(1)).build().unwrap();
    let inner = Scripted::new([429, 200]);
    let mut service = client(&registry, inner.clone());
    send_all(&mut service, 1).await;
    tokio::time::sleep(secs(30)).await;
    send_all(&mut service, 1).await;
    tokio::time::sleep(secs(29)).await;
    assert_eq!(
        registry.scope_stats("site.example").unwrap().backoff_level,
        1,
        "still backing off at 59 s"
    );
    tokio::time::sleep(secs(1)).await;
    assert_eq!(
        registry.scope_stats("site.example").unwrap().backoff_level,
        0,
        "recovered at 60 s"
    );
}

#[tokio::test(start_paused = true)]
async fn jitter_while_backing_off_stays_within_ten_percent() {
    // A long window keeps the backoff in force for the whole test.
    let config = ScopeConfig::default()
        .concurrency(1)
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.5)
        .backoff(BackoffConfig::default().min_delay(secs(10)).window(secs(100_000)));
    let registry = Registry::builder()
        .default_scope(config)
        .jitter_seed(5)
        .build()
        .unwrap();
    let inner = Scripted::new([429]);
    let mut service = client(&registry, inner.clone());
    send_all(&mut service, 200).await;
    let sent = inner.sent();
    let gaps: Vec<Duration> = sent.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.iter()
            .all(|gap| *gap >= secs(9) && *gap <= Duration::from_millis(11_001)),
        "{gaps:?}"
    );
    // Not all the same: jitter is drawn per send.
    assert!(gaps.iter().any(|gap| *gap != gaps[0]));
}

#[tokio::test(start_paused = true)]
async fn errors_that_signal_overload_are_backoff_feedback_and_still_reach_the_caller() {
    let registry = Registry::builder().default_scope(exact(1)).build().unwrap();
    let failing = tower::service_fn(|_request: http::Request<()>| async {
        Err::<http::Response<()>, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
    });
    let service = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(BackoffLayer::new(registry.clone()))
        .service(failing);
    let error = service.oneshot(get("https://down.example/")).await.unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionRefused);
    assert_eq!(registry.scope_stats("down.example").unwrap().backoff_level, 1);
}

#[tokio::test(start_paused = true)]
async fn a_custom_hook_reads_the_upstream_status_and_the_actual_cost() {
    let registry = Registry::builder().default_scope(exact(1)).build().unwrap();
    let api = tower::service_fn(|_request: http::Request<()>| async {
        let response = http::Response::builder()
            .header("X-Upstream-Status-Code", "503")
            .header("X-Actual-Cost", "2.5")
            .body(())
            .unwrap();
        Ok::<_, Infallible>(response)
    });
    let layer = BackoffLayer::new(registry.clone()).on_response(|head, config| {
        let upstream = head.headers["X-Upstream-Status-Code"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let cost = head.headers["X-Actual-Cost"].to_str().unwrap().parse().unwrap();
        let feedback = if config.is_backoff_status(upstream) {
            tower_throttle::registry::Feedback::backoff()
        } else {
            tower_throttle::registry::Feedback::success()
        };
        feedback.with_actual_cost(cost)
    });
    let service = ThrottleLayer::new(registry.clone()).layer(layer.layer(api));
    service.oneshot(get("https://api.example/")).await.unwrap();
    let stats = registry.scope_stats("api.example").unwrap();
    assert_eq!((stats.backoff_level, stats.reported_cost), (1, 2.5));
}

#[tokio::test(start_paused = true)]
async fn retries_go_through_the_throttle_and_wait_for_the_backed_off_delay() {
    let registry = Registry::builder().default_scope(exact(1)).build().unwrap();
    let inner = Scripted::new([503]);
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(
            BackoffLayer::new(registry.clone()).retry_policy(3),
        ))
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(BackoffLayer::new(registry.clone()))
        .service(inner.clone());
    let request = http::Request::get("https://site.example/")
        .body(String::from("payload"))
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    // The 503 set a 1 s backoff delay; the retry waited for it.
    assert_eq!(inner.sent(), vec![secs(0), secs(1)]);
}

#[tokio::test(start_paused = true)]
async fn retries_are_bounded() {
    let registry = Registry::builder().default_scope(exact(1)).build().unwrap();
    let inner = Scripted::new([503; 10]);
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(
            BackoffLayer::new(registry.clone()).retry_policy(2),
        ))
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(BackoffLayer::new(registry.clone()))
        .service(inner.clone());
    let request = http::Request::get("https://site.example/")
        .body(String::new())
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 503, "the last answer reaches the caller");
    // Three attempts, each after the growing backoff delay: 0, 1 s, 1 + 2 s.
    assert_eq!(inner.sent(), vec![secs(0), secs(1), secs(3)]);
}

/// A body that cannot be replayed, like a stream.
#[derive(Debug)]
struct Streamed;

impl TryCloneBody for Streamed {
    fn try_clone_body(&self) -> Option<Self> {
        None
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_body_cannot_be_copied_is_not_retried() {
    let registry = Registry::builder().default_scope(exact(1)).build().unwrap();
    let inner = Scripted::new([503]);
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(
            BackoffLayer::new(registry.clone()).retry_policy(3),
        ))
        .layer(ThrottleLayer::new(registry.clone()))
        .service(inner.clone());
    let request = http::Request::get("https://site.example/")
        .body(Streamed)
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(inner.sent().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn steps_up_and_down_are_traced() {
    let captured = support::captured_events(tracing::Level::DEBUG);
    let registry = Registry::builder().default_scope(exact(1)).build().unwrap();
    let mut service = client(&registry, Scripted::new([429]));
    // Its own host, so other tests' events cannot satisfy the assertions.
    let traced = |path: &str| get(&format!("https://traced.example/{path}"));
    service.ready().await.unwrap();
    service.call(traced("first")).await.unwrap();
    tokio::time::sleep(secs(61)).await;
    service.ready().await.unwrap();
    service.call(traced("second")).await.unwrap();
    let log = captured.lock().unwrap().join("");
    let ours = |message: &str| {
        log.lines()
            .any(|line| line.contains(message) && line.contains("scope=traced.example"))
    };
    assert!(ours("backoff step up"), "{log}");
    assert!(ours("backoff step down"), "{log}");
}

/// A server (real hyper, over an in-memory pipe) that answers 429 to any
/// request sooner than `1 / rate` after the last one it accepted, and
/// counts what it accepted and rejected per minute.
#[derive(Clone)]
struct RateLimitedSite {
    interval: Duration,
    start: Instant,
    state: Arc<Mutex<SiteState>>,
}

#[derive(Default)]
struct SiteState {
    last_accepted: Option<Instant>,
    /// (accepted, rejected) per minute.
    per_minute: Vec<(u32, u32)>,
}

impl RateLimitedSite {
    fn new(rate: f64) -> Self {
        RateLimitedSite {
            interval: Duration::from_secs_f64(1.0 / rate),
            start: Instant::now(),
            state: Arc::default(),
        }
    }

    fn answer(&self) -> u16 {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap();
        let minute = ((now - self.start).as_secs() / 60) as usize;
        if state.per_minute.len() <= minute {
            state.per_minute.resize(minute + 1, (0, 0));
        }
        if state.last_accepted.is_some_and(|last| now - last < self.interval) {
            state.per_minute[minute].1 += 1;
            429
        } else {
            state.last_accepted = Some(now);
            state.per_minute[minute].0 += 1;
            200
        }
    }

    /// (accepted, rejected) per minute.
    fn per_minute(&self) -> Vec<(u32, u32)> {
        self.state.lock().unwrap().per_minute.clone()
    }
}

/// Keeps the scope busy for `minutes` of virtual time.
async fn crawl<S>(service: &mut S, minutes: u64)
where
    S: Service<http::Request<http_body_util::Full<hyper::body::Bytes>>>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + std::fmt::Debug + 'static,
{
    let end = Instant::now() + secs(60 * minutes);
    let mut handles = Vec::new();
    while Instant::now() < end {
        service.ready().await.unwrap();
        handles.push(tokio::spawn(support::dropped(
            service.call(full_request("http://api.example/")),
        )));
        if handles.len() >= 64 {
            // Keep a bounded backlog: wait for the oldest.
            handles.remove(0).await.unwrap().unwrap();
        }
    }
    for handle in handles {
        handle.await.unwrap().unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn without_rampup_a_rate_limited_crawl_backs_off_and_recovers() {
    let site = RateLimitedSite::new(20.0);
    let handler_site = site.clone();
    let server = duplex_service(move |_request| {
        let code = handler_site.answer();
        async move { full_status(code) }
    });
    let registry = Registry::builder().default_scope(exact(1)).build().unwrap();
    let mut service = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(BackoffLayer::new(registry.clone()))
        .service(server);
    crawl(&mut service, 5).await;
    let stats = registry.scope_stats("api.example").unwrap();
    assert!(stats.backoff_feedbacks >= 1, "the crawl hit the limit");
    let per_minute = site.per_minute();
    let rejected: u32 = per_minute.iter().map(|m| m.1).sum();
    let accepted: u32 = per_minute.iter().map(|m| m.0).sum();
    // Backing off keeps rejections rare: the scope slows to 1 s and only
    // returns to full speed after a quiet window.
    assert!(rejected * 20 <= accepted, "{per_minute:?}");
    tokio::time::sleep(secs(180)).await;
    let stats = registry.scope_stats("api.example").unwrap();
    assert_eq!(
        (stats.backoff_level, stats.delay_limited_by),
        (0, LimitSource::Config),
        "recovered"
    );
}

#[tokio::test(start_paused = true)]
async fn with_rampup_a_rate_limited_crawl_settles_near_the_server_rate() {
    let rate = 20.0;
    let site = RateLimitedSite::new(rate);
    let handler_site = site.clone();
    let server = duplex_service(move |_request| {
        let code = handler_site.answer();
        async move { full_status(code) }
    });
    let registry = Registry::builder()
        .default_scope(exact(1).delay(secs(1)).rampup(RampupConfig::default()))
        .build()
        .unwrap();
    let mut service = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(BackoffLayer::new(registry.clone()))
        .service(server);
    crawl(&mut service, 30).await;
    let per_minute = site.per_minute();
    // Settled: the last 15 minutes.
    let settled = &per_minute[15..30];
    let accepted: u32 = settled.iter().map(|m| m.0).sum();
    let rejected: u32 = settled.iter().map(|m| m.1).sum();
    let served_rate = f64::from(accepted) / (15.0 * 60.0);
    eprintln!("rampup per minute (accepted, rejected): {per_minute:?}; settled rate {served_rate:.2}/s");
    assert!(served_rate >= 0.9 * rate, "served {served_rate:.2}/s of {rate}/s");
    assert!(f64::from(rejected) <= 0.02 * f64::from(accepted + rejected));
    assert!(
        settled.iter().all(|m| m.1 <= 1),
        "backoffs per window within the target: {settled:?}"
    );
    let stats = registry.scope_stats("api.example").unwrap();
    assert_eq!(stats.delay_limited_by, LimitSource::Rampup);
    assert!(stats.rampup_windows >= 29);
}

/// 30 virtual minutes against a server accepting 20 requests/s: (accepted,
/// rejected) per minute, and the registry.
async fn rate_limited_crawl(scope: ScopeConfig) -> (Vec<(u32, u32)>, Registry) {
    let site = RateLimitedSite::new(20.0);
    let handler_site = site.clone();
    let server = duplex_service(move |_request| {
        let code = handler_site.answer();
        async move { full_status(code) }
    });
    let registry = Registry::builder().default_scope(scope).build().unwrap();
    let mut service = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(BackoffLayer::new(registry.clone()))
        .service(server);
    crawl(&mut service, 30).await;
    (site.per_minute(), registry)
}

/// The rampup search as a scope manager (`registry::manager::Rampup`)
/// takes exactly the steps the built-in rampup takes.
#[tokio::test(start_paused = true)]
async fn the_rampup_manager_finds_the_server_rate_exactly_as_the_built_in_rampup() {
    let manager =
        |_scope: &tower_throttle::Scope| -> Box<dyn tower_throttle::registry::manager::ScopeManager> {
            Box::new(tower_throttle::registry::manager::Rampup::new(
                RampupConfig::default(),
            ))
        };
    let (built_in, _) = rate_limited_crawl(exact(1).delay(secs(1)).rampup(RampupConfig::default())).await;
    let (managed, registry) = rate_limited_crawl(exact(1).delay(secs(1)).manager(manager)).await;
    assert_eq!(managed, built_in, "(accepted, rejected) per minute");
    let accepted: u32 = managed[15..30].iter().map(|minute| minute.0).sum();
    assert!(f64::from(accepted) / (15.0 * 60.0) >= 18.0, "{managed:?}");
    let stats = registry.scope_stats("api.example").unwrap();
    assert_eq!(
        (stats.manager.as_ref(), stats.delay_limited_by),
        ("rampup", LimitSource::Manager)
    );
    assert!(
        stats.delay < secs(1),
        "paced faster than the configured delay: {:?}",
        stats.delay
    );
}

/// A scraping API: the HTTP status is always 200, the target site's status
/// is in `X-Upstream-Status-Code`. Answers each call with the next scripted
/// upstream status (200 once exhausted) and records when each call came.
fn scraping_api(
    upstream: impl IntoIterator<Item = u16>,
    status: u16,
    sent: &Arc<Mutex<Vec<Duration>>>,
) -> impl Service<http::Request<String>, Response = http::Response<()>, Error = Infallible, Future = impl Send>
       + Clone
       + Send {
    let script = Arc::new(Mutex::new(upstream.into_iter().collect::<VecDeque<u16>>()));
    let start = Instant::now();
    let calls = sent.clone();
    tower::service_fn(move |_request: http::Request<String>| {
        calls.lock().unwrap().push(start.elapsed());
        let upstream = script.lock().unwrap().pop_front().unwrap_or(200);
        let response = http::Response::builder()
            .status(status)
            .header("X-Upstream-Status-Code", upstream)
            .body(())
            .unwrap();
        std::future::ready(Ok::<_, Infallible>(response))
    })
}

fn upstream_status(head: &tower_throttle::backoff::ResponseHead<'_>, config: &BackoffConfig) -> Feedback {
    let upstream = head.headers["X-Upstream-Status-Code"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    if config.is_backoff_status(upstream) {
        Feedback::backoff()
    } else {
        Feedback::success()
    }
}

/// Retry → Throttle → Backoff judging by the upstream status, over `api`.
fn retrying_upstream_status_stack<S>(
    registry: &Registry,
    api: S,
) -> impl Service<http::Request<String>, Response = http::Response<ThrottledBody<()>>, Error = tower::BoxError>
where
    S: Service<http::Request<String>, Response = http::Response<()>, Error = Infallible> + Clone,
{
    ServiceBuilder::new()
        .layer(RetryLayer::new(
            BackoffLayer::new(registry.clone()).retry_policy(3),
        ))
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(BackoffLayer::new(registry.clone()).on_response(upstream_status))
        .service(api)
        .map_err(|never: Infallible| -> tower::BoxError { match never {} })
}

fn payload() -> http::Request<String> {
    http::Request::get("https://api.example/")
        .body(String::from("payload"))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_response_the_hook_calls_backoff_is_retried() {
    let registry = Registry::builder().default_scope(exact(1)).build().unwrap();
    let sent = Arc::default();
    let api = scraping_api([429], 200, &sent);
    let service = retrying_upstream_status_stack(&registry, api);
    let response = service.oneshot(payload()).await.unwrap();
    assert_eq!(response.headers()["X-Upstream-Status-Code"], "200");
    // The upstream 429 set a 1 s backoff delay; the retry waited for it.
    assert_eq!(*sent.lock().unwrap(), vec![secs(0), secs(1)]);
}

#[tokio::test(start_paused = true)]
async fn a_503_the_hook_exempts_is_not_retried() {
    let registry = Registry::builder().default_scope(exact(1)).build().unwrap();
    // HTTP 503 from the API, but the target site answered 200.
    let sent = Arc::default();
    let api = scraping_api([200, 200], 503, &sent);
    let service = retrying_upstream_status_stack(&registry, api);
    let response = service.oneshot(payload()).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(sent.lock().unwrap().len(), 1);
    assert_eq!(registry.scope_stats("api.example").unwrap().backoff_level, 0);
}

#[tokio::test(start_paused = true)]
async fn without_a_backoff_layer_the_retry_falls_back_to_the_scope_status_rule() {
    let registry = Registry::builder()
        .default_scope(exact(1).backoff(BackoffConfig::default().jitter(0.0).http_codes([418])))
        .build()
        .unwrap();
    let inner = Scripted::new([418, 503]);
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(
            BackoffLayer::new(registry.clone()).retry_policy(3),
        ))
        .layer(ThrottleLayer::new(registry.clone()))
        .service(inner.clone());
    let response = service.oneshot(payload()).await.unwrap();
    // 418 is in this scope's http_codes, 503 is not.
    assert_eq!(response.status(), 503);
    assert_eq!(inner.sent().len(), 2);
}

/// A body type the test treats as foreign: it does not implement
/// `TryCloneBody`.
#[derive(Debug, Clone, PartialEq)]
struct ForeignBody(&'static str);

#[tokio::test(start_paused = true)]
async fn a_body_cloning_closure_makes_a_foreign_body_retryable() {
    let registry = Registry::builder().default_scope(exact(1)).build().unwrap();
    let inner = Scripted::new([503]);
    let bodies: Arc<Mutex<Vec<ForeignBody>>> = Arc::default();
    let seen = bodies.clone();
    let recording = tower::service_fn(move |request: http::Request<ForeignBody>| {
        seen.lock().unwrap().push(request.body().clone());
        inner.clone().oneshot(request)
    });
    let policy = BackoffLayer::new(registry.clone())
        .retry_policy(3)
        .clone_body_with(|body: &ForeignBody| Some(body.clone()));
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(policy))
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(BackoffLayer::new(registry.clone()))
        .service(recording);
    let request = http::Request::get("https://site.example/")
        .body(ForeignBody("form"))
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        *bodies.lock().unwrap(),
        vec![ForeignBody("form"), ForeignBody("form")]
    );
}

/// An error no default rule knows.
#[derive(Debug)]
struct UpstreamBusy;

impl std::fmt::Display for UpstreamBusy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("upstream busy")
    }
}

impl std::error::Error for UpstreamBusy {}

#[tokio::test(start_paused = true)]
async fn the_layers_retry_policy_judges_errors_with_the_layers_hook() {
    let registry = Registry::builder().default_scope(exact(1)).build().unwrap();
    let calls: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let start = Instant::now();
    let seen = calls.clone();
    let flaky = tower::service_fn(move |_request: http::Request<String>| {
        let mut calls = seen.lock().unwrap();
        calls.push(start.elapsed());
        let result = match calls.len() {
            1 => Err(UpstreamBusy),
            _ => Ok(http::Response::new(())),
        };
        std::future::ready(result)
    });
    let backoff = BackoffLayer::new(registry.clone()).on_error(|error| {
        if error.downcast_ref::<UpstreamBusy>().is_some() {
            Feedback::backoff()
        } else {
            Feedback::success()
        }
    });
    // The default rule does not know this error: no retry.
    let plain = ServiceBuilder::new()
        .layer(RetryLayer::new(
            BackoffLayer::new(registry.clone()).retry_policy(3),
        ))
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(backoff.clone())
        .service(flaky.clone());
    assert!(plain.oneshot(payload()).await.is_err());
    // The layer's own policy shares its hook: retried after the backoff.
    calls.lock().unwrap().clear();
    let judged = ServiceBuilder::new()
        .layer(RetryLayer::new(backoff.retry_policy(3)))
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(backoff)
        .service(flaky);
    let retried_from = Instant::now();
    judged.oneshot(payload()).await.unwrap();
    assert_eq!(calls.lock().unwrap().len(), 2);
    assert!(
        retried_from.elapsed() >= secs(1),
        "the retry waited for the backoff delay"
    );
}
