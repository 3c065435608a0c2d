//! Which waiter of a ready scope goes: the first of its candidates that
//! every one of its scopes allows, parking on the way the leaders another
//! scope holds back (see `groups.rs`), with each waiter's own quota cost
//! checked.

use tokio::time::Instant;

use super::{Scheduler, ScopeCheck, ScopeId, TicketId, Verdict, WakeList};
use crate::registry::LimitSource;
use crate::waited::{CauseKey, WaitCause};

/// What holds a ready scope's queue when its head waits for another scope.
pub(super) const OTHER_SCOPE: CauseKey = (WaitCause::OtherScope, None);

impl Scheduler {
    /// The first candidate of a ready scope that every one of its scopes
    /// allows now; the candidates another scope holds back are parked on
    /// the way (they could not go, so the ones behind them may). Or what
    /// holds the queue.
    pub(super) fn pick_waiter(
        &mut self,
        scope_id: ScopeId,
        now: Instant,
        wake: &mut WakeList,
    ) -> Result<TicketId, CauseKey> {
        // Each candidate found held back elsewhere leaves the queue, so the
        // walk always looks at the first one left, and a waiter is looked
        // at here once per change of what holds it.
        while let Some((_, id)) = self.scopes[scope_id].queue().first() {
            match self.evaluate(id, Some(scope_id), now) {
                Verdict::Admit => return Ok(id),
                Verdict::Global => {
                    let ticket = &mut self.tickets[id];
                    if !ticket.in_global_queue {
                        ticket.in_global_queue = true;
                        self.global_queue.insert(ticket.order, id);
                    }
                    return Err((WaitCause::GlobalConcurrency, Some(LimitSource::MaxConcurrency)));
                }
                Verdict::HeldBy(other) if other == scope_id => {
                    // Only a quota stops a waiter this scope allows: look
                    // again when its window ends.
                    let frees = self.scopes[scope_id]
                        .state
                        .quota_frees_at(self.cost_in(id, scope_id), now);
                    self.set_timer(scope_id, frees, wake);
                    return Err((WaitCause::Quota, Some(LimitSource::Quota)));
                }
                Verdict::HeldBy(other) => {
                    if !self.hold_back(id, other, scope_id) {
                        // This scope keeps its turn for it.
                        return Err(OTHER_SCOPE);
                    }
                }
            }
        }
        Err(OTHER_SCOPE)
    }

    /// Whether every scope of ticket `id` lets it go now. `known_ready` is
    /// a scope whose limits and order were just checked by the caller.
    /// `Verdict::Admit` takes its global permit: the caller sends it.
    pub(super) fn evaluate(&mut self, id: TicketId, known_ready: Option<ScopeId>, now: Instant) -> Verdict {
        let ticket = &self.tickets[id];
        let order = ticket.order;
        for seat in &ticket.seats {
            let scope = &self.scopes[seat.scope];
            if Some(seat.scope) == known_ready {
                // Checked for the first waiter's cost; this one's may differ.
                if scope.state.quota_frees_at(seat.cost, now).is_some() {
                    return Verdict::HeldBy(seat.scope);
                }
                continue;
            }
            let effective = scope.state.effective(now, self.max_concurrency);
            if !matches!(
                scope.state.check(now, &effective, seat.cost),
                ScopeCheck::Ready { .. }
            ) {
                return Verdict::HeldBy(seat.scope);
            }
            // A candidate ahead of it there goes first (one that scope
            // holds for itself, or one it has not looked at yet).
            if scope.queue().has_one_before(order) {
                return Verdict::HeldBy(seat.scope);
            }
        }
        // Taken here, the last check: an admitted waiter is sent at once
        // (`Verdict::Admit` means its permit is taken). Permits go in one
        // order across all scopes: behind an earlier waiter for one, this
        // one joins them.
        let earlier_waits = self
            .global_queue
            .first_key_value()
            .is_some_and(|(&first, _)| first < order);
        if earlier_waits || !self.global.take_locked() {
            return Verdict::Global;
        }
        Verdict::Admit
    }

    /// The expected cost of the first waiter of `scope_id` there (0 in a
    /// scope without a quota, where no cost counts).
    pub(crate) fn head_cost(&self, scope_id: ScopeId) -> f64 {
        let scope = &self.scopes[scope_id];
        if scope.state.config.get_quota().is_none() {
            return 0.0;
        }
        match scope.queue().first() {
            Some((_, first)) => self.cost_in(first, scope_id),
            None => 0.0,
        }
    }

    /// Whether the first waiter of `scope_id` has several scopes.
    pub(super) fn head_has_several_scopes(&self, scope_id: ScopeId) -> bool {
        self.scopes[scope_id]
            .queue()
            .first()
            .is_some_and(|(_, first)| self.tickets[first].seats.as_slice().len() > 1)
    }

    /// The expected cost of ticket `id` in scope `scope_id`.
    pub(super) fn cost_in(&self, id: TicketId, scope_id: ScopeId) -> f64 {
        self.tickets[id]
            .seats
            .iter()
            .find(|seat| seat.scope == scope_id)
            .map_or(0.0, |seat| seat.cost)
    }
}
