//! The scheduler: per-scope runtime state and the admission algorithm.
//!
//! Everything here runs under the registry's lock and never blocks or
//! sleeps; the futures in `throttle` do the waiting. See the module docs of
//! `registry` for the model.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::task::Waker;
use std::time::Duration;

use slab::Slab;
use tokio::time::Instant;

use std::sync::Arc;

use super::backoff::{BackoffNow, BackoffState};
use super::config::{saturating_add, Jitter, ScopeConfig, MAX_CONFIG_DELAY};
use super::feedback::{Feedback, FeedbackKind};
use super::rampup::RampupState;
use super::stats::{AnnouncedLimits, LimitSource, ScopeStats, Stats};
use crate::scope::{Scope, Scopes};

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub(crate) type ScopeId = usize;
pub(crate) type TicketId = usize;

/// How many waiters behind the head of a scope a dispatch looks at when the
/// head is held back by another of its scopes. Bounds the work per event.
const MAX_SCAN: usize = 32;

/// How many times a waiter may be passed in a scope while another of its
/// scopes holds it back. After that it keeps its place: later waiters wait
/// behind it, so a multi-scope request cannot be starved.
const MAX_BYPASS: u32 = 16;

/// Position of a waiter: higher priority first, then arrival order. The
/// order is global (one sequence for all scopes), so two waiters are in the
/// same relative order in every scope they share, which is what makes
/// all-or-nothing admission deadlock-free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct OrderKey {
    priority: Reverse<i32>,
    seq: u64,
}

/// The last send of a lane or a scope, with the random draw for the gap
/// that follows it. The gap itself is computed when it is checked, from the
/// limits and jitter in force *then*, so a config change, a backoff step or
/// any new contribution applies to requests already waiting.
#[derive(Debug, Clone, Copy)]
struct LastSend {
    at: Instant,
    /// Uniform in `[0, 1)`; mapped onto the jitter range in force.
    draw: f64,
}

impl LastSend {
    fn next_allowed(&self, gap: Duration, jitter: &Jitter) -> Instant {
        self.next_allowed_at_least(gap, jitter, Duration::ZERO)
    }

    fn next_allowed_at_least(&self, gap: Duration, jitter: &Jitter, floor: Duration) -> Instant {
        if gap.is_zero() && floor.is_zero() {
            return self.at;
        }
        saturating_add(self.at, scale(gap, jitter.factor(self.draw)).max(floor))
    }
}

fn scale(gap: Duration, factor: f64) -> Duration {
    if factor == 1.0 {
        return gap;
    }
    Duration::try_from_secs_f64(gap.as_secs_f64() * factor).unwrap_or(MAX_CONFIG_DELAY)
}

#[derive(Debug, Clone, Copy)]
struct Lane {
    busy: bool,
    last_send: LastSend,
}

/// What the feedback layers add to a scope's limits. Each source owns one
/// field; [`ScopeState::effective`] folds them into the limits the scheduler
/// applies, keeping the most restrictive (smallest concurrency, largest
/// delay). A new source is one more field and one more term in that fold.
#[derive(Debug, Clone, Default)]
pub(crate) struct Contributions {
    /// Nothing is sent before this instant (Retry-After, rate-limit resets).
    pub(crate) hold_until: Option<Instant>,
    /// Exponential backoff after the last step (recovery is computed from
    /// it when read).
    pub(crate) backoff: Option<BackoffState>,
    /// AutoThrottle's current delay, when AutoThrottle is on.
    pub(crate) autothrottle_delay: Option<Duration>,
    /// robots.txt Crawl-delay, and whether it applies (a scope with an
    /// explicit config keeps its own limits).
    pub(crate) robots: Option<RobotsDelay>,
    /// Pacing derived from a server-announced policy (spread the remaining
    /// quota until its reset), and the instant it stops applying.
    pub(crate) pacing: Option<(Duration, Instant)>,
    /// What the server last announced about its limits (for stats).
    pub(crate) announced: Option<Box<AnnouncedLimits>>,
    /// The rampup controller, when rampup is on.
    pub(crate) rampup: Option<Box<RampupState>>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RobotsDelay {
    pub(crate) crawl_delay: Duration,
    /// Whether it sets the scope's concurrency to 1 (not when the scope's
    /// own config sets a concurrency).
    pub(crate) limits_concurrency: bool,
    /// Whether it raises the scope's delay (not when the scope's own config
    /// sets a delay).
    pub(crate) limits_delay: bool,
}

impl RobotsDelay {
    fn for_config(crawl_delay: Duration, config: &ScopeConfig, explicit: bool) -> Self {
        RobotsDelay {
            crawl_delay,
            limits_concurrency: !(explicit && config.set_by_user.concurrency),
            limits_delay: !(explicit && config.set_by_user.delay),
        }
    }

