//! The shared registry: scope configs, the resolver, per-scope runtime state
//! and the global limits, behind one `Arc`.
//!
//! Every layer of this crate takes a [`Registry`] and talks only to it;
//! layers never talk to each other. [`Throttle`](crate::Throttle) asks it
//! *when* a request may be sent; the feedback layers (backoff, rate-limit
//! headers, robots.txt, AutoThrottle) report what they observe to it, which
//! changes what `Throttle` allows next. Cloning a `Registry` is cheap and
//! every clone sees the same state.
//!
//! # State model
//!
//! For each scope the registry keeps:
//!
//! - its **config** ([`ScopeConfig`]: lanes, delay, per-lane delay, jitter),
//!   from [`RegistryBuilder::scope`] or the default, replaceable at runtime
//!   with [`Registry::set_scope`];
//! - **contributions**: limits added by the feedback layers, one field per
//!   source:
//!   - a *hold* (Retry-After, rate-limit resets): nothing is sent before
//!     an instant, capped at the registry's `max_hold` (1 h);
//!   - *backoff*: level, delay and concurrency after the last step; quiet
//!     windows step it back, computed from the instant of the last step
//!     when the limits are read (no timer);
//!   - *AutoThrottle*'s delay, adjusted on every response;
//!   - *robots.txt*'s Crawl-delay: concurrency 1 and at least that delay,
//!     except for the settings a scope config of its own sets explicitly;
//!     jitter never shortens a gap below it;
//!   - *pacing* to a server-announced quota, until its reset;
//!   - *rampup*'s pace, which replaces the configured delay and lanes of a
//!     scope that opted in;
//!   - a custom [*scope manager*](manager)'s answer (delay, concurrency,
//!     hold), which replaces backoff and rampup for its scope; it is made
//!     on the scope's first feedback;
//!   - the *quota window* of a scope with a [quota](ScopeConfig::quota):
//!     what its sends have spent since the window began (expected costs,
//!     corrected by reported actual costs or remaining quota). Unlike the
//!     others it depends on the request: a waiter goes when its own cost
//!     fits, so the scope checks its first waiter's cost, and a later,
//!     cheaper waiter never overtakes it.
//!   - with a [scope store](crate::store), the *fleet*'s backoff delay
//!     (another worker's backoff, [`LimitSource::Fleet`]);
//!
//!   The *effective* limits are the most restrictive of the config and every
//!   contribution: the smallest concurrency and the largest delay.
//!   [`ScopeStats`] says which source set each one. A new source (quotas,
//!   a shared store's reservations) is a new field and one more term in
//!   that fold; the scheduler does not change;
//! - **lanes** (what Scrapy calls *slots*, hence the setting's name
//!   `delay_per_slot`): each lane carries at most one request in flight
//!   and the instant and jitter draw of its last send (the next send on it
//!   may come `delay_per_slot` later). Lanes are created on first use, so
//!   an idle scope costs little whatever its concurrency;
//! - the scope's **last send** (the next may come `delay` later) and its
//!   **queue** of waiting requests.
//!
//! Jitter is drawn once per send, as a position in `[0, 1)`; the gap that
//! follows is computed when it is checked, from the delay and jitter range
//! in force then. Nothing drawn is ever folded into a limit, so jitter does
//! not compound and the mean gap equals the configured delay.
//!
//! # Admission
//!
//! A request is sent when every one of its scopes allows it (a free lane
//! past its per-lane delay, the scope delay passed, no hold) and fewer than
//! `max_concurrency` requests are in flight. Admission is all-or-nothing:
//! a request waiting on scope B takes nothing in scope A. Waiters are
//! ordered by [`Priority`](crate::Priority), then arrival, with one global
//! sequence, so any two requests are in the same order in every scope they
//! share; that is what rules out deadlocks. Within a scope the order is
//! first-come first-served, with one exception that keeps a shared scope
//! (a server behind an IP scope, many hosts' pages) busy: a waiter that
//! another of its scopes holds back (that scope's delay, lanes, hold,
//! quota or pacing) does not block a scope where it merely stands first.
//! Later waiters go past it there, as often as they come, while it could
//! not go anyway. Once every other scope of it would admit it, it waits
//! among the scope's candidates and is passed no more, so it cannot be
//! starved; a waiter of two busy shared scopes, refused by each just as
//! the other let it go, is passed at most 16 times in all before both keep
//! their turn for it. Waiters with the same scopes (a site's pages) stand
//! in their scopes' queues as one entry, so choosing the next waiter costs
//! the same with ten pages queued per site or ten thousand.
//!
//! # Send instants: departure, not admission
//!
//! A request's send instant is its *departure*: a clock reading its own
//! future takes once the inner service has the request (after the inner
//! future's first poll; see the [`throttle`](crate::throttle) module docs),
//! never the admission instant. Admission takes a lane and starts the
//! scope's and the lane's gaps from `now`; the departure moves them to the
//! later instant. Between the two, the request is *undeparted* and a scope
//! with a delay admits nothing else, so a late departure (a task preempted
//! between admission and hand-over, a waiter admitted by another task's
//! event whose own task runs later) can never be followed by an on-time
//! one closer than the delay.
//!
//! The departure reaches the scheduler under a lock of its own only when
//! the scheduler said at admission that it must: the scope has a delay and
//! more than one lane, so another request could be admitted before this
//! one ends. Otherwise nothing can be admitted in between (the only lane
//! is busy, or no gap depends on it), and the instant rides with the
//! completion, which takes the lock anyway: one lock round trip fewer per
//! request.
//!
//! A departure wakes nobody in the common case. A waiter held by an
//! undeparted request keeps a timer for the earliest instant its gap
//! allows (counted from the earlier request's admission, a lower bound the
//! departure can only move later), and a waiter is woken to re-aim its
//! timer only when the instant moves earlier. The departing task runs
//! right after the inner client's first poll woke its connection task; a
//! wake-up of its own there would take that connection task's place in
//! tokio's run queue (the LIFO slot) and hold the request's bytes back.
//!
//! # Cold start
//!
//! A scope's first request pays for setting up the connection (TCP, TLS)
//! *after* it leaves, so the server sees it late, and a second request
//! riding the then-pooled connection would arrive closer than the delay.
//! Until a scope's first request ends (response head or error), a scope
//! with a delay sends nothing else, and its next gap runs from that end:
//! with delay `d`, the second send comes `d` after the first answer. From
//! then on gaps run from sends as usual. Scopes without a delay are not
//! affected. The same holds, in each of its scopes, for a request of
//! several scopes one of which is cold: a name's first request opens a
//! connection of its own, so its server's scope (shared with other names)
//! waits for its answer too. (A mid-crawl connection opened by a second
//! lane is not covered: the scheduler cannot see the client's pool. A
//! departure stamped at the client's write covers it: see
//! [`departure`](crate::departure).)
//!
//! # Eviction
//!
//! A scope with nothing in flight or queued is *idle*. Idle scopes are
//! dropped after [`idle_ttl`](RegistryBuilder::idle_ttl) (1 h), and past
//! [`max_scopes`](RegistryBuilder::max_scopes) (100 000) the least recently
//! used idle ones go first, so memory follows the active scopes. Nothing
//! that still limits a scope is ever lost: a scope with a hold, a backoff,
//! a pacing or a quota window in force, or a robots.txt Crawl-delay whose
//! cache entry is still valid, is kept (and a rampup scope is kept until
//! its `idle_ttl` even past `max_scopes`). A scope that comes back starts
//! from its configured limits. The work is spread over arriving requests
//! (a few candidates each, oldest first), never a scan of every scope.
//!
//! Nothing polls: a waiting request sleeps until an event that concerns one
//! of its scopes (a send, a departure, a completion, a config change, a
//! hold, a timer). Each scope has at most one timer, kept by its first
//! waiter.
//!
//! # Metrics
//!
//! With the `metrics` feature, the registry reports counters and gauges
//! through the [`metrics`](https://docs.rs/metrics) facade (without it
//! nothing is recorded and the calls compile away):
//!
//! | name | kind | what |
//! |---|---|---|
//! | `tower_throttle_requests_sent_total` | counter | requests handed to the inner service |
//! | `tower_throttle_backoffs_total` | counter | backoff feedbacks received |
//! | `tower_throttle_holds_total` | counter | holds set (Retry-After, rate-limit resets, `Registry::hold`) |
//! | `tower_throttle_evictions_total` | counter | idle scopes evicted |
//! | `tower_throttle_requests_waiting` | gauge | requests waiting for their scopes |
//! | `tower_throttle_requests_in_flight` | gauge | requests sent and not answered |
//! | `tower_throttle_scopes_tracked` | gauge | scopes the registry holds |
//! | `tower_throttle_wait_seconds` | histogram | each part of a request's wait, labelled `cause` and `source` (see [`crate::waited`]; `source` is `none` for causes without one) |
//!
//! The wait histogram is recorded for requests that waited, once each when
//! handed to the inner service (and by `RobotsDelay` for its own wait); its
//! labels are bounded: 12 causes by 12 sources at most.
//!
//! The counters carry a `scope` label only with
//! [`RegistryBuilder::metrics_per_scope`]:
//! a broad crawl has millions of scopes, which most metrics back ends
//! cannot hold as label values.
//!
//! # Layout
//!
//! One scope at an instant (its config, contributions, lanes, and what
//! they allow next) is `scope_state`; the queues, the all-or-nothing
//! dispatch and the timers are the `scheduler`, pure (every call is given
//! `now`) and unit-tested at fixed instants; this file is the [`Registry`]
//! handle around the scheduler behind the registry's one lock, and
//! `seam.rs` the few calls through which a throttled request's ticket (in
//! [`throttle`](crate::throttle)) queues, polls, departs and finishes. Only
//! the lock-free words of busy plain scopes (`fast_path.rs`) run outside
//! that lock. What a response says reaches the
//! scopes through `report.rs`. Each file's own docs say what it holds.

