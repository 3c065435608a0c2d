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
    /// The last send of a lane that never sent: long past.
    pub(super) const NONE: LastSend = LastSend {
        at: Stamp::EARLIEST,
        draw: 0.5,
    };

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

/// What a request's admission replaced in its scope: the scope's and the
/// lane's last sends before it, and the send it made. They are put back if
/// the request never leaves (it is dropped, or its inner service fails to
/// get ready, before the hand-over): the site saw nothing, so no gap may
/// run from it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendsBefore {
    pub(super) scope: Option<LastSend>,
    pub(super) lane: LastSend,
    /// The scope's send the admission made: the scope's last send is put
    /// back only while it is still this one.
    pub(super) made: LastSend,
}

impl super::ScopeState {
    /// Forgets the send of a request admitted on `lane` that ends without
    /// having left: the lane's last send is the one before it again, and so
    /// is the scope's, unless a later send replaced it (that one stays).
    pub(crate) fn forget_send(&mut self, lane: usize, before: &SendsBefore) {
        if let Some(lane) = self.lanes.get_mut(lane) {
            lane.last_send = before.lane;
        }
        let still_ours = self
            .last_send
            .is_some_and(|last| last.at == before.made.at && last.draw == before.made.draw);
        if still_ours {
            self.last_send = before.scope;
        }
    }
}
