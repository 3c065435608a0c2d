//! One scope at a given instant: its config, what the feedback layers
//! contribute to its limits, its lanes and last sends, and what all of that
//! says about its next send.
//!
//! Nothing here reads the clock or knows about waiters: the scheduler owns
//! the queues and passes `now` in. The feedback handlers' per-scope work is
//! here too; the scheduler's side of them is finding the scope and letting
//! its waiters re-evaluate.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;
use tokio::time::Instant;

use super::backoff::BackoffNow;
use super::config::ScopeConfig;
use super::fast_path::Adopted;
use super::limit_source::LimitSource;
use super::ticket::SendsBefore;
use crate::scope::Scope;
use crate::store::backend::AutoThrottleSample;
use crate::time::{scale, Jitter, Stamp};
use crate::waited::{CauseKey, WaitCause};
use contributions::NO_CONTRIBUTIONS;
pub(crate) use contributions::{Contributions, QuotaWindow, RobotsContribution};
pub(crate) use manager::Manager;

/// The draw a plain scope's send records instead of a random one: no gap
/// follows a send while its scope is plain (no delay to jitter), so it
/// spares the request path two draws. Should the scope stop being plain
/// (a backoff step, a config change), the one gap that runs from such a
/// send gets the middle of the jitter range, its mean, and every later
/// send a draw of its own.
const MIDDLE_DRAW: f64 = 0.5;

/// `now` as a [`Stamp`], converted at most once, and only if a gap needs
/// comparing: scopes without delays never pay for the conversion.
struct NowStamp {
    instant: Instant,
    stamp: Option<Stamp>,
}

impl NowStamp {
    fn new(instant: Instant) -> Self {
        NowStamp { instant, stamp: None }
    }

    fn get(&mut self) -> Stamp {
        let instant = self.instant;
        *self.stamp.get_or_insert_with(|| Stamp::of(instant))
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Lane {
    busy: bool,
    last_send: LastSend,
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
    /// A custom manager's hold: nothing is sent before then. (Stamps, not
    /// instants: 8 bytes each keep `Effective`, which is moved around on
    /// every request, from growing past what is copied inline.)
    pub(crate) manager_hold: Option<Stamp>,
    /// When a custom manager's answer changes by itself.
    pub(crate) review_at: Option<Stamp>,
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

/// One scope's runtime state, without its waiters (the scheduler keeps
/// those).
#[derive(Debug)]
pub(crate) struct ScopeState {
    pub(crate) key: Scope,
    pub(crate) config: Arc<ScopeConfig>,
    /// Whether the scope has a config of its own (not the default one).
    pub(crate) explicit: bool,
    /// What the feedback layers contribute, allocated on the first one:
    /// most scopes of a broad crawl never get any.
    contributed: Option<Box<Contributions>>,
    /// One lane inline: most scopes never have two requests in flight.
    pub(crate) lanes: SmallVec<[Lane; 1]>,
    pub(crate) last_send: Option<LastSend>,
    pub(crate) in_flight: u32,
    /// Requests admitted whose departure (the hand-over to the inner
    /// service) is not recorded yet: the scope's next gap cannot start
    /// before they leave.
    pub(crate) undeparted: u32,
    /// Whether a request of the scope has ended (answered or failed). Until
    /// then the scope is cold: its first connection is still being set up.
    pub(crate) warm: bool,
    /// Requests in flight that also belong to a cold scope (a name's first
    /// request, in its server's scope): each opens a connection of its own
    /// after it leaves, so this scope's next gap runs from its answer, as a
    /// cold scope's does (see [`first_answer_pending`](Self::first_answer_pending)).
    /// One byte, in padding: in a scope with a gap there is at most one
    /// (its next send waits for that answer); a scope without one, where
    /// nothing waits on the count, stops counting at 255.
    opening: u8,
    /// Whether the config makes lanes the only limit
    /// ([`ScopeConfig::is_plain`], kept with the config).
    plain: bool,
    /// For the scheduler's eviction (kept here, in padding, so a scope's
    /// entry stays within its memory budget): whether the scope is among
    /// the eviction candidates.
    pub(crate) evictable: bool,
    /// Whether it was used since it joined the candidates (it then gets a
    /// second chance under pressure).
    pub(crate) referenced: bool,
    pub(crate) sent: u64,
    /// The latency average in nanoseconds + 1 (0 would be a latency
    /// too), once a response came; 8 bytes where `Option<Duration>` takes 16.
    latency: Option<NonZeroU64>,
    /// How far the latency samples fall from the average, on average, in
    /// thousandths of it (a moving average as the latency's, of the
    /// samples that end while other requests of the scope are in flight;
    /// two bytes of padding hold it): how spread out busy lanes' ends are,
    /// for forecasts.
    latency_spread: u16,
}

/// The request a scope is sending, as [`ScopeState::take_lane`] needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sending {
    /// When it was queued (for the debug event).
    pub(crate) enqueued_at: Instant,
    /// Its expected quota cost in this scope.
    pub(crate) cost: f64,
}

/// The lane [`ScopeState::take_lane`] gave a request, and what its
/// departure means to the scope.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TakenLane {
    pub(crate) lane: usize,
    /// Whether another request of the scope may be admitted before this one
    /// ends, and would have to time its gap from this one's departure: the
    /// scope has a delay and more than one lane. Otherwise nothing is
    /// admitted before this request ends (its only lane is busy, or no gap
    /// depends on it), so its departure can wait for the end.
    pub(crate) others_may_follow: bool,
    /// What to put back if the request never leaves.
    pub(crate) before: SendsBefore,
}

/// What a scope's own limits say about its next send.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ScopeCheck {
    /// A send may happen now, on this lane (an index equal to the number of
    /// lanes means a new lane).
    Ready { lane: usize },
    /// Time holds it until then.
    Until(Instant),
    /// Every usable lane is in flight: a completion must come first.
    Full,
    /// The next gap runs from an instant still to come: the departure of an
    /// admitted request, or the answer to a request that opened a
    /// connection (see [`ScopeState::first_answer_pending`]).
    AwaitingEarlier,
}

