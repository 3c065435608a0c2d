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
use std::collections::BTreeMap;
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use slab::Slab;
use tokio::time::Instant;

use super::config::ScopeConfig;
use super::feedback::{AnnouncedLimits, Feedback};
use super::scope_state::{Effective, ScopeCheck, ScopeState};
use super::ticket::{OrderKey, Seat, Seats, Status, TicketState};
pub(crate) use super::ticket::{Outcome, ScopeId, TicketId, TicketPoll, WakeList};
use crate::scope::{Scope, Scopes};

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// How many waiters behind the head of a scope a dispatch looks at when the
/// head is held back by another of its scopes. Bounds the work per event.
const MAX_SCAN: usize = 32;

/// How many times a waiter may be passed in a scope while another of its
/// scopes holds it back. After that it keeps its place: later waiters wait
/// behind it, so a multi-scope request cannot be starved.
const MAX_BYPASS: u32 = 16;

/// What stopped a waiter at an evaluation.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Verdict {
    Admit,
    HeldBy(ScopeId),
    Global,
}

/// A scope as the scheduler keeps it: its state, and its waiters.
#[derive(Debug)]
pub(crate) struct ScopeEntry {
    pub(crate) state: ScopeState,
    /// The waiters, in order.
    queue: BTreeMap<OrderKey, TicketId>,
    /// The waiter told to keep the scope's timer, and the instant the
    /// scope's own time limits next let its head go.
    timer_owner: Option<(TicketId, Instant)>,
}

impl ScopeEntry {
    /// Requests waiting for this scope.
    pub(crate) fn queued(&self) -> usize {
        self.queue.len()
    }
}

/// The whole scheduling state of a registry.
#[derive(Debug)]
pub(crate) struct Scheduler {
    /// Scope configs are shared: every scope without its own config points
    /// at this one.
    default_config: Arc<ScopeConfig>,
    overrides: HashMap<Scope, Arc<ScopeConfig>>,
    index: HashMap<Scope, ScopeId>,
    scopes: Slab<ScopeEntry>,
    tickets: Slab<TicketState>,
    next_seq: u64,
    max_concurrency: u32,
    in_flight: u32,
    /// Waiters whose scopes all allow them but the global limit does not.
    global_queue: BTreeMap<OrderKey, TicketId>,
    rng: fastrand::Rng,
    dirty: Vec<ScopeId>,
    passed: Vec<TicketId>,
    /// The ticket whose own future is calling into the scheduler and will
    /// hand its request to the inner service at once if it is admitted now.
    /// Any other ticket admitted meanwhile leaves later, when its task runs.
    departing: Option<TicketId>,
}

impl Scheduler {
    pub(crate) fn new(
        default_config: ScopeConfig,
        overrides: impl IntoIterator<Item = (Scope, ScopeConfig)>,
        max_concurrency: u32,
        rng: fastrand::Rng,
    ) -> Self {
        let mut overrides_map = HashMap::default();
        overrides_map.extend(
            overrides
                .into_iter()
                .map(|(key, config)| (key, Arc::new(config.inherit_from(&default_config)))),
        );
        Scheduler {
            default_config: Arc::new(default_config),
            overrides: overrides_map,
            index: HashMap::default(),
            scopes: Slab::new(),
            tickets: Slab::new(),
            next_seq: 0,
            max_concurrency,
            in_flight: 0,
            global_queue: BTreeMap::new(),
            rng,
            dirty: Vec::new(),
            passed: Vec::new(),
            departing: None,
        }
    }

    fn scope_id(&mut self, key: &Scope, now: Instant) -> ScopeId {
        if let Some(&id) = self.index.get(key.as_str()) {
            return id;
        }
        let (config, explicit) = match self.overrides.get(key.as_str()) {
            Some(config) => (config.clone(), true),
            None => (self.default_config.clone(), false),
        };
        let id = self.scopes.insert(ScopeEntry {
            state: ScopeState::new(key.clone(), config, explicit, now),
            queue: BTreeMap::new(),
            timer_owner: None,
        });
        self.index.insert(key.clone(), id);
        id
    }

