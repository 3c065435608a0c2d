//! Fairness between workers: each scope's line of waiting workers (see
//! the [module docs](super#fairness-between-workers)).

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::scope::Scope;
use crate::time::saturating_add;

/// How long past the instant a busy answer told a waiter to ask again its
/// place in line is kept. A waiter that asks later than that (it stopped
/// wanting the scope, or its worker died) loses its place, so the lanes it
/// was owed go to the next in line; one that comes back asks as a newcomer.
pub const LINE_GRACE: Duration = Duration::from_millis(500);

/// A waiter: one worker with one set of scopes asked together. Each has
/// at most one place in a scope's line, however many of its requests wait,
/// so lanes go round the workers, not round their requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WaiterId(pub(crate) u64);

impl WaiterId {
    /// The waiter of `worker` asking for `scopes` together: FNV-1a over
    /// the worker's random name and the scopes' names (a few instructions
    /// per byte; two waiters that collide share a place, which costs one of
    /// them a turn, nothing more).
    pub(crate) fn of<'a>(worker: u64, scopes: impl Iterator<Item = &'a Scope>) -> Self {
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let mix = |hash: u64, bytes: &[u8]| {
            bytes
                .iter()
                .fold(hash, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(PRIME))
        };
        let mut hash = mix(0xcbf2_9ce4_8422_2325, &worker.to_le_bytes());
        for scope in scopes {
            // A separator, so ["ab"] and ["a", "b"] differ.
            hash = mix(mix(hash, scope.as_str().as_bytes()), &[0xff]);
        }
        WaiterId(hash)
    }
}

impl fmt::Display for WaiterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// One scope's line in [`MemoryStore`](super::MemoryStore): waiters with
/// their tickets and when their places expire.
#[derive(Debug, Default)]
pub(crate) struct Line {
    places: Vec<(WaiterId, u64, Instant)>,
}

impl Line {
    pub(crate) fn forget_expired(&mut self, now: Instant) {
        self.places.retain(|&(_, _, until)| until > now);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.places.is_empty()
    }

    /// The ticket of `waiter`'s place, if it has one.
    pub(crate) fn ticket_of(&self, waiter: WaiterId) -> Option<u64> {
        self.places
            .iter()
            .find(|&&(place, ..)| place == waiter)
            .map(|&(_, ticket, _)| ticket)
    }

    /// How many waiters are ahead of a ticket (`None`: a newcomer, behind
    /// everyone).
    pub(crate) fn ahead_of(&self, ticket: Option<u64>) -> usize {
        match ticket {
            Some(ticket) => self.places.iter().filter(|&&(_, held, _)| held < ticket).count(),
            None => self.places.len(),
        }
    }

    /// Puts `waiter` in line with `ticket` (or refreshes its place) until
    /// `retry_at` plus the grace.
    pub(crate) fn join(&mut self, waiter: WaiterId, ticket: u64, retry_at: Instant) {
        let until = saturating_add(retry_at, LINE_GRACE);
        match self.places.iter_mut().find(|(place, ..)| *place == waiter) {
            Some(place) => *place = (waiter, ticket, until),
            None => self.places.push((waiter, ticket, until)),
        }
    }

    pub(crate) fn leave(&mut self, waiter: WaiterId) {
        self.places.retain(|&(place, ..)| place != waiter);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiters_of_one_worker_differ_by_their_scopes() {
        let (a, b) = (Scope::new("a"), Scope::new("b"));
        let one = WaiterId::of(1, [&a].into_iter());
        assert_eq!(one, WaiterId::of(1, [&a].into_iter()));
        assert_ne!(one, WaiterId::of(1, [&a, &b].into_iter()));
        assert_ne!(one, WaiterId::of(2, [&a].into_iter()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_line_counts_the_tickets_ahead_and_drops_expired_places() {
        let mut line = Line::default();
        let now = Instant::now();
        line.join(WaiterId(1), 10, now);
        line.join(WaiterId(2), 20, now + Duration::from_secs(1));
        assert_eq!(line.ahead_of(Some(10)), 0);
        assert_eq!(line.ahead_of(Some(20)), 1);
        assert_eq!(line.ahead_of(None), 2);
        line.forget_expired(now + LINE_GRACE);
        assert_eq!(line.ticket_of(WaiterId(1)), None);
        assert_eq!(line.ticket_of(WaiterId(2)), Some(20));
        assert_eq!(line.ahead_of(None), 1);
        line.leave(WaiterId(2));
        assert!(line.is_empty());
    }
}
