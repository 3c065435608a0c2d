//! The scheduler: tickets, per-scope queues, dispatch and timers.
//!
//! Everything here runs under the registry's lock and never blocks, sleeps
//! or reads the clock: every call takes `now` from its caller, so the
//! admission algorithm can be tested at fixed instants. What one scope
//! allows at `now` is [`ScopeState`]'s business; the scheduler orders the
//! waiters, admits them all-or-nothing across their scopes, and keeps one
//! timer per scope. The futures in `throttle` do the waiting. See the
//! module docs of `registry` for the model.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use slab::Slab;
use tokio::time::Instant;

use super::config::ScopeConfig;
use super::configs::ConfigTable;
use super::fast_path::{FastScope, GlobalFlight, WordOwner};
use super::metrics::Metrics;
use super::scope_state::{Effective, ScopeCheck, ScopeState, Sending};
use super::shards::{Across, Placement, JOINT};
use super::ticket::{HeldBy, OrderKey, Seat, Seats, Status, TicketState, WaitedInScheduler};
pub(crate) use super::ticket::{Outcome, ScopeId, TicketId, TicketPoll, WakeList};
use crate::scope::{Scope, Scopes, DEFAULT_COST};
use crate::store::backend::AutoThrottleSample;
use crate::time::Stamp;
use crate::waited::WaitCause;
pub(crate) use entry::ScopeEntry;

/// How long a server may hold a scope by default (`RegistryBuilder::max_hold`).
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(3600);

/// The longest `max_hold` may be set to: a day.
pub const MAX_MAX_HOLD: Duration = Duration::from_secs(24 * 3600);

/// How a plain admission may use a scope's lock-free word (see
/// [`fast_path`](super::fast_path)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FastMode {
    /// Never: the scheduler admits, and closes an open scope first (a
    /// debug listener wants every send's event).
    Never,
    /// On the word of a scope already open (another thread uses it); also
    /// opens the word of a plain scope that the last one-scope request
    /// queued under the lock asked for too (a scope asked for twice in a
    /// row, by one thread or several, is busy).
    Join,
    /// Also opens a plain scope: the caller's thread had its word.
    Open,
}

/// What queuing a request gave.
#[derive(Debug)]
pub(crate) enum Admission {
    /// Admitted on the scope's open word: it ends there too.
    Fast(Arc<FastScope>),
    /// A ticket of the scheduler; admitted at once or not, as
    /// [`Scheduler::enqueue`] says.
    Ticket(TicketId, Option<bool>),
    /// Admitted at once on a lane of a plain scope, without a ticket: the
    /// scope and the lane are all its end needs (see
    /// [`Scheduler::finish_request`]).
    Plain(ScopeId, u32),
    /// Not queued: this home shard gave the request's scope to the joint
    /// shard, where the request goes instead (see
    /// [`shards`](super::shards)). The registry never hands it on.
    Elsewhere,
}

/// The request that ends, as [`Scheduler::finish_request`] is told it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Finishing {
    Ticket(TicketId),
    Plain(ScopeId, u32),
}

/// What stopped a waiter at an evaluation.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Verdict {
    Admit,
    HeldBy(ScopeId),
    Global,
}

/// The whole scheduling state of a registry.
#[derive(Debug)]
pub(crate) struct Scheduler {
    /// The scope configs, shared with the registry (which reads them
    /// without this lock): every scope without its own config points at
    /// the default one.
    configs: Arc<ConfigTable>,
    index: ScopeIndex,
    scopes: Slab<ScopeEntry>,
    tickets: Slab<TicketState>,
    next_seq: u64,
    max_concurrency: u32,
    /// Requests in flight over all scopes, shared with the open scopes
    /// (see [`fast_path`](super::fast_path)).
    global: Arc<GlobalFlight>,
    /// Whether plain scopes may open (not with a store: a fleet's scopes
    /// always reserve through it).
    fast_allowed: bool,
    /// What a scope's word is made with (set once the registry exists).
    word_owner: Option<WordOwner>,
    /// The scope of the last one-scope request queued (see
    /// [`FastMode::Join`]).
    last_one_scope: ScopeId,
    /// Waiters whose scopes all allow them but the global limit does not.
    global_queue: BTreeMap<OrderKey, TicketId>,
    rng: fastrand::Rng,
    dirty: Vec<ScopeId>,
    /// Waiters of several scopes, by their scopes (see [`groups`]).
    groups: groups::Groups,
    eviction: Eviction,
    /// The longest a hold may last (`RegistryBuilder::max_hold`).
    max_hold: Duration,
    /// Whether the fleet learns together: rampup's backoffs go to the
    /// fleet's search (which the scope adopts once written) rather than to
    /// the local copy, and AutoThrottle's samples to the fleet's delay.
    fleet_learns: bool,
    /// AutoThrottle samples for the fleet's store, taken by the registry
    /// after the lock (empty without a fleet that learns).
    autothrottle_samples: Vec<(Scope, AutoThrottleSample)>,
    /// Why each request admitted after waiting waited, until its future
    /// takes it (or it ends): beside the tickets, not in them, so a waiting
    /// request stays within its memory budget.
    waited: HashMap<TicketId, Box<WaitedInScheduler>>,
    /// Requests in the scopes' queues.
    waiting: usize,
    /// Past this many waiting requests, warn (once per crossing).
    delayed_warn_threshold: usize,
    /// Whether the warning for the current crossing was given.
    delayed_warned: bool,
    metrics: Metrics,
    /// This scheduler's shard of its registry (see [`shards`](super::shards)).
    shard: usize,
    /// This shard in the ids it gives (0 in the joint shard).
    id_tag: usize,
    /// What the shards share, when there are several.
    across: Option<Arc<Across>>,
    /// The scopes of this home shard that live in the joint shard, or are
    /// leaving for it (empty but in a home of a sharded registry).
    elsewhere: HashMap<Scope, Placement>,
    /// This shard's scopes that are leaving for the joint shard.
    leaving: Vec<ScopeId>,
    /// Placeholders of scopes arriving from their homes (counted there).
    arriving: usize,
    /// Scopes the joint shard evicted whose home is another shard: their
    /// homes must forget they gave them away (see
    /// [`take_unplaced`](Self::take_unplaced)).
    unplaced: Vec<Scope>,
    /// Whether `leaving` or `unplaced` may hold something: one flag for
    /// the lock's epilogue to read (set when either grows; cleared by the
    /// epilogue once both are empty).
    moving: bool,
}