    /// Queues a request for `scopes`; sends it at once when nothing is
    /// ahead of it and every limit allows. `departs_if_sent`: the caller
    /// hands the request to the inner service at once if it is sent now.
    pub(crate) fn enqueue(
        &mut self,
        scopes: &Scopes,
        priority: i32,
        now: Instant,
        wake: &mut WakeList,
        departs_if_sent: bool,
    ) -> (TicketId, bool) {
        let ids: Vec<ScopeId>;
        let seats = if scopes.len() == 1 {
            let (scope, _cost) = scopes.iter().next().expect("a Scopes is never empty");
            Seats::One([Seat {
                scope: self.scope_id(scope, now),
                lane: usize::MAX,
            }])
        } else {
            ids = scopes
                .iter()
                .map(|(scope, _cost)| self.scope_id(scope, now))
                .collect();
            Seats::from_iter(ids.iter().map(|&scope| Seat {
                scope,
                lane: usize::MAX,
            }))
        };
        let order = OrderKey {
            priority: Reverse(priority),
            seq: self.next_seq,
        };
        self.next_seq += 1;
        let id = self.tickets.insert(TicketState {
            order,
            seats,
            status: Status::Queued,
            waker: None,
            bypassed: 0,
            held_by: None,
            in_global_queue: false,
            enqueued_at: now,
            sent_at: None,
            departed: false,
        });
        self.departing = departs_if_sent.then_some(id);
        if self.try_send_directly(id, now, wake) {
            self.departing = None;
            return (id, true);
        }
        let ticket = &self.tickets[id];
        for seat in &ticket.seats {
            self.scopes[seat.scope].queue.insert(order, id);
            self.dirty.push(seat.scope);
        }
        self.run_dispatch(now, wake);
        self.departing = None;
        let sent = self.tickets[id].status == Status::InFlight;
        if !sent {
            tracing::debug!(
                target: "tower_throttle",
                scopes = ?scopes,
                "request waits for its scopes to allow it"
            );
        }
        (id, sent)
    }

    /// The fast path: every scope has an empty queue and allows a send now.
    fn try_send_directly(&mut self, id: TicketId, now: Instant, wake: &mut WakeList) -> bool {
        if self.in_flight >= self.max_concurrency {
            return false;
        }
        let ticket = &self.tickets[id];
        let mut first_lane = None;
        for seat in &ticket.seats {
            let scope = &self.scopes[seat.scope];
            if !scope.queue.is_empty() {
                return false;
            }
            let effective = scope.state.effective(now, self.max_concurrency);
            match scope.state.check(now, &effective) {
                ScopeCheck::Ready { lane } => {
                    first_lane.get_or_insert((lane, effective));
                }
                _ => return false,
            }
        }
        match (&ticket.seats, first_lane) {
            // One scope, just checked: no need to check it again.
            (Seats::One(_), Some(chosen)) => self.send_on_lanes(id, now, wake, Some(chosen)),
            _ => self.send(id, now, wake),
        }
        true
    }

    /// Polls a waiting ticket: runs the timers it keeps, and says whether it
    /// was sent or how long to sleep. `departs_if_sent` as for
    /// [`enqueue`](Self::enqueue).
    pub(crate) fn poll_ticket(
        &mut self,
        id: TicketId,
        now: Instant,
        waker: &Waker,
        wake: &mut WakeList,
        departs_if_sent: bool,
    ) -> TicketPoll {
        let ticket = &self.tickets[id];
        if ticket.status == Status::InFlight {
            return TicketPoll::Sent {
                departed: ticket.departed,
            };
        }
        self.departing = departs_if_sent.then_some(id);
        self.fire_due_timers(id, now);
        self.run_dispatch(now, wake);
        self.departing = None;
        let ticket = &mut self.tickets[id];
        if ticket.status == Status::InFlight {
            return TicketPoll::Sent {
                departed: ticket.departed,
            };
        }
        match &ticket.waker {
            Some(known) if known.will_wake(waker) => {}
            _ => ticket.waker = Some(waker.clone()),
        }
        TicketPoll::Waiting {
            timer: self.timer_of(id),
        }
    }

    fn fire_due_timers(&mut self, id: TicketId, now: Instant) {
        for seat in &self.tickets[id].seats {
            let scope = &mut self.scopes[seat.scope];
            if let Some((owner, at)) = scope.timer_owner {
                if owner == id && at <= now {
                    scope.timer_owner = None;
                    self.dirty.push(seat.scope);
                }
            }
        }
    }

