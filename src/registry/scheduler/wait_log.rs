//! What held a scope's queue, and since when: the log each scope with
//! waiters keeps, from which a request reads why it waited (see
//! [`crate::waited`]).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::registry::ticket::WaitParts;
use crate::waited::{CauseKey, WaitCause};

/// The causes that held a scope's queue, each from the instant it began
/// to the next one's start (the last one lasts until now).
#[derive(Debug, Default)]
pub(crate) struct WaitLog {
    segments: VecDeque<(Instant, CauseKey)>,
    /// The length after the last trim: the next trim waits until the log
    /// doubled, so trimming costs O(1) per segment.
    trimmed_to: usize,
}

impl WaitLog {
    /// Notes that `key` holds the queue from `now` on.
    pub(crate) fn note(&mut self, now: Instant, key: CauseKey) {
        match self.segments.back_mut() {
            Some((_, last)) if *last == key => {}
            // Nothing was held on the cause noted at this same instant.
            Some((at, last)) if *at == now => {
                *last = key;
                let len = self.segments.len();
                if len >= 2 && self.segments[len - 2].1 == key {
                    self.segments.pop_back();
                }
            }
            _ => self.segments.push_back((now, key)),
        }
    }

    /// The time from `from` to `to`, by cause, in the order the causes
    /// began. Time before the first segment (none, when every waiter's
    /// arrival is noted) goes to the first cause, so the parts always add
    /// up to the whole.
    pub(crate) fn parts(&self, from: Instant, to: Instant) -> WaitParts {
        let mut parts = WaitParts::new();
        let start = self
            .segments
            .partition_point(|(at, _)| *at <= from)
            .saturating_sub(1);
        let mut segments = self.segments.range(start..).peekable();
        let mut counted = Duration::ZERO;
        while let Some(&(began, key)) = segments.next() {
            let ended = segments.peek().map_or(to, |(next, _)| *next).min(to);
            let time = ended.saturating_duration_since(began.max(from));
            counted += time;
            add_part(&mut parts, key, time);
            if ended >= to {
                break;
            }
        }
        if let Some(&(_, key)) = self.segments.front() {
            add_part(
                &mut parts,
                key,
                to.saturating_duration_since(from).saturating_sub(counted),
            );
        }
        parts
    }

    /// Forgets what ended before `oldest`, the arrival of the oldest waiter
    /// (which only [`needs_trim`](Self::needs_trim) asks for).
    pub(crate) fn trim(&mut self, oldest: Instant) {
        while self.segments.len() > 1 && self.segments[1].0 <= oldest {
            self.segments.pop_front();
        }
        self.trimmed_to = self.segments.len();
    }

    /// Whether the log grew enough since the last trim to look for the
    /// oldest waiter.
    pub(crate) fn needs_trim(&self) -> bool {
        self.segments.len() > 2 * self.trimmed_to + 8
    }

    /// Forgets everything: nobody waits.
    pub(crate) fn clear(&mut self) {
        self.segments.clear();
        self.trimmed_to = 0;
    }

    /// The cause in force at `at` (the first one, before the log starts).
    fn key_at(&self, at: Instant) -> Option<CauseKey> {
        let index = self.segments.partition_point(|(start, _)| *start <= at);
        self.segments.get(index.saturating_sub(1)).map(|(_, key)| *key)
    }

    /// The instants strictly between `from` and `to` where a cause began.
    fn starts_within(&self, from: Instant, to: Instant) -> impl Iterator<Item = Instant> + '_ {
        self.segments
            .iter()
            .map(|(start, _)| *start)
            .filter(move |start| from < *start && *start < to)
    }
}

