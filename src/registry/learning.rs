//! The registry's side of what a fleet learns together: reading the
//! fleet's rampup search when a store's answer shows a newer one, and
//! writing each backoff feedback into it. Both run in the background, off
//! the registry's lock (see [`crate::store`]'s "What the fleet learns").

use std::sync::{Arc, PoisonError};

use tokio::time::Instant;

use super::rampup::RampupState;
use super::Registry;
use crate::scope::Scope;
use crate::store::{
    backend::{AutoThrottleSample, BackoffStep, LEARNT_TTL},
    StoreError, StoreHandle,
};

/// How many times a backoff is written again after other workers wrote
/// first, before it is given up (it stays in this worker's copy).
const MAX_SWAPS: usize = 8;

impl Registry {
    /// Reads, in the background, the fleet's search of each of `stale`
    /// (scopes whose copy a store's answer showed older), one read per
    /// scope at a time, and adopts it.
    pub(crate) fn refresh_learnt(&self, stale: Vec<Scope>) {
        let (Some(fleet), Ok(runtime)) = (self.fleet(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        for scope in stale {
            if !reading(fleet).insert(scope.clone()) {
                continue;
            }
            let (registry, fleet) = (self.clone(), fleet.clone());
            runtime.spawn(async move {
                if let Err(error) = registry.read_learnt(&fleet, &scope).await {
                    fleet.note_failure(&error);
                }
                reading(&fleet).remove(&scope);
            });
        }
    }

    /// Writes, in the background, a backoff feedback of rampup scope
    /// `scope` at `at` (for a request sent at `sent`) into the fleet's search: reads it, applies the
    /// backoff, and writes it back if no other worker wrote meanwhile
    /// (else again, from what that worker wrote); then adopts the result.
    pub(crate) fn share_rampup_backoff(&self, scope: Scope, at: Instant, sent: Option<Instant>) {
        let (Some(fleet), Ok(runtime)) = (self.fleet(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        let (registry, fleet) = (self.clone(), fleet.clone());
        runtime.spawn(async move {
            if let Err(error) = registry.write_backoff(&fleet, &scope, (at, sent)).await {
                fleet.note_failure(&error);
                // The fleet's search did not get it: this worker's copy
                // does, as if it searched alone.
                registry.with_scheduler(|scheduler, now, wake| {
                    scheduler.rampup_backoff_locally(&scope, (at, sent), now, wake);
                });
            }
        });
    }

    async fn read_learnt(&self, fleet: &StoreHandle, scope: &Scope) -> Result<(), StoreError> {
        let Some(learnt) = fleet.store.learnt(scope.clone()).await? else {
            return Ok(());
        };
        fleet.note_answer();
        let now = Instant::now();
        let Some((config, _)) = self.with_scheduler(|scheduler, _, _| scheduler.rampup_snapshot(scope))
        else {
            return Ok(());
        };
        match RampupState::decode(&learnt.state, learnt.age, now) {
            Some(mut state) => {
                state.catch_up(now, &config);
                self.adopt_rampup(scope, state, learnt.version);
            }
            None => unreadable(scope, &learnt.state),
        }
        Ok(())
    }

    async fn write_backoff(
        &self,
        fleet: &StoreHandle,
        scope: &Scope,
        (at, sent): (Instant, Option<Instant>),
    ) -> Result<(), StoreError> {
        for _ in 0..MAX_SWAPS {
            let learnt = fleet.store.learnt(scope.clone()).await?;
            let now = Instant::now();
            let Some((config, local)) =
                self.with_scheduler(|scheduler, _, _| scheduler.rampup_snapshot(scope))
            else {
                return Ok(());
            };
            let decoded = learnt.as_ref().map(|learnt| {
                (
                    learnt.version,
                    RampupState::decode(&learnt.state, learnt.age, now),
                )
            });
            let (version, mut state) = match decoded {
                Some((version, Some(mut fleet_state))) => {
                    fleet_state.catch_up(at.min(now), &config);
                    (version, fleet_state)
                }
                Some((version, None)) => {
                    unreadable(scope, learnt.as_ref().map_or("", |learnt| learnt.state.as_str()));
                    (version, local)
                }
                // The first word of the fleet: this worker's search.
                None => (0, local),
            };
            state.on_backoff_sent(at, sent, &config);
            if let Some(written) = fleet
                .store
                .swap_learnt(scope.clone(), version, state.encode(now), LEARNT_TTL)
                .await?
            {
                fleet.note_answer();
                self.adopt_rampup(scope, state, written);
                return Ok(());
            }
        }
        tracing::debug!(
            target: "tower_throttle",
            %scope,
            tries = MAX_SWAPS,
            "rampup: other workers kept writing the fleet's search first; this backoff stays local"
        );
        self.with_scheduler(|scheduler, now, wake| {
            scheduler.rampup_backoff_locally(scope, (at, sent), now, wake);
        });
        Ok(())
    }

    /// Steps, in the background, the fleet's backoff of `scope` (the store
    /// steps it from the level in force) and takes the result as the
    /// scope's; a store that keeps no level, or cannot be reached, leaves
    /// the step to this worker's own backoff (and, for the first, the delay
    /// to the store's backoff fact, as before).
    pub(crate) fn share_backoff_step(&self, scope: Scope, step: BackoffStep) {
        let (Some(fleet), Ok(runtime)) = (self.fleet(), tokio::runtime::Handle::try_current()) else {
            self.with_scheduler(|scheduler, now, wake| scheduler.step_backoff_locally(&scope, now, wake));
            return;
        };
        let (registry, fleet) = (self.clone(), fleet.clone());
        runtime.spawn(async move {
            let stepped = fleet.store.step_backoff(scope.clone(), step).await;
            let left = registry.with_scheduler(|scheduler, now, wake| match &stepped {
                Ok(Some(level)) => {
                    scheduler.adopt_fleet_backoff(&scope, Some(*level), now, wake);
                    None
                }
                _ => {
                    scheduler.step_backoff_locally(&scope, now, wake);
                    scheduler.backoff_left(&scope, now)
                }
            });
            match stepped {
                Ok(Some(_)) => fleet.note_answer(),
                Ok(None) => {
                    fleet.note_answer();
                    if let Some((delay, left)) = left {
                        fleet.in_background(fleet.store.backoff(scope, delay, left));
                    }
                }
                Err(error) => fleet.note_failure(&error),
            }
        });
    }

    /// Applies, in the background, each AutoThrottle sample to the fleet's
    /// delay of its scope, and takes the result as the scope's; a sample
    /// the store cannot take moves this worker's own delay instead.
    pub(crate) fn share_autothrottle(&self, samples: Vec<(Scope, AutoThrottleSample)>) {
        let (Some(fleet), Ok(runtime)) = (self.fleet(), tokio::runtime::Handle::try_current()) else {
            self.with_scheduler(|scheduler, now, wake| {
                for (scope, sample) in &samples {
                    scheduler.autothrottle_locally(scope, sample, now, wake);
                }
            });
            return;
        };
        for (scope, sample) in samples {
            let (registry, fleet) = (self.clone(), fleet.clone());
            runtime.spawn(async move {
                let shared = fleet.store.autothrottle(scope.clone(), sample).await;
                registry.with_scheduler(|scheduler, now, wake| match &shared {
                    Ok(Some(delay)) => scheduler.adopt_autothrottle(&scope, *delay, now, wake),
                    _ => scheduler.autothrottle_locally(&scope, &sample, now, wake),
                });
                match shared {
                    Ok(_) => fleet.note_answer(),
                    Err(error) => fleet.note_failure(&error),
                }
            });
        }
    }

    fn adopt_rampup(&self, scope: &Scope, state: RampupState, version: u64) {
        self.with_scheduler(|scheduler, now, wake| scheduler.adopt_rampup(scope, state, version, now, wake));
    }
}

fn reading(fleet: &Arc<StoreHandle>) -> std::sync::MutexGuard<'_, std::collections::HashSet<Scope>> {
    fleet.reading.lock().unwrap_or_else(PoisonError::into_inner)
}

fn unreadable(scope: &Scope, state: &str) {
    tracing::warn!(
        target: "tower_throttle",
        %scope,
        state,
        "the fleet's rampup state in the store is not one this version reads; this worker's replaces it"
    );
}