    /// The earliest timer this ticket keeps for one of its scopes.
    fn timer_of(&self, id: TicketId) -> Option<Instant> {
        self.tickets[id]
            .seats
            .iter()
            .filter_map(|seat| match self.scopes[seat.scope].timer_owner {
                Some((owner, at)) if owner == id => Some(at),
                _ => None,
            })
            .min()
    }

    /// Marks a request finished (response or error): frees its lanes and
    /// its global permit, and lets the next waiters go. A ticket still
    /// waiting just leaves its queues. A response feeds each scope's
    /// latency average and AutoThrottle.
    pub(crate) fn finish(&mut self, id: TicketId, outcome: Outcome, now: Instant, wake: &mut WakeList) {
        let ticket = self.tickets.remove(id);
        match ticket.status {
            Status::InFlight => {
                if let (
                    Outcome::Response {
                        status,
                        adjust_autothrottle,
                    },
                    Some(sent),
                ) = (outcome, ticket.sent_at)
                {
                    let latency = now.saturating_duration_since(sent);
                    for seat in &ticket.seats {
                        self.scopes[seat.scope]
                            .state
                            .observe_latency(latency, status, adjust_autothrottle);
                    }
                }
                self.release_lanes(&ticket, now, wake);
            }
            Status::Queued => self.leave_queues(id, &ticket, now, wake),
        }
    }

    /// Stamps the departure of ticket `id`, admitted earlier, at `now`:
    /// its scopes' next gaps run from now if that is later than its
    /// admission, and the scopes it held back look at their waiters again.
    pub(crate) fn depart(&mut self, id: TicketId, now: Instant, wake: &mut WakeList) {
        let ticket = &mut self.tickets[id];
        if ticket.departed || ticket.status != Status::InFlight {
            return;
        }
        ticket.departed = true;
        ticket.sent_at = Some(now);
        for seat in &ticket.seats {
            let scope = &mut self.scopes[seat.scope];
            scope.state.depart(seat.lane, now);
            if !scope.queue.is_empty() {
                self.dirty.push(seat.scope);
            }
        }
        self.run_dispatch(now, wake);
    }

    /// Ticket `id`, stamped as departing when it was admitted, leaves later
    /// after all: its scopes wait for [`depart`](Self::depart).
    pub(crate) fn postpone_departure(&mut self, id: TicketId) {
        let ticket = &mut self.tickets[id];
        if !ticket.departed {
            return;
        }
        ticket.departed = false;
        for seat in &ticket.seats {
            self.scopes[seat.scope].state.postpone_departure();
        }
    }

    fn release_lanes(&mut self, ticket: &TicketState, now: Instant, wake: &mut WakeList) {
        for seat in &ticket.seats {
            let scope = &mut self.scopes[seat.scope];
            scope.state.release_lane(seat.lane, ticket.departed, now);
            if !scope.queue.is_empty() {
                self.dirty.push(seat.scope);
            }
        }
        self.in_flight -= 1;
        if !self.global_queue.is_empty() {
            self.serve_global_queue(now, wake);
        }
        self.run_dispatch(now, wake);
    }

    fn leave_queues(&mut self, id: TicketId, ticket: &TicketState, now: Instant, wake: &mut WakeList) {
        for seat in &ticket.seats {
            let scope = &mut self.scopes[seat.scope];
            scope.queue.remove(&ticket.order);
            if matches!(scope.timer_owner, Some((owner, _)) if owner == id) {
                scope.timer_owner = None;
            }
            self.dirty.push(seat.scope);
        }
        if ticket.in_global_queue {
            self.global_queue.remove(&ticket.order);
        }
        self.run_dispatch(now, wake);
    }

    /// Hands freed global permits to the oldest waiters that only lacked one.
    fn serve_global_queue(&mut self, now: Instant, wake: &mut WakeList) {
        while self.in_flight < self.max_concurrency {
            let Some((_, id)) = self.global_queue.pop_first() else {
                return;
            };
            self.tickets[id].in_global_queue = false;
            self.passed.clear();
            if self.evaluate(id, None, now) == Verdict::Admit {
                self.send(id, now, wake);
            }
        }
    }

    fn run_dispatch(&mut self, now: Instant, wake: &mut WakeList) {
        while let Some(scope) = self.dirty.pop() {
            self.dispatch(scope, now, wake);
        }
    }

