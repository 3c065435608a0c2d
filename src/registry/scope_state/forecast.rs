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
//!
//! A request admitted on the scope's lock-free word has no lane and no
//! departure the scheduler knows (the word reads no clock as it admits):
//! only that it left after the word last opened. Each such request, on
//! the open word or adopted from it, is estimated to end a latency average
//! after that, or, when the word opened longer ago than half an average,
//! half an average from now (what is left of a request of unknown age, on
//! average). A burst that opened the word is then timed from its start, as
//! a scheduler's lanes would be (`tests/predict_loopback.rs`).
//!
//! Busy lanes do not all free at their average: of several requests in
//! flight, the first to end is likely one of the quick ones. The busy ends
//! are spread, in their order, as the expected order of that many
//! latencies spread as the scope's samples were (their mean absolute
//! deviation from the average; the offsets of a uniform spread): with
//! responses of 50 ms ± 50 %, four lanes busy since the same instant free
//! at about 35, 45, 55 and 65 ms rather than all at 50.

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

/// What a forecast knows of the requests the scope's lock-free word
/// admitted: how many are in flight on the open word (the scope does not
/// count them), the word's latency average, and the instant the word last
/// opened (none of them, nor of those the scope adopted from it, left
/// before).
#[derive(Debug, Clone, Copy)]
pub(crate) struct OnWord {
    pub(crate) in_flight: u32,
    pub(crate) latency: Option<Duration>,
    pub(crate) opened_at: Option<Instant>,
}