mod autothrottle;
mod backoff;
mod bounded;
mod builder;
mod checks;
mod config;
mod config_changes;
mod configs;
mod fast_path;
mod feedback;
mod learning;
mod limit_source;
pub mod manager;
mod metrics;
mod predict;
mod rampup;
mod report;
mod scheduler;
mod scope_state;
mod seam;
mod stats;
mod ticket;
mod unread;

pub use crate::time::{Jitter, MAX_CONFIG_DELAY};
pub use autothrottle::AutoThrottleConfig;
pub use backoff::{BackoffConfig, DEFAULT_BACKOFF_CODES};
pub(crate) use bounded::RequestBound;
pub(crate) use builder::GlobalSettings;
pub use builder::RegistryBuilder;
#[cfg(feature = "serde")]
pub(crate) use checks::check_key;
pub use checks::ConfigWarning;
#[cfg(feature = "serde")]
pub(crate) use config::Setting;
pub use config::{ScopeConfig, DEFAULT_QUOTA_WINDOW};
pub use feedback::{AnnouncedLimits, ErrorKind, Feedback, FeedbackKind};
pub use limit_source::LimitSource;
pub use predict::Prediction;
pub use rampup::RampupConfig;
pub(crate) use report::ScopeReport;
pub use stats::{QuotaStats, ScopeStats, Stats};

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::scope::{handover, RequestHead, Scope, ScopeResolver, Scopes};
use crate::store::StoreHandle;
use crate::time::saturating_add;
pub(crate) use fast_path::places::{PlaceHandle, QueuePlace, Reserved};
pub(crate) use fast_path::{Held, WordShard};
pub(crate) use report::collect;
pub(crate) use report::Collected;
pub(crate) use scheduler::{Admission, Finishing, Outcome, Refusal, TicketId, TicketPoll};
use scheduler::{Scheduler, WakeList};
pub use scheduler::{
    DEFAULT_DELAYED_WARN_THRESHOLD, DEFAULT_IDLE_TTL, DEFAULT_MAX_HOLD, DEFAULT_MAX_SCOPES, MAX_MAX_HOLD,
};
pub(crate) use seam::{Asked, EndOwner, EndTiming, RequestEnd};
pub(crate) use ticket::WaitedInScheduler;