    /// Sends as many waiters of `scope_id` as its limits allow, in order,
    /// and sets its timer when time is what holds the head back.
    fn dispatch(&mut self, scope_id: ScopeId, now: Instant, wake: &mut WakeList) {
        loop {
            let scope = &self.scopes[scope_id];
            if scope.queue.is_empty() {
                self.set_timer(scope_id, None, wake);
                return;
            }
            let effective = scope.state.effective(now, self.max_concurrency);
            match scope.state.check(now, &effective) {
                ScopeCheck::Full => {
                    self.set_timer(scope_id, None, wake);
                    return;
                }
                ScopeCheck::Until(at) => {
                    self.set_timer(scope_id, Some(at), wake);
                    return;
                }
                ScopeCheck::Ready { .. } => {}
            }
            self.set_timer(scope_id, None, wake);
            match self.pick_waiter(scope_id, now) {
                Some(id) => self.send(id, now, wake),
                None => return,
            }
        }
    }

    /// The first waiter of a ready scope that every one of its scopes
    /// allows now, passing over (a bounded number of) waiters that another
    /// scope holds back.
    fn pick_waiter(&mut self, scope_id: ScopeId, now: Instant) -> Option<TicketId> {
        let candidates: Vec<TicketId> = self.scopes[scope_id]
            .queue
            .values()
            .take(MAX_SCAN)
            .copied()
            .collect();
        let mut skipped_here = 0;
        for id in candidates {
            self.passed.clear();
            match self.evaluate(id, Some(scope_id), now) {
                Verdict::Admit => {
                    // The waiters skipped here are the first ones in the queue.
                    for &passed in self.scopes[scope_id].queue.values().take(skipped_here) {
                        self.tickets[passed].bypassed += 1;
                    }
                    for passed in self.passed.drain(..) {
                        self.tickets[passed].bypassed += 1;
                    }
                    return Some(id);
                }
                Verdict::Global => {
                    let ticket = &mut self.tickets[id];
                    if !ticket.in_global_queue {
                        ticket.in_global_queue = true;
                        self.global_queue.insert(ticket.order, id);
                    }
                    return None;
                }
                Verdict::HeldBy(other) => {
                    let ticket = &mut self.tickets[id];
                    ticket.held_by = Some(other);
                    if other == scope_id || ticket.bypassed >= MAX_BYPASS {
                        return None;
                    }
                    skipped_here += 1;
                }
            }
        }
        None
    }

    /// Whether every scope of ticket `id` lets it go now. `known_ready` is
    /// a scope whose limits and order were just checked by the caller.
    fn evaluate(&mut self, id: TicketId, known_ready: Option<ScopeId>, now: Instant) -> Verdict {
        let ticket = &self.tickets[id];
        let order = ticket.order;
        for seat in &ticket.seats {
            if Some(seat.scope) == known_ready {
                continue;
            }
            let scope = &self.scopes[seat.scope];
            let effective = scope.state.effective(now, self.max_concurrency);
            if !matches!(scope.state.check(now, &effective), ScopeCheck::Ready { .. }) {
                return Verdict::HeldBy(seat.scope);
            }
            for &ahead in scope.queue.range(..order).map(|(_, id)| id).take(MAX_SCAN + 1) {
                let ahead_ticket = &self.tickets[ahead];
                let passable = matches!(ahead_ticket.held_by, Some(other) if other != seat.scope)
                    && ahead_ticket.bypassed < MAX_BYPASS;
                if !passable || self.passed.len() > MAX_SCAN {
                    return Verdict::HeldBy(seat.scope);
                }
                self.passed.push(ahead);
            }
        }
        if self.in_flight >= self.max_concurrency {
            return Verdict::Global;
        }
        Verdict::Admit
    }

