//! One timer per scope, kept by its first waiter: who keeps it, when it
//! fires, and whom a change of it wakes.

use tokio::time::Instant;

use super::{Scheduler, ScopeId, TicketId, WakeList};

impl Scheduler {
    /// Clears the timers ticket `id` keeps that are due at `now`: their
    /// scopes look at their waiters again.
    pub(super) fn fire_due_timers(&mut self, id: TicketId, now: Instant) {
        for seat in &self.tickets[id].seats {
            let scope = &mut self.scopes[seat.scope];
            if let Some((owner, at)) = scope.timer_owner() {
                if owner == id && at <= now {
                    scope.set_timer_owner(None);
                    self.dirty.push(seat.scope);
                }
            }
        }
    }

    /// The earliest timer this ticket keeps for one of its scopes.
    pub(super) fn timer_of(&self, id: TicketId) -> Option<Instant> {
        self.tickets[id]
            .seats
            .iter()
            .filter_map(|seat| match self.scopes[seat.scope].timer_owner() {
                Some((owner, at)) if owner == id => Some(at),
                _ => None,
            })
            .min()
    }

    /// Records when a scope's head may next go, and makes sure its first
    /// waiter keeps a timer for it (one timer per scope).
    pub(super) fn set_timer(&mut self, scope_id: ScopeId, at: Option<Instant>, wake: &mut WakeList) {
        let scope = &mut self.scopes[scope_id];
        let owner = match (at, scope.queue().first()) {
            (Some(at), Some((_, first))) => Some((first, at)),
            _ => None,
        };
        let previous = scope.timer_owner();
        if previous == owner {
            return;
        }
        scope.set_timer_owner(owner);
        // The same waiter with a later instant needs no wake-up: its timer
        // fires at the earlier one, and it learns the new one then. That is
        // the common case of a departure, which only ever moves a scope's
        // next send later; not waking anyone there keeps the departing
        // task from waking a task right after it handed its request over,
        // which on tokio would take the run-queue slot (the LIFO slot) its
        // connection task was just given and delay the request's bytes.
        let needs_wake = match (previous, owner) {
            (Some((before, earlier)), Some((first, at))) => before != first || at < earlier,
            (None, Some(_)) => true,
            (_, None) => false,
        };
        if let (true, Some((first, _))) = (needs_wake, owner) {
            if let Some(waker) = &self.tickets[first].waker {
                wake.push(waker.clone());
            }
        }
    }
}