impl Scheduler {
    pub(crate) fn new(
        default_config: ScopeConfig,
        overrides: impl IntoIterator<Item = (Scope, ScopeConfig)>,
        max_concurrency: u32,
        rng: fastrand::Rng,
    ) -> Self {
        let own: Vec<_> = overrides
            .into_iter()
            .map(|(key, config)| (key, Arc::new(config.inherit_from(&default_config))))
            .collect();
        Scheduler {
            configs: Arc::new(ConfigTable::new(Arc::new(default_config), own)),
            index: ScopeIndex::default(),
            scopes: Slab::new(),
            tickets: Slab::new(),
            next_seq: 0,
            max_concurrency,
            global: Arc::new(GlobalFlight::new(max_concurrency, 1)),
            fast_allowed: true,
            word_owner: None,
            last_one_scope: ScopeId::MAX,
            global_queue: BTreeMap::new(),
            rng,
            dirty: Vec::new(),
            groups: groups::Groups::default(),
            eviction: Eviction::new(DEFAULT_IDLE_TTL, DEFAULT_MAX_SCOPES),
            max_hold: DEFAULT_MAX_HOLD,
            fleet_learns: false,
            autothrottle_samples: Vec::new(),
            waited: HashMap::new(),
            waiting: 0,
            delayed_warn_threshold: DEFAULT_DELAYED_WARN_THRESHOLD,
            delayed_warned: false,
            metrics: Metrics::default(),
            shard: JOINT,
            id_tag: 0,
            across: None,
            elsewhere: HashMap::new(),
            leaving: Vec::new(),
            arriving: 0,
            unplaced: Vec::new(),
            moving: false,
        }
    }

    /// This scheduler split into `shards` schedulers (a power of two, at
    /// least 2) with its settings, which share its configs, a global count
    /// and an [`Across`] (with the count of scopes `max_scopes` bounds).
    pub(crate) fn into_shards(mut self, shards: usize) -> Vec<Scheduler> {
        let global = Arc::new(GlobalFlight::new(self.max_concurrency, shards));
        let across = Arc::new(Across::new(shards));
        let max_scopes = self.eviction.max_scopes;
        (0..shards)
            .map(|shard| {
                let mut one = Scheduler::new_sharing(&self.configs, self.max_concurrency, self.rng.fork());
                one.fast_allowed = self.fast_allowed;
                one.eviction = Eviction::new(self.eviction.idle_ttl, max_scopes);
                one.max_hold = self.max_hold;
                one.fleet_learns = self.fleet_learns;
                one.delayed_warn_threshold = self.delayed_warn_threshold;
                one.metrics = self.metrics;
                one.global = global.clone();
                one.shard = shard;
                one.id_tag = crate::registry::shards::encode(shard, 0);
                one.across = Some(across.clone());
                one
            })
            .collect()
    }

    /// A scheduler with every default but the configs, shared with
    /// another shard's.
    fn new_sharing(configs: &Arc<ConfigTable>, max_concurrency: u32, rng: fastrand::Rng) -> Self {
        let mut scheduler = Scheduler::new(ScopeConfig::default(), [], max_concurrency, rng);
        scheduler.configs = configs.clone();
        scheduler
    }

    /// Id `id` of this scheduler's (a ticket's or a scope's) with its
    /// shard, as an [`Admission`] names it (see
    /// [`shards::encode`](crate::registry::shards::encode)).
    #[inline(always)]
    fn tagged(&self, id: usize) -> usize {
        id | self.id_tag
    }

    /// Reports to the `metrics` facade (with the `metrics` feature).
    pub(crate) fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Sets the gauges: waiting, in flight, scopes tracked (in every
    /// shard).
    #[inline]
    pub(crate) fn report_levels(&self) {
        // Nothing to read without the `metrics` feature.
        if cfg!(feature = "metrics") {
            let (waiting, scopes) = match &self.across {
                Some(across) => across.levels(),
                None => (self.waiting, self.scopes.len()),
            };
            self.metrics.levels(waiting, self.global.in_flight(), scopes);
        }
    }

    /// Warns when more than `threshold` requests wait (once each time the
    /// count passes it).
    pub(crate) fn with_delayed_warn_threshold(mut self, threshold: usize) -> Self {
        self.delayed_warn_threshold = threshold;
        self
    }

    /// One more request waits; warns once when the count passes the
    /// threshold, and again only after it fell back below half of it.
    fn count_waiter(&mut self) {
        self.waiting += 1;
        // Over every shard: the threshold is the registry's.
        let waiting = match &self.across {
            Some(across) => across.waiting_changed(1),
            None => self.waiting,
        };
        if waiting <= self.delayed_warn_threshold / 2 {
            self.delayed_warned = false;
        }
        if waiting > self.delayed_warn_threshold && !self.delayed_warned {
            self.delayed_warned = true;
            tracing::warn!(
                target: "tower_throttle",
                waiting,
                threshold = self.delayed_warn_threshold,
                in_flight = self.global.in_flight(),
                "more requests wait for their scopes than delayed_warn_threshold: \
                 the crawl produces requests faster than its scopes allow"
            );
        }
    }

    /// One request fewer waits.
    fn uncount_waiter(&mut self) {
        self.waiting -= 1;
        if let Some(across) = &self.across {
            across.waiting_changed(-1);
        }
    }

    /// Evicts scopes idle for `idle_ttl`, and idle ones first past
    /// `max_scopes`; see the `eviction` module.
    /// IP scopes without a config of their own run with `config`
    /// (completed from the default).
    pub(crate) fn with_ip_scopes(self, config: Option<ScopeConfig>) -> Self {
        let config = config.map(|config| Arc::new(config.inherit_from(&self.configs.default_config())));
        self.configs.set_ip_scopes(config);
        self
    }

    pub(crate) fn with_eviction(mut self, idle_ttl: Duration, max_scopes: usize) -> Self {
        self.eviction = Eviction::new(idle_ttl, max_scopes);
        self
    }

    /// Sends rampup's backoffs to the fleet's search and AutoThrottle's
    /// samples to the fleet's delay (see [`crate::store`]'s "What the fleet
    /// learns").
    pub(crate) fn with_fleet_learning(mut self, learns: bool) -> Self {
        self.fleet_learns = learns;
        self
    }

    /// Caps every hold at `max_hold`.
    pub(crate) fn with_max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = max_hold;
        self
    }

