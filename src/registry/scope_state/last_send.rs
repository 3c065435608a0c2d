//! The last send of a lane or a scope: where its scope's next gaps run
//! from.

use std::time::Duration;

use crate::registry::ticket::SendsBefore;
use crate::time::{scale, Jitter, Stamp};

/// The last send of a lane or a scope, with the random draw for the gap
/// that follows it. The gap itself is computed when it is checked, from the
/// limits and jitter in force *then*, so a config change, a backoff step or
/// any new contribution applies to requests already waiting.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LastSend {
    pub(super) at: Stamp,
    /// Uniform in `[0, 1)`; mapped onto the jitter range in force.
    pub(super) draw: f64,
}

impl LastSend {
    /// Moves the send to `at` when it happened later than stamped (the
    /// request left after its admission); the jitter draw stays.
    pub(super) fn departed_at(&mut self, at: Stamp) {
        self.at = self.at.max(at);
    }

    /// When the next send may go after this one, `gap` later with the
    /// jitter applied; `None` when there is no gap (a past send never
    /// blocks), which spares the request path a clock conversion.
    pub(super) fn next_allowed(&self, gap: Duration, jitter: &Jitter) -> Option<Stamp> {
        self.next_allowed_at_least(gap, jitter, Duration::ZERO)
    }

    pub(super) fn next_allowed_at_least(
        &self,
        gap: Duration,
        jitter: &Jitter,
        floor: Duration,
    ) -> Option<Stamp> {
        if gap.is_zero() && floor.is_zero() {
            return None;
        }
        Some(self.at.after(scale(gap, jitter.factor(self.draw)).max(floor)))
    }
}

impl super::ScopeState {
    /// Forgets the send of a request admitted on `lane` that ends without
    /// having left: the lane's last send is the one before it again, and so
    /// is the scope's while it is still this request's (stamped at its
    /// admission, as its lane is: until it leaves, a scope with a delay
    /// admits nothing else). The `cost` it spent of the scope's quota goes
    /// back too (see [`refund_quota`](Self::refund_quota)).
    pub(crate) fn forget_send(&mut self, lane: usize, before: &SendsBefore, cost: f64) {
        if before.lane == Stamp::LATEST {
            return;
        }
        let Some(lane) = self.lanes.get_mut(lane) else {
            return;
        };
        let admitted_at = lane.last_send.at;
        lane.last_send.at = before.lane;
        self.refund_quota(cost, admitted_at.instant());
        if let Some(last) = &mut self.last_send {
            if last.at == admitted_at {
                match before.scope {
                    Some(at) => last.at = at,
                    None => self.last_send = None,
                }
            }
        }
    }
}
