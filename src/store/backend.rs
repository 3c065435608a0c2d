//! What a store implements: the [`ScopeStore`] trait and the records its
//! methods take and return. A registry talks to any store through this
//! interface; [`MemoryStore`](super::MemoryStore) and, with the `redis`
//! feature, `RedisStore` are its two implementations. Write your own to
//! keep the fleet's shared facts elsewhere: see the [`store`](super)
//! module docs for what each fact means and the guarantees a store gives.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::StoreError;
use crate::scope::Scope;

pub use super::autothrottle::AutoThrottleSample;
pub use super::backoff::{BackoffStep, FleetBackoff};
pub use super::line::{WaiterId, LINE_GRACE};

/// What a store's methods return: a boxed future that owns what it needs.
pub type StoreFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'static>>;

/// Where the shared facts of scopes live; see the [module docs](self).
pub trait ScopeStore: fmt::Debug + Send + Sync + 'static {
    /// Atomically, for every scope of `reservation`: drops expired leases
    /// and expired places in line; if each scope has a free lane for the
    /// reservation's waiter (more free lanes than waiters ahead of it in
    /// the scope's [line](self#fairness-between-workers)) and room in its
    /// quota window for the request's cost (an empty window takes any
    /// cost), takes one lease in each, spends the cost, takes the waiter
    /// out of the lines, picks the send instant `t` = the latest of now,
    /// every scope's next send instant and hold, and moves every scope's
    /// next send instant to `t` + its delay (at least its stored backoff
    /// delay). Otherwise takes nothing, puts the waiter in the line of each
    /// scope that had no lane for it, and says to ask again at the scopes'
    /// next instant or, when a quota is what is missing, when its window
    /// ends.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot be reached or answers
    /// nonsense.
    fn reserve(&self, reservation: Reservation) -> StoreFuture<Grant>;

    /// Gives back the lanes `lease` holds, ends the wait a
    /// [first](ScopeTerms::first) request imposed on its scopes, and moves
    /// each scope's next send instant to at least the store's now plus its
    /// [`next_send_after`](Lease::next_send_after). Releasing an expired or
    /// unknown lease only does the last.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot be reached.
    fn release(&self, lease: Lease) -> StoreFuture<()>;

    /// Holds `scope` for `duration` from the store's now: no reservation
    /// gets an instant before then. Never shortens a longer hold.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot be reached.
    fn hold(&self, scope: Scope, duration: Duration) -> StoreFuture<()>;

    /// Records that `scope` is backing off: each gap is at least `delay`,
    /// for `ttl` from the store's now (a later report replaces it).
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot be reached.
    fn backoff(&self, scope: Scope, delay: Duration, ttl: Duration) -> StoreFuture<()>;

    /// Extends each of `leases`, in every scope it holds a lane of, to the
    /// store's now plus the [lease TTL](Self::lease_ttl), so a request
    /// longer than the TTL keeps its lanes. A lease given back or expired
    /// is not taken again. A registry calls it in the background for the
    /// leases its requests hold, all in one call, every third of the TTL;
    /// a worker that stops (a crash) stops renewing, and its lanes come
    /// back within one TTL. The default renews nothing.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot be reached (the leases then
    /// last until their TTL, and the next round tries again).
    fn renew(&self, leases: Vec<Lease>) -> StoreFuture<()> {
        drop(leases);
        Box::pin(std::future::ready(Ok(())))
    }

    /// What the fleet learnt of `scope`: the state of its shared rampup
    /// search, if one was written (see the [module docs](self#what-the-fleet-learns)).
    /// The default, for a store that does not share learning: nothing.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot be reached.
    fn learnt(&self, scope: Scope) -> StoreFuture<Option<Learnt>> {
        drop(scope);
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Atomically, replaces what the fleet learnt of `scope` with `state`
    /// if its version is still `version` (0: nothing written yet), keeps it
    /// for `ttl` from the store's now, and returns the new version (never
    /// 0, one more than the last); `None` when another worker wrote first
    /// (the caller reads again and retries). The default: `None`.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot be reached.
    fn swap_learnt(
        &self,
        scope: Scope,
        version: u64,
        state: String,
        ttl: Duration,
    ) -> StoreFuture<Option<u64>> {
        drop((scope, state, version, ttl));
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Atomically, steps the fleet's backoff of `scope` up by one: from the
    /// backoff in force now (the level and delay kept, stepped back by the
    /// quiet windows since the last step: [`BackoffStep::recovered`]) to
    /// [`BackoffStep::step`] of it, kept until it would have stepped all the
    /// way back; returns it. The reservation answers carry the backoff in
    /// force ([`SharedFacts::backoff_level`], `backoff_delay`,
    /// `backoff_remaining`). The default, for a store that does not share
    /// learning: `None`, and the worker steps its own backoff (and writes
    /// its delay with [`backoff`](Self::backoff)).
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot be reached.
    fn step_backoff(&self, scope: Scope, step: BackoffStep) -> StoreFuture<Option<FleetBackoff>> {
        drop((scope, step));
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Atomically, applies `sample` to the fleet's AutoThrottle delay of
    /// `scope` ([`AutoThrottleSample::next_delay`] from the delay kept, or
    /// from the start delay when none is), keeps the result for
    /// [`LEARNT_TTL`], and returns it; the reservation answers carry it
    /// ([`SharedFacts::autothrottle_delay`]). The default, for a store that
    /// does not share learning: `None`, and the worker adjusts its own.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot be reached.
    fn autothrottle(&self, scope: Scope, sample: AutoThrottleSample) -> StoreFuture<Option<Duration>> {
        drop((scope, sample));
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Whether this store shares what the fleet learns ([`learnt`](Self::learnt),
    /// [`swap_learnt`](Self::swap_learnt) and [`autothrottle`](Self::autothrottle)
    /// [`step_backoff`](Self::step_backoff) implemented, and
    /// [`SharedFacts::learnt_version`], [`SharedFacts::autothrottle_delay`]
    /// and [`SharedFacts::backoff_level`] filled). The default: `false`,
    /// and each worker learns alone.
    fn shares_learning(&self) -> bool {
        false
    }

    /// How long a lease lasts unless renewed. `None` (the default): the
    /// registry does not renew leases, which then last their TTL.
    fn lease_ttl(&self) -> Option<Duration> {
        None
    }
}

/// The name of a lease, unique across the fleet (random).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId(pub(crate) u64);

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A request's ask: a lease named `lease` in each scope, on these terms.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Reservation {
    /// The lease to take (the same name on every attempt of one request).
    pub lease: LeaseId,
    /// One entry per scope of the request.
    pub scopes: Vec<ScopeTerms>,
    /// Who waits: the worker with this set of scopes, one place in each
    /// scope's [line](self#fairness-between-workers) however many of its
    /// requests wait.
    pub waiter: WaiterId,
}

/// The local limits of one scope, as a reservation carries them.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ScopeTerms {
    /// The scope.
    pub scope: Scope,
    /// Lanes the fleet may use at once.
    pub concurrency: u32,
    /// The gap after this request's send (the effective delay, with this
    /// send's jitter already drawn).
    pub delay: Duration,
    /// The scope's quota, when it has one.
    pub quota: Option<QuotaTerms>,
    /// Whether this is the worker's first request to the scope (and the
    /// scope has a delay). Its connection is set up after it leaves, so the
    /// site sees it late by that setup; a granted first request keeps
    /// every other reservation of the scope waiting until its lease is
    /// released, when [`Lease::next_send_after`] says how far the next send
    /// must be.
    pub first: bool,
}

/// A scope's quota, as a reservation carries it: the fleet spends at most
/// `quota` units per `window` (a window starts at the first spend after the
/// last one ended).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct QuotaTerms {
    /// Units per window.
    pub quota: f64,
    /// The window's length.
    pub window: Duration,
    /// What this request spends (its expected cost in the scope).
    pub cost: f64,
}

/// The lanes a granted reservation holds, as its request gives them back.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lease {
    /// Its name.
    pub id: LeaseId,
    /// The scopes it holds a lane of.
    pub scopes: Vec<Scope>,
    /// Per scope, in `scopes`' order: the shortest time from the store's
    /// now (when it handles the release) to the scope's next send. It is
    /// the request's gap counted from when the request really left (or,
    /// for a [first](ScopeTerms::first) request, from its end), so a send
    /// that left later than its granted instant, by a late wake-up or a
    /// worker clock that runs behind, still keeps its gap to the next one.
    /// Zero (or a missing entry) adds nothing.
    pub next_send_after: Vec<Duration>,
}

