//! How the feedback layers and config changes update one scope.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::manager::ManagerKind;
use super::{Effective, Manager, QuotaWindow, RobotsContribution, ScopeState};
use crate::registry::backoff::{BackoffNow, BackoffState};
use crate::registry::config::ScopeConfig;
use crate::registry::feedback::{AnnouncedLimits, Feedback};
use crate::registry::manager::{BaseLimits, ManagerFactory, ManagerFeedback};
use crate::registry::rampup::{RampupConfig, RampupState};
use crate::store::backend::{BackoffStep, FleetBackoff};
use crate::time::{saturating_add, MAX_CONFIG_DELAY};

impl ScopeState {
    /// Replaces the scope's config (an explicit one, from
    /// `Registry::set_scope`), keeping what the feedback layers learnt.
    pub(crate) fn replace_config(&mut self, config: Arc<ScopeConfig>, now: Instant) {
        let autothrottle = config.get_autothrottle().copied();
        // Nothing learnt yet: the scope starts as a new one of this config
        // would, without contributions unless the config brings some (an
        // empty set would keep a plain scope off its plain lanes and its
        // word for good).
        let fresh =
            self.contributed.is_none() && autothrottle.is_none() && Manager::initial(&config, now).is_none();
        if fresh {
            self.plain = config.is_plain();
            self.config = config;
            self.explicit = true;
            return;
        }
        let contributions = self.contributed.get_or_insert_with(Box::default);
        contributions.autothrottle_delay = match (autothrottle, contributions.autothrottle_delay) {
            (None, _) => None,
            (Some(_), Some(kept)) => Some(kept.max(config.delay)),
            (Some(autothrottle), None) => Some(autothrottle.start(config.delay)),
        };
        if let Some(robots) = &mut contributions.robots {
            *robots = RobotsContribution::for_config(robots.crawl_delay, &config, true, robots.pinned_until);
        }
        // Another kind of manager (or another factory): the old state means
        // nothing to the new one.
        contributions.manager =
            Manager::across_config_change(contributions.manager.take(), &self.config, &config, now);
        self.plain = config.is_plain();
        self.config = config;
        self.explicit = true;
    }

    /// Applies feedback about one response (or error). Returns whether the
    /// scope's limits changed (backoff feedback: a backoff or rampup step).
    /// `fleet_learns`: rampup's backoffs go to the fleet's search instead,
    /// and the scope adopts the search once they are written.
    pub(crate) fn apply_feedback(
        &mut self,
        feedback: Feedback,
        expected_cost: f64,
        now: Instant,
        (max_concurrency, fleet_learns): (u32, bool),
    ) -> bool {
        let mut quota_changed = false;
        if let Some(cost) = feedback.actual_cost() {
            self.contributions_mut().reported_cost += cost;
            quota_changed |= self.correct_spending(cost - expected_cost, now);
        }
        if let Some(remaining) = feedback.remaining_quota() {
            quota_changed |= self.set_remaining_quota(remaining, now);
        }
        let config = Arc::clone(&self.config);
        let kind = config.manager_kind();
        if !kind.hears(&feedback) {
            return quota_changed;
        }
        if feedback.is_backoff() {
            self.contributions_mut().backoff_feedbacks += 1;
        }
        match kind {
            // With a fleet that learns, the fleet's level steps (in the
            // store) and the scope takes it once stepped.
            ManagerKind::Backoff if fleet_learns => {}
            ManagerKind::Backoff => self.step_backoff(now, max_concurrency),
            ManagerKind::Rampup(rampup) => {
                let sent = feedback.latency().and_then(|latency| now.checked_sub(latency));
                self.tell_rampup(rampup, now, sent.filter(|_| !fleet_learns), fleet_learns);
            }
            ManagerKind::Custom(factory) => self.tell_custom_manager(factory, feedback, now, max_concurrency),
        }
        true
    }

    /// The scope's limits before backoff, and the built-in backoff in force
    /// at `now` (after the steps back quiet windows earned).
    fn backoff_in_force(&self, now: Instant, max_concurrency: u32) -> (Effective, Option<BackoffNow>) {
        let base = self.effective_before_backoff(max_concurrency);
        let current = self
            .contributions()
            .backoff()
            .and_then(|state| state.at(now, self.config.get_backoff(), base.concurrency));
        (base, current)
    }

    /// The built-in backoff's step up on backoff feedback, from the limits
    /// in force at `now` (after the steps back quiet windows earned).
    pub(crate) fn step_backoff(&mut self, now: Instant, max_concurrency: u32) {
        self.note_backoff_recovery(now, max_concurrency);
        let (base, current) = self.backoff_in_force(now, max_concurrency);
        let config = self.config.get_backoff();
        let stepped = BackoffState::step(current, now, config, base.delay, base.concurrency);
        tracing::debug!(
            target: "tower_throttle",
            scope = %self.key,
            level = stepped.level,
            delay_ms = stepped.delay.as_millis() as u64,
            concurrency = stepped.concurrency,
            "backoff step up"
        );
        self.contributions_mut().set_backoff(Some(stepped));
    }