/// Default global cap on requests in flight.
pub const DEFAULT_MAX_CONCURRENCY: u32 = 16;
/// Default cap on requests admitted by `poll_ready` but not yet sent.
pub const DEFAULT_MAX_QUEUED: usize = 10_000;

/// The shared throttling state. See the [module docs](self) for the model.
///
/// # Clone
///
/// Cloning is cheap (an `Arc`), and clones share everything.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::{Registry, ScopeConfig};
///
/// let registry = Registry::builder()
///     .max_concurrency(16)
///     .default_scope(ScopeConfig::default())
///     .scope(
///         "quotes.toscrape.com",
///         ScopeConfig::default().concurrency(16).delay(Duration::ZERO),
///     )
///     .build()?;
/// # Ok::<(), tower_throttle::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct Registry {
    shared: Arc<RegistryShared>,
}

/// Aligned to 128 bytes, so that the `Arc`'s counts, which every request
/// that holds the registry writes twice, sit on lines of their own: not
/// on the line of the fields every request reads (a core's write to a
/// line takes it from every other core's cache).
#[repr(align(128))]
struct RegistryShared {
    /// The scope state and the queues, behind the registry's one lock
    /// (boxed: its lines are not those every request reads).
    scheduler: Box<Locked>,
    /// This registry's number, for the threads' caches of open scopes.
    uid: u64,
    /// The requests in flight over all scopes, shared with the scheduler.
    global: Arc<fast_path::GlobalFlight>,
    /// The words of plain scopes by name, found without the lock.
    words: Arc<fast_path::Directory>,
    resolver: Box<dyn ScopeResolver>,
    max_queued: usize,
    /// What the builder was given, for reading the config back.
    settings: GlobalSettings,
    /// The `max_queued` places: one per request readied by `poll_ready`
    /// and not yet sent (see `fast_path/places.rs`).
    queue_places: Arc<fast_path::places::QueuePlaces>,
    /// The scope store shared with other workers, if any.
    fleet: Option<Arc<StoreHandle>>,
    /// Whether some scope's manager hears successes (a config with a custom
    /// manager; set once, never cleared): only then do feedback layers
    /// measure what managers alone use, such as latency.
    managers_hear_successes: AtomicBool,
    /// Whether some scope counts whole transfers (set once): else no lookup.
    whole_transfers_somewhere: AtomicBool,
    /// Responses of whole-transfer scopes held unread (see `unread`).
    unread: unread::UnreadTransfers,
    /// Times the scheduler's lock was taken, counted in debug builds only
    /// (tests check the locking per request with it).
    #[cfg(debug_assertions)]
    locks: std::sync::atomic::AtomicU64,
    /// Every backoff status of every scope config, read without the lock.
    backoff_statuses: report::BackoffStatuses,
    /// Whether the resolver is the built-in [`HostResolver`](crate::scope::HostResolver)
    /// (then the throttle finds a host's scope by name, without a key).
    resolves_hosts: bool,
    /// What the config checks found that can never take effect, for
    /// [`Registry::config_warnings`]: the builder's, then each
    /// [`Registry::set_scope`]'s (replacing the warnings of the config it
    /// replaces).
    config_warnings: Mutex<Vec<checks::ConfigWarning>>,
    /// The scope configs, read without the lock to judge responses.
    configs: Arc<configs::ConfigTable>,
}

