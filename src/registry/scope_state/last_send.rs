//! The last send of a lane or a scope: where its scope's next gaps run
//! from.

use std::time::Duration;

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