    /// The scope `key`, created if the scheduler has not seen it, and
    /// marked busy at once, so that making room for another scope of the
    /// same request cannot evict it.
    fn busy_scope_id(&mut self, key: &Scope, now: Instant) -> ScopeId {
        let id = self.scope_id(key, now);
        self.note_busy(id);
        id
    }

    fn scope_id(&mut self, key: &Scope, now: Instant) -> ScopeId {
        let id = self.scope_id_named(key.as_str(), || key.clone(), now);
        self.close_fast(id);
        id
    }

    /// The scope named `name`, created with the key `key` makes if the
    /// scheduler has not seen it (so a scope it knows costs no key). Its
    /// word stays as it is: the caller closes it unless it admits on it.
    fn scope_id_named(&mut self, name: &str, key: impl FnOnce() -> Scope, now: Instant) -> ScopeId {
        self.scope_id_hashed(name, self.index.hash(name), key, now)
    }

    /// [`scope_id_named`](Self::scope_id_named), given the name's hash
    /// (see [`NameHash`](crate::registry::shards::NameHash)).
    #[inline]
    fn scope_id_hashed(
        &mut self,
        name: &str,
        hash: u64,
        key: impl FnOnce() -> Scope,
        now: Instant,
    ) -> ScopeId {
        if let Some(id) = self.index.get_hashed(name, hash, &self.scopes) {
            return id;
        }
        self.make_room(now);
        let (config, explicit) = self.configs.config_of(name);
        let id = self
            .scopes
            .insert(ScopeEntry::new(ScopeState::new(key(), config, explicit, now)));
        self.index.insert(id, &self.scopes);
        if let Some(across) = &self.across {
            across.scopes_changed(1);
            self.note_scope_made();
        }
        id
    }

    /// Queues a request for the one scope named `name` (with the default
    /// cost), as [`enqueue`](Self::enqueue) does; also returns the scope's
    /// key, the scheduler's own when it knew the scope: the host resolver's
    /// path, which allocates no key for a scope already known.
    /// A plain scope may be admitted on its lock-free word, as `mode`
    /// allows.
    #[inline(always)]
    pub(crate) fn enqueue_named(
        &mut self,
        (name, hash): (&str, u64),
        priority: i32,
        mode: FastMode,
        now: Instant,
        wake: &mut WakeList,
    ) -> (Admission, Scope) {
        if self.placement(name).is_some() {
            return (Admission::Elsewhere, Scope::new(name));
        }
        self.evict_expired(now);
        let scope = self.scope_id_hashed(name, hash, || Scope::new(name), now);
        let key = self.scopes[scope].state.key.clone();
        if let Some(fast) = self.fast_admission(scope, mode, now) {
            return (Admission::Fast(fast), key);
        }
        self.note_busy(scope);
        if let Some(plain) = self.plain_admission(scope, mode, now) {
            return (plain, key);
        }
        let seats = Seats::One([Seat {
            scope,
            lane: usize::MAX,
            cost: DEFAULT_COST,
        }]);
        let (id, admitted) = self.enqueue_seats(seats, priority, now, wake);
        (Admission::Ticket(self.tagged(id), admitted), key)
    }

    /// Queues a request for `scopes`; admits it at once when nothing is
    /// ahead of it and every limit allows, and then says what to do with
    /// its departure (as [`TicketPoll::Sent`]); `None` while it waits.
    /// A one-scope request of a plain scope may be admitted on the
    /// scope's lock-free word, as `mode` allows.
    pub(crate) fn enqueue(
        &mut self,
        scopes: &Scopes,
        priority: i32,
        mode: FastMode,
        now: Instant,
        wake: &mut WakeList,
    ) -> Admission {
        let ids: Vec<(ScopeId, f64)>;
        let seats = if scopes.len() == 1 {
            let (key, cost) = scopes.iter().next().expect("a Scopes is never empty");
            if self.placement(key.as_str()).is_some() {
                return Admission::Elsewhere;
            }
            self.evict_expired(now);
            let scope = self.scope_id_named(key.as_str(), || key.clone(), now);
            if let Some(fast) = self.fast_admission(scope, mode, now) {
                return Admission::Fast(fast);
            }
            self.note_busy(scope);
            if let Some(plain) = self.plain_admission(scope, mode, now) {
                return plain;
            }
            Seats::One([Seat {
                scope,
                lane: usize::MAX,
                cost,
            }])
        } else {
            self.evict_expired(now);
            ids = scopes
                .iter()
                .map(|(scope, cost)| (self.busy_scope_id(scope, now), cost))
                .collect();
            Seats::from_iter(ids.iter().map(|&(scope, cost)| Seat {
                scope,
                lane: usize::MAX,
                cost,
            }))
        };
        let (id, admitted) = self.enqueue_seats(seats, priority, now, wake);
        Admission::Ticket(self.tagged(id), admitted)
    }

