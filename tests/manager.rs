//! Pluggable scope managers: which scopes run which manager, what managers
//! are told, how their answers limit a scope, and their life with
//! eviction. Paused virtual time, in-process services: instants are exact.

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_throttle::throttle::ThrottledBody;

use support::get;
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::registry::manager::{BaseLimits, ManagerFeedback, ManagerLimits, ScopeManager};
use tower_throttle::registry::{BackoffConfig, ErrorKind, Feedback, LimitSource, RampupConfig};
use tower_throttle::{BackoffLayer, Registry, ScopeConfig, Scopes, ThrottleLayer};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// No delay, no jitter, and backoff without jitter: exact instants.
fn exact() -> ScopeConfig {
    ScopeConfig::default()
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
        .backoff(BackoffConfig::default().jitter(0.0))
}

/// Adds `step` to the delay per backoff feedback, for good.
#[derive(Debug)]
struct Steps {
    name: String,
    step: Duration,
    backoffs: u32,
}

impl Steps {
    fn boxed(name: &str, step: Duration) -> Box<dyn ScopeManager> {
        Box::new(Steps {
            name: name.to_owned(),
            step,
            backoffs: 0,
        })
    }
}

impl ScopeManager for Steps {
    fn name(&self) -> &str {
        &self.name
    }

    fn on_feedback(&mut self, feedback: &ManagerFeedback) {
        if feedback.feedback().is_backoff() {
            self.backoffs += 1;
        }
    }

    fn limits(&self, _now: Instant, base: &BaseLimits) -> ManagerLimits {
        match self.backoffs {
            0 => ManagerLimits::none(),
            n => ManagerLimits::none().delay(base.delay() + self.step * n),
        }
    }
}

/// Answers the calls to each host with the statuses of the script in turn
/// (200 once it is exhausted) after `latency`, and records when each call
/// came.
#[derive(Clone)]
struct Scripted {
    script: Arc<Vec<u16>>,
    sent: Arc<Mutex<Vec<(String, Duration)>>>,
    latency: Duration,
    start: Instant,
}

impl Scripted {
    fn new(statuses: impl IntoIterator<Item = u16>) -> Self {
        Scripted {
            script: Arc::new(statuses.into_iter().collect()),
            sent: Arc::default(),
            latency: Duration::ZERO,
            start: Instant::now(),
        }
    }

    fn sent_to(&self, host: &str) -> Vec<Duration> {
        let sent = self.sent.lock().unwrap();
        sent.iter()
            .filter(|(to, _)| to == host)
            .map(|(_, at)| *at)
            .collect()
    }
}

impl Service<http::Request<()>> for Scripted {
    type Response = http::Response<()>;
    type Error = Infallible;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<http::Response<()>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<()>) -> Self::Future {
        let host = request.uri().host().unwrap_or_default().to_owned();
        let mut sent = self.sent.lock().unwrap();
        let earlier = sent.iter().filter(|(to, _)| *to == host).count();
        let code = self.script.get(earlier).copied().unwrap_or(200);
        sent.push((host, self.start.elapsed()));
        let latency = self.latency;
        Box::pin(async move {
            tokio::time::sleep(latency).await;
            Ok(http::Response::builder().status(code).body(()).unwrap())
        })
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
> + Clone
       + Send
       + 'static {
    ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(BackoffLayer::new(registry.clone()))
        .service(inner)
}

