//! When a scope could next send a given request: its limits now, played
//! forward over the waiters ahead of it, without taking anything.
//!
//! The scheduler admits by the same facts (see [`ScopeState::check`]); a
//! forecast replays them: the hold, the quota window, the scope's gap from
//! its last send (with the jitter drawn for it, and for the sends still to
//! come the shortest gap the jitter allows), each lane's own gap, and the
//! lanes. A busy lane frees when its request ends, which nothing here can
//! know: it is estimated from the scope's latency average (zero before a
//! response came), and a forecast that leans on such an estimate, or on a
//! gap that runs from an instant still to come, says it is not exact.

use std::time::Duration;

use smallvec::SmallVec;
use tokio::time::Instant;

use super::{Effective, Lane, LimitSource, ScopeState};
use crate::time::{saturating_add, scale, Stamp};
use crate::waited::{CauseKey, WaitCause};

/// What a scope's limits say about a request's admission.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ScopeForecast {
    /// The earliest instant the scope would admit it.
    pub(crate) at: Instant,
    /// What accounts for most of the wait until then (`None`: no wait).
    pub(crate) cause: Option<CauseKey>,
    /// Whether `at` is the instant the scheduler would pick if nothing
    /// changes (no estimate of a busy lane's end, no gap from an instant
    /// still to come, no limit that may relax on its own before then).
    pub(crate) exact: bool,
}

impl ScopeForecast {
    /// The instant, the cause and whether it is exact.
    pub(crate) fn view(self) -> (Instant, Option<CauseKey>, bool) {
        (self.at, self.cause, self.exact)
    }
}

/// A lane as a forecast plays it: when it frees, and whether that is an
/// estimate.
#[derive(Debug, Clone, Copy)]
struct Slot {
    free_at: Instant,
    estimated: bool,
}

impl ScopeState {
    /// When the scope could admit a request costing `cost` with `ahead`
    /// requests before it in its queue (each of which takes a send first),
    /// from its limits `effective` at `now`. `on_word`: the requests in
    /// flight on the scope's open lock-free word, which the scope does not
    /// count (when they left is not known: each is estimated to end half a
    /// latency average from now), with the word's latency average.
    pub(crate) fn forecast(
        &self,
        now: Instant,
        effective: &Effective,
        (cost, ahead): (f64, usize),
        on_word: (u32, Option<Duration>),
    ) -> ScopeForecast {
        let latency = on_word.1.or(self.latency()).unwrap_or(Duration::ZERO);
        let mut exact = true;
        let mut slots = self.slots(now, effective, (latency, on_word.0), ahead + 1);
        if slots.is_empty() {
            // No lane at all (never: a concurrency is at least 1).
            slots.push(Slot {
                free_at: now,
                estimated: true,
            });
        }
        let delay_cause = match effective.delay_source {
            LimitSource::RateLimitPolicy => WaitCause::Pacing,
            _ => WaitCause::Delay,
        };
        let has_gap = !effective.delay.is_zero() || !effective.delay_floor.is_zero();
        if has_gap && (self.undeparted > 0 || (!self.warm && self.in_flight > 0)) {
            // The next gap runs from a departure (or a first answer) still
            // to come: what is known is a lower bound.
            exact = false;
        }
        let mut gap_ends = self
            .last_send
            .and_then(|last| {
                last.next_allowed_at_least(effective.delay, &effective.jitter, effective.delay_floor)
            })
            .map(Stamp::instant);
        if !self.warm && self.in_flight > 0 && has_gap {
            gap_ends = gap_ends.map(|at| saturating_add(at, latency));
        }
        if ahead > 0 && self.config.get_quota().is_some() {
            // The waiters ahead spend from the window too.
            exact = false;
        }
        let hold = self.contributions().hold_until;
        let manager_hold = effective.manager_hold.map(Stamp::instant);
        // The shortest gap the jitter allows after a send not made yet.
        let shortest_gap = scale(effective.delay, effective.jitter.factor(0.0)).max(effective.delay_floor);
        let shortest_lane_gap = scale(effective.delay_per_slot, effective.jitter.factor(0.0));
        let mut parts: SmallVec<[(CauseKey, Duration); 3]> = SmallVec::new();
        let mut previous = now;
        let mut at = now;
        for step in 0..=ahead {
            let (index, slot) = slots
                .iter()
                .copied()
                .enumerate()
                .min_by_key(|(_, slot)| slot.free_at)
                .expect("at least one slot");
            exact &= !slot.estimated;
            let lane_cause = match slot.estimated {
                true => (WaitCause::Lanes, Some(effective.concurrency_source)),
                false => (WaitCause::Delay, Some(LimitSource::Config)),
            };
            let quota = match step {
                0 => self.quota_frees_at(cost, now),
                _ => None,
            };
            let ends = [
                (quota, (WaitCause::Quota, Some(LimitSource::Quota))),
                (hold, (WaitCause::Hold, Some(LimitSource::Hold))),
                (manager_hold, (WaitCause::Hold, Some(LimitSource::Manager))),
                (gap_ends, (delay_cause, Some(effective.delay_source))),
                (Some(slot.free_at), lane_cause),
            ];
            let mut binding: Option<(Instant, CauseKey)> = None;
            for (end, key) in ends {
                if let Some(end) = end.filter(|&end| end > binding.map_or(now, |(at, _)| at)) {
                    binding = Some((end, key));
                }
            }
            at = binding.map_or(now, |(end, _)| end).max(previous);
            if let Some((_, key)) = binding {
                add_part(&mut parts, key, at.saturating_duration_since(previous));
            }
            previous = at;
            slots[index] = Slot {
                free_at: saturating_add(at, latency.max(shortest_lane_gap)),
                estimated: true,
            };
            gap_ends = has_gap.then(|| saturating_add(at, shortest_gap));
        }
        if at > now && self.relaxes_before(effective, now, at) {
            exact = false;
        }
        let cause = parts
            .iter()
            .fold(None::<(CauseKey, Duration)>, |best, &(key, time)| match best {
                Some((_, longest)) if longest >= time => best,
                _ => Some((key, time)),
            })
            .filter(|(_, time)| !time.is_zero())
            .map(|(key, _)| key);
        ScopeForecast { at, cause, exact }
    }