    /// Admits a one-scope request of scope `id` on its lock-free word
    /// when `mode` allows: an open word with a lane free, or a plain
    /// scope the scheduler holds nothing of, opened now. Otherwise the
    /// word is closed (the scheduler adopts what is in flight on it): the
    /// request goes through the scheduler. Either way the scope is noted
    /// as the last one asked for.
    #[inline(always)]
    fn fast_admission(&mut self, id: ScopeId, mode: FastMode, now: Instant) -> Option<Arc<FastScope>> {
        let last = std::mem::replace(&mut self.last_one_scope, id);
        // The common case, checked inline: a scope without a word, other
        // than the last one.
        if last != id && self.scopes[id].fast.is_none() {
            return None;
        }
        self.word_admission_or_close(id, mode, now)
    }

    /// Admits a one-scope request on a free lane of a plain scope nobody
    /// waits for, without a ticket (not for `FastMode::Never`, which tests
    /// of tickets use, nor with a store, whose reservation needs the
    /// ticket).
    #[inline(always)]
    fn plain_admission(&mut self, scope: ScopeId, mode: FastMode, now: Instant) -> Option<Admission> {
        if mode == FastMode::Never || !self.fast_allowed {
            return None;
        }
        let lane = self.take_plain_lane(scope, now)?;
        match u32::try_from(lane) {
            Ok(lane) => Some(Admission::Plain(self.tagged(scope), lane)),
            // Lanes never outnumber a `u32` concurrency.
            Err(_) => unreachable!("lane {lane} beyond the concurrency"),
        }
    }

    /// [`fast_admission`](Self::fast_admission) past its inline check.
    #[inline(never)]
    fn word_admission_or_close(
        &mut self,
        id: ScopeId,
        mode: FastMode,
        now: Instant,
    ) -> Option<Arc<FastScope>> {
        let fast = self.word_admission(id, mode, now);
        if fast.is_none() {
            self.close_fast(id);
        }
        fast
    }

    /// Admits on scope `id`'s word, opening it if `mode` and the scope
    /// allow.
    fn word_admission(&mut self, id: ScopeId, mode: FastMode, now: Instant) -> Option<Arc<FastScope>> {
        // A debug listener wants each send's event, which the lock gives.
        if mode == FastMode::Never || tracing::enabled!(target: "tower_throttle", tracing::Level::DEBUG) {
            return None;
        }
        let entry = &mut self.scopes[id];
        let open = entry.open_fast().is_some();
        if !open {
            let Some(owner) = &self.word_owner else {
                return None;
            };
            let openable = self.fast_allowed
                && !entry.has_waiters()
                && entry.state.in_flight == 0
                && entry.state.is_plain_now();
            if !openable {
                return None;
            }
            let lanes = entry.state.config.concurrency.min(self.max_concurrency);
            let latency = entry.state.latency_value();
            let fast = entry
                .fast
                .get_or_insert_with(|| FastScope::new(id, entry.state.key.clone(), owner));
            if !fast.open(lanes, latency) {
                return None;
            }
            self.global.note_word_opened();
        }
        let fast = entry.fast.as_ref()?;
        if !fast.admit() {
            return None;
        }
        let fast = fast.clone();
        self.metrics.sent(&fast.key);
        self.note_open(id, now);
        Some(fast)
    }

    /// An open scope is an eviction candidate from its first admission on
    /// (its word says whether it is idle: see `look_at_candidate`).
    fn note_open(&mut self, id: ScopeId, now: Instant) {
        let entry = &self.scopes[id];
        if entry.idle_since.is_none() || !entry.state.evictable {
            self.note_if_idle(id, Stamp::of(now));
        }
    }

    /// Closes scope `id`'s word, if open: the scheduler adopts its
    /// requests in flight (see [`ScopeState::adopt`]).
    pub(super) fn close_fast(&mut self, id: ScopeId) {
        let entry = &mut self.scopes[id];
        let Some(fast) = entry.open_fast() else {
            return;
        };
        let adopted = fast.close();
        if adopted.was_open {
            entry.state.adopt(adopted, &mut self.rng);
        }
    }

    /// Ends a request admitted on `fast`'s word after the word was closed
    /// (the scheduler adopted it): as [`finish`](Self::finish) ends a
    /// ticket on no lane.
    pub(crate) fn finish_adopted(
        &mut self,
        fast: &FastScope,
        outcome: Outcome,
        departed_at: Option<Stamp>,
        now: (Instant, Option<Stamp>),
        wake: &mut WakeList,
    ) {
        let ours = self
            .scopes
            .get(fast.id)
            .and_then(|entry| entry.fast.as_deref())
            .is_some_and(|word| std::ptr::eq(word, fast));
        if !ours {
            // Never: an adopted request keeps its scope from eviction. Its
            // permit still goes back.
            self.global.release();
            return;
        }
        let seat = Seat {
            scope: fast.id,
            lane: usize::MAX,
            cost: DEFAULT_COST,
        };
        self.finish_unticketed(seat, outcome, departed_at, now, wake);
    }

    /// After each operation: tells the open scopes whether requests wait
    /// for a global permit, and lets them go if one was given back on an
    /// open word meanwhile (see [`GlobalFlight::publish_queued`]).
    /// With shards, the shard of the oldest request waiting for a permit
    /// when one is free and that request is another shard's: the caller
    /// settles that shard next, once this lock is released.
    #[inline(always)]
    pub(crate) fn settle_global(&mut self, now: Instant, wake: &mut WakeList) -> Option<usize> {
        let mut elsewhere = None;
        if let Some(across) = &self.across {
            // Checked inline: nobody waits for a permit, nothing published.
            if across.global_waiters() || self.global.queued() {
                elsewhere = self.settle_global_across(now, wake);
            }
            // Every shard's requests need to know when eviction work is
            // due in any shard (see `Registry::sweep_evictions`).
            self.publish_eviction_due();
        } else {
            // A waiter served goes, or waits for its scopes; one that needs
            // a permit again is queued again only when none is free.
            while self.global.publish_queued(!self.global_queue.is_empty()) {
                self.serve_global_queue(now, wake);
                self.run_dispatch(now, wake);
            }
            // With one shard, only the words need to know when eviction
            // work is due.
            if self.global.words_exist() {
                self.publish_eviction_due();
            }
        }
        elsewhere
    }