    /// Sends ticket `id`: takes a lane in each scope, starts each scope's
    /// delays (with a fresh jitter draw) and counts it in flight.
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
        let departs_now = self.departing == Some(id);
        let ticket = &mut self.tickets[id];
        for seat in ticket.seats.iter_mut() {
            let scope = &mut self.scopes[seat.scope];
            seat.lane = scope.state.take_lane(
                now,
                chosen,
                self.max_concurrency,
                &mut self.rng,
                ticket.enqueued_at,
                departs_now,
            );
            if scope.queue.remove(&ticket.order).is_some() {
                self.dirty.push(seat.scope);
            }
        }
        if ticket.in_global_queue {
            ticket.in_global_queue = false;
            self.global_queue.remove(&ticket.order);
        }
        ticket.status = Status::InFlight;
        ticket.sent_at = Some(now);
        ticket.departed = departs_now;
        if let Some(waker) = ticket.waker.take() {
            wake.push(waker);
        }
        self.in_flight += 1;
    }

    /// Records when a scope's head may next go, and makes sure its first
    /// waiter keeps a timer for it (one timer per scope).
    fn set_timer(&mut self, scope_id: ScopeId, at: Option<Instant>, wake: &mut WakeList) {
        let scope = &mut self.scopes[scope_id];
        let owner = match (at, scope.queue.values().next()) {
            (Some(at), Some(&first)) => Some((first, at)),
            _ => None,
        };
        if scope.timer_owner == owner {
            return;
        }
        scope.timer_owner = owner;
        if let Some((first, _)) = owner {
            if let Some(waker) = &self.tickets[first].waker {
                wake.push(waker.clone());
            }
        }
    }

    /// Replaces a scope's config; waiters re-evaluate at once.
    pub(crate) fn set_scope(&mut self, key: Scope, config: ScopeConfig, now: Instant, wake: &mut WakeList) {
        let config = Arc::new(config.inherit_from(&self.default_config));
        if let Some(&id) = self.index.get(key.as_str()) {
            self.scopes[id].state.replace_config(config.clone(), now);
            self.dirty.push(id);
        }
        self.overrides.insert(key, config);
        self.run_dispatch(now, wake);
    }

    /// Applies feedback about one response (or error) to scope `key`.
    pub(crate) fn feedback(&mut self, key: &Scope, feedback: Feedback, now: Instant, wake: &mut WakeList) {
        let id = self.scope_id(key, now);
        if self.scopes[id]
            .state
            .apply_feedback(feedback, now, self.max_concurrency)
        {
            self.dirty.push(id);
            self.run_dispatch(now, wake);
        }
    }

    /// The config scope `key` uses, without creating the scope.
    pub(crate) fn config_arc(&self, key: &str) -> Arc<ScopeConfig> {
        match self.index.get(key) {
            Some(&id) => self.scopes[id].state.config.clone(),
            None => self.overrides.get(key).unwrap_or(&self.default_config).clone(),
        }
    }

    /// Records a robots.txt Crawl-delay for scope `key` (`None`: no delay
    /// known); see [`ScopeState::set_robots_delay`].
    pub(crate) fn set_robots_delay(
        &mut self,
        key: &Scope,
        crawl_delay: Option<Duration>,
        now: Instant,
        wake: &mut WakeList,
    ) {
        let id = self.scope_id(key, now);
        self.scopes[id].state.set_robots_delay(crawl_delay);
        self.dirty.push(id);
        self.run_dispatch(now, wake);
    }

    /// Holds scope `key` until `until`; see [`ScopeState::hold`].
    pub(crate) fn hold(&mut self, key: &Scope, until: Instant, now: Instant, wake: &mut WakeList) {
        let id = self.scope_id(key, now);
        if self.scopes[id].state.hold(until, now) {
            self.dirty.push(id);
            self.run_dispatch(now, wake);
        }
    }

    /// Paces scope `key`, or stops pacing it; see [`ScopeState::set_pacing`].
    pub(crate) fn set_pacing(
        &mut self,
        key: &Scope,
        pacing: Option<(Duration, Instant)>,
        now: Instant,
        wake: &mut WakeList,
    ) {
        let id = self.scope_id(key, now);
        self.scopes[id].state.set_pacing(pacing, now);
        self.dirty.push(id);
        self.run_dispatch(now, wake);
    }

    pub(crate) fn set_announced_limits(&mut self, key: &Scope, limits: AnnouncedLimits, now: Instant) {
        let id = self.scope_id(key, now);
        self.scopes[id].state.set_announced_limits(limits);
    }

    pub(crate) fn config_of(&self, key: &str) -> ScopeConfig {
        let config = self.overrides.get(key).unwrap_or(&self.default_config);
        ScopeConfig::clone(config)
    }

    /// The scope `key`, if the scheduler has seen it.
    pub(crate) fn scope(&self, key: &str) -> Option<&ScopeEntry> {
        self.index.get(key).map(|&id| &self.scopes[id])
    }

    /// Every scope the scheduler knows.
    pub(crate) fn scopes(&self) -> impl Iterator<Item = &ScopeEntry> {
        self.scopes.iter().map(|(_, scope)| scope)
    }

    /// The global cap on requests in flight.
    pub(crate) fn max_concurrency(&self) -> u32 {
        self.max_concurrency
    }

    /// Requests in flight over all scopes.
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Requests waiting to be sent.
    pub(crate) fn waiting(&self) -> usize {
        self.tickets
            .iter()
            .filter(|(_, ticket)| ticket.status == Status::Queued)
            .count()
    }
}

