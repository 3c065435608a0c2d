//! When a scope's next gap can start: the departures not recorded yet, and
//! the requests that open a connection, whose answer (not their departure)
//! the next gap runs from.

use tokio::time::Instant;

use super::{Effective, ScopeState};
use crate::time::Stamp;

impl ScopeState {
    /// Whether the scope's delay since its last send has not passed yet.
    pub(crate) fn last_send_blocks(&self, effective: &Effective, now: Instant) -> bool {
        self.last_send
            .and_then(|last| {
                last.next_allowed_at_least(effective.delay, &effective.jitter, effective.delay_floor)
            })
            .is_some_and(|at| at > Stamp::of(now))
    }

    /// Whether the scope's next gap cannot be measured yet, because it runs
    /// from an instant still to come: the departure of a request admitted
    /// but not yet handed to the inner service, or the answer to a request
    /// that opens a connection (it pays for the connection's setup after
    /// its send, so the server would see the next one early: see
    /// [`first_answer_pending`](Self::first_answer_pending)). Scopes without
    /// a delay have no gap to protect.
    pub(super) fn waits_for_an_earlier_request(&self, effective: &Effective) -> bool {
        if effective.delay.is_zero() && effective.delay_floor.is_zero() {
            return false;
        }
        self.undeparted > 0 || self.first_answer_pending()
    }

    /// Whether a request in flight opens a connection after it leaves, so
    /// that the server sees it later than its departure says: the scope's
    /// first (cold start), or one that also belongs to a cold scope (a
    /// name's first request, in the scope of the server it shares with
    /// other names: hyper-util and reqwest keep a connection per name).
    /// The next gap then runs from its answer.
    #[inline]
    pub(crate) fn first_answer_pending(&self) -> bool {
        (!self.warm && self.in_flight > 0) || self.opening > 0
    }

    /// Counts a request of this scope in flight that opens a connection
    /// (it also belongs to a cold scope): see [`opening`](Self::opening).
    pub(crate) fn start_opening(&mut self) {
        self.opening = self.opening.saturating_add(1);
    }

    /// The end of a request counted by [`start_opening`](Self::start_opening):
    /// if it left, the scope's next gap runs from its answer (`answered_at`:
    /// its response head, or its end when it had none), as after a cold
    /// start; a gap already longer stays.
    pub(crate) fn end_opening(&mut self, departed: bool, answered_at: Stamp) {
        self.opening = self.opening.saturating_sub(1);
        if departed {
            if let Some(last_send) = &mut self.last_send {
                last_send.departed_at(answered_at);
            }
        }
    }
}