async fn send<S, B>(service: &S, uri: &str)
where
    S: Service<http::Request<()>, Response = http::Response<B>, Error = Infallible> + Clone,
    B: Send + 'static,
{
    service.clone().oneshot(get(uri)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_custom_manager_on_one_scope_changes_that_scope_only() {
    let registry = Registry::builder()
        .default_scope(exact())
        .scope(
            "custom.example",
            exact().manager(|_scope| Steps::boxed("steps", secs(5))),
        )
        .build()
        .unwrap();
    let inner = Scripted::new([429, 429]);
    let service = client(&registry, inner.clone());
    let crawls = ["https://custom.example/", "https://plain.example/"].map(|uri| {
        let service = service.clone();
        tokio::spawn(async move {
            for _ in 0..3 {
                send(&service, uri).await;
            }
        })
    });
    for crawl in crawls {
        crawl.await.unwrap();
    }
    // custom: + 5 s per backoff (5 s, then 10 s); plain: the built-in
    // exponential backoff (1 s, then 2 s).
    assert_eq!(inner.sent_to("custom.example"), [0, 5, 15].map(secs));
    assert_eq!(inner.sent_to("plain.example"), [0, 1, 3].map(secs));
    let custom = registry.scope_stats("custom.example").unwrap();
    assert_eq!(custom.manager, "steps");
    assert_eq!(
        (custom.delay, custom.delay_limited_by, custom.backoff_level),
        (secs(10), LimitSource::Manager, 0)
    );
    assert_eq!(custom.backoff_feedbacks, 2);
    let plain = registry.scope_stats("plain.example").unwrap();
    assert_eq!(plain.manager, "default");
    assert_eq!(
        (plain.delay, plain.delay_limited_by, plain.backoff_level),
        (secs(2), LimitSource::Backoff, 2)
    );
}

#[tokio::test(start_paused = true)]
async fn a_scope_without_a_custom_manager_backs_off_exactly_as_before() {
    // The figures of tests/backoff.rs's three_429s_at_once test, one at a
    // time: 1 s, 2 s, 4 s.
    let registry = Registry::builder().default_scope(exact()).build().unwrap();
    let inner = Scripted::new([429, 429, 429]);
    let service = client(&registry, inner.clone());
    for _ in 0..4 {
        send(&service, "https://site.example/").await;
    }
    assert_eq!(inner.sent_to("site.example"), [0, 1, 3, 7].map(secs));
    let stats = registry.scope_stats("site.example").unwrap();
    assert_eq!((stats.manager.as_ref(), stats.backoff_level), ("default", 3));
    assert_eq!(
        (stats.delay, stats.delay_limited_by),
        (secs(4), LimitSource::Backoff)
    );
}

#[tokio::test(start_paused = true)]
async fn a_per_scope_manager_beats_the_global_one() {
    let registry = Registry::builder()
        .default_scope(exact())
        .scope_manager(|_scope| Steps::boxed("global", secs(1)))
        .scope(
            "own.example",
            exact().manager(|_scope| Steps::boxed("own", secs(7))),
        )
        .build()
        .unwrap();
    for scope in ["own.example", "other.example"] {
        registry.feedback(&Scopes::from(scope), Feedback::backoff());
    }
    let own = registry.scope_stats("own.example").unwrap();
    let other = registry.scope_stats("other.example").unwrap();
    assert_eq!((own.manager.as_ref(), own.delay), ("own", secs(7)));
    assert_eq!((other.manager.as_ref(), other.delay), ("global", secs(1)));
    // A scope set at runtime without a manager of its own inherits the
    // global one.
    registry.set_scope("late.example", exact()).unwrap();
    registry.feedback(&Scopes::from("late.example"), Feedback::backoff());
    assert_eq!(registry.scope_stats("late.example").unwrap().manager, "global");
}

/// Counts the managers a factory made; each reports its number in its name.
#[derive(Debug)]
struct Numbered {
    name: String,
    hold_until: Option<Instant>,
}

impl ScopeManager for Numbered {
    fn name(&self) -> &str {
        &self.name
    }

    fn on_feedback(&mut self, feedback: &ManagerFeedback) {
        if feedback.feedback().is_backoff() {
            self.hold_until = Some(feedback.now() + secs(600));
        }
    }

    fn limits(&self, _now: Instant, _base: &BaseLimits) -> ManagerLimits {
        match self.hold_until {
            Some(until) => ManagerLimits::none().hold_until(until),
            None => ManagerLimits::none(),
        }
    }
}

fn numbered_registry(made: Arc<AtomicUsize>) -> Registry {
    Registry::builder()
        .default_scope(exact())
        .idle_ttl(secs(60))
        .scope_manager(move |scope| {
            let number = made.fetch_add(1, Ordering::SeqCst) + 1;
            Box::new(Numbered {
                name: format!("{scope} #{number}"),
                hold_until: None,
            })
        })
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_manager_is_made_on_first_feedback_and_again_after_eviction() {
    let made = Arc::new(AtomicUsize::new(0));
    let registry = numbered_registry(made.clone());
    let service = client(&registry, Scripted::new([]));
    send(&service, "https://a.example/").await;
    // Throttle alone sends nothing to the manager; the backoff layer's
    // success feedback made it.
    assert_eq!(made.load(Ordering::SeqCst), 1);
    assert_eq!(registry.scope_stats("a.example").unwrap().manager, "a.example #1");
    send(&service, "https://a.example/").await;
    assert_eq!(made.load(Ordering::SeqCst), 1, "one instance per scope");
    // Idle past idle_ttl, with a manager that limits nothing: evicted when
    // another request arrives.
    tokio::time::sleep(secs(61)).await;
    send(&service, "https://b.example/").await;
    assert!(registry.scope_stats("a.example").is_none());
    send(&service, "https://a.example/").await;
    assert_eq!(made.load(Ordering::SeqCst), 3, "b, then a again");
    assert_eq!(registry.scope_stats("a.example").unwrap().manager, "a.example #3");
}

#[tokio::test(start_paused = true)]
async fn a_scope_idle_with_no_feedback_has_no_manager_yet() {
    let made = Arc::new(AtomicUsize::new(0));
    let registry = numbered_registry(made.clone());
    let service = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .service(Scripted::new([]));
    send(&service, "https://quiet.example/").await;
    assert_eq!(made.load(Ordering::SeqCst), 0);
    assert_eq!(
        registry.scope_stats("quiet.example").unwrap().manager,
        "custom (not yet created: no feedback)"
    );
}

#[tokio::test(start_paused = true)]
async fn a_manager_whose_hold_is_in_force_keeps_its_scope_from_eviction() {
    let made = Arc::new(AtomicUsize::new(0));
    let registry = numbered_registry(made.clone());
    let service = client(&registry, Scripted::new([429]));
    let start = Instant::now();
    send(&service, "https://held.example/").await;
    tokio::time::sleep(secs(120)).await;
    send(&service, "https://other.example/").await;
    let stats = registry
        .scope_stats("held.example")
        .expect("kept: its hold is in force");
    assert_eq!(stats.held_for, Some(secs(480)));
    // Its next request waits out the manager's hold, not capped at the
    // backoff max_delay (300 s).
    let waiting = tokio::spawn({
        let service = service.clone();
        async move { send(&service, "https://held.example/").await }
    });
    tokio::task::yield_now().await;
    let stats = registry.scope_stats("held.example").unwrap();
    assert_eq!(stats.held_back_by, Some(LimitSource::Manager));
    waiting.await.unwrap();
    assert_eq!(start.elapsed(), secs(600));
    assert_eq!(made.load(Ordering::SeqCst), 2, "held, other: never made again");
}

/// Records what it is told.
#[derive(Debug, Default)]
struct Recorder {
    told: Arc<Mutex<Vec<ManagerFeedback>>>,
}

impl ScopeManager for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }

    fn on_feedback(&mut self, feedback: &ManagerFeedback) {
        self.told.lock().unwrap().push(*feedback);
    }

    fn limits(&self, _now: Instant, _base: &BaseLimits) -> ManagerLimits {
        ManagerLimits::none()
    }
}

#[tokio::test(start_paused = true)]
async fn a_manager_is_told_every_response_with_status_latency_and_instant() {
    let told = Arc::new(Mutex::new(Vec::new()));
    let registry = Registry::builder()
        .default_scope(exact().concurrency(3))
        .scope_manager({
            let told = told.clone();
            move |_scope| Box::new(Recorder { told: told.clone() })
        })
        .build()
        .unwrap();
    let mut inner = Scripted::new([200, 503]);
    inner.latency = Duration::from_millis(250);
    let service = client(&registry, inner);
    let start = Instant::now();
    send(&service, "https://api.example/").await;
    send(&service, "https://api.example/").await;
    let told = told.lock().unwrap().clone();
    let seen: Vec<_> = told
        .iter()
        .map(|feedback| {
            (
                feedback.feedback().is_backoff(),
                feedback.feedback().status().map(|status| status.as_u16()),
                feedback.feedback().latency(),
                feedback.now() - start,
                feedback.base().concurrency(),
            )
        })
        .collect();
    let latency = Duration::from_millis(250);
    assert_eq!(
        seen,
        [
            (false, Some(200), Some(latency), latency, 3),
            (true, Some(503), Some(latency), latency * 2, 3),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_manager_is_told_the_kind_of_an_error() {
    let told = Arc::new(Mutex::new(Vec::new()));
    let registry = Registry::builder()
        .default_scope(exact())
        .scope_manager({
            let told = told.clone();
            move |_scope| Box::new(Recorder { told: told.clone() })
        })
        .build()
        .unwrap();
    let service = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(BackoffLayer::new(registry.clone()))
        .service(tower::service_fn(|_request: http::Request<()>| async {
            Err::<http::Response<()>, _>(std::io::Error::from(std::io::ErrorKind::TimedOut))
        }));
    service.oneshot(get("https://api.example/")).await.unwrap_err();
    let told = told.lock().unwrap();
    assert_eq!(told.len(), 1);
    assert!(told[0].feedback().is_backoff());
    assert_eq!(told[0].feedback().error_kind(), Some(ErrorKind::Timeout));
    assert_eq!(told[0].feedback().status(), None);
}

/// A 100 s delay until 10 s after the last backoff, then nothing.
#[derive(Debug, Default)]
struct ShortPenalty {
    until: Option<Instant>,
}

impl ScopeManager for ShortPenalty {
    fn name(&self) -> &str {
        "short-penalty"
    }

    fn on_feedback(&mut self, feedback: &ManagerFeedback) {
        if feedback.feedback().is_backoff() {
            self.until = Some(feedback.now() + secs(10));
        }
    }

    fn limits(&self, now: Instant, _base: &BaseLimits) -> ManagerLimits {
        match self.until {
            Some(until) if until > now => ManagerLimits::none()
                .delay(secs(100))
                .concurrency(1)
                .review_at(until),
            _ => ManagerLimits::none(),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_looked_at_again_when_the_manager_says_its_answer_changes() {
    let registry = Registry::builder()
        .default_scope(
            exact()
                .concurrency(4)
                .manager(|_scope| Box::new(ShortPenalty::default())),
        )
        .build()
        .unwrap();
    let inner = Scripted::new([503]);
    let service = client(&registry, inner.clone());
    send(&service, "https://api.example/").await;
    let stats = registry.scope_stats("api.example").unwrap();
    assert_eq!(
        (stats.delay, stats.delay_limited_by),
        (secs(100), LimitSource::Manager)
    );
    assert_eq!(
        (stats.concurrency, stats.concurrency_limited_by),
        (1, LimitSource::Manager)
    );
    send(&service, "https://api.example/").await;
    // Sent when the penalty ended (10 s), not after the 100 s delay.
    assert_eq!(inner.sent_to("api.example"), [0, 10].map(secs));
    let stats = registry.scope_stats("api.example").unwrap();
    assert_eq!((stats.delay, stats.concurrency), (Duration::ZERO, 4));
}

#[tokio::test(start_paused = true)]
async fn set_scope_with_another_factory_replaces_the_manager() {
    let registry = Registry::builder()
        .default_scope(exact())
        .scope("api", exact().manager(|_scope| Steps::boxed("first", secs(3))))
        .build()
        .unwrap();
    registry.feedback(&Scopes::from("api"), Feedback::backoff());
    assert_eq!(registry.scope_stats("api").unwrap().delay, secs(3));
    registry
        .set_scope("api", exact().manager(|_scope| Steps::boxed("second", secs(5))))
        .unwrap();
    let stats = registry.scope_stats("api").unwrap();
    assert_eq!(
        (stats.manager.as_ref(), stats.delay),
        ("custom (not yet created: no feedback)", Duration::ZERO)
    );
    registry.feedback(&Scopes::from("api"), Feedback::backoff());
    assert_eq!(registry.scope_stats("api").unwrap().delay, secs(5));
    // Back to the built-in manager: exponential backoff again.
    registry.set_scope("api", exact()).unwrap();
    registry.feedback(&Scopes::from("api"), Feedback::backoff());
    let stats = registry.scope_stats("api").unwrap();
    assert_eq!((stats.manager.as_ref(), stats.delay), ("default", secs(1)));
}

/// A scope has one manager, chosen by its config: a config change that
/// keeps the kind keeps what the manager learnt; another kind starts fresh.
#[tokio::test(start_paused = true)]
async fn set_scope_keeps_the_managers_state_only_while_its_kind_stays() {
    let registry = Registry::builder().default_scope(exact()).build().unwrap();
    registry.feedback(&Scopes::from("api"), Feedback::backoff());
    let backoff = |registry: &Registry| {
        let stats = registry.scope_stats("api").unwrap();
        (stats.backoff_level, stats.delay, stats.rampup_delay)
    };
    assert_eq!(backoff(&registry), (1, secs(1), None));
    // The built-in backoff still: its step stays.
    registry.set_scope("api", exact().concurrency(2)).unwrap();
    assert_eq!(backoff(&registry), (1, secs(1), None));
    // Rampup: its search starts from the configured delay, the backoff's
    // step goes with the backoff.
    let ramping = exact().delay(secs(2)).rampup(RampupConfig::default());
    registry.set_scope("api", ramping.clone()).unwrap();
    assert_eq!(backoff(&registry), (0, secs(2), Some(secs(2))));
    // Backoff feedback now goes to rampup, which slows down once a window
    // has more than its target (one).
    registry.feedback(&Scopes::from("api"), Feedback::backoff());
    registry.feedback(&Scopes::from("api"), Feedback::backoff());
    let (level, _, slowed) = backoff(&registry);
    assert_eq!(level, 0);
    assert!(slowed.unwrap() > secs(2), "{slowed:?}");
    // Rampup still (another window, say): what it learnt stays.
    registry.set_scope("api", ramping.concurrency(2)).unwrap();
    assert_eq!(backoff(&registry).2, slowed);
    // Back to the built-in backoff: nothing in force, the next feedback
    // steps from the config.
    registry.set_scope("api", exact()).unwrap();
    assert_eq!(backoff(&registry), (0, Duration::ZERO, None));
    registry.feedback(&Scopes::from("api"), Feedback::backoff());
    assert_eq!(backoff(&registry), (1, secs(1), None));
}

#[test]
fn configs_are_equal_only_with_the_same_factory() {
    let config = exact().manager(|_scope| Steps::boxed("a", secs(1)));
    assert_eq!(config, config.clone());
    let other = exact().manager(|_scope| Steps::boxed("a", secs(1)));
    assert_ne!(config, other);
    assert_ne!(config, exact());
}

#[tokio::test(start_paused = true)]
async fn a_custom_manager_replaces_rampup() {
    let registry = Registry::builder()
        .default_scope(
            exact()
                .rampup(tower_throttle::registry::RampupConfig::default())
                .manager(|_scope| Steps::boxed("steps", secs(2))),
        )
        .build()
        .unwrap();
    registry.feedback(&Scopes::from("api"), Feedback::backoff());
    let stats = registry.scope_stats("api").unwrap();
    assert_eq!(stats.rampup_delay, None);
    assert_eq!(
        (stats.delay, stats.delay_limited_by),
        (secs(2), LimitSource::Manager)
    );
}

#[tokio::test(start_paused = true)]
async fn the_exponential_backoff_manager_steps_and_recovers_as_the_built_in_one() {
    use tower_throttle::registry::manager::ExponentialBackoff;
    let registry = Registry::builder()
        .default_scope(exact().concurrency(3))
        .scope(
            "managed.example",
            exact()
                .concurrency(3)
                .manager(|_scope| Box::new(ExponentialBackoff::new(BackoffConfig::default()))),
        )
        .build()
        .unwrap();
    let mut inner = Scripted::new([429, 429, 429]);
    inner.latency = Duration::from_millis(100);
    let service = client(&registry, inner.clone());
    let start = Instant::now();
    let burst = |host: &'static str, count: usize| {
        let service = service.clone();
        async move {
            let sends = (0..count).map(|_| send(&service, host));
            futures::future::join_all(sends).await;
        }
    };
    for (at, count) in [(0, 3), (0, 4), (130, 4)] {
        tokio::time::sleep_until(start + secs(at)).await;
        tokio::join!(
            burst("https://builtin.example/", count),
            burst("https://managed.example/", count)
        );
    }
    let builtin = inner.sent_to("builtin.example");
    // Three sends at once on three lanes, three steps when their answers
    // come at 0.1 s (4 s, one lane; the next gap runs from that first
    // answer), then two quiet windows back (1 s, three lanes) by t=130.
    let millis = |ms: [u64; 11]| ms.map(Duration::from_millis);
    assert_eq!(
        builtin,
        millis([0, 0, 0, 4_100, 8_100, 12_100, 16_100, 130_000, 131_000, 132_000, 133_000])
    );
    assert_eq!(inner.sent_to("managed.example"), builtin);
}

#[tokio::test(start_paused = true)]
async fn latency_is_measured_only_when_some_scope_may_run_a_custom_manager() {
    use tower_throttle::backoff::Judged;
    let judged_latency = |registry: Registry| async move {
        let mut inner = Scripted::new([]);
        inner.latency = Duration::from_millis(40);
        let response = client(&registry, inner)
            .oneshot(get("https://api.example/"))
            .await
            .unwrap();
        response
            .extensions()
            .get::<Judged>()
            .unwrap()
            .feedback()
            .latency()
    };
    let plain = Registry::builder().default_scope(exact()).build().unwrap();
    assert_eq!(judged_latency(plain.clone()).await, None);
    // A manager set at runtime on any scope turns it on.
    plain
        .set_scope("other", exact().manager(|_scope| Steps::boxed("steps", secs(1))))
        .unwrap();
    assert_eq!(judged_latency(plain).await, Some(Duration::from_millis(40)));
}

#[cfg(feature = "serde")]
#[tokio::test(start_paused = true)]
async fn a_registrys_config_keeps_its_managers_in_memory_but_not_in_files() {
    let registry = Registry::builder()
        .default_scope(exact())
        .scope("api", exact().manager(|_scope| Steps::boxed("steps", secs(2))))
        .build()
        .unwrap();
    let config = registry.config();
    let toml = config.to_toml_string().unwrap();
    assert!(!toml.contains("manager"), "{toml}");
    let rebuilt = config.build().unwrap();
    rebuilt.feedback(&Scopes::from("api"), Feedback::backoff());
    assert_eq!(rebuilt.scope_stats("api").unwrap().manager, "steps");
    let from_file = tower_throttle::config_file::RegistryConfig::from_toml_str(&toml)
        .unwrap()
        .build()
        .unwrap();
    from_file.feedback(&Scopes::from("api"), Feedback::backoff());
    assert_eq!(from_file.scope_stats("api").unwrap().manager, "default");
}

/// A pace is what a manager learnt, not a limit in force: a scope paced by
/// the `Rampup` manager goes once idle for `idle_ttl`, as a scope with the
/// built-in rampup does (otherwise a broad crawl with a pacing manager on
/// every scope would never evict one).
#[tokio::test(start_paused = true)]
async fn a_scope_paced_by_a_manager_is_evicted_once_idle() {
    let registry = Registry::builder()
        .idle_ttl(secs(60))
        .default_scope(exact())
        .scope_manager(|_scope| {
            Box::new(tower_throttle::registry::manager::Rampup::new(
                tower_throttle::registry::RampupConfig::default(),
            ))
        })
        .build()
        .unwrap();
    let service = client(&registry, Scripted::new([]));
    send(&service, "https://paced.example/").await;
    assert_eq!(
        registry.scope_stats("paced.example").unwrap().delay_limited_by,
        LimitSource::Manager
    );
    tokio::time::sleep(secs(61)).await;
    send(&service, "https://other.example/").await;
    assert!(registry.scope_stats("paced.example").is_none());
}