/// The scheduler behind its lock, on cache lines of its own.
#[repr(align(128))]
struct Locked(Mutex<Scheduler>);

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("max_queued", &self.shared.max_queued)
            .field(
                "queued",
                &(self.shared.max_queued - self.shared.queue_places.free()),
            )
            .finish_non_exhaustive()
    }
}

impl Default for Registry {
    /// A registry with every default (equivalent to
    /// `Registry::builder().build()`).
    fn default() -> Self {
        Registry::builder()
            .build()
            .expect("the default configuration is valid")
    }
}

impl Registry {
    /// Starts building a registry.
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::default()
    }

    /// A hook for the project's tests, hidden from the docs: it may change
    /// or go in any release. How many times the registry's locks have been
    /// taken, in debug builds (`None` in release builds, which do not
    /// count): how tests check the locks a request costs.
    #[doc(hidden)]
    pub fn debug_lock_count(&self) -> Option<u64> {
        #[cfg(debug_assertions)]
        return Some(self.shared.locks.load(Ordering::Relaxed));
        #[cfg(not(debug_assertions))]
        None
    }

    /// Locks the scheduler.
    #[inline]
    fn lock(&self) -> MutexGuard<'_, Scheduler> {
        #[cfg(debug_assertions)]
        self.shared.locks.fetch_add(1, Ordering::Relaxed);
        // The scheduler never panics while holding the lock, but if a
        // tracing subscriber did, its state is still consistent.
        self.shared
            .scheduler
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// [`with_scheduler_at`](Self::with_scheduler_at), now.
    #[inline(always)]
    fn with_scheduler<T>(&self, act: impl FnOnce(&mut Scheduler, Instant, &mut WakeList) -> T) -> T {
        self.with_scheduler_at(None, act)
    }

    /// Locks the scheduler, runs `act` with the current instant (or `now`,
    /// when the caller has just read the clock: an instant read before the
    /// lock is at most a little early, which only makes the scheduler's
    /// checks stricter) and a list to collect wakers in, lets the global
    /// permits given back meanwhile go to the requests waiting for them,
    /// unlocks, then wakes them. Waking after the lock is released keeps a
    /// woken task that runs at once on another thread from contending for
    /// it; this is the one place that does it.
    #[inline(always)]
    fn with_scheduler_at<T>(
        &self,
        now: Option<Instant>,
        act: impl FnOnce(&mut Scheduler, Instant, &mut WakeList) -> T,
    ) -> T {
        self.with_scheduler_timed(|_| now.unwrap_or_else(Instant::now), act)
    }

    /// [`with_scheduler_at`](Self::with_scheduler_at), at the instant `now`
    /// gives once the lock is taken: it may look at the scheduler to tell
    /// whether the clock must be read at all.
    #[inline(always)]
    fn with_scheduler_timed<T>(
        &self,
        now: impl FnOnce(&Scheduler) -> Instant,
        act: impl FnOnce(&mut Scheduler, Instant, &mut WakeList) -> T,
    ) -> T {
        // Empty until something is woken: no allocation on the common path.
        let mut wake = WakeList::new();
        let result = {
            let mut scheduler = self.lock();
            let now = now(&scheduler);
            let result = act(&mut scheduler, now, &mut wake);
            scheduler.settle_global(now, &mut wake);
            scheduler.report_levels();
            result
        };
        // Checked first: most operations wake nobody, and consuming an
        // empty list still costs its iterator and its drop.
        if !wake.is_empty() {
            for waker in wake {
                waker.wake();
            }
        }
        result
    }

    /// Holds scope `key` for `duration`: nothing of it is sent before then.
    /// The hold is capped at the registry's
    /// [`max_hold`](RegistryBuilder::max_hold) (1 h by default; a longer
    /// one is capped with a warning) and never shortens a longer one
    /// already active. This is the call rate-limit feedback (Retry-After,
    /// RateLimit resets) uses; to hold until an instant, pass the time
    /// left until it.
    ///
    /// With a [scope store](crate::store), the hold is written to the store
    /// too (in the background), so every worker of the fleet holds.
    pub fn hold(&self, key: impl Into<Scope>, duration: Duration) {
        let now = Instant::now();
        self.hold_until(key, saturating_add(now, duration));
    }

    /// Holds scope `key` until `until`. See [`hold`](Self::hold).
    fn hold_until(&self, key: impl Into<Scope>, until: Instant) {
        let key = key.into();
        let held = self.with_scheduler(|scheduler, now, wake| {
            scheduler.hold(&key, until, now, wake);
            scheduler.hold_left(&key, now)
        });
        if let (Some(fleet), Some(left)) = (self.fleet(), held) {
            fleet.in_background(fleet.store.hold(key, left));
        }
    }

    /// The scope store, if the registry shares its scopes through one.
    pub(crate) fn fleet(&self) -> Option<&Arc<StoreHandle>> {
        self.shared.fleet.as_ref()
    }

    /// Reports what a response (or error) of a request with `scopes` says:
    /// backoff feedback takes a backoff step in each scope. This is the call
    /// the backoff layer makes; use it directly from your own layers. With a
    /// [scope store](crate::store), a backoff step's delay is written to the
    /// store too (in the background), for the fleet's other workers.
    pub fn feedback(&self, scopes: &Scopes, feedback: Feedback) {
        self.report(scopes, |_, _| ScopeReport::new().feedback(feedback));
    }

    /// Whether `status` is backoff feedback for scope `key` (its backoff
    /// `http_codes`). Cheaper than [`scope_config`](Self::scope_config):
    /// nothing is copied.
    pub(crate) fn is_backoff_status(&self, key: &str, status: u16) -> bool {
        self.with_scheduler(|scheduler, _, _| scheduler.config_arc(key))
            .get_backoff()
            .is_backoff_status(status)
    }

    /// Records the robots.txt Crawl-delay that applies to scope `key`
    /// (`None`: none known). The scope then sends one request at a time, at
    /// least `crawl_delay` apart, unless it has an explicit config, which
    /// keeps precedence (with a warning unless it sets `ignore_robots_txt`).
    /// An idle scope may be evicted with it.
    pub fn set_robots_delay(&self, key: impl Into<Scope>, crawl_delay: Option<Duration>) {
        let key = key.into();
        self.with_scheduler(|scheduler, now, wake| {
            scheduler.set_robots_delay(&key, crawl_delay, None, now, wake)
        });
    }

    /// Like [`set_robots_delay`](Self::set_robots_delay), and keeps the
    /// scope from being evicted while idle before `valid_until` (when the
    /// robots.txt it comes from expires): a cache that tells each scope its
    /// Crawl-delay once must not have it forgotten meanwhile. This is the
    /// call the robots.txt layer makes.
    #[cfg(feature = "robots")]
    pub(crate) fn set_robots_delay_until(
        &self,
        key: impl Into<Scope>,
        crawl_delay: Option<Duration>,
        valid_until: Instant,
    ) {
        let key = key.into();
        self.with_scheduler(|scheduler, now, wake| {
            scheduler.set_robots_delay(&key, crawl_delay, Some(valid_until), now, wake)
        });
    }

    /// Paces scope `key`: at least `delay` between sends until `until`;
    /// `None` stops it. The delay is capped at the scope's backoff
    /// `max_delay`, the span at 7 days. The
    /// rate-limit header layer reports it (through a scope report) to
    /// spread an announced quota; tests set it directly.
    #[cfg(test)]
    pub(crate) fn set_pacing(&self, key: impl Into<Scope>, pacing: Option<(Duration, Instant)>) {
        let key = key.into();
        self.with_scheduler(|scheduler, now, wake| scheduler.set_pacing(&key, pacing, now, wake));
    }

    /// The config scope `key` uses (its own, or the default one), with the
    /// settings it inherits filled in.
    pub fn scope_config(&self, key: &str) -> ScopeConfig {
        ScopeConfig::clone(&self.shared.configs.config_of(key).0)
    }

    /// The plain-value settings the registry was built with.
    #[cfg(feature = "serde")]
    pub(crate) fn global_settings(&self) -> GlobalSettings {
        self.shared.settings
    }

    /// The config of IP scopes without their own, if set.
    #[cfg(feature = "serde")]
    pub(crate) fn ip_scopes_config(&self) -> Option<ScopeConfig> {
        self.shared.configs.ip_scopes()
    }

    /// The default scope's config and every scope's own config (with the
    /// settings it inherits filled in), as they are now.
    #[cfg(feature = "serde")]
    pub(crate) fn scope_configs(&self) -> (ScopeConfig, Vec<(Scope, ScopeConfig)>) {
        self.shared.configs.snapshot()
    }

    /// A snapshot of scope `key`, or `None` if the registry does not hold
    /// it (never seen, or evicted while idle).
    pub fn scope_stats(&self, key: &str) -> Option<ScopeStats> {
        self.with_scheduler(|scheduler, now, _| scheduler.scope_stats(key, now))
    }

    /// The global counters: in flight, waiting, scopes tracked, evictions.
    /// Cheap whatever the number of scopes (nothing per scope is built);
    /// see [`all_scope_stats`](Self::all_scope_stats) for every scope.
    pub fn stats(&self) -> Stats {
        self.lock().stats()
    }

    /// A snapshot of every scope the registry holds, sorted by name. Costs
    /// one [`ScopeStats`] per scope, under the registry's lock: for a
    /// dashboard, not for every request.
    pub fn all_scope_stats(&self) -> Vec<ScopeStats> {
        self.with_scheduler(|scheduler, now, _| scheduler.all_scope_stats(now))
    }

    /// The scopes `request` is throttled by: its [`Scopes`] extension if it
    /// has one; else, called from an inner layer's `call` while a
    /// [`Throttle`](crate::Throttle) of this registry hands the request over,
    /// the scopes that throttle decided; otherwise what the resolver says.
    /// Inner layers call this in their `call` to report to the right scopes
    /// (see [`ThrottleLayer::record_scopes`](crate::ThrottleLayer::record_scopes)).
    pub fn scopes_of<B>(&self, request: &http::Request<B>) -> Scopes {
        if let Some(scopes) = request.extensions().get::<Scopes>() {
            return scopes.clone();
        }
        handover::being_handed_over(self.id())
            .unwrap_or_else(|| self.shared.resolver.resolve(&RequestHead::of(request)))
    }

    /// The scopes a throttle resolves for `request`: its [`Scopes`]
    /// extension, or what the resolver says (never a scope being handed
    /// over: that is another request's).
    pub(crate) fn resolve<B>(&self, request: &http::Request<B>) -> Scopes {
        match request.extensions().get::<Scopes>() {
            Some(scopes) => scopes.clone(),
            None => self.shared.resolver.resolve(&RequestHead::of(request)),
        }
    }

    /// This registry's identity (shared by its clones), to tell it from
    /// another registry's.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    /// Whether some scope's manager may hear successes (a custom one): the
    /// feedback layers measure latency, and report successes, only then.
    pub(crate) fn managers_hear_successes(&self) -> bool {
        self.shared.managers_hear_successes.load(Ordering::Relaxed)
    }

    /// Whether a request of `scopes` keeps its lanes until its response
    /// body ends rather than only until its head: when any one of its
    /// scopes' configs counts whole transfers (see
    /// [`ScopeConfig::count_whole_transfers`]).
    #[inline]
    pub(crate) fn counts_whole_transfers(&self, scopes: &Scopes) -> bool {
        self.shared.whole_transfers_somewhere.load(Ordering::Relaxed)
            && self.any_counts_whole_transfers(scopes)
    }

    #[cold]
    fn any_counts_whole_transfers(&self, scopes: &Scopes) -> bool {
        scopes.iter().any(|(scope, _)| {
            self.shared
                .configs
                .config_of(scope.as_str())
                .0
                .count_whole_transfers
        })
    }

    /// A handle that reserves places among `max_queued` (one per service
    /// clone: it keeps the state of a pending reservation).
    pub(crate) fn queue_places(&self) -> PlaceHandle {
        PlaceHandle::new(self.shared.queue_places.clone())
    }
}

#[cfg(test)]
mod tests;