#[cfg(test)]
mod tests {
    //! The scheduler on its own, at fixed instants: no runtime, no clock,
    //! no futures. Every instant is `t0 + a duration`.

    use std::task::Waker;

    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    /// No delays, no jitter, `lanes` lanes.
    fn free(lanes: u32) -> ScopeConfig {
        ScopeConfig::default()
            .concurrency(lanes)
            .delay(Duration::ZERO)
            .delay_per_slot(Duration::ZERO)
            .jitter(0.0)
    }

    fn scheduler(default: ScopeConfig, max_concurrency: u32) -> Scheduler {
        Scheduler::new(
            default,
            Vec::<(Scope, ScopeConfig)>::new(),
            max_concurrency,
            fastrand::Rng::with_seed(1),
        )
    }

    /// A ticket sent in the poll that asked, so already on its way.
    const SENT: TicketPoll = TicketPoll::Sent { departed: true };
    /// A ticket another event admitted: it reports its own departure.
    const ADMITTED_EARLIER: TicketPoll = TicketPoll::Sent { departed: false };

    /// A test driver: the scheduler plus the wakers each call collected.
    struct Driver {
        scheduler: Scheduler,
        woken: WakeList,
    }

    impl Driver {
        fn new(scheduler: Scheduler) -> Self {
            Driver {
                scheduler,
                woken: WakeList::new(),
            }
        }

        /// Queues a request; says whether it was sent at once.
        fn enqueue(&mut self, scopes: impl Into<Scopes>, priority: i32, now: Instant) -> (TicketId, bool) {
            self.woken.clear();
            self.scheduler
                .enqueue(&scopes.into(), priority, now, &mut self.woken, true)
        }

        fn poll(&mut self, id: TicketId, now: Instant) -> TicketPoll {
            self.woken.clear();
            self.scheduler
                .poll_ticket(id, now, Waker::noop(), &mut self.woken, true)
        }

        fn finish(&mut self, id: TicketId, outcome: Outcome, now: Instant) {
            self.woken.clear();
            self.scheduler.finish(id, outcome, now, &mut self.woken);
        }

        /// The lane ticket `id` took in its first scope.
        fn lane(&self, id: TicketId) -> usize {
            self.scheduler.tickets[id].seats.iter().next().unwrap().lane
        }

        fn in_flight(&self, scope: &str) -> u32 {
            self.scheduler
                .scope(scope)
                .map_or(0, |scope| scope.state.in_flight)
        }
    }

    const ANSWERED: Outcome = Outcome::Response {
        status: 200,
        adjust_autothrottle: true,
    };

    fn waiting(timer: Option<Instant>) -> TicketPoll {
        TicketPoll::Waiting { timer }
    }

    /// DESIGN §2 rule 2: concurrency 2, delay 0.3 s, per-slot 1.0 s, no
    /// jitter, instant responses, three requests at t=0 are sent at 0.0
    /// (lane 1), 0.3 (lane 2) and 1.0 (lane 1).
    #[test]
    fn seeds_worked_example_sends_at_0_0_3_and_1_0_on_the_soonest_free_lane() {
        let config = ScopeConfig::default()
            .concurrency(2)
            .delay(ms(300))
            .delay_per_slot(ms(1000))
            .jitter(0.0);
        let mut d = Driver::new(scheduler(config, 16));
        let t0 = tokio::time::Instant::now();

        let (a, sent) = d.enqueue("site", 0, t0);
        assert!(sent, "the first request goes at once");
        assert_eq!(d.lane(a), 0);
        d.finish(a, ANSWERED, t0);

        let (b, sent_b) = d.enqueue("site", 0, t0);
        let (c, sent_c) = d.enqueue("site", 0, t0);
        assert!(!sent_b && !sent_c);
        // The head keeps the scope's one timer, for the scope delay.
        assert_eq!(d.poll(b, t0), waiting(Some(t0 + ms(300))));
        assert_eq!(d.poll(c, t0), waiting(None));

        // At 0.3 lane 1 is still in its per-slot delay: B takes a new lane.
        assert_eq!(d.poll(b, t0 + ms(300)), SENT);
        assert_eq!(d.lane(b), 1);
        d.finish(b, ANSWERED, t0 + ms(300));

        // Lane 1 frees at 1.0, lane 2 at 1.3, the scope delay ends at 0.6.
        assert_eq!(d.poll(c, t0 + ms(300)), waiting(Some(t0 + ms(1000))));
        assert_eq!(d.poll(c, t0 + ms(999)), waiting(Some(t0 + ms(1000))));
        assert_eq!(d.poll(c, t0 + ms(1000)), SENT);
        assert_eq!(d.lane(c), 0);
    }