    /// The built-in backoff's settings with the scope's delay before
    /// backoff, for the fleet's store to step (`None` when another manager
    /// runs the scope).
    pub(crate) fn backoff_step_terms(&self, max_concurrency: u32) -> Option<BackoffStep> {
        if !matches!(self.config.manager_kind(), ManagerKind::Backoff) {
            return None;
        }
        let base = self.effective_before_backoff(max_concurrency);
        Some(self.config.get_backoff().step_terms(base.delay))
    }

    /// Takes the fleet's backoff in force (`None`: none) as the built-in
    /// backoff's state; whether the scope's limits changed.
    pub(crate) fn adopt_fleet_backoff(
        &mut self,
        fleet: Option<FleetBackoff>,
        now: Instant,
        max_concurrency: u32,
    ) -> bool {
        if !matches!(self.config.manager_kind(), ManagerKind::Backoff) {
            return false;
        }
        let (base, current) = self.backoff_in_force(now, max_concurrency);
        let config = self.config.get_backoff();
        let same = match (fleet, current) {
            (None, None) => true,
            (Some(fleet), Some(current)) => {
                fleet.level == current.level && fleet.delay.abs_diff(current.delay) < Duration::from_millis(1)
            }
            _ => false,
        };
        if same {
            return false;
        }
        let adopted = fleet.map(|fleet| BackoffState::of_fleet(fleet, now, config, base.concurrency));
        self.contributed
            .get_or_insert_with(Box::default)
            .set_backoff(adopted);
        true
    }

    /// Rampup's slow-down on backoff feedback, for a request sent at `sent`
    /// when known; with `fleet_learns`, only makes sure the search exists
    /// (the fleet's search takes the backoff: see `registry::learning`).
    pub(crate) fn tell_rampup(
        &mut self,
        config: &RampupConfig,
        now: Instant,
        sent: Option<Instant>,
        fleet_learns: bool,
    ) {
        let delay = self.config.delay;
        let contributions = self.contributed.get_or_insert_with(Box::default);
        if !matches!(contributions.manager, Some(Manager::Rampup(_))) {
            contributions.manager = Some(Manager::Rampup(Box::new(RampupState::new(delay, now))));
        }
        let Some(Manager::Rampup(rampup)) = contributions.manager.as_mut() else {
            return;
        };
        if fleet_learns {
            return;
        }
        let before = rampup.delay;
        rampup.on_backoff_sent(now, sent, config);
        tracing::debug!(
            target: "tower_throttle",
            scope = %self.key,
            old_delay_ms = before.as_secs_f64() * 1000.0,
            new_delay_ms = rampup.delay.as_secs_f64() * 1000.0,
            "rampup: backoff feedback"
        );
    }

    /// Tells the scope's custom manager about `feedback`, making the
    /// manager first if this is the scope's first feedback since it was
    /// created.
    fn tell_custom_manager(
        &mut self,
        factory: &ManagerFactory,
        feedback: Feedback,
        now: Instant,
        max_concurrency: u32,
    ) {
        let base = self.effective_before_backoff(max_concurrency);
        let base = BaseLimits::new(base.delay, base.concurrency, self.latency());
        let contributions = self.contributed.get_or_insert_with(Box::default);
        if !matches!(contributions.manager, Some(Manager::Custom(_))) {
            contributions.manager = Some(Manager::Custom(factory.create(&self.key)));
        }
        let Some(Manager::Custom(manager)) = contributions.manager.as_mut() else {
            return;
        };
        manager.on_feedback(&ManagerFeedback::new(feedback, now, base));
        tracing::debug!(
            target: "tower_throttle",
            scope = %self.key,
            manager = manager.name(),
            backoff = feedback.is_backoff(),
            status = feedback.status().map(|status| status.as_u16()),
            "scope manager told of feedback"
        );
    }

    /// Applies the difference between what a request actually cost and what
    /// it was expected to cost to the current quota window. Returns whether
    /// the spending changed.
    pub(crate) fn correct_spending(&mut self, difference: f64, now: Instant) -> bool {
        if difference == 0.0 || self.current_window(now).is_none() {
            return false;
        }
        let Some(window) = self.contributions_mut().quota.as_deref_mut() else {
            return false;
        };
        window.used = (window.used + difference).max(0.0);
        true
    }

    /// Sets the current window's spending from what the server says is
    /// left (`quota − remaining`), starting a window now if none is
    /// current. Returns whether the spending changed.
    pub(crate) fn set_remaining_quota(&mut self, remaining: f64, now: Instant) -> bool {
        let Some(quota) = self.config.get_quota() else {
            return false;
        };
        let used = (quota - remaining).max(0.0);
        if self.current_window(now).is_none() {
            self.contributions_mut().quota = Some(Box::new(QuotaWindow { started: now, used }));
            return true;
        }
        match self.contributions_mut().quota.as_deref_mut() {
            Some(window) if window.used != used => {
                window.used = used;
                true
            }
            _ => false,
        }
    }

