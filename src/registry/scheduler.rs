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
use std::time::Duration;

use slab::Slab;
use tokio::time::Instant;

use super::config::ScopeConfig;
use super::configs::ConfigTable;
use super::fast_path::{GlobalFlight, WordOwner, WordPair, WordShard};
use super::metrics::Metrics;
use super::scope_state::{Effective, ScopeCheck, ScopeState};
use super::ticket::{HeldBy, OrderKey, Seat, Seats, SendsBefore, Status, TicketState, WaitedInScheduler};
pub(crate) use super::ticket::{Outcome, Refusal, ScopeId, TicketId, TicketPoll, WakeList};
use crate::scope::{Scope, Scopes, DEFAULT_COST};
use crate::store::backend::AutoThrottleSample;
use crate::time::Stamp;
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
    /// request of several scopes; tests of tickets).
    Never,
    /// On the word of a scope already open (another thread uses it); also
    /// opens the word of a plain scope asked for before (a scope asked for
    /// again is worth a word; one asked for once, as a crawl asks for most
    /// hosts, is not).
    Join,
}

/// What queuing a request gave.
#[derive(Debug)]
pub(crate) enum Admission {
    /// Admitted on its scope's open word, or its two scopes': it ends
    /// there too.
    Fast(Arc<WordShard>),
    /// Admitted on its two scopes' open words: it ends there too.
    FastTwo(WordPair),
    /// A ticket of the scheduler; admitted at once or not, as
    /// [`Scheduler::enqueue`] says.
    Ticket(TicketId, Option<bool>),
    /// Failed for its bounds (see `bounds.rs`): it left the scheduler.
    Refused(Box<Refusal>),
    /// Admitted at once on a lane of a plain scope, without a ticket: the
    /// scope and the lane are all its end needs (see
    /// [`Scheduler::finish_request`]).
    Plain(ScopeId, u32),
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
    /// The latest instant a scope was seen to go idle: the scheduler's
    /// clock for telling busy scopes from quiet ones without reading one
    /// (see `fast_admission`).
    latest_idle: Stamp,
    /// Words made and not yet retired (at most [`MAX_WORDS`](plain::MAX_WORDS)).
    words_live: usize,
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
    /// request stays within its memory budget. (Ticket ids are the
    /// scheduler's own slab indices: a fast hash, not SipHash.)
    waited: HashMap<TicketId, WaitedInScheduler, foldhash::fast::RandomState>,
    /// Requests in the scopes' queues.
    waiting: usize,
    /// Past this many waiting requests, warn (once per crossing).
    delayed_warn_threshold: usize,
    /// Whether the warning for the current crossing was given.
    delayed_warned: bool,
    metrics: Metrics,
    bounds: bounds::Bounds,
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
            global: Arc::new(GlobalFlight::new(max_concurrency)),
            fast_allowed: true,
            word_owner: None,
            latest_idle: Stamp::EARLIEST,
            words_live: 0,
            global_queue: BTreeMap::new(),
            rng,
            dirty: Vec::new(),
            groups: groups::Groups::default(),
            eviction: Eviction::new(DEFAULT_IDLE_TTL, DEFAULT_MAX_SCOPES),
            max_hold: DEFAULT_MAX_HOLD,
            fleet_learns: false,
            autothrottle_samples: Vec::new(),
            waited: HashMap::default(),
            waiting: 0,
            delayed_warn_threshold: DEFAULT_DELAYED_WARN_THRESHOLD,
            delayed_warned: false,
            metrics: Metrics::default(),
            bounds: bounds::Bounds::default(),
        }
    }

    /// Sets the gauges: waiting, in flight, scopes tracked.
    #[inline]
    pub(crate) fn report_levels(&self) {
        // Nothing to read without the `metrics` feature.
        if cfg!(feature = "metrics") {
            self.metrics
                .levels(self.waiting, self.global.in_flight(), self.scopes.len());
        }
    }

    /// The scope `key`, created if the scheduler has not seen it, and
    /// marked busy at once, so that making room for another scope of the
    /// same request cannot evict it.
    fn scope_id(&mut self, key: &Scope, now: Instant) -> ScopeId {
        let id = self.scope_id_named(key.as_str(), || key.clone(), now);
        self.close_fast(id);
        id
    }

    /// The scope named `name`, created with the key `key` makes if the
    /// scheduler has not seen it (so a scope it knows costs no key). Its
    /// word stays as it is: the caller closes it unless it admits on it.
    fn scope_id_named(&mut self, name: &str, key: impl FnOnce() -> Scope, now: Instant) -> ScopeId {
        if let Some(id) = self.index.get(name, &self.scopes) {
            return id;
        }
        self.make_room(now);
        let (config, explicit) = self.configs.config_of(name);
        let id = self
            .scopes
            .insert(ScopeEntry::new(ScopeState::new(key(), config, explicit, now)));
        self.index.insert(id, &self.scopes);
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
        name: &str,
        priority: i32,
        mode: FastMode,
        now: Instant,
        wake: &mut WakeList,
    ) -> (Admission, Scope) {
        self.evict_expired(now);
        let scope = self.scope_id_named(name, || Scope::new(name), now);
        let key = self.scopes[scope].state.key.clone();
        (
            self.enqueue_one(scope, DEFAULT_COST, priority, mode, now, wake),
            key,
        )
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
        self.evict_expired(now);
        if scopes.len() == 1 {
            let (key, cost) = scopes.iter().next().expect("a Scopes is never empty");
            let scope = self.scope_id_named(key.as_str(), || key.clone(), now);
            return self.enqueue_one(scope, cost, priority, mode, now, wake);
        }
        // Each scope is marked busy as it is found, so that making the
        // next cannot evict it; whether it is worth a word is read first.
        let mut on_words = scopes.len() == 2 && mode == FastMode::Join;
        let mut ids: Vec<(ScopeId, f64)> = Vec::with_capacity(scopes.len());
        for (scope, cost) in scopes.iter() {
            let id = self.scope_id_named(scope.as_str(), || scope.clone(), now);
            on_words &= self.worth_a_word(id);
            self.note_busy(id);
            ids.push((id, cost));
        }
        if on_words {
            if let Some(pair) = self.two_word_admission([ids[0].0, ids[1].0], now, wake) {
                return Admission::FastTwo(pair);
            }
        }
        for &(id, _) in &ids {
            self.close_fast(id);
        }
        let seats = Seats::from_iter(ids.iter().map(|&(scope, cost)| Seat {
            scope,
            lane: usize::MAX,
            cost,
            before: SendsBefore::KEEP,
        }));
        let (id, admitted) = self.enqueue_seats(seats, priority, now, wake);
        Admission::Ticket(id, admitted)
    }

    /// The one admission of a one-scope request (of scope `scope`, at
    /// `cost`), whichever way its scope was found: on the scope's word,
    /// on a plain lane, or with a ticket.
    #[inline(always)]
    fn enqueue_one(
        &mut self,
        scope: ScopeId,
        cost: f64,
        priority: i32,
        mode: FastMode,
        now: Instant,
        wake: &mut WakeList,
    ) -> Admission {
        if let Some(fast) = self.fast_admission(scope, mode, now) {
            return Admission::Fast(fast);
        }
        self.note_busy(scope);
        if let Some(plain) = self.plain_admission(scope, mode, now) {
            return plain;
        }
        let seats = Seats::One([Seat {
            scope,
            lane: usize::MAX,
            cost,
            before: SendsBefore::KEEP,
        }]);
        let (id, admitted) = self.enqueue_seats(seats, priority, now, wake);
        Admission::Ticket(id, admitted)
    }

    /// After each operation: tells the open scopes whether requests wait
    /// for a global permit, lets them go if one was given back on an open
    /// word meanwhile (see [`GlobalFlight::publish_queued`]), and tells
    /// the words when eviction work is next due.
    #[inline(always)]
    pub(crate) fn settle_global(&mut self, now: Instant, wake: &mut WakeList) {
        // A waiter served goes, or waits for its scopes; one that needs a
        // permit again is queued again only when none is free.
        while self.global.publish_queued(!self.global_queue.is_empty()) {
            self.serve_global_queue(now, wake);
            self.run_dispatch(now, wake);
        }
        // Requests under the lock do eviction work as they come; only
        // requests on words need to be told when it is due.
        if self.global.words_exist() {
            self.publish_eviction_due();
        }
    }

    /// The requests in flight over all scopes, shared with the open words.
    pub(crate) fn global(&self) -> &Arc<GlobalFlight> {
        &self.global
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
            bounds_woken: false,
            waiting: false,
            opens_connection: false,
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
        self.global.has_room() && self.global_queue.is_empty()
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
                    (outcome, ticket.opens_connection),
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
                    before: SendsBefore::KEEP,
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
            (outcome, false),
            (departed_at, departed_at),
            (now, now_stamp),
            wake,
        );
        self.note_if_idle(scope, now_stamp);
    }

    /// Frees the `seats` of an admitted request that ended with `outcome`
    /// at `now`, and its global permit, and lets the next waiters go.
    /// `opened`: whether it counted as opening a connection in its scopes
    /// (see `ScopeState::start_opening`).
    /// `departure`: when it departed, if it did, and the departure the
    /// scheduler has yet to apply (an admitted request never handed over
    /// leaves its scopes' undeparted count as its lanes are released). A
    /// response feeds each scope's latency average and AutoThrottle.
    #[inline(always)]
    fn release_seats(
        &mut self,
        seats: &[Seat],
        (outcome, opened): (Outcome, bool),
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
            match to_apply {
                Some(at) => scope.state.depart(seat.lane, at),
                None if departed_at.is_none() => scope.state.forget_send(seat.lane, &seat.before, seat.cost),
                None => {}
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
            if opened {
                scope.state.end_opening(departed_at.is_some(), answered_at);
            }
            if scope.has_waiters() {
                self.dirty.push(seat.scope);
            }
        }
        self.global.release();
        // The freed scopes look first: a waiter they let go takes the
        // permit if it is earlier than every waiter for one (`evaluate`
        // queues a later one behind them), and the permit then goes to the
        // earliest of all.
        self.run_dispatch(now, wake);
        if !self.global_queue.is_empty() {
            self.serve_global_queue(now, wake);
            self.run_dispatch(now, wake);
        }
    }
}

mod bounds;
mod choice;
mod dispatch;
mod entry;
mod eviction;
mod groups;
mod index;
mod learning;
mod ordered;
mod plain;
mod predict;
mod settings;
mod store_terms;
mod timers;
mod updates;
mod wait_log;

use eviction::Eviction;
pub use eviction::{DEFAULT_IDLE_TTL, DEFAULT_MAX_SCOPES};
use index::ScopeIndex;
use learning::sample_for_fleet;

/// Default number of waiting requests past which the registry warns.
pub const DEFAULT_DELAYED_WARN_THRESHOLD: usize = 500;

#[cfg(test)]
mod tests;
