//! Scope stores: where the facts a fleet of workers must agree on live.
//!
//! One registry throttles one process. When a crawl runs as many workers
//! (processes, machines), each site must still see one polite client: the
//! delay between two requests of a scope and its number of lanes hold for
//! the whole fleet, and a `Retry-After` or a backoff seen by one worker
//! slows all of them. A [`ScopeStore`] keeps these *shared facts* of each
//! scope where every worker reaches them:
//!
//! - the **next permitted send instant**, taken by reservation as in GCRA:
//!   atomically `t = max(now, next); next = t + delay`, so two workers never
//!   get the same instant;
//! - **lane leases** with an expiry, which each worker renews in the
//!   background for its requests in flight (one batched call every third
//!   of the TTL, so a request may outlast the TTL): a worker that crashes
//!   while holding a lane stops renewing, and the lane comes back within
//!   one TTL;
//! - the **hold** (pause-until, from `Retry-After` and rate-limit resets)
//!   and the **backoff delay** with the time it still applies;
//! - the **quota window** of a scope with a [quota](crate::ScopeConfig::quota):
//!   what the fleet spent of it (expected costs; the corrections feedback
//!   reports stay local).
//!
//! - **what the fleet learns**: the state of each rampup scope's search
//!   for the server's rate, each AutoThrottle scope's delay, and the level
//!   of the built-in backoff (see [below](#what-the-fleet-learns));
//! - the **line** of workers waiting for a busy scope's lanes (see
//!   [fairness](#fairness-between-workers)).
//!
//! Everything else stays in the process: the queues, the waiters' wake-ups,
//! the latency average, a custom manager's state.
//!
//! # How a request goes through a store
//!
//! The registry's scheduler admits a request by its local limits as usual.
//! Then, before the request is handed to the inner service, its response
//! future asks the store for one reservation covering all of its scopes at
//! once: a lane lease in each and the send instant (the latest of the
//! scopes' next instants and holds). It sleeps until that instant (counted
//! from the store's answer, so never early) and sends. When the request
//! ends (or its future is dropped) the leases are released in the
//! background; a crash leaves them to expire. If a scope
//! has no free lane in the fleet, the answer says when to ask again (the
//! scope's next send instant, at least a few milliseconds away): no polling
//! loop faster than the delay. Each answer also brings the scopes' stored
//! hold and backoff delay, which the local scope applies as limits of its
//! own ([`LimitSource::Fleet`](crate::registry::LimitSource::Fleet) in its stats), so
//! the local scheduler stops admitting what the fleet would make wait.
//!
//!
//! ## What the site sees: late sends and first requests
//!
//! A granted instant is a promise about when the request *leaves*, and a
//! worker can miss it: its runtime is busy, or its clock estimate of the
//! store's time is a little behind. So the release says how far the next
//! send must be, counted from when the request really left: the store's
//! next send instant moves to at least `release time + (departure + gap −
//! now)`. With one lane, no other worker can reserve before that release,
//! so a late send never shortens the gap after it. With more lanes another
//! worker may already hold the next instant, so a request that wakes more
//! than 1.5 ms late gives its instant up and reserves again (at most three
//! times).
//!
//! A worker's first request to a scope sets up its connection (TCP, TLS)
//! after it leaves, so the site sees it late by that setup. As the local
//! [cold start](crate::registry#cold-start) rule does for one process, such
//! a request ([`ScopeTerms::first`](backend::ScopeTerms::first)) keeps every other reservation of the
//! scope waiting until it ends, and the fleet's next send comes the scope's
//! delay after that end. Each worker pays this once per scope (again after
//! the scope is evicted); a worker that crashes mid-way holds the scope
//! until its lease TTL, as it holds its lane.
//!
//! [`Registry::hold`](crate::Registry::hold) (and so `RetryAfterLayer`) and
//! backoff feedback write to the store too, in the background.
//!
//! Without a store (the default), the registry's own in-memory state is the
//! only state: nothing of this runs and a request costs what it did.
//! [`MemoryStore`] is a store kept in the process, shared by registries that
//! hold clones of it: the same protocol without a network, useful to test a
//! fleet under paused time. `RedisStore` (with the `redis` feature) is
//! the store for a real fleet.
//!
//! # What the fleet learns
//!
//! A [rampup](crate::registry::RampupConfig) scope searches for the fastest
//! pace its server accepts. Searched by each worker alone, the paces drift
//! apart (one worker's probe is another's refusal, and a reservation spaces
//! the fleet's next send by the reserving worker's own pace): four workers
//! against a server allowing 20 requests a second got 0.08 of them, with
//! 43.6 % refused, in the paused-time test `tests/fleet_learning.rs`. So
//! the search is one search for the fleet, in the store:
//!
//! - its state is a short versioned line of text per scope
//!   ([`ScopeStore::learnt`]), kept a day ([`LEARNT_TTL`]) after its last
//!   write;
//! - a worker's backoff feedback goes to it, not to the worker's copy, in
//!   the background: read, caught up with the windows that ended since the
//!   last write, the backoff applied, written back only if no other worker
//!   wrote meanwhile ([`ScopeStore::swap_learnt`], a compare-and-swap on the
//!   version; otherwise again, from what that worker wrote); then the
//!   worker takes the result as its own (if the store cannot be reached,
//!   its copy takes the backoff, as if it searched alone);
//! - every reservation answer says which version the store has
//!   ([`SharedFacts::learnt_version`]); a worker whose copy is older reads
//!   it (once per scope at a time) and takes it;
//! - a window's end is not written: every worker rolls its copy at the
//!   same instants, the same way.
//!
//! The same four workers then got 19.99 requests a second with 0.08 %
//! refused, as one worker does; against nginx `limit_req` at 20 r/s, four
//! workers got 96.3–96.8 % of the rate over three runs, at most 1.14 %
//! refused (`benches/rampup_nginx.rs`; learning alone, 11.8 % and 23.4 %). The decision logic stays in Rust: the store
//! only compares versions. [`RegistryBuilder::fleet_learning(false)`](crate::registry::RegistryBuilder::fleet_learning)
//! keeps each worker's search its own.
//!
//! An **AutoThrottle** scope's delay is one delay for the fleet too: each
//! response's sample (latency, status, with the scope's settings:
//! [`AutoThrottleSample`]) goes to the store in the background, which
//! applies Scrapy's rule to the delay it keeps, atomically
//! ([`ScopeStore::autothrottle`]: a Lua script in Redis), as if one client
//! had seen every worker's responses in turn; the worker takes the result
//! as its delay, and every reservation answer carries the fleet's delay
//! ([`SharedFacts::autothrottle_delay`]), so a worker that saw no response
//! follows it. One slow response seen by one worker slows them all; the
//! fast responses of all of them bring the delay down together. A sample
//! the store cannot take moves the worker's own delay. (A store call per
//! response of an AutoThrottle scope, in the background, off the request's
//! path.)
//!
//! The **built-in backoff** has one level for the fleet: a worker's backoff
//! feedback steps the fleet's level up in the store, atomically
//! ([`ScopeStore::step_backoff`]: from the level in force, stepped back by
//! the quiet windows since the last step, one level more and the delay times
//! the factor), and the worker takes the result as its backoff; every
//! reservation answer carries the level in force, its delay and the time
//! to its next step back ([`SharedFacts::backoff_level`]), so every worker
//! has the same level, with the same concurrency reduction and jitter, and
//! steps back at the same instant. Before, each worker stepped its own
//! level and wrote only its delay, so a worker at its first step could
//! replace a fleet's 8 s with 1 s (`tests/fleet_learning.rs`: two workers'
//! backoffs give the fleet level 2, 2 s; learning alone, level 1 each and
//! 1 s between sends).
//!
//! A custom [`ScopeManager`](crate::registry::manager::ScopeManager)'s state
//! stays in its worker. Its state is any Rust value; sharing it would need
//! every manager to encode its state and to say how two workers' updates
//! merge, for what a built-in manager or a [hold](crate::Registry::hold)
//! (which the fleet shares) mostly covers. A manager that must act for the
//! fleet can hold the scope, or keep its state in a store of its own; an
//! opt-in pair of methods to export and import a small state can be added
//! to the trait later without breaking a manager written today.
//!
//! # Fairness between workers
//!
//! When a scope's lanes are all taken, the workers that want one ask again
//! and again, and without more the one that asks first after a lane frees
//! takes it. That is most often the worker whose request just ended: its
//! next request asks as the last one gives its lane back. In the test
//! `tests/fleet_fairness.rs`, one worker of four kept both lanes of a scope
//! for the whole run and the others sent nothing. So a store keeps a
//! **line** per scope:
//!
//! - a reservation names its **waiter** ([`Reservation::waiter`]): the
//!   worker with the set of scopes it asks for. However many requests a
//!   worker has waiting, its waiter has one place in a line;
//! - a waiter refused a lane joins the scope's line with a **ticket**: its
//!   ticket in any line it is already in, else a new one, larger than every
//!   ticket given before. One ticket for all its lines orders waiters the
//!   same way in every scope, so two waiters over two scopes never hold a
//!   lane each for the other (the smallest ticket is first everywhere);
//! - a scope's free lanes go to the line first: a reservation takes a lane
//!   only when the scope has more free lanes than waiters ahead of it (all
//!   of them, for a waiter not in line);
//! - a granted waiter leaves the lines of its scopes, so its next wait
//!   starts at the back: the lanes go round the waiting workers;
//! - a place lasts until the waiter's next ask is due plus
//!   [`LINE_GRACE`](backend::LINE_GRACE); a worker that stopped asking (its requests were
//!   dropped, or it crashed) loses it, and the lanes it was owed go on.
//!
//! A worker with ten times the requests of the others then gets the same
//! share of a busy scope as each of them, and a worker that asks for less
//! than its share gets all it asks. With 4 workers on two lanes of 100 ms
//! requests, in paused time: 5 sends a second each (20 for the fleet),
//! where one worker had taken all 20 before; against Redis, in real time,
//! 4–5 a second for each worker with one request loop and 5–8 for the one
//! with ten (1–7 and 5–12 without lines). A line only decides who takes a free lane: the
//! delay, quota and holds apply as before.
//!
//! # When the store is unreachable
//!
//! The registry fails in the direction chosen with
//! [`RegistryBuilder::store_failure`](crate::registry::RegistryBuilder::store_failure):
//!
//! - [`StoreFailure::FailClosed`] (the default): the request fails with an
//!   [`Error`](crate::Error) whose [`is_store`](crate::Error::is_store) is
//!   true. That needs a throttle service that can return the crate's error:
//!   [`ThrottleLayer::store_errors`](crate::ThrottleLayer::store_errors).
//!   A throttle that passes the inner service's error type through has no
//!   way to say it, so its requests wait and ask the store again (nothing
//!   is sent unthrottled), with a warning once per outage;
//! - [`StoreFailure::FailLocal`]: the request goes by the per-process
//!   limits alone, with a warning once per outage and a note when the store
//!   answers again.
//!
//! # Writing a store
//!
//! A store is four methods returning boxed futures ([`StoreFuture`]), so it
//! can be kept behind an `Arc<dyn ScopeStore>` and its futures stored in the
//! response future. `reserve` must be atomic over all of its scopes.
//!
//! ```
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_throttle::store::MemoryStore;
//! use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Two workers sharing one store: together they send one request to
//! // example.com every 100 ms.
//! let store = MemoryStore::new();
//! let config = ScopeConfig::default().delay(Duration::from_millis(100)).jitter(0.0);
//! let worker = |store: &MemoryStore| {
//!     let registry = Registry::builder()
//!         .default_scope(config.clone())
//!         .store(store.clone())
//!         .build()?;
//!     Ok::<_, tower_throttle::ConfigError>(
//!         ServiceBuilder::new()
//!             .layer(ThrottleLayer::new(registry).store_errors())
//!             .service(tower::service_fn(|_request: http::Request<()>| async {
//!                 Ok::<_, std::convert::Infallible>(http::Response::new(()))
//!             })),
//!     )
//! };
//! let (one, two) = (worker(&store)?, worker(&store)?);
//! let start = tokio::time::Instant::now();
//! one.oneshot(http::Request::get("https://example.com/a").body(())?).await?;
//! two.oneshot(http::Request::get("https://example.com/b").body(())?).await?;
//! assert_eq!(start.elapsed(), Duration::from_millis(100));
//! # Ok(())
//! # }
//! ```