    /// [`settle_global`](Self::settle_global) of one shard of several:
    /// serves this shard's global waiters while a permit is free and the
    /// oldest waiter of all shards is one of them.
    #[inline(never)]
    fn settle_global_across(&mut self, now: Instant, wake: &mut WakeList) -> Option<usize> {
        loop {
            let across = self.across.as_deref()?;
            if !self.global.publish_queued(across.global_waiters()) {
                return None;
            }
            let (_, shard) = across.first_global_waiter()?;
            if shard != self.shard {
                return Some(shard);
            }
            self.serve_first_global_waiter(now, wake);
            self.run_dispatch(now, wake);
        }
    }

    /// The requests in flight over all scopes, shared with the open words.
    pub(crate) fn global(&self) -> &Arc<GlobalFlight> {
        &self.global
    }

    /// Lets plain scopes open words that reach `registry` (the registry
    /// that holds this scheduler) when they need its lock.
    pub(super) fn with_word_owner(mut self, registry: std::sync::Weak<super::RegistryShared>) -> Self {
        self.word_owner = Some(WordOwner {
            shard: self.shard,
            evict_slot: match self.across {
                Some(_) => super::fast_path::EVICT_HINT,
                None => self.shard,
            },
            global: self.global.clone(),
            registry,
            metrics: self.metrics,
        });
        self
    }

    /// Keeps every scope's word closed (a fleet: every send reserves
    /// through the store).
    pub(crate) fn without_fast_path(mut self) -> Self {
        self.fast_allowed = false;
        self
    }

    /// Queues a request for `seats` (its scopes, already marked busy);
    /// see [`enqueue`](Self::enqueue).
    fn enqueue_seats(
        &mut self,
        seats: Seats,
        priority: i32,
        now: Instant,
        wake: &mut WakeList,
    ) -> (TicketId, Option<bool>) {
        let order = OrderKey {
            priority: Reverse(priority),
            seq: self.next_seq,
        };
        self.next_seq += 1;
        let plain_lane = match &seats {
            Seats::One([seat]) => self.take_plain_lane(seat.scope, now),
            _ => None,
        };
        let status = match plain_lane {
            // Nothing to report early: a plain scope has no gap.
            Some(_) => Status::Admitted {
                report_departure: false,
            },
            None => Status::Queued,
        };
        let seats = match (seats, plain_lane) {
            (Seats::One([seat]), Some(lane)) => Seats::One([Seat { lane, ..seat }]),
            (seats, _) => seats,
        };
        let id = self.tickets.insert(TicketState {
            order,
            seats,
            status,
            waker: None,
            near_misses: 0,
            group: groups::NO_GROUP,
            held_by: HeldBy::NONE,
            in_global_queue: false,
            waiting: false,
            enqueued_at: now,
        });
        if plain_lane.is_some() {
            return (id, Some(false));
        }
        if self.try_send_directly(id, now, wake) {
            return (id, self.report_departure(id));
        }
        let ticket = &mut self.tickets[id];
        ticket.waiting = true;
        if let Some(across) = &self.across {
            // A place in the one order of every shard's waiters (a request
            // sent at once needs none).
            ticket.order.seq = across.next_seq();
        }
        self.start_waiting(id);
        self.count_waiter();
        self.run_dispatch(now, wake);
        let admitted = self.report_departure(id);
        if admitted.is_none() && tracing::enabled!(target: "tower_throttle", tracing::Level::DEBUG) {
            let scopes: Vec<(&str, f64)> = self.tickets[id]
                .seats
                .iter()
                .map(|seat| (self.scopes[seat.scope].state.key.as_str(), seat.cost))
                .collect();
            tracing::debug!(
                target: "tower_throttle",
                scopes = ?scopes,
                "request waits for its scopes to allow it"
            );
        }
        (id, admitted)
    }

    /// The fast path of a one-scope request: takes a lane in scope `id`
    /// when it is plain (see [`ScopeState::take_plain_lane`]), nobody waits
    /// for it and the global limit allows; counts the send.
    #[inline(always)]
    fn take_plain_lane(&mut self, id: ScopeId, now: Instant) -> Option<usize> {
        if !self.global_permit_is_free() {
            return None;
        }
        let scope = &mut self.scopes[id];
        if scope.has_waiters() {
            return None;
        }
        let global = &self.global;
        let lane = scope
            .state
            .take_plain_lane(now, self.max_concurrency, (now, || global.take_locked()))?;
        self.metrics.sent(&scope.state.key);
        Some(lane)
    }

    /// Whether a new request may take a global permit now: one is free
    /// and no earlier request waits for one. (A permit given back on a
    /// word is free before the lock lets the first waiter have it.)
    #[inline]
    fn global_permit_is_free(&self) -> bool {
        self.global.has_room()
            && self.global_queue.is_empty()
            && !self.across.as_ref().is_some_and(|across| across.global_waiters())
    }

    /// For an admitted ticket, whether its departure must be reported as
    /// soon as it happens; `None` while it waits.
    fn report_departure(&self, id: TicketId) -> Option<bool> {
        match self.tickets[id].status {
            Status::Queued => None,
            Status::Admitted { report_departure } => Some(report_departure),
            Status::Departed(_) => Some(false),
        }
    }

    /// The fast path: every scope has an empty queue and allows a send now.
    fn try_send_directly(&mut self, id: TicketId, now: Instant, wake: &mut WakeList) -> bool {
        if !self.global_permit_is_free() {
            return false;
        }
        let ticket = &self.tickets[id];
        let mut first_lane = None;
        for seat in &ticket.seats {
            let scope = &self.scopes[seat.scope];
            if scope.has_waiters() {
                return false;
            }
            let effective = scope.state.effective(now, self.max_concurrency);
            match scope.state.check(now, &effective, seat.cost) {
                ScopeCheck::Ready { lane } => {
                    first_lane.get_or_insert((lane, effective));
                }
                _ => return false,
            }
        }
        if !self.global.take_locked() {
            return false;
        }
        match (&ticket.seats, first_lane) {
            // One scope, just checked: no need to check it again.
            (Seats::One(_), Some(chosen)) => self.send_on_lanes(id, now, wake, Some(chosen)),
            _ => self.send(id, now, wake),
        }
        true
    }