impl ScopeState {
    pub(crate) fn new(key: Scope, config: Arc<ScopeConfig>, explicit: bool, now: Instant) -> Self {
        let mut contributed = None;
        if let Some(autothrottle) = config.get_autothrottle() {
            let contributions: &mut Contributions = contributed.get_or_insert_with(Box::default);
            contributions.autothrottle_delay = Some(autothrottle.start(config.delay));
        }
        if let Some(manager) = Manager::initial(&config, now) {
            let contributions: &mut Contributions = contributed.get_or_insert_with(Box::default);
            contributions.manager = Some(manager);
        }
        let plain = config.is_plain();
        ScopeState {
            key,
            config,
            explicit,
            contributed,
            lanes: SmallVec::new(),
            last_send: None,
            in_flight: 0,
            undeparted: 0,
            warm: false,
            opening: 0,
            plain,
            evictable: false,
            referenced: false,
            sent: 0,
            latency: None,
            latency_spread: 0,
        }
    }

    /// The latency average (send to response head), once a response came.
    pub(crate) fn latency(&self) -> Option<Duration> {
        self.latency.map(|biased| Duration::from_nanos(biased.get() - 1))
    }

    /// How far a latency sample falls from the average, on average, as a
    /// fraction of the average.
    pub(crate) fn latency_spread(&self) -> f64 {
        f64::from(self.latency_spread) / 1000.0
    }

    /// The latency average as kept (nanoseconds + 1; 0: none), for the
    /// scope's lock-free word.
    pub(crate) fn latency_value(&self) -> u64 {
        self.latency.map_or(0, NonZeroU64::get)
    }

    /// Whether lanes are the scope's only limit now: a plain config and
    /// nothing contributed (what [`take_plain_lane`](Self::take_plain_lane)
    /// and the lock-free word need).
    pub(crate) fn is_plain_now(&self) -> bool {
        self.plain && self.contributed.is_none()
    }

