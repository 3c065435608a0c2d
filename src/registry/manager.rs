//! Pluggable scope managers: replace *how* a scope reacts to feedback.
//!
//! The feedback layers decide *what* counts as feedback (a 429, a timeout,
//! a hook of yours); a scope's **manager** decides what the scope does about
//! it. The built-in manager (named `"default"` in
//! [`ScopeStats::manager`](crate::ScopeStats::manager)) is the exponential
//! backoff of [`BackoffConfig`](crate::registry::BackoffConfig) with quiet-window
//! recovery, or the [rampup](crate::registry::RampupConfig) search when the scope
//! opted in. Each scope has exactly **one** manager, chosen by its config:
//! a custom factory wins, then rampup, then the exponential backoff. The
//! built-ins run with no dynamic dispatch (a scope's manager state is one
//! enum: backoff, rampup or custom), and are also [`ScopeManager`]s,
//! [`ExponentialBackoff`] and [`Rampup`], taking the same steps by the same
//! state machines (tests check the send instants and per-minute counts are
//! identical), to build on. To react differently, implement [`ScopeManager`] and give the
//! registry a factory for it: for every scope with
//! [`RegistryBuilder::scope_manager`](crate::registry::RegistryBuilder::scope_manager),
//! or for one scope with [`ScopeConfig::manager`](crate::ScopeConfig::manager)
//! (the per-scope one wins). This is the seeds' `THROTTLING_SCOPE_MANAGER`
//! setting and its per-scope `"manager"` key.
//!
//! # The model
//!
//! - **One instance per scope**, made by the factory on the scope's first
//!   feedback. A scope that never gets feedback never has one (idle scopes
//!   cost nothing more), and a scope evicted while idle gets a new instance
//!   on its next feedback after it comes back. A scope is only evicted when
//!   its manager's answer no longer limits it (no delay, concurrency or hold
//!   in force), so eviction never loses a limit in force, though it may lose
//!   what a manager learnt.
//! - **Told every feedback** for its scope
//!   ([`on_feedback`](ScopeManager::on_feedback)): backoff or success, the
//!   response status or the error kind when known, the actual cost, the
//!   latency, the instant, and the scope's limits without the manager.
//!   Feedback the classifier marks [`Ignore`](crate::registry::FeedbackKind::Ignore)
//!   is not passed on.
//! - **Asked for its contribution** at an instant
//!   ([`limits`](ScopeManager::limits)): a delay, a concurrency, a hold, or
//!   nothing. It is folded with the scope's other limits like any
//!   contribution (the largest delay and the smallest concurrency win);
//!   when the manager's answer is the one that binds,
//!   [`ScopeStats`](crate::ScopeStats) says
//!   [`LimitSource::Manager`](crate::registry::LimitSource::Manager).
//!
//! ## No timers: recovery is computed when asked
//!
//! Nothing ticks for a scope. A manager that recovers over time (one step
//! back per quiet window, say) computes the recovery from the instant it is
//! asked about, as the built-in backoff does. That is why
//! [`limits`](ScopeManager::limits) takes `&self` and `now`: the scheduler
//! asks on every admission decision, under its lock, and a query that
//! cannot change anything can be asked any number of times. The registry
//! does not know what a window is for your policy, so the manager says when
//! its answer will next change on its own
//! ([`ManagerLimits::review_at`]): a request waiting for the scope is looked
//! at again then, instead of sleeping out a delay that has shrunk meanwhile.
//! Telling managers of elapsed windows instead would need the registry to
//! keep time for every scope, which is what the lazy model avoids.
//!
//! ## What a custom manager replaces
//!
//! A scope with a custom manager runs neither the exponential backoff nor
//! rampup (its [`BackoffConfig`](crate::registry::BackoffConfig) still says which
//! statuses are backoff feedback and caps Retry-After holds; its
//! [`RampupConfig`](crate::registry::RampupConfig), if any, is unused). Everything else
//! applies as usual: config, robots.txt, AutoThrottle, Retry-After holds,
//! pacing, quotas. The scope's own jitter applies to the manager's delay.
//!
//! # Example: linear backoff
//!
//! One more second of delay per backoff feedback, one second less per quiet
//! minute:
//!
//! ```
//! use std::time::Duration;
//! use tokio::time::Instant;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_throttle::{BackoffLayer, Registry, ScopeConfig, ThrottleLayer};
//! use tower_throttle::registry::LimitSource;
//! use tower_throttle::registry::manager::{BaseLimits, ManagerFeedback, ManagerLimits, ScopeManager};
//!
//! const WINDOW: Duration = Duration::from_secs(60);
//!
//! /// + 1 s per backoff feedback, − 1 s per quiet window.
//! #[derive(Debug, Default)]
//! struct Linear {
//!     /// Seconds added, as of `last_backoff`.
//!     seconds: u32,
//!     last_backoff: Option<Instant>,
//! }
//!
//! impl Linear {
//!     /// Seconds still added at `now`, and when the next one goes.
//!     fn at(&self, now: Instant) -> (u32, Option<Instant>) {
//!         let Some(last) = self.last_backoff else { return (0, None) };
//!         let quiet_windows = (now.saturating_duration_since(last).as_secs() / WINDOW.as_secs()) as u32;
//!         let seconds = self.seconds.saturating_sub(quiet_windows);
//!         let next = (seconds > 0).then(|| last + WINDOW * (quiet_windows + 1));
//!         (seconds, next)
//!     }
//! }
//!
//! impl ScopeManager for Linear {
//!     fn name(&self) -> &str {
//!         "linear"
//!     }
//!
//!     fn on_feedback(&mut self, feedback: &ManagerFeedback) {
//!         if feedback.feedback().is_backoff() {
//!             self.seconds = self.at(feedback.now()).0 + 1;
//!             self.last_backoff = Some(feedback.now());
//!         }
//!     }
//!
//!     fn limits(&self, now: Instant, base: &BaseLimits) -> ManagerLimits {
//!         match self.at(now) {
//!             (0, _) => ManagerLimits::none(),
//!             (seconds, next) => {
//!                 let limits = ManagerLimits::none().delay(base.delay() + Duration::from_secs(seconds.into()));
//!                 match next {
//!                     Some(next) => limits.review_at(next),
//!                     None => limits,
//!                 }
//!             }
//!         }
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = Registry::builder()
//!     .default_scope(ScopeConfig::default().delay(Duration::ZERO).delay_per_slot(Duration::ZERO).jitter(0.0))
//!     .scope_manager(|_scope| Box::new(Linear::default()))
//!     .build()?;
//! // Two 503s, then 200s.
//! let answers = std::sync::Arc::new(std::sync::Mutex::new(vec![200, 503, 503]));
//! let server = tower::service_fn(move |_request: http::Request<()>| {
//!     let status = answers.lock().unwrap().pop().unwrap_or(200);
//!     async move { Ok::<_, std::convert::Infallible>(http::Response::builder().status(status).body(()).unwrap()) }
//! });
//! let client = ServiceBuilder::new()
//!     .layer(ThrottleLayer::new(registry.clone()))
//!     .layer(BackoffLayer::new(registry.clone()))
//!     .service(server);
//! let start = Instant::now();
//! let mut sent = Vec::new();
//! for _ in 0..3 {
//!     client.clone().oneshot(http::Request::get("https://api.example/").body(())?).await?;
//!     sent.push(start.elapsed());
//! }
//! // The first 503 adds 1 s, the second 2 s.
//! assert_eq!(sent, [0, 1, 3].map(Duration::from_secs));
//! let stats = registry.scope_stats("api.example").unwrap();
//! assert_eq!(stats.manager, "linear");
//! assert_eq!((stats.delay, stats.delay_limited_by), (Duration::from_secs(2), LimitSource::Manager));
//! // One quiet minute after the last backoff: one second less.
//! tokio::time::sleep_until(start + Duration::from_secs(1) + WINDOW).await;
//! assert_eq!(registry.scope_stats("api.example").unwrap().delay, Duration::from_secs(1));
//! tokio::time::sleep(WINDOW).await;
//! let stats = registry.scope_stats("api.example").unwrap();
//! assert_eq!((stats.delay, stats.delay_limited_by), (Duration::ZERO, LimitSource::Config));
//! # Ok(())
//! # }
//! ```
//!
//! # Example: an API whose bans last ten minutes
//!
//! The API answers 403 with an `X-Banned` header when it bans a client, and
//! lifts the ban exactly ten minutes later; nothing else it says should slow
//! the client down. The classifier marks the ban as backoff feedback (the
//! manager never sees headers, only what the classifier reports), and the
//! manager holds the scope for ten minutes on it and ignores everything
//! else:
//!
//! ```
//! use std::time::Duration;
//! use tokio::time::Instant;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_throttle::backoff::{default_response_feedback, ResponseHead};
//! use tower_throttle::{BackoffLayer, Registry, ScopeConfig, ThrottleLayer};
//! use tower_throttle::registry::{BackoffConfig, Feedback, LimitSource};
//! use tower_throttle::registry::manager::{BaseLimits, ManagerFeedback, ManagerLimits, ScopeManager};
//!
//! const BAN: Duration = Duration::from_secs(600);
//!
//! #[derive(Debug, Default)]
//! struct TenMinuteBans {
//!     banned_until: Option<Instant>,
//! }
//!
//! impl ScopeManager for TenMinuteBans {
//!     fn name(&self) -> &str {
//!         "ten-minute-bans"
//!     }
//!
//!     fn on_feedback(&mut self, feedback: &ManagerFeedback) {
//!         if feedback.feedback().is_backoff() && feedback.feedback().status() == Some(http::StatusCode::FORBIDDEN) {
//!             self.banned_until = Some(feedback.now() + BAN);
//!         }
//!     }
//!
//!     fn limits(&self, now: Instant, _base: &BaseLimits) -> ManagerLimits {
//!         match self.banned_until {
//!             Some(until) if until > now => ManagerLimits::none().hold_until(until),
//!             _ => ManagerLimits::none(),
//!         }
//!     }
//! }
//!
//! fn bans_are_backoff(head: &ResponseHead<'_>, config: &BackoffConfig) -> Feedback {
//!     if head.status == http::StatusCode::FORBIDDEN && head.headers.contains_key("x-banned") {
//!         Feedback::backoff()
//!     } else {
//!         default_response_feedback(head, config)
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = Registry::builder()
//!     .scope(
//!         "api.example",
//!         ScopeConfig::default()
//!             .delay(Duration::ZERO)
//!             .delay_per_slot(Duration::ZERO)
//!             .jitter(0.0)
//!             .manager(|_scope| Box::new(TenMinuteBans::default())),
//!     )
//!     .build()?;
//! // A 429, a ban, then 200s.
//! let answers = std::sync::Arc::new(std::sync::Mutex::new(vec![(200, false), (403, true), (429, false)]));
//! let server = tower::service_fn(move |_request: http::Request<()>| {
//!     let (status, banned) = answers.lock().unwrap().pop().unwrap_or((200, false));
//!     let mut response = http::Response::builder().status(status);
//!     if banned {
//!         response = response.header("X-Banned", "1");
//!     }
//!     async move { Ok::<_, std::convert::Infallible>(response.body(()).unwrap()) }
//! });
//! let client = ServiceBuilder::new()
//!     .layer(ThrottleLayer::new(registry.clone()))
//!     .layer(BackoffLayer::new(registry.clone()).on_response(bans_are_backoff))
//!     .service(server);
//! let start = Instant::now();
//! let mut sent = Vec::new();
//! for _ in 0..3 {
//!     client.clone().oneshot(http::Request::get("https://api.example/").body(())?).await?;
//!     sent.push(start.elapsed());
//! }
//! // The 429 does not slow the scope; the ban holds it exactly 10 minutes.
//! assert_eq!(sent, [Duration::ZERO, Duration::ZERO, BAN]);
//! let stats = registry.scope_stats("api.example").unwrap();
//! assert_eq!((&*stats.manager, stats.backoff_feedbacks), ("ten-minute-bans", 2));
//! assert_eq!((stats.delay, stats.backoff_level), (Duration::ZERO, 0));
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::feedback::Feedback;
use crate::scope::Scope;

