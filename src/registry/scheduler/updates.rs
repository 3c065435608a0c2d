//! What changes a scope from outside the request path: config
//! replacements and the feedback layers' reports, plus the read-only views
//! stats are built from.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Scheduler, ScopeEntry, ScopeId, WakeList};
use crate::registry::config::ScopeConfig;
use crate::registry::configs::ConfigTable;
use crate::registry::feedback::{AnnouncedLimits, Feedback};
use crate::scope::Scope;
use crate::time::Stamp;

impl Scheduler {
    /// The scope `key`, created if the scheduler has not seen it (a scope
    /// created by an update, with nothing queued, is idle from the start).
    fn scope_for_update(&mut self, key: &Scope, now: Instant) -> ScopeId {
        let id = self.scope_id(key, now);
        self.note_if_idle(id, Stamp::of(now));
        id
    }

    /// Replaces a scope's config (completed from the default, in the
    /// shared table too); waiters re-evaluate at once.
    pub(crate) fn set_scope(&mut self, key: Scope, config: ScopeConfig, now: Instant, wake: &mut WakeList) {
        let config = Arc::new(config.inherit_from(&self.configs.default_config()));
        self.configs_changed();
        if let Some(id) = self.index.get(key.as_str(), &self.scopes) {
            self.close_fast(id);
            self.scopes[id].state.replace_config(config.clone(), now);
            self.dirty.push(id);
            self.wake_bounded(id, wake);
        }
        self.configs.set(key, config);
        self.run_dispatch(now, wake);
    }

    /// The configs, for the registry to read without this lock (see
    /// [`ConfigTable`]).
    pub(crate) fn config_table(&self) -> Arc<ConfigTable> {
        self.configs.clone()
    }

    /// Applies feedback about one response (or error) of a request sent
    /// with `expected_cost` to scope `key`.
    pub(crate) fn feedback(
        &mut self,
        key: &Scope,
        feedback: Feedback,
        expected_cost: f64,
        now: Instant,
        wake: &mut WakeList,
    ) {
        let id = self.scope_for_update(key, now);
        if feedback.is_backoff() {
            self.metrics.backoff(key);
        }
        if self.scopes[id].state.apply_feedback(
            feedback,
            expected_cost,
            now,
            (self.max_concurrency, self.fleet_learns),
        ) {
            self.dirty.push(id);
            self.wake_bounded(id, wake);
            self.run_dispatch(now, wake);
        }
    }

    /// The config scope `key` uses, without creating the scope.
    pub(crate) fn config_arc(&self, key: &str) -> Arc<ScopeConfig> {
        match self.index.get(key, &self.scopes) {
            Some(id) => self.scopes[id].state.config.clone(),
            None => self.configs.config_of(key).0,
        }
    }

    /// Records a robots.txt Crawl-delay for scope `key` (`None`: no delay
    /// known); see [`ScopeState::set_robots_delay`](crate::registry::scope_state::ScopeState::set_robots_delay).
    pub(crate) fn set_robots_delay(
        &mut self,
        key: &Scope,
        crawl_delay: Option<Duration>,
        pinned_until: Option<Instant>,
        now: Instant,
        wake: &mut WakeList,
    ) {
        let id = self.scope_for_update(key, now);
        self.scopes[id].state.set_robots_delay(crawl_delay, pinned_until);
        self.dirty.push(id);
        self.wake_bounded(id, wake);
        self.run_dispatch(now, wake);
    }

    /// Holds scope `key` until `until`; see [`ScopeState::hold`](crate::registry::scope_state::ScopeState::hold). A hold
    /// asked for longer than `max_hold` is capped with a warning naming the
    /// scope and the ask (a hold learnt from the fleet's store is capped
    /// without one: the worker that asked warned).
    pub(crate) fn hold(&mut self, key: &Scope, until: Instant, now: Instant, wake: &mut WakeList) {
        let asked = until.saturating_duration_since(now);
        if asked > self.max_hold {
            tracing::warn!(
                target: "tower_throttle",
                scope = %key,
                asked_s = asked.as_secs(),
                max_hold_s = self.max_hold.as_secs(),
                "a hold longer than the registry's max_hold is capped"
            );
        }
        let id = self.scope_for_update(key, now);
        if self.scopes[id].state.hold(until, now, self.max_hold) {
            self.metrics.hold(key);
            self.dirty.push(id);
            self.wake_bounded(id, wake);
            self.run_dispatch(now, wake);
        }
    }

    /// Paces scope `key`, or stops pacing it; see [`ScopeState::set_pacing`](crate::registry::scope_state::ScopeState::set_pacing).
    pub(crate) fn set_pacing(
        &mut self,
        key: &Scope,
        pacing: Option<(Duration, Instant)>,
        now: Instant,
        wake: &mut WakeList,
    ) {
        let id = self.scope_for_update(key, now);
        self.scopes[id].state.set_pacing(pacing, now);
        self.dirty.push(id);
        self.wake_bounded(id, wake);
        self.run_dispatch(now, wake);
    }

    pub(crate) fn set_announced_limits(&mut self, key: &Scope, limits: AnnouncedLimits, now: Instant) {
        let id = self.scope_for_update(key, now);
        self.scopes[id].state.set_announced_limits(limits);
    }

    /// Every scope the scheduler knows, with its id.
    pub(crate) fn scopes_with_ids(&self) -> impl Iterator<Item = (ScopeId, &ScopeEntry)> {
        self.scopes.iter()
    }

    /// The scope `key` and its id, if the scheduler has seen it.
    pub(crate) fn scope_with_id(&self, key: &str) -> Option<(ScopeId, &ScopeEntry)> {
        self.index.get(key, &self.scopes).map(|id| (id, &self.scopes[id]))
    }

    /// The global cap on requests in flight.
    pub(crate) fn max_concurrency(&self) -> u32 {
        self.max_concurrency
    }

    /// Requests in flight over all scopes.
    pub(crate) fn in_flight(&self) -> u32 {
        self.global.in_flight()
    }

    /// Requests waiting to be sent.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting
    }
}