    /// Takes in the requests of the scope's closed word (see
    /// [`fast_path`](super::fast_path)): each counts in flight and
    /// undeparted, on no lane, until it ends under the lock; the word's
    /// sends, latency average and last departure become the scope's.
    pub(crate) fn adopt(&mut self, adopted: Adopted, rng: &mut fastrand::Rng) {
        self.in_flight += adopted.in_flight;
        self.undeparted += adopted.in_flight;
        self.sent += adopted.sent;
        self.latency = NonZeroU64::new(adopted.latency);
        self.warm |= adopted.warm;
        // The adopted requests' gaps run from their departures, which move
        // this stamp when they end.
        let newest = adopted
            .last_departure
            .or((adopted.in_flight > 0).then_some(Stamp::EARLIEST));
        if let Some(at) = newest {
            match &mut self.last_send {
                Some(last) => last.departed_at(at),
                None => self.last_send = Some(LastSend { at, draw: rng.f64() }),
            }
        }
    }

    /// What the feedback layers contribute to the scope's limits.
    pub(crate) fn contributions(&self) -> &Contributions {
        self.contributed.as_deref().unwrap_or(&NO_CONTRIBUTIONS)
    }

    /// The contributions, to change them (allocated on first use).
    pub(crate) fn contributions_mut(&mut self) -> &mut Contributions {
        self.contributed.get_or_insert_with(Box::default)
    }

    /// What the scope's limits say about sending, now, a request that costs
    /// `cost` in it.
    pub(crate) fn check(&self, now: Instant, effective: &Effective, cost: f64) -> ScopeCheck {
        if self.in_flight >= effective.concurrency {
            return ScopeCheck::Full;
        }
        let mut now_stamp = NowStamp::new(now);
        let Some((lane, lane_free)) = self.soonest_free_lane(&mut now_stamp, effective) else {
            return ScopeCheck::Full;
        };
        let next_send = self.last_send.and_then(|last| {
            last.next_allowed_at_least(effective.delay, &effective.jitter, effective.delay_floor)
        });
        // The gaps are in stamps, the feedback's instants are not: compare
        // each kind with `now` in its own terms, and convert only a wait.
        let gaps_end = lane_free.max(next_send).filter(|&at| at > now_stamp.get());
        let quota_frees = self.quota_frees_at(cost, now);
        let other_limits_end = quota_frees
            .max(self.contributions().hold_until)
            .max(effective.manager_hold.map(Stamp::instant))
            .filter(|&at| at > now);
        match gaps_end.map(Stamp::instant).max(other_limits_end) {
            Some(at) => {
                // A backoff step back or the end of a pacing may shorten the
                // delay before then: look again at that instant.
                let step_back = effective.backoff.map(|backoff| backoff.next_step_back);
                let pacing_end = self.contributions().pacing.map(|(_, until)| until);
                let review = effective.review_at.map(Stamp::instant);
                let relief = [step_back, pacing_end, review]
                    .into_iter()
                    .flatten()
                    .filter(|&relief| relief > now)
                    .min();
                // While an earlier request has not left (or a cold scope's
                // first has not ended), the instant is a lower bound, from
                // its admission: the waiter looks again then. Keeping a
                // timer meanwhile means the departure, which can only move
                // the instant later, has nobody to wake.
                ScopeCheck::Until(relief.map_or(at, |relief| relief.min(at)))
            }
            None if self.waits_for_an_earlier_request(effective) => ScopeCheck::AwaitingEarlier,
            None => ScopeCheck::Ready { lane },
        }
    }