    /// Polls a waiting ticket: runs the timers it keeps, and says whether it
    /// was sent or how long to sleep.
    pub(crate) fn poll_ticket(
        &mut self,
        id: TicketId,
        now: Instant,
        waker: &Waker,
        wake: &mut WakeList,
    ) -> TicketPoll {
        if let Some(report_departure) = self.report_departure(id) {
            return TicketPoll::Sent { report_departure };
        }
        self.fire_due_timers(id, now);
        self.run_dispatch(now, wake);
        if let Some(report_departure) = self.report_departure(id) {
            return TicketPoll::Sent { report_departure };
        }
        let ticket = &mut self.tickets[id];
        match &ticket.waker {
            Some(known) if known.will_wake(waker) => {}
            _ => ticket.waker = Some(waker.clone()),
        }
        TicketPoll::Waiting {
            timer: self.timer_of(id),
        }
    }

    /// Marks a request finished (response or error): frees its lanes and
    /// its global permit, and lets the next waiters go. A ticket still
    /// waiting just leaves its queues. `departed_at`: when the request was
    /// handed to the inner service, if it was and that was not reported
    /// yet (it is applied first, as [`depart`](Self::depart) would have). A
    /// response feeds each scope's latency average and AutoThrottle.
    /// `now_stamp`: the stamp of `now`, when the caller has it.
    pub(crate) fn finish(
        &mut self,
        id: TicketId,
        outcome: Outcome,
        departed_at: Option<Stamp>,
        (now, now_stamp): (Instant, Option<Stamp>),
        wake: &mut WakeList,
    ) {
        if self.tickets[id].status == Status::Queued {
            self.leave_queues(id, now, wake);
        }
        let ticket = self.tickets.remove(id);
        if !self.waited.is_empty() {
            // Ended before its future took the record.
            self.waited.remove(&id);
        }
        // One conversion for everything below that keeps an instant (none
        // when the caller has it).
        let now_stamp = now_stamp.unwrap_or_else(|| Stamp::of(now));
        match ticket.status {
            Status::Queued => {}
            status => {
                // A departure the scheduler has yet to apply. Admitted but
                // never handed over (dropped, or the inner service failed
                // to get ready): it leaves its scopes' undeparted count as
                // its lanes are released.
                let departure = match status {
                    Status::Departed(at) => (Some(at), None),
                    _ => (departed_at, departed_at),
                };
                self.release_seats(
                    ticket.seats.as_slice(),
                    outcome,
                    departure,
                    (now, now_stamp),
                    wake,
                );
            }
        }
        for seat in &ticket.seats {
            self.note_if_idle(seat.scope, now_stamp);
        }
    }

    /// Whether ending request `which` may let a waiter go: a waiter of
    /// one of its scopes, or of a global permit. (A request still queued
    /// leaves its queues, at the current instant too.) When none, the end
    /// needs no clock reading.
    #[inline]
    pub(crate) fn end_lets_someone_go(&self, which: Finishing) -> bool {
        if !self.global_queue.is_empty() || self.across.as_ref().is_some_and(|across| across.global_waiters())
        {
            return true;
        }
        match which {
            Finishing::Ticket(id) => match self.tickets.get(id) {
                Some(ticket) => {
                    ticket.status == Status::Queued
                        || ticket
                            .seats
                            .iter()
                            .any(|seat| self.scopes[seat.scope].has_waiters())
                }
                None => false,
            },
            Finishing::Plain(scope, _) => self.scopes.get(scope).is_some_and(ScopeEntry::has_waiters),
        }
    }

    /// Ends a request: a ticket's, as [`finish`](Self::finish) does, or one
    /// admitted on a plain lane without a ticket.
    #[inline]
    pub(crate) fn finish_request(
        &mut self,
        which: Finishing,
        outcome: Outcome,
        departed_at: Option<Stamp>,
        now: (Instant, Option<Stamp>),
        wake: &mut WakeList,
    ) {
        match which {
            Finishing::Ticket(id) => self.finish(id, outcome, departed_at, now, wake),
            Finishing::Plain(scope, lane) => self.finish_unticketed(
                Seat {
                    scope,
                    lane: lane as usize,
                    cost: DEFAULT_COST,
                },
                outcome,
                departed_at,
                now,
                wake,
            ),
        }
    }

    /// Ends a request of one scope that holds no ticket: admitted on a
    /// plain lane, or adopted from a closed word (on no lane).
    #[inline(always)]
    fn finish_unticketed(
        &mut self,
        seat: Seat,
        outcome: Outcome,
        departed_at: Option<Stamp>,
        (now, now_stamp): (Instant, Option<Stamp>),
        wake: &mut WakeList,
    ) {
        let now_stamp = now_stamp.unwrap_or_else(|| Stamp::of(now));
        let scope = seat.scope;
        self.release_seats(
            &[seat],
            outcome,
            (departed_at, departed_at),
            (now, now_stamp),
            wake,
        );
        self.note_if_idle(scope, now_stamp);
    }