mod exponential;
mod rampup;

pub use exponential::ExponentialBackoff;
pub use rampup::Rampup;

/// How one scope reacts to feedback; see the [module docs](self).
///
/// One instance per scope, made by the factory given to
/// [`RegistryBuilder::scope_manager`](crate::registry::RegistryBuilder::scope_manager)
/// or [`ScopeConfig::manager`](crate::ScopeConfig::manager) on the scope's
/// first feedback. Its methods run under the registry's lock: keep them
/// short, and never block in them. `Send + Sync` because the registry is
/// shared between threads.
pub trait ScopeManager: Send + Sync + 'static {
    /// A short name for [`ScopeStats::manager`](crate::ScopeStats::manager)
    /// and log events (`"default"` is the built-in manager's).
    fn name(&self) -> &str;

    /// One feedback for the scope: a response or an error the feedback
    /// layers judged, or a call to
    /// [`Registry::feedback`](crate::Registry::feedback).
    fn on_feedback(&mut self, feedback: &ManagerFeedback);

    /// The manager's contribution to the scope's limits at `now`, given
    /// the scope's limits without it (`base`). Asked often (at every
    /// admission decision): compute, do not change state. Recovery over
    /// time is computed here from `now`; say with
    /// [`ManagerLimits::review_at`] when the answer will change.
    fn limits(&self, now: Instant, base: &BaseLimits) -> ManagerLimits;

    /// A request of the scope was sent at `now`. Most managers need not
    /// know (the default does nothing); [`Rampup`] counts its windows from
    /// sends.
    fn on_send(&mut self, now: Instant) {
        let _ = now;
    }
}

