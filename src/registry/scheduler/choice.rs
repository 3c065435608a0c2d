//! Which waiter of a ready scope goes: the first one every one of its
//! scopes allows, passing (a bounded number of) waiters another scope holds
//! back, with each waiter's own quota cost checked.

use std::ops::Bound::{Excluded, Unbounded};

use tokio::time::Instant;

use super::{OrderKey, Scheduler, ScopeCheck, ScopeId, TicketId, Verdict, WakeList, MAX_BYPASS, MAX_SCAN};
use crate::registry::LimitSource;
use crate::waited::{CauseKey, WaitCause};

/// What holds a ready scope's queue when its head waits for another scope.
const OTHER_SCOPE: CauseKey = (WaitCause::OtherScope, None);

impl Scheduler {
    /// The first waiter of a ready scope that every one of its scopes
    /// allows now, passing over (a bounded number of) waiters that another
    /// scope holds back; or what holds the queue.
    pub(super) fn pick_waiter(
        &mut self,
        scope_id: ScopeId,
        now: Instant,
        wake: &mut WakeList,
    ) -> Result<TicketId, CauseKey> {
        // The candidates are walked in the queue, one after the other (the
        // walk changes no queue), so the common case, the head going, looks
        // at the head alone and gathers nothing.
        let mut skipped_here = 0;
        let mut after = None;
        for _ in 0..MAX_SCAN {
            let queue = self.scopes[scope_id].queue();
            let next = match after {
                None => queue.iter().next(),
                Some(key) => queue.range((Excluded(key), Unbounded)).next(),
            };
            let Some((&key, &id)) = next else {
                break;
            };
            after = Some(key);
            self.passed.clear();
            match self.evaluate(id, Some(scope_id), now) {
                Verdict::Admit => {
                    // The waiters skipped here are the first ones in the queue.
                    for &passed in self.scopes[scope_id].queue().values().take(skipped_here) {
                        self.tickets[passed].bypassed += 1;
                    }
                    self.count_passes();
                    return Ok(id);
                }
                Verdict::Global => {
                    let ticket = &mut self.tickets[id];
                    if !ticket.in_global_queue {
                        ticket.in_global_queue = true;
                        self.global_queue.insert(ticket.order, id);
                        if let Some(across) = &self.across {
                            across.add_global_waiter(ticket.order, self.shard);
                        }
                    }
                    return Err((WaitCause::GlobalConcurrency, Some(LimitSource::MaxConcurrency)));
                }
                Verdict::HeldBy(other) => {
                    if other == scope_id {
                        // Only a quota stops a waiter behind a head this
                        // scope allows: look again when its window ends.
                        let frees = self.scopes[scope_id]
                            .state
                            .quota_frees_at(self.cost_in(id, scope_id), now);
                        self.set_timer(scope_id, frees, wake);
                        return Err((WaitCause::Quota, Some(LimitSource::Quota)));
                    }
                    let ticket = &mut self.tickets[id];
                    ticket.held_by = Some(other);
                    if ticket.bypassed >= MAX_BYPASS {
                        return Err(OTHER_SCOPE);
                    }
                    skipped_here += 1;
                }
            }
        }
        Err(OTHER_SCOPE)
    }

    /// Counts a pass for each waiter the last [`evaluate`](Self::evaluate)
    /// that admitted a ticket went past in another scope: every admission
    /// that passes waiters must call it, or the `MAX_BYPASS` bound does not
    /// hold.
    pub(super) fn count_passes(&mut self) {
        for passed in self.passed.drain(..) {
            self.tickets[passed].bypassed += 1;
        }
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
            for &ahead in scope.queue().range(..order).map(|(_, id)| id).take(MAX_SCAN + 1) {
                let ahead_ticket = &self.tickets[ahead];
                let passable = matches!(ahead_ticket.held_by, Some(other) if other != seat.scope)
                    && ahead_ticket.bypassed < MAX_BYPASS;
                if !passable || self.passed.len() > MAX_SCAN {
                    return Verdict::HeldBy(seat.scope);
                }
                self.passed.push(ahead);
            }
        }
        // Taken here, the last check: an admitted waiter is sent at once
        // (`Verdict::Admit` means its permit is taken).
        if self.older_global_waiter_elsewhere(order) || !self.global.take_locked(self.permit_pool) {
            return Verdict::Global;
        }
        Verdict::Admit
    }

    /// With shards: whether a request older than `order` waits for a
    /// global permit in some shard (it goes first, as it would with one
    /// lock, where the global queue is served before any scope).
    fn older_global_waiter_elsewhere(&self, order: OrderKey) -> bool {
        let Some(across) = &self.across else {
            return false;
        };
        across
            .first_global_waiter()
            .is_some_and(|(first, _)| first < order)
    }

    /// The expected cost of the first waiter of `scope_id` there.
    pub(crate) fn head_cost(&self, scope_id: ScopeId) -> f64 {
        match self.scopes[scope_id].queue().values().next() {
            Some(&first) => self.cost_in(first, scope_id),
            None => 0.0,
        }
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