    /// What holds a waiter costing `cost` when [`check`](Self::check) says
    /// `Until`: the limit whose end comes last (the first of the list below
    /// on a tie), with the source that set it. Only for the waiting path:
    /// `check` itself stays as lean as the common admission needs.
    pub(crate) fn wait_cause(&self, now: Instant, effective: &Effective, cost: f64) -> CauseKey {
        let lane_free = self
            .soonest_free_lane(&mut NowStamp::new(now), effective)
            .and_then(|(_, free)| free)
            .map(Stamp::instant);
        let next_send = self
            .last_send
            .and_then(|last| {
                last.next_allowed_at_least(effective.delay, &effective.jitter, effective.delay_floor)
            })
            .map(Stamp::instant);
        let delay_cause = match effective.delay_source {
            LimitSource::RateLimitPolicy => WaitCause::Pacing,
            _ => WaitCause::Delay,
        };
        let ends = [
            (
                self.quota_frees_at(cost, now),
                (WaitCause::Quota, Some(LimitSource::Quota)),
            ),
            (
                self.contributions().hold_until,
                (WaitCause::Hold, Some(LimitSource::Hold)),
            ),
            (
                effective.manager_hold.map(Stamp::instant),
                (WaitCause::Hold, Some(LimitSource::Manager)),
            ),
            (next_send, (delay_cause, Some(effective.delay_source))),
            (lane_free, (WaitCause::Delay, Some(LimitSource::Config))),
        ];
        let mut binding = (now, (WaitCause::Delay, Some(effective.delay_source)));
        for (end, key) in ends {
            if let Some(end) = end.filter(|&end| end > binding.0) {
                binding = (end, key);
            }
        }
        binding.1
    }

    /// The free lane whose per-slot delay ends soonest. Lanes are created
    /// lazily, so a scope that never had more than one request in flight
    /// keeps one lane whatever its concurrency.
    /// The lane's free instant is `None` when it is free now.
    fn soonest_free_lane(&self, now: &mut NowStamp, effective: &Effective) -> Option<(usize, Option<Stamp>)> {
        let mut best: Option<(usize, Option<Stamp>)> = None;
        for (index, lane) in self.lanes.iter().enumerate().filter(|(_, lane)| !lane.busy) {
            let free = lane
                .last_send
                .next_allowed(effective.delay_per_slot, &effective.jitter);
            // A lane free now ends the search: which of several lanes free
            // now is taken changes no instant (each is free from then on),
            // and a lane with no gap at all is the soonest there is. A
            // backlog on many lanes then finds its lane in a few steps, not
            // a pass over every lane at every admission.
            if free.is_none_or(|free| free <= now.get()) {
                return Some((index, free));
            }
            if best.is_none_or(|(_, soonest)| free < soonest) {
                best = Some((index, free));
            }
        }
        if self.lanes.len() < effective.concurrency as usize {
            return Some((self.lanes.len(), None));
        }
        best
    }
    /// Takes a lane for `sending` at `now`: the one `chosen` by the caller
    /// under this same lock (when no backoff may have changed since), or the
    /// one the scope's limits give now. Starts the lane's and the scope's
    /// delays with fresh jitter draws (from `now`, moved to the departure
    /// once it is known) and counts the request in flight and undeparted.
    // Inline: this and `observe_latency` were part of the scheduler's send
    // and finish paths before they moved here, and are on every request.
    #[inline]
    pub(crate) fn take_lane(
        &mut self,
        now: Instant,
        chosen: Option<(usize, Effective)>,
        max_concurrency: u32,
        rng: &mut fastrand::Rng,
        sending: Sending,
    ) -> TakenLane {
        let Sending { enqueued_at, cost } = sending;
        if let Some(manager) = self
            .contributed
            .as_deref_mut()
            .and_then(|contributed| contributed.manager.as_mut())
        {
            manager.on_send(now, &self.config);
        }
        let (check, effective) = match chosen {
            Some((lane, effective)) if self.contributions().backoff().is_none() => {
                (ScopeCheck::Ready { lane }, effective)
            }
            _ => {
                self.note_backoff_recovery(now, max_concurrency);
                let effective = self.effective(now, max_concurrency);
                (self.check(now, &effective, cost), effective)
            }
        };
        let lane = match check {
            ScopeCheck::Ready { lane } => lane,
            // Callers only send after every scope allowed it under the
            // same lock; should that ever break, a fresh lane keeps the
            // books consistent where a panic would poison the registry.
            _ => {
                debug_assert!(false, "send called on a scope that does not allow it");
                self.lanes.len()
            }
        };
        let scope_before = self.last_send.map(|last| last.at);
        let lane_before = self
            .lanes
            .get(lane)
            .map_or(Stamp::EARLIEST, |lane| lane.last_send.at);
        let scope_send = self.record_send(lane, Stamp::of(now), (rng.f64(), rng.f64()));
        self.spend_quota(cost, now);
        tracing::debug!(
            target: "tower_throttle",
            scope = %self.key,
            lane,
            waited_ms = now.duration_since(enqueued_at).as_millis() as u64,
            next_send_in_ms = scale(effective.delay, effective.jitter.factor(scope_send.draw)).as_millis() as u64,
            "request sent"
        );
        let has_gap = !effective.delay.is_zero() || !effective.delay_floor.is_zero();
        TakenLane {
            lane,
            others_may_follow: has_gap && effective.concurrency > 1,
            before: SendsBefore {
                scope: scope_before,
                lane: lane_before,
            },
        }
    }