/// A scope's limits without its manager's contribution: its config, capped
/// by `max_concurrency`, with robots.txt and AutoThrottle folded in.
/// A multiplicative policy (such as the built-in backoff) scales these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BaseLimits {
    delay: Duration,
    concurrency: u32,
    latency: Option<Duration>,
}

impl BaseLimits {
    pub(crate) fn new(delay: Duration, concurrency: u32, latency: Option<Duration>) -> Self {
        BaseLimits {
            delay,
            concurrency,
            latency,
        }
    }

    /// The scope's latency average (send to response head), once a
    /// response came: what a pace needs to size its lanes.
    pub fn latency(&self) -> Option<Duration> {
        self.latency
    }

    /// The delay between sends.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The lanes.
    pub fn concurrency(&self) -> u32 {
        self.concurrency
    }
}

/// One feedback, as a [`ScopeManager`] is told it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ManagerFeedback {
    feedback: Feedback,
    now: Instant,
    base: BaseLimits,
}

impl ManagerFeedback {
    pub(crate) fn new(feedback: Feedback, now: Instant, base: BaseLimits) -> Self {
        ManagerFeedback { feedback, now, base }
    }

    /// The feedback as reported.
    pub fn feedback(&self) -> &Feedback {
        &self.feedback
    }

    /// When the feedback arrived.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The scope's limits without the manager, at that instant.
    pub fn base(&self) -> &BaseLimits {
        &self.base
    }
}