    #[test]
    fn finishing_releases_the_lane_and_wakes_the_next_waiter() {
        let mut d = Driver::new(scheduler(free(1), 16));
        let t0 = tokio::time::Instant::now();
        let (a, _) = d.enqueue("site", 0, t0);
        let (b, sent) = d.enqueue("site", 0, t0);
        assert!(!sent);
        // Only a completion can free the one lane: no timer.
        assert_eq!(d.poll(b, t0), waiting(None));
        assert_eq!(d.in_flight("site"), 1);

        d.finish(a, ANSWERED, t0 + ms(50));
        assert_eq!(d.woken.len(), 1, "the waiter is woken once");
        assert_eq!(d.in_flight("site"), 1, "B took the freed lane");
        assert_eq!(d.poll(b, t0 + ms(50)), ADMITTED_EARLIER);
        assert_eq!(d.lane(b), 0);
        // The latency of A (send to answer) feeds the average.
        assert_eq!(d.scheduler.scope("site").unwrap().state.latency, Some(ms(50)));

        d.finish(b, Outcome::NoResponse, t0 + ms(60));
        assert_eq!(d.in_flight("site"), 0);
        assert_eq!(d.scheduler.in_flight(), 0);
    }

    /// A request waiting on scope B holds nothing in scope A, and A's later
    /// requests pass it while B holds it back.
    #[test]
    fn multi_scope_admission_is_all_or_nothing() {
        let mut d = Driver::new(scheduler(free(1), 16));
        let t0 = tokio::time::Instant::now();
        let (x, _) = d.enqueue("b", 0, t0);

        let (y, sent) = d.enqueue(["a", "b"], 0, t0);
        assert!(!sent);
        assert_eq!(d.in_flight("a"), 0, "nothing taken in a while b is full");
        assert_eq!(d.poll(y, t0), waiting(None));

        let (z, sent) = d.enqueue("a", 0, t0 + ms(1));
        assert!(sent, "a is free: its later request passes the held one");
        assert_eq!(d.scheduler.tickets[y].bypassed, 1);

        // b frees, but a is now busy with Z: Y still takes nothing.
        d.finish(x, ANSWERED, t0 + ms(2));
        assert_eq!(d.poll(y, t0 + ms(2)), waiting(None));
        assert_eq!((d.in_flight("a"), d.in_flight("b")), (1, 0));

        d.finish(z, ANSWERED, t0 + ms(3));
        assert_eq!(d.poll(y, t0 + ms(3)), ADMITTED_EARLIER);
        assert_eq!((d.in_flight("a"), d.in_flight("b")), (1, 1));
        assert_eq!(d.scheduler.in_flight(), 1);
    }

    /// Requests whose scopes allow them but the global cap does not wait in
    /// one global queue, served oldest first as permits free.
    #[test]
    fn global_max_concurrency_queues_waiters_in_arrival_order() {
        let mut d = Driver::new(scheduler(free(8), 1));
        let t0 = tokio::time::Instant::now();
        let (a, sent) = d.enqueue("a", 0, t0);
        assert!(sent);
        let (b, sent_b) = d.enqueue("b", 0, t0);
        let (c, sent_c) = d.enqueue("a", 0, t0);
        assert!(!sent_b && !sent_c);
        assert_eq!(d.poll(b, t0), waiting(None));
        assert_eq!(d.poll(c, t0), waiting(None));

        d.finish(a, ANSWERED, t0 + ms(10));
        assert_eq!(d.poll(b, t0 + ms(10)), ADMITTED_EARLIER, "B is older than C");
        assert_eq!(d.poll(c, t0 + ms(10)), waiting(None));

        d.finish(b, ANSWERED, t0 + ms(20));
        assert_eq!(d.poll(c, t0 + ms(20)), ADMITTED_EARLIER);
        assert_eq!(d.scheduler.in_flight(), 1);
    }