    fn applies(&self) -> bool {
        self.limits_concurrency || self.limits_delay
    }
}

/// The limits of a scope at one instant, with what set each of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Effective {
    pub(crate) concurrency: u32,
    pub(crate) concurrency_source: LimitSource,
    pub(crate) delay: Duration,
    pub(crate) delay_source: LimitSource,
    pub(crate) delay_per_slot: Duration,
    pub(crate) jitter: Jitter,
    /// No gap between two sends is shorter than this, whatever the jitter.
    pub(crate) delay_floor: Duration,
    /// The backoff in force, if any.
    pub(crate) backoff: Option<BackoffNow>,
}

impl Effective {
    fn raise_delay(&mut self, delay: Duration, source: LimitSource) {
        if delay > self.delay {
            self.delay = delay;
            self.delay_source = source;
        }
    }

    fn lower_concurrency(&mut self, concurrency: u32, source: LimitSource) {
        if concurrency < self.concurrency {
            self.concurrency = concurrency;
            self.concurrency_source = source;
        }
    }
}

#[derive(Debug)]
struct ScopeState {
    key: Scope,
    config: Arc<ScopeConfig>,
    /// Whether the scope has a config of its own (not the default one).
    explicit: bool,
    contributions: Contributions,
    lanes: Vec<Lane>,
    last_send: Option<LastSend>,
    in_flight: u32,
    sent: u64,
    backoff_feedbacks: u64,
    reported_cost: f64,
    latency: Option<Duration>,
    queue: BTreeMap<OrderKey, TicketId>,
    /// The waiter told to keep the scope's timer, and the instant the
    /// scope's own time limits next let its head go.
    timer_owner: Option<(TicketId, Instant)>,
}

/// What a scope's own limits say about its next send.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ScopeCheck {
    /// A send may happen now, on this lane (an index equal to the number of
    /// lanes means a new lane).
    Ready { lane: usize },
    /// Time holds it until then.
    Until(Instant),
    /// Every usable lane is in flight: a completion must come first.
    Full,
}

impl ScopeState {
    fn new(key: Scope, config: Arc<ScopeConfig>, explicit: bool, now: Instant) -> Self {
        let mut contributions = Contributions::default();
        if let Some(autothrottle) = config.get_autothrottle() {
            contributions.autothrottle_delay = Some(autothrottle.start(config.delay));
        }
        if config.get_rampup().is_some() {
            contributions.rampup = Some(Box::new(RampupState::new(config.delay, now)));
        }
        ScopeState {
            key,
            config,
            explicit,
            contributions,
            lanes: Vec::new(),
            last_send: None,
            in_flight: 0,
            sent: 0,
            backoff_feedbacks: 0,
            reported_cost: 0.0,
            latency: None,
            queue: BTreeMap::new(),
            timer_owner: None,
        }
    }

    /// The limits without backoff: config, global cap, robots.txt and
    /// AutoThrottle. Backoff steps multiply these.
    fn effective_before_backoff(&self, max_concurrency: u32) -> Effective {
        let config = &self.config;
        let mut effective = match &self.contributions.rampup {
            Some(rampup) => Effective {
                concurrency: self.rampup_lanes(rampup.delay),
                concurrency_source: LimitSource::Rampup,
                delay: rampup.delay,
                delay_source: LimitSource::Rampup,
                delay_per_slot: Duration::ZERO,
                // Rampup paces precisely: the boundary it finds is only
                // worth something if sends keep to it.
                jitter: Jitter::NONE,
                delay_floor: Duration::ZERO,
                backoff: None,
            },
            None => Effective {
                concurrency: config.concurrency,
                concurrency_source: LimitSource::Config,
                delay: config.delay,
                delay_source: LimitSource::Config,
                delay_per_slot: config.delay_per_slot,
                jitter: config.jitter,
                delay_floor: Duration::ZERO,
                backoff: None,
            },
        };
        effective.lower_concurrency(max_concurrency, LimitSource::MaxConcurrency);
        if let Some(robots) = self.contributions.robots {
            if robots.limits_concurrency {
                effective.lower_concurrency(1, LimitSource::Robots);
            }
            if robots.limits_delay {
                effective.raise_delay(robots.crawl_delay, LimitSource::Robots);
                // The site asked for at least this much: jitter may
                // lengthen a gap, never shorten it below the Crawl-delay.
                effective.delay_floor = robots.crawl_delay;
            }
        }
        if let Some(delay) = self.contributions.autothrottle_delay {
            effective.raise_delay(delay, LimitSource::AutoThrottle);
        }
        effective
    }