/// What a [`ScopeManager`] contributes to its scope's limits at one
/// instant: a delay, a concurrency, a hold, any of them or nothing.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::registry::manager::ManagerLimits;
///
/// let slower = ManagerLimits::none().delay(Duration::from_secs(2)).concurrency(1);
/// // The order of the calls does not matter.
/// assert_eq!(slower, ManagerLimits::none().concurrency(1).delay(Duration::from_secs(2)));
/// assert_ne!(slower, ManagerLimits::none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ManagerLimits {
    pace: Option<(Duration, u32)>,
    delay: Option<Duration>,
    concurrency: Option<u32>,
    hold_until: Option<Instant>,
    review_at: Option<Instant>,
}

impl ManagerLimits {
    /// No contribution: the scope runs on its other limits.
    pub fn none() -> Self {
        ManagerLimits::default()
    }

    /// The scope's pace: `delay` between sends on up to `lanes` lanes,
    /// *instead of* its configured delay, per-slot delay, jitter and
    /// concurrency, so it may be faster than the config (which no other
    /// answer can be). Everything else still applies on top: robots.txt,
    /// AutoThrottle, Retry-After holds, pacing, quotas, `max_concurrency`,
    /// and this answer's own `delay`, `concurrency` and hold. This is how
    /// [`Rampup`] searches for a server's rate.
    #[must_use]
    pub fn pace(mut self, delay: Duration, lanes: u32) -> Self {
        self.pace = Some((delay, lanes.max(1)));
        self
    }

    /// At least `delay` between two sends of the scope (the largest delay
    /// of all contributions applies).
    #[must_use]
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// At most `lanes` requests in flight (the smallest concurrency of all
    /// contributions applies; 0 counts as 1).
    #[must_use]
    pub fn concurrency(mut self, lanes: u32) -> Self {
        self.concurrency = Some(lanes.max(1));
        self
    }