impl OnWord {
    /// A scope whose word never opened.
    pub(crate) const NONE: OnWord = OnWord {
        in_flight: 0,
        latency: None,
        opened_at: None,
    };
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
    /// from its limits `effective` at `now`. `on_word`: what the scope's
    /// lock-free word admitted (see the module docs for their ends).
    pub(crate) fn forecast(
        &self,
        now: Instant,
        effective: &Effective,
        (cost, ahead): (f64, usize),
        on_word: OnWord,
    ) -> ScopeForecast {
        let latency = on_word.latency.or(self.latency()).unwrap_or(Duration::ZERO);
        let mut exact = true;
        let mut slots = self.slots(now, effective, (latency, on_word), ahead + 1);
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
        if has_gap && (self.undeparted > 0 || self.first_answer_pending()) {
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
        // What the first gap waits for: the answer still pending, when
        // it runs from one (as a waiter's `Waited` then says), else the
        // delay.
        let mut gap_key = (delay_cause, Some(effective.delay_source));
        if self.first_answer_pending() && has_gap {
            gap_ends = gap_ends.map(|at| self.after_the_first_answer(at, latency, now));
            gap_key = (WaitCause::Departure, None);
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
                (gap_ends, gap_key),
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
            gap_key = (delay_cause, Some(effective.delay_source));
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

    /// When the gap that ends at `gap_ends` (counted from the last send)
    /// ends once it runs from the answer still pending instead: a
    /// `latency` after it, as the estimate goes, and never sooner than the
    /// same gap from `now`, since an answer not come yet comes at `now` at
    /// the earliest. (Without that floor, a late answer would make the
    /// forecast say *now* while the scope admits nothing until it comes.)
    fn after_the_first_answer(&self, gap_ends: Instant, latency: Duration, now: Instant) -> Instant {
        let sent = self.last_send.map_or(gap_ends, |last| last.at.instant());
        let gap = gap_ends.saturating_duration_since(sent);
        saturating_add(gap_ends, latency).max(saturating_add(now, gap))
    }

    /// The `wanted` lanes that free soonest: the lanes of the requests in
    /// flight (each estimated to free `latency` after its send, and no
    /// sooner than its lane's own gap), the free lanes after their own
    /// gaps, and the lanes not made yet, free now.
    fn slots(
        &self,
        now: Instant,
        effective: &Effective,
        (latency, word): (Duration, OnWord),
        wanted: usize,
    ) -> SmallVec<[Slot; 4]> {
        let concurrency = effective.concurrency as usize;
        let on_word = word.in_flight;
        let in_flight = (self.in_flight + on_word) as usize;
        // The end of a request of the word's (module docs).
        let word_end = {
            let from_open = word.opened_at.map(|opened| saturating_add(opened, latency));
            let residual = saturating_add(now, latency / 2);
            from_open.map_or(residual, |end| end.max(residual))
        };
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
                .chain(on_no_lane.then_some(Slot {
                    free_at: word_end,
                    estimated: true,
                }))
                .chain(unmade.then_some(Slot {
                    free_at: now,
                    estimated: false,
                }))
                .min_by_key(|slot| slot.free_at);
            return soonest.into_iter().collect();
        }
        let mut busy: SmallVec<[(Instant, Instant); 4]> = self
            .lanes
            .iter()
            .filter(|lane| lane.busy)
            .map(|lane| {
                (
                    saturating_add(lane.last_send.at.instant(), latency),
                    free_at(lane),
                )
            })
            .collect();
        // Requests in flight on no lane (taken over from a lock-free word)
        // or on the open word: when each left is not known (module docs).
        let on_no_lane = (self.in_flight as usize).saturating_sub(busy.len()) + on_word as usize;
        busy.extend((0..on_no_lane).map(|_| (word_end, now)));
        let deviation = latency.mul_f64(self.latency_spread());
        let busy = spread_ends(busy, deviation, now);
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

/// The ends of busy lanes, each given as (its request's start plus the
/// latency average, the earliest it can free: its lane's own gap, or `now`),
/// spread in their order as the expected order of as many latencies with
/// mean absolute deviation `deviation` (module docs), and sorted.
fn spread_ends(
    mut busy: SmallVec<[(Instant, Instant); 4]>,
    deviation: Duration,
    now: Instant,
) -> SmallVec<[Instant; 4]> {
    busy.sort_unstable();
    let count = busy.len() as f64;
    let mut ends: SmallVec<[Instant; 4]> = busy
        .iter()
        .enumerate()
        .map(|(index, &(average, earliest))| {
            // A uniform spread of mean absolute deviation d spans ± 2d;
            // its i-th of n lies at (2 (i + 1) / (n + 1) − 1) of that.
            let place = 2.0 * (index as f64 + 1.0) / (count + 1.0) - 1.0;
            let offset = deviation.mul_f64(2.0 * place.abs());
            let end = match place < 0.0 {
                true => average.checked_sub(offset).unwrap_or(average),
                false => saturating_add(average, offset),
            };
            end.max(earliest).max(now)
        })
        .collect();
    ends.sort_unstable();
    ends
}

/// Adds `time` on `key` to a forecast's parts.
fn add_part(parts: &mut SmallVec<[(CauseKey, Duration); 3]>, key: CauseKey, time: Duration) {
    match parts.iter_mut().find(|(known, _)| *known == key) {
        Some((_, sum)) => *sum += time,
        None => parts.push((key, time)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four lanes busy since the same instant, latencies 50 ms ± 25 ms
    /// (uniform: a mean absolute deviation of 12.5 ms), free at their
    /// expected order statistics.
    #[test]
    fn busy_lanes_of_one_start_free_spread_as_their_latencies() {
        let now = Instant::now();
        let average = now + Duration::from_millis(50);
        let busy = [(average, now); 4].into_iter().collect();
        let ends: Vec<u128> = spread_ends(busy, Duration::from_micros(12_500), now)
            .iter()
            .map(|end| end.duration_since(now).as_millis())
            .collect();
        assert_eq!(ends, [35, 45, 55, 65]);
        // One lane, or no spread: the average.
        let one = spread_ends(
            [(average, now)].into_iter().collect(),
            Duration::from_millis(12),
            now,
        );
        assert_eq!(one[0], average);
        // Never before its lane's own gap (80 ms), nor before now.
        let gap = now + Duration::from_millis(80);
        let floored = spread_ends(
            [(average, now), (now + Duration::from_millis(10), gap)]
                .into_iter()
                .collect(),
            Duration::from_millis(30),
            now,
        );
        assert_eq!(floored.as_slice(), [now + Duration::from_millis(70), gap]);
    }
}