impl Lease {
    /// A lease named `id` over `scopes`, adding nothing to their next sends.
    pub fn new(id: LeaseId, scopes: Vec<Scope>) -> Self {
        Lease {
            id,
            scopes,
            next_send_after: Vec::new(),
        }
    }
}

/// A store's answer to a [`Reservation`]. Made with [`Grant::new`] (it may
/// gain fields).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Grant {
    /// Whether the lanes were taken, and when to send or ask again.
    pub answer: Answer,
    /// The shared facts of each scope, in the reservation's order.
    pub facts: Vec<SharedFacts>,
}

impl Grant {
    /// The answer `answer`, with each scope's shared `facts` in the
    /// reservation's order.
    pub fn new(answer: Answer, facts: Vec<SharedFacts>) -> Self {
        Grant { answer, facts }
    }
}

/// Whether a reservation was granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Answer {
    /// The leases are taken: send `wait` from now.
    Granted {
        /// Time until the reserved send instant.
        wait: Duration,
    },
    /// A scope has no free lane in the fleet; nothing was taken. Ask again
    /// in `retry_in`.
    Busy {
        /// When to ask again.
        retry_in: Duration,
    },
}

/// What the store knows of one scope, as of its answer. Start from
/// `SharedFacts::default()` (nothing known) and set the fields (it may gain
/// fields).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharedFacts {
    /// Time left of the scope's hold (zero: none).
    pub hold: Duration,
    /// The backoff delay in force (zero: none) ...
    pub backoff_delay: Duration,
    /// ... and for how much longer.
    pub backoff_remaining: Duration,
    /// The version of what the fleet learnt of the scope (0: nothing; see
    /// [`ScopeStore::learnt`]): a worker whose copy is older reads it.
    pub learnt_version: u64,
    /// The fleet's AutoThrottle delay of the scope, if one is kept (see
    /// [`ScopeStore::autothrottle`]).
    pub autothrottle_delay: Option<Duration>,
    /// The level of the fleet's backoff in force (0: none, or a store that
    /// keeps no level; see [`ScopeStore::step_backoff`]); `backoff_delay`
    /// and `backoff_remaining` are then its delay and the time until its
    /// next step back.
    pub backoff_level: u32,
}

/// What the fleet learnt of a scope, as its store keeps it (see
/// [`ScopeStore::learnt`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Learnt {
    /// One more at every write; never 0.
    pub version: u64,
    /// The state, opaque to the store: a short line of text.
    pub state: String,
    /// How long ago it was written, by the store's clock.
    pub age: Duration,
}

impl Learnt {
    /// What a store read: `state` at `version`, written `age` ago.
    pub fn new(version: u64, state: String, age: Duration) -> Self {
        Learnt { version, state, age }
    }
}

/// How long a store keeps what the fleet learnt of a scope after its last
/// write: a day, so a fleet that pauses overnight starts where it was.
pub const LEARNT_TTL: Duration = Duration::from_secs(24 * 3600);