/// The time from `from` to `to` of a request that waited in the queues
/// of several scopes at once, by cause: at each instant, the first cause
/// among its scopes' logs that is not [`WaitCause::OtherScope`] (a scope
/// ready for the request, which waits because another of its scopes holds
/// it, says `OtherScope`; the scope that holds it says why). Only when
/// every scope says `OtherScope` (the request waits behind another request
/// that a scope holds) is the time `OtherScope`.
pub(crate) fn merged_parts(logs: &[&WaitLog], from: Instant, to: Instant) -> WaitParts {
    let mut cuts = vec![from, to];
    for log in logs {
        cuts.extend(log.starts_within(from, to));
    }
    cuts.sort_unstable();
    cuts.dedup();
    let mut parts = WaitParts::new();
    for pair in cuts.windows(2) {
        let mut keys = logs.iter().filter_map(|log| log.key_at(pair[0]));
        let first = keys.next();
        let key = first
            .into_iter()
            .chain(keys)
            .find(|(cause, _)| *cause != WaitCause::OtherScope)
            .or(first);
        if let Some(key) = key {
            add_part(&mut parts, key, pair[1] - pair[0]);
        }
    }
    parts
}

/// Adds `time` on `key` to `parts` (to the part of the same cause and
/// source, if there is one); nothing for no time.
fn add_part(parts: &mut WaitParts, (cause, source): CauseKey, time: Duration) {
    if time.is_zero() {
        return;
    }
    match parts
        .iter_mut()
        .find(|(known, known_source, _)| *known == cause && *known_source == source)
    {
        Some((_, _, sum)) => *sum += time,
        None => parts.push((cause, source, time)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::LimitSource;

    const MS: Duration = Duration::from_millis(1);
    const LANES: CauseKey = (WaitCause::Lanes, Some(LimitSource::Config));
    const DELAY: CauseKey = (WaitCause::Delay, Some(LimitSource::Config));

    #[test]
    fn a_wait_is_cut_from_the_segments_that_cover_it() {
        let t0 = Instant::now();
        let mut log = WaitLog::default();
        log.note(t0, LANES);
        log.note(t0 + 100 * MS, LANES);
        log.note(t0 + 300 * MS, DELAY);
        log.note(t0 + 400 * MS, LANES);
        // From the start: 300 of lanes, 100 of delay, 100 of lanes again.
        assert_eq!(
            log.parts(t0, t0 + 500 * MS)[..],
            [(LANES.0, LANES.1, 400 * MS), (DELAY.0, DELAY.1, 100 * MS)]
        );
        // A later arrival sees only its part.
        assert_eq!(
            log.parts(t0 + 350 * MS, t0 + 420 * MS)[..],
            [(DELAY.0, DELAY.1, 50 * MS), (LANES.0, LANES.1, 20 * MS)]
        );
        log.trim(t0 + 350 * MS);
        assert_eq!(
            log.parts(t0 + 350 * MS, t0 + 400 * MS)[..],
            [(DELAY.0, DELAY.1, 50 * MS)]
        );
    }

    #[test]
    fn several_scopes_give_each_instant_to_the_one_that_held_the_request() {
        const OTHER: CauseKey = (WaitCause::OtherScope, None);
        let t0 = Instant::now();
        // Scope one: its lanes until 100 ms, then ready (other scope).
        let mut one = WaitLog::default();
        one.note(t0, LANES);
        one.note(t0 + 100 * MS, OTHER);
        // Scope two: ready (other scope) until 50 ms, then its delay.
        let mut two = WaitLog::default();
        two.note(t0, OTHER);
        two.note(t0 + 50 * MS, DELAY);
        assert_eq!(
            merged_parts(&[&one, &two], t0, t0 + 300 * MS)[..],
            [(LANES.0, LANES.1, 100 * MS), (DELAY.0, DELAY.1, 200 * MS)]
        );
        // Both ready, behind a request another scope holds.
        let mut three = WaitLog::default();
        three.note(t0, OTHER);
        assert_eq!(
            merged_parts(&[&three, &three], t0, t0 + 10 * MS)[..],
            [(WaitCause::OtherScope, None, 10 * MS)]
        );
    }

    #[test]
    fn a_cause_replaced_at_the_same_instant_takes_no_time() {
        let t0 = Instant::now();
        let mut log = WaitLog::default();
        log.note(t0, DELAY);
        log.note(t0 + MS, LANES);
        log.note(t0 + MS, DELAY);
        assert_eq!(log.segments.len(), 1);
        assert_eq!(log.parts(t0, t0 + 2 * MS)[..], [(DELAY.0, DELAY.1, 2 * MS)]);
    }
}