mod autothrottle;
mod backoff;
mod line;
mod memory;
#[cfg(feature = "redis")]
mod redis;

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use self::redis::RedisStore;
pub mod backend;

use backend::{
    Answer, AutoThrottleSample, BackoffStep, FleetBackoff, Grant, Learnt, Lease, LeaseId, QuotaTerms,
    Reservation, ScopeStore, SharedFacts, StoreFuture, LEARNT_TTL,
};
pub use memory::MemoryStore;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::scope::Scope;
use tower::BoxError;

/// What a registry does when its store cannot be reached; see the
/// [module docs](self#when-the-store-is-unreachable).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreFailure {
    /// Requests fail with a store error (or wait, if the throttle cannot
    /// return one). Nothing is sent without the store's word.
    #[default]
    FailClosed,
    /// Requests go by the per-process limits alone until the store answers
    /// again, with a warning once per outage.
    FailLocal,
}

/// A store could not be reached, timed out, or answered something
/// unexpected.
#[derive(Debug)]
#[non_exhaustive]
pub struct StoreError {
    what: String,
    source: Option<BoxError>,
}

impl StoreError {
    /// An error saying `what` failed, caused by `source`.
    pub fn new(what: impl Into<String>, source: impl Into<BoxError>) -> Self {
        StoreError {
            what: what.into(),
            source: Some(source.into()),
        }
    }

