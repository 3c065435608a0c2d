//! The scheduler's side of what a fleet learns together: which scopes'
//! copies of the fleet's rampup search are stale, and adopting the fleet's
//! state (see [`crate::store`]'s "What the fleet learns").

use std::time::Duration;

use tokio::time::Instant;

use super::{Scheduler, TicketId, WakeList};
use crate::registry::rampup::{RampupConfig, RampupState};
use crate::registry::scope_state::{Manager, ScopeState};
use crate::scope::Scope;
use crate::store::backend::{AutoThrottleSample, BackoffStep, FleetBackoff, SharedFacts};

impl Scheduler {
    /// The scopes of ticket `id` (in its order, beside `facts`) that run
    /// rampup and whose copy of the fleet's search is older than the
    /// store's.
    pub(crate) fn stale_learnt(&self, id: TicketId, facts: &[SharedFacts]) -> Vec<Scope> {
        let Some(ticket) = self.tickets.get(id) else {
            return Vec::new();
        };
        ticket
            .seats
            .iter()
            .zip(facts)
            .filter(|(seat, facts)| {
                let contributions = self.scopes[seat.scope].state.contributions();
                contributions
                    .rampup()
                    .is_some_and(|rampup| rampup.fleet_version < facts.learnt_version)
            })
            .map(|(seat, _)| self.scopes[seat.scope].state.key.clone())
            .collect()
    }

    /// Whether scope `key` runs the built-in rampup search.
    pub(crate) fn runs_rampup(&self, key: &Scope) -> bool {
        self.index
            .get(key.as_str(), &self.scopes)
            .is_some_and(|id| self.scopes[id].state.config.get_rampup().is_some())
    }

    /// Scope `key`'s rampup settings and a copy of its search, when it
    /// runs rampup.
    pub(crate) fn rampup_snapshot(&self, key: &Scope) -> Option<(RampupConfig, RampupState)> {
        let id = self.index.get(key.as_str(), &self.scopes)?;
        let state = &self.scopes[id].state;
        let config = state.config.get_rampup()?.clone();
        Some((config, state.contributions().rampup()?.clone()))
    }

    /// Applies a rampup backoff of scope `key` (at `at`, for a request sent
    /// at `sent`) to the local copy of the search: when it could not be
    /// written to the fleet's (the store is unreachable, or other workers
    /// kept writing first).
    pub(crate) fn rampup_backoff_locally(
        &mut self,
        key: &Scope,
        (at, sent): (Instant, Option<Instant>),
        now: Instant,
        wake: &mut WakeList,
    ) {
        self.change_scope(key, (now, wake), |scope, _| {
            let Some(config) = scope.config.get_rampup().cloned() else {
                return false;
            };
            let Some(Manager::Rampup(rampup)) = scope.contributions_mut().manager.as_mut() else {
                return false;
            };
            rampup.on_backoff_sent(at, sent, &config);
            true
        });
    }

    /// Takes the fleet's search `state`, at `version`, as scope `key`'s,
    /// unless its copy is as new already; its waiters look again at `now`.
    pub(crate) fn adopt_rampup(
        &mut self,
        key: &Scope,
        mut state: RampupState,
        version: u64,
        now: Instant,
        wake: &mut WakeList,
    ) {
        let Some(id) = self.index.get(key.as_str(), &self.scopes) else {
            return;
        };
        let scope = &mut self.scopes[id].state;
        if scope.config.get_rampup().is_none() {
            return;
        }
        let Some(Manager::Rampup(rampup)) = scope.contributions_mut().manager.as_mut() else {
            return;
        };
        if rampup.fleet_version >= version {
            return;
        }
        state.fleet_version = version;
        tracing::debug!(
            target: "tower_throttle",
            scope = %key,
            version,
            old_delay_ms = rampup.delay.as_secs_f64() * 1000.0,
            new_delay_ms = state.delay.as_secs_f64() * 1000.0,
            "rampup: the fleet's search"
        );
        **rampup = state;
        if self.scopes[id].has_waiters() {
            self.dirty.push(id);
        }
        self.run_dispatch(now, wake);
    }

    /// The AutoThrottle samples the last requests left for the fleet's
    /// store, if any (`None` on most calls).
    #[inline]
    pub(crate) fn take_autothrottle_samples(&mut self) -> Option<Vec<(Scope, AutoThrottleSample)>> {
        if self.autothrottle_samples.is_empty() {
            return None;
        }
        Some(std::mem::take(&mut self.autothrottle_samples))
    }

    /// Takes the fleet's AutoThrottle `delay` as scope `key`'s; its
    /// waiters look again at `now` if it changed.
    pub(crate) fn adopt_autothrottle(
        &mut self,
        key: &Scope,
        delay: Duration,
        now: Instant,
        wake: &mut WakeList,
    ) {
        self.change_scope(key, (now, wake), |scope, _| scope.adopt_autothrottle(delay));
    }

    /// Applies an AutoThrottle `sample` of scope `key` to its own delay:
    /// when the fleet's store could not take it.
    pub(crate) fn autothrottle_locally(
        &mut self,
        key: &Scope,
        sample: &AutoThrottleSample,
        now: Instant,
        wake: &mut WakeList,
    ) {
        self.change_scope(key, (now, wake), |scope, _| {
            let old = scope.contributions().autothrottle_delay;
            scope.adopt_autothrottle(sample.next_delay(old))
        });
    }

    /// Scope `key`'s backoff settings for the fleet's store to step, when
    /// the built-in backoff runs it.
    pub(crate) fn backoff_step_terms(&self, key: &Scope) -> Option<BackoffStep> {
        let id = self.index.get(key.as_str(), &self.scopes)?;
        self.scopes[id].state.backoff_step_terms(self.max_concurrency)
    }

    /// Takes the fleet's backoff in force as scope `key`'s; its waiters
    /// look again at `now` if its limits changed.
    pub(crate) fn adopt_fleet_backoff(
        &mut self,
        key: &Scope,
        fleet: Option<FleetBackoff>,
        now: Instant,
        wake: &mut WakeList,
    ) {
        self.change_scope(key, (now, wake), |scope, max_concurrency| {
            scope.adopt_fleet_backoff(fleet, now, max_concurrency)
        });
    }

    /// Steps scope `key`'s own backoff: when the fleet's store could not.
    pub(crate) fn step_backoff_locally(&mut self, key: &Scope, now: Instant, wake: &mut WakeList) {
        self.change_scope(key, (now, wake), |scope, max_concurrency| {
            scope.step_backoff(now, max_concurrency);
            true
        });
    }

    /// Applies `change` to scope `key` (with the registry's global limit);
    /// when it says the scope's limits changed, its waiters look again at
    /// `now`.
    fn change_scope(
        &mut self,
        key: &Scope,
        (now, wake): (Instant, &mut WakeList),
        change: impl FnOnce(&mut ScopeState, u32) -> bool,
    ) {
        let Some(id) = self.index.get(key.as_str(), &self.scopes) else {
            return;
        };
        if change(&mut self.scopes[id].state, self.max_concurrency) {
            self.dirty.push(id);
            self.run_dispatch(now, wake);
        }
    }
}

/// Keeps a response's AutoThrottle sample for the fleet's store (when the
/// scope runs AutoThrottle): off the common path.
#[inline(never)]
pub(super) fn sample_for_fleet(
    samples: &mut Vec<(Scope, AutoThrottleSample)>,
    scope: &ScopeState,
    latency: Duration,
    status: u16,
) {
    if let Some(sample) = scope.autothrottle_sample(latency, status) {
        samples.push((scope.key.clone(), sample));
    }
}