    /// Frees the `seats` of an admitted request that ended with `outcome`
    /// at `now`, and its global permit, and lets the next waiters go.
    /// `departure`: when it departed, if it did, and the departure the
    /// scheduler has yet to apply (an admitted request never handed over
    /// leaves its scopes' undeparted count as its lanes are released). A
    /// response feeds each scope's latency average and AutoThrottle.
    #[inline(always)]
    fn release_seats(
        &mut self,
        seats: &[Seat],
        outcome: Outcome,
        (departed_at, to_apply): (Option<Stamp>, Option<Stamp>),
        (now, now_stamp): (Instant, Stamp),
        wake: &mut WakeList,
    ) {
        let (latency, answered_at) = match (outcome, departed_at) {
            (
                Outcome::Response {
                    status,
                    adjust_autothrottle,
                    answered_at,
                },
                Some(sent),
            ) => {
                let answered_at = answered_at.unwrap_or(now_stamp);
                (
                    Some((answered_at.since(sent), status, adjust_autothrottle)),
                    answered_at,
                )
            }
            _ => (None, now_stamp),
        };
        for seat in seats {
            let scope = &mut self.scopes[seat.scope];
            if let Some(at) = to_apply {
                scope.state.depart(seat.lane, at);
            }
            if let Some((latency, status, adjust_autothrottle)) = latency {
                if adjust_autothrottle && self.fleet_learns {
                    scope.state.observe_latency(latency, status, false);
                    sample_for_fleet(&mut self.autothrottle_samples, &scope.state, latency, status);
                } else {
                    scope.state.observe_latency(latency, status, adjust_autothrottle);
                }
            }
            scope
                .state
                .release_lane(seat.lane, departed_at.is_some(), answered_at);
            if scope.has_waiters() {
                self.dirty.push(seat.scope);
            }
        }
        self.global.release();
        if !self.global_queue.is_empty() {
            self.serve_global_queue(now, wake);
        }
        self.run_dispatch(now, wake);
    }

    /// Records that admitted ticket `id` was handed to the inner service
    /// at `at` (a clock reading taken after the hand-over, before this
    /// lock): its scopes' next gaps run from then, and the scopes it held
    /// back look at their waiters again, at `now`.
    pub(crate) fn depart(&mut self, id: TicketId, at: Stamp, now: Instant, wake: &mut WakeList) {
        let ticket = &mut self.tickets[id];
        if !matches!(ticket.status, Status::Admitted { .. }) {
            return;
        }
        ticket.status = Status::Departed(at);
        for seat in &ticket.seats {
            let scope = &mut self.scopes[seat.scope];
            scope.state.depart(seat.lane, at);
            if scope.has_waiters() {
                self.dirty.push(seat.scope);
            }
        }
        self.run_dispatch(now, wake);
    }

    /// Takes waiting ticket `id` out of its scopes' queues and the global
    /// queue (it is gone), and lets the next waiters go.
    fn leave_queues(&mut self, id: TicketId, now: Instant, wake: &mut WakeList) {
        self.stop_waiting(id);
        let ticket = &self.tickets[id];
        if ticket.in_global_queue {
            self.global_queue.remove(&ticket.order);
            if let Some(across) = &self.across {
                across.remove_global_waiter(&ticket.order);
            }
        }
        if ticket.waiting {
            self.uncount_waiter();
        }
        self.run_dispatch(now, wake);
    }

    /// Hands freed global permits to the oldest waiters that only lacked one.
    fn serve_global_queue(&mut self, now: Instant, wake: &mut WakeList) {
        if self.across.is_some() {
            // Across shards, the oldest waiter of all goes first: see
            // `settle_global_across`, which every lock's epilogue runs.
            return;
        }
        while self.global.has_room() {
            if !self.serve_first_global_waiter(now, wake) {
                return;
            }
        }
    }

    /// Lets this shard's first global waiter go if its scopes allow (or
    /// has its scopes look at it again); false when there is none.
    fn serve_first_global_waiter(&mut self, now: Instant, wake: &mut WakeList) -> bool {
        {
            let Some((order, id)) = self.global_queue.pop_first() else {
                return false;
            };
            if let Some(across) = &self.across {
                across.remove_global_waiter(&order);
            }
            self.tickets[id].in_global_queue = false;
            if self.evaluate(id, None, now) == Verdict::Admit {
                self.send(id, now, wake);
            } else {
                // Its scopes note their own causes when they look again.
                for seat in &self.tickets[id].seats {
                    self.dirty.push(seat.scope);
                }
            }
        }
        true
    }

    #[inline]
    fn run_dispatch(&mut self, now: Instant, wake: &mut WakeList) {
        while let Some(scope) = self.dirty.pop() {
            self.dispatch(scope, now, wake);
        }
    }

    /// Sends as many waiters of `scope_id` as its limits allow, in order,
    /// and sets its timer when time is what holds the head back. Notes in
    /// the scope's wait log what holds its queue (see [`crate::waited`]).
    fn dispatch(&mut self, scope_id: ScopeId, now: Instant, wake: &mut WakeList) {
        loop {
            let scope = &self.scopes[scope_id];
            if !scope.has_candidates() {
                // Its waiters, if any, are parked: other scopes hold them.
                let cause = scope.has_waiters().then_some(choice::OTHER_SCOPE);
                self.scopes[scope_id].note_wait(now, cause);
                self.set_timer(scope_id, None, wake);
                return;
            }
            let effective = scope.state.effective(now, self.max_concurrency);
            let head_cost = self.head_cost(scope_id);
            let (held, lane) = match scope.state.check(now, &effective, head_cost) {
                ScopeCheck::Full => (
                    Some(((WaitCause::Lanes, Some(effective.concurrency_source)), None)),
                    0,
                ),
                ScopeCheck::AwaitingEarlier => (Some(((WaitCause::Departure, None), None)), 0),
                ScopeCheck::Until(at) => (
                    Some((scope.state.wait_cause(now, &effective, head_cost), Some(at))),
                    0,
                ),
                ScopeCheck::Ready { lane } => (None, lane),
            };
            if let Some((cause, timer)) = held {
                self.scopes[scope_id].note_wait(now, Some(cause));
                self.set_timer(scope_id, timer, wake);
                return;
            }
            self.set_timer(scope_id, None, wake);
            match self.pick_waiter(scope_id, now, wake) {
                // The lane just found is the one to take (nothing changed
                // the scope's lanes since) when this scope is the
                // waiter's only one.
                Ok(id) if self.tickets[id].seats.as_slice().len() == 1 => {
                    self.send_on_lanes(id, now, wake, Some((lane, effective)));
                }
                Ok(id) => self.send(id, now, wake),
                Err(cause) => {
                    self.scopes[scope_id].note_wait(now, Some(cause));
                    if self.scopes[scope_id].timer_owner().is_none() {
                        let relief = self.when_another_scope_may_let_the_head_go(scope_id, now);
                        self.set_timer(scope_id, relief, wake);
                    }
                    return;
                }
            }
        }
    }