    /// Nothing of the scope is sent before `until`. Unlike Retry-After
    /// holds it is not capped at the backoff `max_delay` (the manager is
    /// your policy), only at [`MAX_CONFIG_DELAY`](crate::registry::MAX_CONFIG_DELAY)
    /// from now.
    #[must_use]
    pub fn hold_until(mut self, until: Instant) -> Self {
        self.hold_until = Some(until);
        self
    }

    /// The answer changes by itself at `at` (a quiet window ends): requests
    /// waiting for the scope are looked at again then. Without it, a
    /// waiter sleeps until the limits it last saw let it go.
    #[must_use]
    pub fn review_at(mut self, at: Instant) -> Self {
        self.review_at = Some(at);
        self
    }

    /// The pace set: delay and lanes.
    pub(crate) fn get_pace(&self) -> Option<(Duration, u32)> {
        self.pace
    }

    /// The delay contributed.
    pub(crate) fn get_delay(&self) -> Option<Duration> {
        self.delay
    }

    /// The concurrency contributed.
    pub(crate) fn get_concurrency(&self) -> Option<u32> {
        self.concurrency
    }

    /// The hold.
    pub(crate) fn get_hold_until(&self) -> Option<Instant> {
        self.hold_until
    }

    /// When the answer changes by itself.
    pub(crate) fn get_review_at(&self) -> Option<Instant> {
        self.review_at
    }

    /// Whether the answer limits the scope at `now` (a scope whose manager
    /// says so is not evicted).
    pub(crate) fn limits_anything(&self, now: Instant) -> bool {
        // A pace is what the manager learnt, not a limit in force: like
        // the built-in rampup's, it may go with an idle scope (otherwise a
        // crawl with a pacing manager on every scope would never evict).
        self.delay.is_some_and(|delay| !delay.is_zero())
            || self.concurrency.is_some()
            || self.hold_until.is_some_and(|until| until > now)
    }
}

type Factory = dyn Fn(&Scope) -> Box<dyn ScopeManager> + Send + Sync;

/// Makes a scope's [`ScopeManager`]; what
/// [`ScopeConfig::manager`](crate::ScopeConfig::manager) and
/// [`RegistryBuilder::scope_manager`](crate::registry::RegistryBuilder::scope_manager)
/// keep.
///
/// Two factories are equal when they are the same one (`Arc::ptr_eq`):
/// closures cannot be compared, and a config compared with its clone stays
/// equal. Not serialisable: a config loaded from a file has none.
#[derive(Clone)]
pub(crate) struct ManagerFactory(Arc<Factory>);

impl ManagerFactory {
    pub(crate) fn new<F>(factory: F) -> Self
    where
        F: Fn(&Scope) -> Box<dyn ScopeManager> + Send + Sync + 'static,
    {
        ManagerFactory(Arc::new(factory))
    }

    pub(crate) fn create(&self, scope: &Scope) -> CustomManager {
        CustomManager((self.0)(scope))
    }
}

impl PartialEq for ManagerFactory {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for ManagerFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ManagerFactory")
    }
}

/// A scope's custom manager, in its contributions.
pub(crate) struct CustomManager(Box<dyn ScopeManager>);

impl CustomManager {
    pub(crate) fn name(&self) -> &str {
        self.0.name()
    }

    pub(crate) fn on_feedback(&mut self, feedback: &ManagerFeedback) {
        self.0.on_feedback(feedback);
    }

    pub(crate) fn limits(&self, now: Instant, base: &BaseLimits) -> ManagerLimits {
        self.0.limits(now, base)
    }

    pub(crate) fn on_send(&mut self, now: Instant) {
        self.0.on_send(now);
    }
}

impl fmt::Debug for CustomManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CustomManager").field(&self.name()).finish()
    }
}

/// The name [`ScopeStats::manager`](crate::ScopeStats::manager) shows for
/// the built-in manager.
pub(crate) const DEFAULT_MANAGER_NAME: &str = "default";

/// The name shown for a scope whose custom manager is not made yet (no
/// feedback since the scope was created).
pub(crate) const PENDING_MANAGER_NAME: &str = "custom (not yet created: no feedback)";