    /// The `wanted` lanes that free soonest: the lanes of the requests in
    /// flight (each estimated to free `latency` after its send, and no
    /// sooner than its lane's own gap), the free lanes after their own
    /// gaps, and the lanes not made yet, free now.
    fn slots(
        &self,
        now: Instant,
        effective: &Effective,
        (latency, on_word): (Duration, u32),
        wanted: usize,
    ) -> SmallVec<[Slot; 4]> {
        let concurrency = effective.concurrency as usize;
        let in_flight = (self.in_flight + on_word) as usize;
        let busy_end = |lane: &Lane| {
            let sent = lane.last_send.at.instant();
            let lane_gap = lane
                .last_send
                .next_allowed(effective.delay_per_slot, &effective.jitter)
                .map_or(sent, Stamp::instant);
            saturating_add(sent, latency).max(lane_gap).max(now)
        };
        let free_at = |lane: &Lane| {
            lane.last_send
                .next_allowed(effective.delay_per_slot, &effective.jitter)
                .map_or(now, Stamp::instant)
                .max(now)
        };
        if wanted == 1 && in_flight < concurrency {
            // One send to play with a lane free: the soonest lane is all
            // it needs (a request failed as it comes asks no more).
            let on_no_lane = in_flight > self.lanes.iter().filter(|lane| lane.busy).count();
            let unmade = self.lanes.len() < concurrency;
            let soonest = self
                .lanes
                .iter()
                .map(|lane| match lane.busy {
                    true => Slot {
                        free_at: busy_end(lane),
                        estimated: true,
                    },
                    false => Slot {
                        free_at: free_at(lane),
                        estimated: false,
                    },
                })
                .chain(on_no_lane.then(|| Slot {
                    free_at: saturating_add(now, latency / 2),
                    estimated: true,
                }))
                .chain(unmade.then_some(Slot {
                    free_at: now,
                    estimated: false,
                }))
                .min_by_key(|slot| slot.free_at);
            return soonest.into_iter().collect();
        }
        let mut busy: SmallVec<[Instant; 4]> =
            self.lanes.iter().filter(|lane| lane.busy).map(busy_end).collect();
        // Requests in flight on no lane (taken over from a lock-free word)
        // or on the open word: when each left is not known, so each is
        // estimated halfway through a latency average from now.
        let on_no_lane = (self.in_flight as usize).saturating_sub(busy.len()) + on_word as usize;
        busy.extend((0..on_no_lane).map(|_| saturating_add(now, latency / 2)));
        busy.sort_unstable();
        let mut slots: SmallVec<[Slot; 4]> = SmallVec::new();
        if in_flight >= concurrency {
            // A lane frees only once enough of them ended.
            let skip = in_flight + 1 - concurrency.max(1);
            slots.extend(busy.iter().skip(skip - 1).map(|&free_at| Slot {
                free_at,
                estimated: true,
            }));
        } else {
            slots.extend(busy.iter().map(|&free_at| Slot {
                free_at,
                estimated: true,
            }));
            let mut free: SmallVec<[Instant; 4]> =
                self.lanes.iter().filter(|lane| !lane.busy).map(free_at).collect();
            let unmade = concurrency.saturating_sub(self.lanes.len()).min(wanted);
            free.extend((0..unmade).map(|_| now));
            free.sort_unstable();
            free.truncate(concurrency - in_flight);
            slots.extend(free.into_iter().map(|free_at| Slot {
                free_at,
                estimated: false,
            }));
        }
        slots.sort_unstable_by_key(|slot| slot.free_at);
        slots.truncate(wanted.max(1));
        slots
    }

    /// Whether a limit may relax on its own after `now` and before `at`: a
    /// backoff step back, the end of a pacing, a custom manager's review.
    fn relaxes_before(&self, effective: &Effective, now: Instant, at: Instant) -> bool {
        let step_back = effective.backoff.map(|backoff| backoff.next_step_back);
        let pacing_end = self.contributions().pacing.map(|(_, until)| until);
        let review = effective.review_at.map(Stamp::instant);
        [step_back, pacing_end, review]
            .into_iter()
            .flatten()
            .any(|relief| relief > now && relief < at)
    }
}

/// Adds `time` on `key` to a forecast's parts.
fn add_part(parts: &mut SmallVec<[(CauseKey, Duration); 3]>, key: CauseKey, time: Duration) {
    match parts.iter_mut().find(|(known, _)| *known == key) {
        Some((_, sum)) => *sum += time,
        None => parts.push((key, time)),
    }
}