    /// The admission of a *plain* scope, without computing its limits or
    /// reading its clock: one
    /// with no contribution at all (no backoff, hold, robots.txt, pacing,
    /// quota window, AutoThrottle, rampup or manager state) and a config
    /// with no gap and no quota, so that the only limit is its lanes. Takes
    /// a lane as [`take_lane`](Self::take_lane) would, and returns it; `None`
    /// when the scope is not plain or has no lane free, for the general
    /// path to decide. (For a plain scope the general path's answer is the
    /// same: the first free lane, or a new one below the concurrency.)
    #[inline]
    pub(crate) fn take_plain_lane(
        &mut self,
        now: Instant,
        max_concurrency: u32,
        (enqueued_at, global_permit): (Instant, impl FnOnce() -> bool),
    ) -> Option<usize> {
        if self.contributed.is_some() || !self.plain {
            return None;
        }
        if self.in_flight >= self.config.concurrency.min(max_concurrency) {
            return None;
        }
        let lane = match self.lanes.iter().position(|lane| !lane.busy) {
            Some(lane) => lane,
            None if self.lanes.len() < self.config.concurrency.min(max_concurrency) as usize => {
                self.lanes.len()
            }
            None => return None,
        };
        // Taken last, once the lane is sure: nothing to give back.
        if !global_permit() {
            return None;
        }
        // No gap runs from an admission here, so the send is stamped only
        // by its departure (which only ever moves a stamp later): until
        // then it keeps the scope's previous one, and a request that never
        // leaves changes no gap. That spares the request path a clock
        // conversion.
        let previous = self.last_send.map_or(Stamp::EARLIEST, |last| last.at);
        self.record_send(lane, previous, (MIDDLE_DRAW, MIDDLE_DRAW));
        tracing::debug!(
            target: "tower_throttle",
            scope = %self.key,
            lane,
            waited_ms = now.duration_since(enqueued_at).as_millis() as u64,
            next_send_in_ms = 0u64,
            "request sent"
        );
        Some(lane)
    }

    /// Marks `lane` busy with a send stamped `at` (a new lane when `lane` is
    /// the number of lanes), starts the lane's and the scope's gaps with
    /// fresh jitter draws, and counts the request in flight and undeparted.
    #[inline]
    fn record_send(&mut self, lane: usize, at: Stamp, (lane_draw, scope_draw): (f64, f64)) -> LastSend {
        let lane_send = LastSend { at, draw: lane_draw };
        let scope_send = LastSend { at, draw: scope_draw };
        let taken = Lane {
            busy: true,
            last_send: lane_send,
        };
        match self.lanes.get_mut(lane) {
            Some(existing) => *existing = taken,
            None => {
                // Lanes grow one at a time up to the concurrency, so exact
                // growth costs a few reallocations over a scope's life and
                // spares every scope lanes it never uses.
                self.lanes.reserve_exact(1);
                self.lanes.push(taken);
            }
        }
        self.last_send = Some(scope_send);
        self.in_flight += 1;
        self.undeparted += 1;
        self.sent += 1;
        scope_send
    }

    /// Records the departure at `at` of a request admitted earlier on
    /// `lane`: the lane's and the scope's next gaps run from the later of
    /// admission and departure.
    pub(crate) fn depart(&mut self, lane: usize, at: Stamp) {
        if let Some(lane) = self.lanes.get_mut(lane) {
            lane.last_send.departed_at(at);
        }
        if let Some(last_send) = &mut self.last_send {
            last_send.departed_at(at);
        }
        self.undeparted -= 1;
    }