    /// Reports the backoff steps back that quiet windows earned since last
    /// looked at (recovery is computed lazily, so this is when it is seen),
    /// and drops the backoff state once the scope is back on its limits.
    fn note_backoff_recovery(&mut self, now: Instant, max_concurrency: u32) {
        let Some(state) = self.contributions.backoff else {
            return;
        };
        let base = self.effective_before_backoff(max_concurrency);
        let current = state.at(now, self.config.get_backoff(), base.concurrency);
        let level = current.map_or(0, |current| current.level);
        if level < state.reported_level {
            tracing::debug!(
                target: "tower_throttle",
                scope = %self.key,
                level,
                delay_ms = current.map_or(base.delay, |current| current.delay).as_millis() as u64,
                concurrency = current.map_or(base.concurrency, |current| current.concurrency),
                "backoff step down"
            );
        }
        self.contributions.backoff = current.map(|_| BackoffState {
            reported_level: level,
            ..state
        });
    }

    /// Lanes a rampup scope needs to keep its pace at the observed latency
    /// (at least its configured concurrency).
    fn rampup_lanes(&self, delay: Duration) -> u32 {
        let latency = self.latency.unwrap_or_default().as_secs_f64();
        let needed = (latency / delay.as_secs_f64().max(1e-6)).ceil() + 1.0;
        (needed.min(f64::from(u32::MAX)) as u32).max(self.config.concurrency)
    }

    fn effective(&self, now: Instant, max_concurrency: u32) -> Effective {
        let mut effective = self.effective_before_backoff(max_concurrency);
        if let Some((delay, until)) = self.contributions.pacing {
            if now < until {
                effective.raise_delay(delay, LimitSource::RateLimitPolicy);
            }
        }
        let backoff_config = self.config.get_backoff();
        let backoff = self
            .contributions
            .backoff
            .and_then(|state| state.at(now, backoff_config, effective.concurrency));
        if let Some(backoff) = backoff {
            effective.raise_delay(backoff.delay, LimitSource::Backoff);
            effective.lower_concurrency(backoff.concurrency, LimitSource::Backoff);
            effective.jitter = backoff_config.jitter;
            effective.backoff = Some(backoff);
        }
        effective
    }

    fn check(&self, now: Instant, effective: &Effective) -> ScopeCheck {
        if self.in_flight >= effective.concurrency {
            return ScopeCheck::Full;
        }
        let Some((lane, lane_free)) = self.soonest_free_lane(now, effective) else {
            return ScopeCheck::Full;
        };
        let next_send = self.last_send.map(|last| {
            last.next_allowed_at_least(effective.delay, &effective.jitter, effective.delay_floor)
        });
        let ready_at = [lane_free, next_send, self.contributions.hold_until]
            .into_iter()
            .flatten()
            .max();
        match ready_at {
            Some(at) if at > now => {
                // A backoff step back or the end of a pacing may shorten the
                // delay before then: look again at that instant.
                let step_back = effective.backoff.map(|backoff| backoff.next_step_back);
                let pacing_end = self.contributions.pacing.map(|(_, until)| until);
                let relief = [step_back, pacing_end]
                    .into_iter()
                    .flatten()
                    .filter(|&relief| relief > now)
                    .min();
                ScopeCheck::Until(relief.map_or(at, |relief| relief.min(at)))
            }
            _ => ScopeCheck::Ready { lane },
        }
    }