    #[test]
    fn a_hold_delays_the_head_until_it_ends_capped_at_the_backoff_max_delay() {
        let mut d = Driver::new(scheduler(free(1), 16));
        let t0 = tokio::time::Instant::now();
        let mut wake = WakeList::new();
        d.scheduler
            .hold(&Scope::new("site"), t0 + Duration::from_secs(1000), t0, &mut wake);
        let (a, sent) = d.enqueue("site", 0, t0);
        assert!(!sent);
        // BackoffConfig::default().max_delay is 300 s.
        let end = t0 + Duration::from_secs(300);
        assert_eq!(d.poll(a, t0), waiting(Some(end)));
        assert_eq!(d.poll(a, end - ms(1)), waiting(Some(end)));
        assert_eq!(d.poll(a, end), SENT);
    }

    #[test]
    fn priority_orders_waiters_within_a_scope() {
        let mut d = Driver::new(scheduler(free(1), 16));
        let t0 = tokio::time::Instant::now();
        let (a, _) = d.enqueue("site", 0, t0);
        let (low, _) = d.enqueue("site", 0, t0);
        let (high, _) = d.enqueue("site", 5, t0 + ms(1));
        d.finish(a, ANSWERED, t0 + ms(2));
        assert_eq!(d.poll(low, t0 + ms(2)), waiting(None));
        assert_eq!(d.poll(high, t0 + ms(2)), ADMITTED_EARLIER);
    }

    /// A waiter that leaves (its future dropped) hands the scope's timer to
    /// the next one.
    #[test]
    fn a_waiter_leaving_hands_the_timer_to_the_next() {
        let config = free(1).delay(Duration::from_secs(1));
        let mut d = Driver::new(scheduler(config, 16));
        let t0 = tokio::time::Instant::now();
        let (a, _) = d.enqueue("site", 0, t0);
        d.finish(a, ANSWERED, t0);
        let (b, _) = d.enqueue("site", 0, t0);
        let (c, _) = d.enqueue("site", 0, t0);
        assert_eq!(d.poll(b, t0), waiting(Some(t0 + Duration::from_secs(1))));
        assert_eq!(d.poll(c, t0), waiting(None));

        d.finish(b, Outcome::NoResponse, t0 + ms(100));
        assert_eq!(d.woken.len(), 1, "the new head is woken to take the timer");
        assert_eq!(
            d.poll(c, t0 + ms(100)),
            waiting(Some(t0 + Duration::from_secs(1)))
        );
        assert_eq!(d.poll(c, t0 + Duration::from_secs(1)), SENT);
        assert_eq!(d.scheduler.scope("site").unwrap().queued(), 0);
    }

    /// A ticket admitted by another event leaves when its own task runs:
    /// the scope's next gap runs from that departure, and nothing else of
    /// the scope is admitted before it.
    #[test]
    fn the_next_gap_runs_from_a_late_departure() {
        let config = free(3).delay(ms(100));
        let mut d = Driver::new(scheduler(config, 16));
        let t0 = tokio::time::Instant::now();
        let (a, _) = d.enqueue("site", 0, t0);
        d.finish(a, ANSWERED, t0);
        let (b, sent) = d.enqueue("site", 0, t0);
        assert!(!sent);
        assert_eq!(d.poll(b, t0), waiting(Some(t0 + ms(100))));
        // C's arrival at 100 ms admits B, whose task has not run yet.
        let (c, sent) = d.enqueue("site", 0, t0 + ms(100));
        assert!(!sent);
        assert_eq!(d.scheduler.tickets[b].status, Status::InFlight);
        // Until B leaves, C has no gap to count from: no timer.
        assert_eq!(d.poll(c, t0 + ms(120)), waiting(None));
        let mut wake = WakeList::new();
        d.scheduler.depart(b, t0 + ms(140), &mut wake);
        assert_eq!(d.scheduler.tickets[b].sent_at, Some(t0 + ms(140)));
        assert_eq!(d.poll(c, t0 + ms(140)), waiting(Some(t0 + ms(240))));
        assert_eq!(d.poll(c, t0 + ms(240)), SENT);
    }
}
