//! The scheduler's side of a scope store: the terms of a reservation, and
//! the shared facts an answer brings back, applied to the local scopes.

use std::time::Duration;

use tokio::time::Instant;

use super::{Scheduler, WakeList};
use crate::registry::ticket::TicketId;
use crate::scope::Scope;
use crate::store::backend::{FleetBackoff, QuotaTerms, ScopeTerms, SharedFacts};
use crate::time::{saturating_add, scale};

impl Scheduler {
    /// The store terms of admitted ticket `id`, one per scope in its
    /// order: the effective concurrency, the gap after this send (the
    /// effective delay with this send's jitter drawn, never below the
    /// scope's floor), and whether the scope is still cold in this worker
    /// (or the request opens a connection, as a name's first does in its
    /// server's scope: see `ScopeState::first_answer_pending`).
    pub(crate) fn fleet_terms(&mut self, id: TicketId, now: Instant) -> Vec<ScopeTerms> {
        let ticket = &self.tickets[id];
        ticket
            .seats
            .iter()
            .map(|seat| {
                let state = &self.scopes[seat.scope].state;
                let effective = state.effective(now, self.max_concurrency);
                let jittered = scale(effective.delay, effective.jitter.factor(self.rng.f64()));
                let quota = state.config.get_quota().map(|quota| QuotaTerms {
                    quota,
                    window: state.config.get_window(),
                    cost: seat.cost,
                });
                let delay = jittered.max(effective.delay_floor);
                ScopeTerms {
                    scope: state.key.clone(),
                    concurrency: effective.concurrency,
                    delay,
                    quota,
                    // Cold here, whatever the other workers know: this
                    // worker's connection to the site is not set up yet.
                    first: (!state.warm || ticket.opens_connection) && !delay.is_zero(),
                }
            })
            .collect()
    }

    /// Applies what the store knows of ticket `id`'s scopes (in its order):
    /// a hold holds the local scope too, a backoff delay becomes the local
    /// scope's `LimitSource::Fleet` contribution. When the fleet learns
    /// together, the built-in backoff takes the fleet's level instead, an
    /// AutoThrottle scope the fleet's delay, and the scopes whose copy of
    /// the fleet's rampup search is stale are returned.
    pub(crate) fn apply_shared_facts(
        &mut self,
        id: TicketId,
        facts: &[SharedFacts],
        now: Instant,
        wake: &mut WakeList,
    ) -> Vec<Scope> {
        let Some(ticket) = self.tickets.get(id) else {
            return Vec::new();
        };
        let (max_hold, max_concurrency, learns) = (self.max_hold, self.max_concurrency, self.fleet_learns);
        for (seat, facts) in ticket.seats.iter().zip(facts) {
            let state = &mut self.scopes[seat.scope].state;
            let held = !facts.hold.is_zero() && state.hold(saturating_add(now, facts.hold), now, max_hold);
            let fleet_backoff = (!facts.backoff_delay.is_zero())
                .then(|| (facts.backoff_delay, saturating_add(now, facts.backoff_remaining)));
            // A fleet that learns has one backoff level, which the built-in
            // backoff takes as its state; otherwise the fleet's backoff
            // delay is a limit of its own.
            let level = (facts.backoff_level > 0).then(|| {
                FleetBackoff::new(facts.backoff_level, facts.backoff_delay, facts.backoff_remaining)
            });
            // (A store that keeps no level answers level 0; a backoff delay
            // with it was written by a worker that stepped its own.)
            let keeps_level = facts.backoff_level > 0 || facts.backoff_delay.is_zero();
            let adopted = learns && keeps_level && state.backoff_step_terms(max_concurrency).is_some();
            let mut changed = held
                | if adopted {
                    state.set_fleet_backoff(None) | state.adopt_fleet_backoff(level, now, max_concurrency)
                } else {
                    state.set_fleet_backoff(fleet_backoff)
                };
            if let (true, Some(delay)) = (learns, facts.autothrottle_delay) {
                changed |= state.adopt_autothrottle(delay);
            }
            if changed {
                self.dirty.push(seat.scope);
            }
        }
        self.run_dispatch(now, wake);
        if learns {
            self.stale_learnt(id, facts)
        } else {
            Vec::new()
        }
    }

    /// Time left of scope `key`'s hold, if it is held.
    pub(crate) fn hold_left(&self, key: &Scope, now: Instant) -> Option<Duration> {
        let id = self.index.get(key.as_str(), &self.scopes)?;
        let until = self.scopes[id].state.contributions().hold_until?;
        (until > now).then(|| until - now)
    }

    /// Scope `key`'s backoff delay and the time until its next step back,
    /// if it is backing off.
    pub(crate) fn backoff_left(&self, key: &Scope, now: Instant) -> Option<(Duration, Duration)> {
        let id = self.index.get(key.as_str(), &self.scopes)?;
        let backoff = self.scopes[id]
            .state
            .effective(now, self.max_concurrency)
            .backoff?;
        Some((
            backoff.delay,
            backoff.next_step_back.saturating_duration_since(now),
        ))
    }
}