    /// Records a robots.txt Crawl-delay (`None`: no delay known). It applies
    /// unless the scope has an explicit config, which keeps precedence with
    /// a warning (silenced by `ignore_robots_txt`).
    pub(crate) fn set_robots_delay(&mut self, crawl_delay: Option<Duration>, pinned_until: Option<Instant>) {
        let previous = self.contributions().robots;
        let robots = crawl_delay.map(|crawl_delay| {
            RobotsContribution::for_config(crawl_delay, &self.config, self.explicit, pinned_until)
        });
        self.contributions_mut().robots = robots;
        let overridden = self
            .contributions()
            .robots
            .is_some_and(|robots| !robots.limits_concurrency || !robots.limits_delay);
        let known_before = previous.is_some_and(|robots| Some(robots.crawl_delay) == crawl_delay);
        if overridden && !self.config.ignore_robots_txt && !known_before {
            tracing::warn!(
                target: "tower_throttle",
                scope = %self.key,
                crawl_delay_ms = crawl_delay.unwrap_or_default().as_millis() as u64,
                concurrency = self.config.concurrency,
                delay_ms = self.config.delay.as_millis() as u64,
                "robots.txt asks for a Crawl-delay that the scope's explicit config overrides \
                 (set ignore_robots_txt on the scope to silence this)"
            );
        }
    }

    /// Holds the scope: nothing of it is sent before `until`, capped at
    /// `max_hold` from now. A later hold extends an earlier one; an earlier
    /// one does not shorten it. Returns whether the hold changed.
    pub(crate) fn hold(&mut self, until: Instant, now: Instant, max_hold: Duration) -> bool {
        let until = until.min(saturating_add(now, max_hold));
        if self
            .contributions()
            .hold_until
            .is_some_and(|known| known >= until)
        {
            return false;
        }
        self.contributions_mut().hold_until = Some(until);
        tracing::debug!(
            target: "tower_throttle",
            scope = %self.key,
            hold_ms = until.saturating_duration_since(now).as_millis() as u64,
            "scope held"
        );
        true
    }

    /// Paces the scope at `delay` between sends until `until` (the delay
    /// capped at the scope's backoff `max_delay`, the span at
    /// [`MAX_CONFIG_DELAY`]), or stops pacing it (`None`).
    pub(crate) fn set_pacing(&mut self, pacing: Option<(Duration, Instant)>, now: Instant) {
        let cap = self.config.get_backoff().max_delay;
        let longest = saturating_add(now, MAX_CONFIG_DELAY);
        self.contributions_mut().pacing = pacing.map(|(delay, until)| (delay.min(cap), until.min(longest)));
    }

    /// Records the backoff delay the fleet's store reported, and until
    /// when (`None`: none). Returns whether it changed.
    pub(crate) fn set_fleet_backoff(&mut self, fleet_backoff: Option<(Duration, Instant)>) -> bool {
        if self.contributions().fleet_backoff == fleet_backoff {
            return false;
        }
        self.contributions_mut().fleet_backoff = fleet_backoff;
        true
    }

    /// Records what the server announced about the scope's limits.
    pub(crate) fn set_announced_limits(&mut self, limits: AnnouncedLimits) {
        match &mut self.contributions_mut().announced {
            Some(known) => **known = limits,
            empty => *empty = Some(Box::new(limits)),
        }
    }

    /// Whether forgetting the idle scope now loses nothing that still limits
    /// it: no hold, backoff, pacing or quota window in force, no robots.txt
    /// Crawl-delay whose cache entry is still valid, and (`under_pressure`
    /// aside, when the registry is full) no rampup pace learnt. A scope
    /// created again starts from its configured limits.
    pub(crate) fn may_be_forgotten(&self, now: Instant, under_pressure: bool) -> bool {
        let contributions = self.contributions();
        let held = contributions.hold_until.is_some_and(|until| until > now);
        let backing_off = contributions.backoff().is_some_and(|state| {
            state
                .at(now, self.config.get_backoff(), self.config.concurrency)
                .is_some()
        });
        let paced = contributions.pacing.is_some_and(|(_, until)| until > now)
            || contributions.fleet_backoff.is_some_and(|(_, until)| until > now);
        let robots_pinned = contributions
            .robots
            .and_then(|robots| robots.pinned_until)
            .is_some_and(|until| until > now);
        let rampup_kept = under_pressure && contributions.rampup().is_some();
        let managed = contributions.custom().is_some_and(|manager| {
            let base = BaseLimits::new(self.config.delay, self.config.concurrency, self.latency());
            manager.limits(now, &base).limits_anything(now)
        });
        !(held
            || backing_off
            || paced
            || robots_pinned
            || rampup_kept
            || managed
            || self.current_window(now).is_some())
    }
}