    /// The free lane whose per-slot delay ends soonest. Lanes are created
    /// lazily, so a scope that never had more than one request in flight
    /// keeps one lane whatever its concurrency.
    fn soonest_free_lane(&self, now: Instant, effective: &Effective) -> Option<(usize, Option<Instant>)> {
        let best = self
            .lanes
            .iter()
            .enumerate()
            .filter(|(_, lane)| !lane.busy)
            .map(|(index, lane)| {
                (
                    index,
                    Some(
                        lane.last_send
                            .next_allowed(effective.delay_per_slot, &effective.jitter),
                    ),
                )
            })
            .min_by_key(|(_, free)| *free);
        let ready_now = best.is_some_and(|(_, free)| free.is_none_or(|free| free <= now));
        if !ready_now && self.lanes.len() < effective.concurrency as usize {
            return Some((self.lanes.len(), None));
        }
        best
    }
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    scope: ScopeId,
    lane: usize,
}

/// The slots of a ticket, inline for the common one-scope request.
#[derive(Debug)]
enum Slots {
    One([Slot; 1]),
    Many(Vec<Slot>),
}

impl Slots {
    fn from_iter(mut slots: impl ExactSizeIterator<Item = Slot>) -> Self {
        match (slots.len(), slots.next()) {
            (1, Some(slot)) => Slots::One([slot]),
            (_, first) => Slots::Many(first.into_iter().chain(slots).collect()),
        }
    }

    fn iter(&self) -> std::slice::Iter<'_, Slot> {
        match self {
            Slots::One(one) => one.iter(),
            Slots::Many(many) => many.iter(),
        }
    }

    fn iter_mut(&mut self) -> std::slice::IterMut<'_, Slot> {
        match self {
            Slots::One(one) => one.iter_mut(),
            Slots::Many(many) => many.iter_mut(),
        }
    }
}

impl<'a> IntoIterator for &'a Slots {
    type Item = &'a Slot;
    type IntoIter = std::slice::Iter<'a, Slot>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Status {
    Queued,
    InFlight,
}

#[derive(Debug)]
struct TicketState {
    order: OrderKey,
    slots: Slots,
    status: Status,
    waker: Option<Waker>,
    /// Times a later waiter was sent before this one in a scope while
    /// another scope held this one back.
    bypassed: u32,
    /// The scope that held this waiter back at its last evaluation.
    held_by: Option<ScopeId>,
    in_global_queue: bool,
    enqueued_at: Instant,
    sent_at: Option<Instant>,
}

/// What stopped a waiter at an evaluation.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Verdict {
    Admit,
    HeldBy(ScopeId),
    Global,
}

/// How a sent request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The inner service answered with this status.
    Response { status: u16, adjust_autothrottle: bool },
    /// The inner service failed, or the future was dropped.
    NoResponse,
}

/// The result of polling a ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TicketPoll {
    /// The request may be sent now (it is counted in flight).
    Sent,
    /// Still waiting; keep a timer until this instant, if any.
    Waiting { timer: Option<Instant> },
}

/// Wakers to call once the lock is released.
pub(crate) type WakeList = Vec<Waker>;