    /// Frees `lane` (taken by [`take_lane`](Self::take_lane)) when its
    /// request is over, `departed` or not. The first request to end that
    /// left warms the scope: the next gap runs from `answered_at` (its response head,
    /// or its end when it had none).
    #[inline]
    pub(crate) fn release_lane(&mut self, lane: usize, departed: bool, answered_at: Stamp) {
        if let Some(lane) = self.lanes.get_mut(lane) {
            lane.busy = false;
        }
        self.in_flight -= 1;
        if !departed {
            // It never left: the scope stays cold until a request ends
            // that did.
            self.undeparted -= 1;
        } else if !self.warm {
            self.warm = true;
            if let Some(last_send) = &mut self.last_send {
                // The cold start's next gap runs from the first answer
                // (its head, when its body streamed on), as it did when
                // lanes were freed at the head.
                last_send.departed_at(answered_at);
            }
        }
    }

    /// The AutoThrottle sample of a response (`None` without AutoThrottle),
    /// for the fleet's delay.
    pub(crate) fn autothrottle_sample(&self, latency: Duration, status: u16) -> Option<AutoThrottleSample> {
        let autothrottle = self.config.get_autothrottle()?;
        Some(autothrottle.sample(latency, status, self.config.delay))
    }

    /// Takes the fleet's AutoThrottle `delay` (when the scope runs
    /// AutoThrottle); whether it changed.
    pub(crate) fn adopt_autothrottle(&mut self, delay: Duration) -> bool {
        if self.config.get_autothrottle().is_none() || self.contributions().autothrottle_delay == Some(delay)
        {
            return false;
        }
        self.contributions_mut().autothrottle_delay = Some(delay.max(self.config.delay));
        true
    }

    /// Moves the latency spread towards how far `latest` fell from the
    /// average `before` it.
    #[cold]
    fn learn_spread(&mut self, latest: u64, before: u64) {
        let off = latest.abs_diff(before).saturating_mul(1000) / before.max(1);
        let off = u16::try_from(off).unwrap_or(u16::MAX);
        self.latency_spread = ((u32::from(self.latency_spread) * 4 + u32::from(off)) / 5) as u16;
    }

    /// Scrapy's AutoThrottle step, and the latency average shown in stats.
    #[inline]
    pub(crate) fn observe_latency(&mut self, latency: Duration, status: u16, adjust_autothrottle: bool) {
        // A moving average with weight 1/5 for the newest sample, in whole
        // nanoseconds (no float conversion on the completion path).
        let latest = u64::try_from(latency.as_nanos())
            .unwrap_or(u64::MAX)
            .min(u64::MAX / 8);
        let average = match self.latency {
            Some(biased) => {
                let before = (biased.get() - 1).min(u64::MAX / 8);
                // Learnt while other requests of the scope are in flight:
                // when lanes may bind, which is when forecasts use it (and
                // a scope sent to one request at a time pays nothing).
                if self.in_flight > 1 {
                    self.learn_spread(latest, before);
                }
                (before * 4 + latest) / 5
            }
            None => latest,
        };
        self.latency = NonZeroU64::new(average + 1);
        let (Some(autothrottle), Some(old), true) = (
            self.config.get_autothrottle(),
            self.contributions().autothrottle_delay,
            adjust_autothrottle,
        ) else {
            return;
        };
        let new = autothrottle.next_delay(old, latency, status, self.config.delay);
        self.contributions_mut().autothrottle_delay = Some(new);
        tracing::debug!(
            target: "tower_throttle",
            scope = %self.key,
            in_flight = self.in_flight,
            latency_ms = latency.as_millis() as u64,
            status,
            old_delay_ms = old.as_millis() as u64,
            new_delay_ms = new.as_millis() as u64,
            "autothrottle adjusted the delay"
        );
    }
}

mod contributions;
mod forecast;
mod gap_start;
mod last_send;
mod limits;
mod manager;
mod quota;
mod updates;

pub(crate) use forecast::{OnWord, ScopeForecast};
pub(crate) use last_send::LastSend;