    /// A call that got no answer within `limit`.
    pub fn timeout(what: impl Into<String>, limit: Duration) -> Self {
        StoreError {
            what: format!("{} timed out after {limit:?}", what.into()),
            source: None,
        }
    }

    /// An answer the store should not give.
    pub fn unexpected(what: impl Into<String>) -> Self {
        StoreError {
            what: what.into(),
            source: None,
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Some(source) => write!(f, "{}: {source}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn std::error::Error + 'static))
    }
}

/// The renewal task's hold on its store: a task that does not end by
/// itself (its runtime shut down while it waited) lets the next lease start
/// another.
struct RenewalTask {
    handle: std::sync::Weak<StoreHandle>,
    ended: bool,
}

impl RenewalTask {
    /// The task ends by itself: nothing to hand over.
    fn end(&mut self) {
        self.ended = true;
    }
}

impl Drop for RenewalTask {
    fn drop(&mut self) {
        if !self.ended {
            if let Some(fleet) = self.handle.upgrade() {
                fleet.leases().renewing = false;
            }
        }
    }
}

/// The leases a worker's requests hold, and whether its renewal task runs.
#[derive(Debug, Default)]
struct Leases {
    live: HashMap<LeaseId, Vec<Scope>>,
    renewing: bool,
}

/// A registry's store, with the failure mode chosen and whether an outage
/// is under way (so it is reported once, not per request).
#[derive(Debug)]
pub(crate) struct StoreHandle {
    pub(crate) store: Arc<dyn ScopeStore>,
    pub(crate) failure: StoreFailure,
    /// Whether an outage is under way.
    outage: Mutex<bool>,
    /// The leases this worker's requests hold, and whether the task that
    /// renews them runs: one lock, so a lease that comes as the task ends
    /// either finds it running or starts another.
    leases: Mutex<Leases>,
    /// Whether the fleet learns together (the store shares learning and the
    /// registry wants it).
    pub(crate) learns: bool,
    /// Scopes whose learnt state is being read, so one stale answer after
    /// another starts one read.
    pub(crate) reading: Mutex<std::collections::HashSet<Scope>>,
    /// This worker's name in the scopes' lines (random).
    pub(crate) worker: u64,
}

impl StoreHandle {
    /// `learns`: whether the fleet learns together (asked for, and a store
    /// that shares learning).
    pub(crate) fn new(store: Arc<dyn ScopeStore>, failure: StoreFailure, learns: bool) -> Self {
        StoreHandle {
            learns,
            store,
            failure,
            outage: Mutex::new(false),
            leases: Mutex::default(),
            reading: Mutex::default(),
            worker: fastrand::u64(..),
        }
    }

    fn leases(&self) -> std::sync::MutexGuard<'_, Leases> {
        self.leases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes that a request holds lease `id` in `scopes` until
    /// [`untrack`](Self::untrack), and starts the renewal task if the store
    /// renews and the task is not running yet.
    pub(crate) fn track(self: &Arc<Self>, id: LeaseId, scopes: Vec<Scope>) {
        let Some(ttl) = self.store.lease_ttl() else {
            return;
        };
        let start = {
            let mut leases = self.leases();
            leases.live.insert(id, scopes);
            !std::mem::replace(&mut leases.renewing, true)
        };
        if start {
            self.start_renewing(ttl);
        }
    }

    /// The request holding lease `id` ended: its lease is not renewed
    /// any more.
    pub(crate) fn untrack(&self, id: LeaseId) {
        if self.store.lease_ttl().is_some() {
            self.leases().live.remove(&id);
        }
    }

    /// Every third of `ttl`, renews every lease this worker's requests hold,
    /// in one store call; ends when none is held (the next lease starts it
    /// again) or the registry is gone.
    fn start_renewing(self: &Arc<Self>, ttl: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.leases().renewing = false;
            return;
        };
        let period = (ttl / 3).max(Duration::from_millis(1));
        let mut task = RenewalTask {
            handle: Arc::downgrade(self),
            ended: false,
        };
        runtime.spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(fleet) = task.handle.upgrade() else {
                    task.end();
                    return;
                };
                let leases: Vec<Lease> = {
                    let mut leases = fleet.leases();
                    if leases.live.is_empty() {
                        // Nothing in flight: the task ends (no timer kept
                        // for an idle worker); the next lease starts
                        // another.
                        leases.renewing = false;
                        task.end();
                        return;
                    }
                    leases
                        .live
                        .iter()
                        .map(|(&id, scopes)| Lease::new(id, scopes.clone()))
                        .collect()
                };
                match fleet.store.renew(leases).await {
                    Ok(()) => fleet.note_answer(),
                    Err(error) => fleet.note_failure(&error),
                }
            }
        });
    }

    fn outage(&self) -> std::sync::MutexGuard<'_, bool> {
        self.outage.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes that the store answered, and says so if it had not before.
    pub(crate) fn note_answer(&self) {
        if std::mem::take(&mut *self.outage()) {
            tracing::warn!(
                target: "tower_throttle",
                store = ?self.store,
                "scope store reachable again: fleet-wide limits apply"
            );
        }
    }

    /// Notes a failed store call, warning on the first of an outage.
    pub(crate) fn note_failure(&self, error: &StoreError) {
        if !std::mem::replace(&mut *self.outage(), true) {
            let consequence = match self.failure {
                StoreFailure::FailClosed => "requests fail (or wait) until it answers",
                StoreFailure::FailLocal => "falling back to per-process limits",
            };
            tracing::warn!(
                target: "tower_throttle",
                store = ?self.store,
                %error,
                "scope store unreachable: {consequence}"
            );
        }
    }

    /// Runs a store write in the background (on the current tokio runtime,
    /// if there is one): holds, backoffs and releases are worth sending but
    /// not worth waiting for, and a lease nobody releases expires.
    pub(crate) fn in_background(self: &Arc<Self>, write: StoreFuture<()>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let fleet = self.clone();
        runtime.spawn(async move {
            match write.await {
                Ok(()) => fleet.note_answer(),
                Err(error) => fleet.note_failure(&error),
            }
        });
    }
}