/// The whole scheduling state of a registry.
#[derive(Debug)]
pub(crate) struct Scheduler {
    /// Scope configs are shared: every scope without its own config points
    /// at this one.
    default_config: Arc<ScopeConfig>,
    overrides: HashMap<Scope, Arc<ScopeConfig>>,
    index: HashMap<Scope, ScopeId>,
    scopes: Slab<ScopeState>,
    tickets: Slab<TicketState>,
    next_seq: u64,
    max_concurrency: u32,
    in_flight: u32,
    /// Waiters whose scopes all allow them but the global limit does not.
    global_queue: BTreeMap<OrderKey, TicketId>,
    rng: fastrand::Rng,
    dirty: Vec<ScopeId>,
    passed: Vec<TicketId>,
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
        }
    }

    fn scope_id(&mut self, key: &Scope) -> ScopeId {
        if let Some(&id) = self.index.get(key.as_str()) {
            return id;
        }
        let (config, explicit) = match self.overrides.get(key.as_str()) {
            Some(config) => (config.clone(), true),
            None => (self.default_config.clone(), false),
        };
        let id = self
            .scopes
            .insert(ScopeState::new(key.clone(), config, explicit, Instant::now()));
        self.index.insert(key.clone(), id);
        id
    }

    /// Queues a request for `scopes`; sends it at once when nothing is
    /// ahead of it and every limit allows.
    pub(crate) fn enqueue(
        &mut self,
        scopes: &Scopes,
        priority: i32,
        now: Instant,
        wake: &mut WakeList,
    ) -> (TicketId, bool) {
        let ids: Vec<ScopeId>;
        let slots = if scopes.len() == 1 {
            let (scope, _cost) = scopes.iter().next().expect("a Scopes is never empty");
            Slots::One([Slot {
                scope: self.scope_id(scope),
                lane: usize::MAX,
            }])
        } else {
            ids = scopes.iter().map(|(scope, _cost)| self.scope_id(scope)).collect();
            Slots::from_iter(ids.iter().map(|&scope| Slot {
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
            slots,
            status: Status::Queued,
            waker: None,
            bypassed: 0,
            held_by: None,
            in_global_queue: false,
            enqueued_at: now,
            sent_at: None,
        });
        if self.try_send_directly(id, now, wake) {
            return (id, true);
        }
        let ticket = &self.tickets[id];
        for slot in &ticket.slots {
            self.scopes[slot.scope].queue.insert(order, id);
            self.dirty.push(slot.scope);
        }
        self.run_dispatch(now, wake);
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
        for slot in &ticket.slots {
            let scope = &self.scopes[slot.scope];
            if !scope.queue.is_empty() {
                return false;
            }
            let effective = scope.effective(now, self.max_concurrency);
            match scope.check(now, &effective) {
                ScopeCheck::Ready { lane } => {
                    first_lane.get_or_insert((lane, effective));
                }
                _ => return false,
            }
        }
        match (&ticket.slots, first_lane) {
            // One scope, just checked: no need to check it again.
            (Slots::One(_), Some(chosen)) => self.send_on_lanes(id, now, wake, Some(chosen)),
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
        if self.tickets[id].status == Status::InFlight {
            return TicketPoll::Sent;
        }
        self.fire_due_timers(id, now);
        self.run_dispatch(now, wake);
        let ticket = &mut self.tickets[id];
        if ticket.status == Status::InFlight {
            return TicketPoll::Sent;
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
        for slot in &self.tickets[id].slots {
            let scope = &mut self.scopes[slot.scope];
            if let Some((owner, at)) = scope.timer_owner {
                if owner == id && at <= now {
                    scope.timer_owner = None;
                    self.dirty.push(slot.scope);
                }
            }
        }
    }

    /// The earliest timer this ticket keeps for one of its scopes.
    fn timer_of(&self, id: TicketId) -> Option<Instant> {
        self.tickets[id]
            .slots
            .iter()
            .filter_map(|slot| match self.scopes[slot.scope].timer_owner {
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
                    for slot in &ticket.slots {
                        self.observe_latency(slot.scope, latency, status, adjust_autothrottle);
                    }
                }
                self.release_lanes(&ticket, now, wake);
            }
            Status::Queued => self.leave_queues(id, &ticket, now, wake),
        }
    }

    /// Scrapy's AutoThrottle step, and the latency average shown in stats.
    fn observe_latency(&mut self, id: ScopeId, latency: Duration, status: u16, adjust_autothrottle: bool) {
        let scope = &mut self.scopes[id];
        // A moving average with weight 1/5 for the newest sample, in whole
        // nanoseconds (no float conversion on the completion path).
        scope.latency = Some(match scope.latency {
            Some(average) => {
                let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX / 8);
                let average = nanos(average).min(u64::MAX / 8);
                let latest = nanos(latency).min(u64::MAX / 8);
                Duration::from_nanos((average * 4 + latest) / 5)
            }
            None => latency,
        });
        let (Some(autothrottle), Some(old), true) = (
            scope.config.get_autothrottle(),
            scope.contributions.autothrottle_delay,
            adjust_autothrottle,
        ) else {
            return;
        };
        let new = autothrottle.next_delay(old, latency, status, scope.config.delay);
        scope.contributions.autothrottle_delay = Some(new);
        tracing::debug!(
            target: "tower_throttle",
            scope = %scope.key,
            in_flight = scope.in_flight,
            latency_ms = latency.as_millis() as u64,
            status,
            old_delay_ms = old.as_millis() as u64,
            new_delay_ms = new.as_millis() as u64,
            "autothrottle adjusted the delay"
        );
    }

    fn release_lanes(&mut self, ticket: &TicketState, now: Instant, wake: &mut WakeList) {
        for slot in &ticket.slots {
            let scope = &mut self.scopes[slot.scope];
            if let Some(lane) = scope.lanes.get_mut(slot.lane) {
                lane.busy = false;
            }
            scope.in_flight -= 1;
            if !scope.queue.is_empty() {
                self.dirty.push(slot.scope);
            }
        }
        self.in_flight -= 1;
        if !self.global_queue.is_empty() {
            self.serve_global_queue(now, wake);
        }
        self.run_dispatch(now, wake);
    }

    fn leave_queues(&mut self, id: TicketId, ticket: &TicketState, now: Instant, wake: &mut WakeList) {
        for slot in &ticket.slots {
            let scope = &mut self.scopes[slot.scope];
            scope.queue.remove(&ticket.order);
            if matches!(scope.timer_owner, Some((owner, _)) if owner == id) {
                scope.timer_owner = None;
            }
            self.dirty.push(slot.scope);
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
            let effective = scope.effective(now, self.max_concurrency);
            match scope.check(now, &effective) {
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
        for slot in &ticket.slots {
            if Some(slot.scope) == known_ready {
                continue;
            }
            let scope = &self.scopes[slot.scope];
            let effective = scope.effective(now, self.max_concurrency);
            if !matches!(scope.check(now, &effective), ScopeCheck::Ready { .. }) {
                return Verdict::HeldBy(slot.scope);
            }
            for &ahead in scope.queue.range(..order).map(|(_, id)| id).take(MAX_SCAN + 1) {
                let ahead_ticket = &self.tickets[ahead];
                let passable = matches!(ahead_ticket.held_by, Some(other) if other != slot.scope)
                    && ahead_ticket.bypassed < MAX_BYPASS;
                if !passable || self.passed.len() > MAX_SCAN {
                    return Verdict::HeldBy(slot.scope);
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
        let max_concurrency = self.max_concurrency;
        let ticket = &mut self.tickets[id];
        for slot in ticket.slots.iter_mut() {
            let scope = &mut self.scopes[slot.scope];
            if let (Some(rampup), Some(config)) = (&mut scope.contributions.rampup, scope.config.get_rampup())
            {
                rampup.roll(now, config);
            }
            let (check, effective) = match chosen {
                Some((lane, effective)) if scope.contributions.backoff.is_none() => {
                    (ScopeCheck::Ready { lane }, effective)
                }
                _ => {
                    scope.note_backoff_recovery(now, max_concurrency);
                    let effective = scope.effective(now, max_concurrency);
                    (scope.check(now, &effective), effective)
                }
            };
            let lane = match check {
                ScopeCheck::Ready { lane } => lane,
                // Callers only send after every scope allowed it under the
                // same lock; should that ever break, a fresh lane keeps the
                // books consistent where a panic would poison the registry.
                _ => {
                    debug_assert!(false, "send called on a scope that does not allow it");
                    scope.lanes.len()
                }
            };
            let lane_send = LastSend {
                at: now,
                draw: self.rng.f64(),
            };
            let scope_send = LastSend {
                at: now,
                draw: self.rng.f64(),
            };
            let taken = Lane {
                busy: true,
                last_send: lane_send,
            };
            match scope.lanes.get_mut(lane) {
                Some(existing) => *existing = taken,
                None => scope.lanes.push(taken),
            }
            scope.last_send = Some(scope_send);
            scope.in_flight += 1;
            scope.sent += 1;
            slot.lane = lane;
            if scope.queue.remove(&ticket.order).is_some() {
                self.dirty.push(slot.scope);
            }
            tracing::debug!(
                target: "tower_throttle",
                scope = %scope.key,
                lane,
                waited_ms = now.duration_since(ticket.enqueued_at).as_millis() as u64,
                next_send_in_ms = scale(effective.delay, effective.jitter.factor(scope_send.draw)).as_millis() as u64,
                "request sent"
            );
        }
        if ticket.in_global_queue {
            ticket.in_global_queue = false;
            self.global_queue.remove(&ticket.order);
        }
        ticket.status = Status::InFlight;
        ticket.sent_at = Some(now);
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
            let scope = &mut self.scopes[id];
            let autothrottle = config.get_autothrottle().copied();
            let contributions = &mut scope.contributions;
            contributions.autothrottle_delay = match (autothrottle, contributions.autothrottle_delay) {
                (None, _) => None,
                (Some(_), Some(kept)) => Some(kept.max(config.delay)),
                (Some(autothrottle), None) => Some(autothrottle.start(config.delay)),
            };
            if let Some(robots) = &mut contributions.robots {
                *robots = RobotsDelay::for_config(robots.crawl_delay, &config, true);
            }
            match (config.get_rampup(), &contributions.rampup) {
                (None, _) => contributions.rampup = None,
                (Some(_), None) => contributions.rampup = Some(Box::new(RampupState::new(config.delay, now))),
                (Some(_), Some(_)) => {}
            }
            scope.config = config.clone();
            scope.explicit = true;
            self.dirty.push(id);
        }
        self.overrides.insert(key, config);
        self.run_dispatch(now, wake);
    }

    /// Applies feedback about one response (or error) to scope `key`.
    pub(crate) fn feedback(&mut self, key: &Scope, feedback: Feedback, now: Instant, wake: &mut WakeList) {
        let id = self.scope_id(key);
        let max_concurrency = self.max_concurrency;
        let scope = &mut self.scopes[id];
        if let Some(cost) = feedback.actual_cost() {
            scope.reported_cost += cost;
        }
        if feedback.kind() != FeedbackKind::Backoff {
            return;
        }
        scope.backoff_feedbacks += 1;
        self.dirty.push(id);
        if let (Some(rampup), Some(config)) = (&mut scope.contributions.rampup, scope.config.get_rampup()) {
            let before = rampup.delay;
            rampup.on_backoff(now, config);
            tracing::debug!(
                target: "tower_throttle",
                scope = %scope.key,
                old_delay_ms = before.as_secs_f64() * 1000.0,
                new_delay_ms = rampup.delay.as_secs_f64() * 1000.0,
                "rampup: backoff feedback"
            );
        } else {
            scope.note_backoff_recovery(now, max_concurrency);
            let base = scope.effective_before_backoff(max_concurrency);
            let config = scope.config.get_backoff();
            let current = scope
                .contributions
                .backoff
                .and_then(|state| state.at(now, config, base.concurrency));
            let stepped = BackoffState::step(current, now, config, base.delay, base.concurrency);
            tracing::debug!(
                target: "tower_throttle",
                scope = %scope.key,
                level = stepped.level,
                delay_ms = stepped.delay.as_millis() as u64,
                concurrency = stepped.concurrency,
                "backoff step up"
            );
            scope.contributions.backoff = Some(stepped);
        }
        self.run_dispatch(now, wake);
    }

    /// The config scope `key` uses, without creating the scope.
    pub(crate) fn config_arc(&self, key: &str) -> Arc<ScopeConfig> {
        match self.index.get(key) {
            Some(&id) => self.scopes[id].config.clone(),
            None => self.overrides.get(key).unwrap_or(&self.default_config).clone(),
        }
    }

    /// Records a robots.txt Crawl-delay for scope `key` (`None`: no delay
    /// known). It applies unless the scope has an explicit config, which
    /// keeps precedence with a warning (silenced by `ignore_robots_txt`).
    pub(crate) fn set_robots_delay(
        &mut self,
        key: &Scope,
        crawl_delay: Option<Duration>,
        now: Instant,
        wake: &mut WakeList,
    ) {
        let id = self.scope_id(key);
        let scope = &mut self.scopes[id];
        let previous = scope.contributions.robots;
        let (config, explicit) = (scope.config.clone(), scope.explicit);
        scope.contributions.robots =
            crawl_delay.map(|crawl_delay| RobotsDelay::for_config(crawl_delay, &config, explicit));
        let overridden = scope
            .contributions
            .robots
            .is_some_and(|robots| !robots.limits_concurrency || !robots.limits_delay);
        let known_before = previous.is_some_and(|robots| Some(robots.crawl_delay) == crawl_delay);
        if overridden && !scope.config.ignore_robots_txt && !known_before {
            tracing::warn!(
                target: "tower_throttle",
                scope = %scope.key,
                crawl_delay_ms = crawl_delay.unwrap_or_default().as_millis() as u64,
                concurrency = scope.config.concurrency,
                delay_ms = scope.config.delay.as_millis() as u64,
                "robots.txt asks for a Crawl-delay that the scope's explicit config overrides \
                 (set ignore_robots_txt on the scope to silence this)"
            );
        }
        self.dirty.push(id);
        self.run_dispatch(now, wake);
    }

    /// Holds a scope: nothing of it is sent before `until`, capped at the
    /// scope's backoff `max_delay` from now. A later hold extends an earlier
    /// one; an earlier one does not shorten it.
    pub(crate) fn hold(&mut self, key: &Scope, until: Instant, now: Instant, wake: &mut WakeList) {
        let id = self.scope_id(key);
        let scope = &mut self.scopes[id];
        let cap = saturating_add(now, scope.config.get_backoff().max_delay);
        let until = until.min(cap);
        if scope.contributions.hold_until.is_some_and(|known| known >= until) {
            return;
        }
        scope.contributions.hold_until = Some(until);
        tracing::debug!(
            target: "tower_throttle",
            scope = %scope.key,
            hold_ms = until.saturating_duration_since(now).as_millis() as u64,
            "scope held"
        );
        self.dirty.push(id);
        self.run_dispatch(now, wake);
    }

    /// Paces scope `key` at `delay` between sends until `until` (capped at
    /// the scope's backoff `max_delay`), or stops pacing it (`None`).
    pub(crate) fn set_pacing(
        &mut self,
        key: &Scope,
        pacing: Option<(Duration, Instant)>,
        now: Instant,
        wake: &mut WakeList,
    ) {
        let id = self.scope_id(key);
        let scope = &mut self.scopes[id];
        let cap = scope.config.get_backoff().max_delay;
        let longest = saturating_add(now, MAX_CONFIG_DELAY);
        scope.contributions.pacing = pacing.map(|(delay, until)| (delay.min(cap), until.min(longest)));
        self.dirty.push(id);
        self.run_dispatch(now, wake);
    }

    pub(crate) fn set_announced_limits(&mut self, key: &Scope, limits: AnnouncedLimits) {
        let id = self.scope_id(key);
        match &mut self.scopes[id].contributions.announced {
            Some(known) => **known = limits,
            empty => *empty = Some(Box::new(limits)),
        }
    }

    pub(crate) fn config_of(&self, key: &str) -> ScopeConfig {
        let config = self.overrides.get(key).unwrap_or(&self.default_config);
        ScopeConfig::clone(config)
    }

    pub(crate) fn scope_stats(&self, key: &str, now: Instant) -> Option<ScopeStats> {
        let &id = self.index.get(key)?;
        Some(self.stats_of(id, now))
    }

    fn stats_of(&self, id: ScopeId, now: Instant) -> ScopeStats {
        let scope = &self.scopes[id];
        let effective = scope.effective(now, self.max_concurrency);
        let contributions = &scope.contributions;
        ScopeStats {
            scope: scope.key.clone(),
            in_flight: scope.in_flight,
            queued: scope.queue.len(),
            concurrency: effective.concurrency,
            concurrency_limited_by: effective.concurrency_source,
            delay: effective.delay,
            delay_limited_by: effective.delay_source,
            delay_per_slot: effective.delay_per_slot,
            held_for: contributions
                .hold_until
                .map(|until| until.saturating_duration_since(now))
                .filter(|left| !left.is_zero()),
            sent: scope.sent,
            backoff_level: effective.backoff.map_or(0, |backoff| backoff.level),
            backoff_delay: effective.backoff.map(|backoff| backoff.delay),
            backoff_feedbacks: scope.backoff_feedbacks,
            autothrottle_delay: contributions.autothrottle_delay,
            robots_delay: contributions.robots.map(|robots| robots.crawl_delay),
            robots_delay_applies: contributions.robots.is_some_and(|robots| robots.applies()),
            rampup_delay: contributions.rampup.as_ref().map(|rampup| rampup.delay),
            rampup_windows: contributions.rampup.as_ref().map_or(0, |rampup| rampup.windows),
            latency: scope.latency,
            reported_cost: scope.reported_cost,
            pacing_delay: contributions
                .pacing
                .filter(|(_, until)| now < *until)
                .map(|(delay, _)| delay),
            announced: contributions.announced.as_deref().cloned(),
        }
    }

    pub(crate) fn stats(&self, now: Instant) -> Stats {
        let mut scopes: Vec<ScopeStats> = self.scopes.iter().map(|(id, _)| self.stats_of(id, now)).collect();
        scopes.sort_by(|a, b| a.scope.cmp(&b.scope));
        Stats {
            in_flight: self.in_flight,
            max_concurrency: self.max_concurrency,
            waiting: self
                .tickets
                .iter()
                .filter(|(_, t)| t.status == Status::Queued)
                .count(),
            scopes,
        }
    }
}