    /// The scope allows a send but its head waits for another of its
    /// scopes: when that scope's own time limits next let it go, if time is
    /// what holds it. Without a timer here, nothing would look at this
    /// scope again should the other scope's next event not reach the head.
    fn when_another_scope_may_let_the_head_go(&self, scope_id: ScopeId, now: Instant) -> Option<Instant> {
        let &head = self.scopes[scope_id].queue().values().next()?;
        self.tickets[head]
            .seats
            .iter()
            .filter(|seat| seat.scope != scope_id)
            .filter_map(|seat| {
                let scope = &self.scopes[seat.scope].state;
                match scope.check(now, &scope.effective(now, self.max_concurrency), seat.cost) {
                    ScopeCheck::Until(at) => Some(at),
                    _ => None,
                }
            })
            .min()
    }

    /// Keeps, for ticket `id` admitted at `now` after waiting, why it
    /// waited: the part of its scopes' wait logs since it came (see
    /// [`crate::waited`]).
    #[cold]
    fn record_wait(&mut self, id: TicketId, now: Instant) {
        let ticket = &self.tickets[id];
        let from = ticket.enqueued_at;
        let parts = match &ticket.seats {
            Seats::One([seat]) => self.scopes[seat.scope]
                .wait_log()
                .map(|log| log.parts(from, now))
                .unwrap_or_default(),
            seats => {
                let logs: Vec<&wait_log::WaitLog> = seats
                    .iter()
                    .filter_map(|seat| self.scopes[seat.scope].wait_log())
                    .collect();
                wait_log::merged_parts(&logs, from, now)
            }
        };
        // Copied out (the trims below need the scheduler mutably); on the
        // stack for the usual one or two scopes.
        let seats: smallvec::SmallVec<[ScopeId; 2]> = ticket.seats.iter().map(|seat| seat.scope).collect();
        self.waited.insert(
            id,
            Box::new(WaitedInScheduler {
                parts,
                admitted_at: now,
            }),
        );
        for scope in seats {
            self.trim_wait_log(scope, id);
        }
    }

    /// Trims the wait log of `scope` to its oldest waiter other than
    /// `leaving`, once the log has grown enough for that to pay.
    fn trim_wait_log(&mut self, scope: ScopeId, leaving: TicketId) {
        let entry = &self.scopes[scope];
        if !entry.wait_log().is_some_and(|log| log.needs_trim()) {
            return;
        }
        let oldest = self.oldest_waiter_since(scope, leaving);
        if let (Some(oldest), Some(log)) = (oldest, self.scopes[scope].wait_log_mut()) {
            log.trim(oldest);
        }
    }

    /// The record of why ticket `id` waited, once it was admitted after
    /// waiting: taken by its future, which finishes it at the hand-over.
    pub(crate) fn take_waited(&mut self, id: TicketId) -> Option<Box<WaitedInScheduler>> {
        self.waited.remove(&id)
    }

    /// Sends ticket `id`: takes a lane in each scope, starts each scope's
    /// delays (with a fresh jitter draw) and counts it in flight.
    /// Sends ticket `id`, whose global permit its caller took (see
    /// [`GlobalFlight::take_locked`]).
    fn send(&mut self, id: TicketId, now: Instant, wake: &mut WakeList) {
        self.send_on_lanes(id, now, wake, None);
    }

    /// [`send`](Self::send), with the lane of a one-scope ticket already
    /// chosen by the caller under this same lock.
    fn send_on_lanes(
        &mut self,
        id: TicketId,
        now: Instant,
        wake: &mut WakeList,
        chosen: Option<(usize, Effective)>,
    ) {
        if self.tickets[id].waiting {
            self.record_wait(id, now);
        }
        let ticket = &mut self.tickets[id];
        let mut report_departure = false;
        for seat in ticket.seats.iter_mut() {
            let scope = &mut self.scopes[seat.scope];
            let taken = scope.state.take_lane(
                now,
                chosen,
                self.max_concurrency,
                &mut self.rng,
                Sending {
                    enqueued_at: ticket.enqueued_at,
                    cost: seat.cost,
                },
            );
            seat.lane = taken.lane;
            report_departure |= taken.others_may_follow;
            self.metrics.sent(&scope.state.key);
        }
        if ticket.waiting {
            self.stop_waiting(id);
        }
        let ticket = &mut self.tickets[id];
        if ticket.in_global_queue {
            ticket.in_global_queue = false;
            self.global_queue.remove(&ticket.order);
            if let Some(across) = &self.across {
                across.remove_global_waiter(&ticket.order);
            }
        }
        if ticket.waiting {
            ticket.waiting = false;
            self.waiting -= 1;
            if let Some(across) = &self.across {
                across.waiting_changed(-1);
            }
        }
        ticket.status = Status::Admitted { report_departure };
        if let Some(waker) = ticket.waker.take() {
            wake.push(waker);
        }
    }
}

mod choice;
mod entry;
mod eviction;
mod groups;
mod index;
mod learning;
mod placement;
mod store_terms;
mod timers;
mod updates;
mod wait_log;

/// Keeps a response's AutoThrottle sample for the fleet's store (when the
/// scope runs AutoThrottle): off the common path.
#[inline(never)]
fn sample_for_fleet(
    samples: &mut Vec<(Scope, AutoThrottleSample)>,
    scope: &ScopeState,
    latency: Duration,
    status: u16,
) {
    if let Some(sample) = scope.autothrottle_sample(latency, status) {
        samples.push((scope.key.clone(), sample));
    }
}

use eviction::Eviction;
pub use eviction::{DEFAULT_IDLE_TTL, DEFAULT_MAX_SCOPES};
use index::ScopeIndex;

/// Default number of waiting requests past which the registry warns.
pub const DEFAULT_DELAYED_WARN_THRESHOLD: usize = 500;

#[cfg(test)]
mod tests;
