//! What the feedback layers add to a scope's limits, one field per source.

use std::time::Duration;

use tokio::time::Instant;

use super::manager::Manager;
use crate::registry::backoff::BackoffState;
use crate::registry::config::ScopeConfig;
use crate::registry::feedback::AnnouncedLimits;
use crate::registry::manager::CustomManager;
use crate::registry::rampup::RampupState;

/// What the feedback layers add to a scope's limits. Each source owns one
/// field; [`ScopeState::effective`](super::ScopeState::effective) folds them into the limits the scheduler
/// applies, keeping the most restrictive (smallest concurrency, largest
/// delay). A new source is one more field and one more term in that fold.
#[derive(Debug, Default)]
pub(crate) struct Contributions {
    /// Nothing is sent before this instant (Retry-After, rate-limit resets).
    pub(crate) hold_until: Option<Instant>,
    /// AutoThrottle's current delay, when AutoThrottle is on.
    pub(crate) autothrottle_delay: Option<Duration>,
    /// robots.txt Crawl-delay, and whether it applies (a scope with an
    /// explicit config keeps its own limits).
    pub(crate) robots: Option<RobotsContribution>,
    /// Pacing derived from a server-announced policy (spread the remaining
    /// quota until its reset), and the instant it stops applying.
    pub(crate) pacing: Option<(Duration, Instant)>,
    /// The backoff delay the fleet's scope store reported (another worker's
    /// backoff), and the instant it stops applying.
    pub(crate) fleet_backoff: Option<(Duration, Instant)>,
    /// What the server last announced about its limits (for stats).
    pub(crate) announced: Option<Box<AnnouncedLimits>>,
    /// The current quota window, when the scope has a quota and has spent
    /// from it (boxed: most scopes have no quota).
    pub(crate) quota: Option<Box<QuotaWindow>>,
    /// Backoff feedbacks received (for stats). Counts of feedback live
    /// here rather than in every scope, since only scopes with feedback
    /// have any.
    pub(crate) backoff_feedbacks: u64,
    /// Sum of the actual costs feedback reported (for stats).
    pub(crate) reported_cost: f64,
    /// The state of the scope's one manager (see [`Manager`]): the
    /// built-in backoff after a step (recovery is computed from it when
    /// read), rampup's controller, or a custom manager once made.
    pub(crate) manager: Option<Manager>,
}

/// The contributions of a scope that has none: what
/// [`ScopeState::contributions`](super::ScopeState::contributions) reads for most scopes.
pub(super) static NO_CONTRIBUTIONS: Contributions = Contributions {
    hold_until: None,
    autothrottle_delay: None,
    robots: None,
    pacing: None,
    fleet_backoff: None,
    announced: None,
    quota: None,
    backoff_feedbacks: 0,
    reported_cost: 0.0,
    manager: None,
};

impl Contributions {
    /// The built-in backoff's state, if the scope is backing off.
    pub(crate) fn backoff(&self) -> Option<BackoffState> {
        match &self.manager {
            Some(Manager::Backoff(state)) => Some(*state),
            _ => None,
        }
    }

    /// Sets the built-in backoff's state (`None`: recovered). A no-op on a
    /// scope whose manager is another one.
    pub(crate) fn set_backoff(&mut self, state: Option<BackoffState>) {
        if matches!(self.manager, None | Some(Manager::Backoff(_))) {
            self.manager = state.map(Manager::Backoff);
        }
    }

    /// Rampup's controller, if the scope ramps up.
    pub(crate) fn rampup(&self) -> Option<&RampupState> {
        match &self.manager {
            Some(Manager::Rampup(rampup)) => Some(rampup),
            _ => None,
        }
    }

    /// The custom manager, once made.
    pub(crate) fn custom(&self) -> Option<&CustomManager> {
        match &self.manager {
            Some(Manager::Custom(custom)) => Some(custom),
            _ => None,
        }
    }
}

/// What a scope with a quota has spent in its current window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct QuotaWindow {
    /// The first send of the window; it ends `window` later.
    pub(crate) started: Instant,
    /// Units spent (expected costs at send, corrected by feedback).
    pub(crate) used: f64,
}

/// The robots.txt contribution of a scope.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RobotsContribution {
    pub(crate) crawl_delay: Duration,
    /// Whether it sets the scope's concurrency to 1 (not when the scope's
    /// own config sets a concurrency).
    pub(crate) limits_concurrency: bool,
    /// Whether it raises the scope's delay (not when the scope's own config
    /// sets a delay).
    pub(crate) limits_delay: bool,
    /// The scope is not evicted before then (the robots.txt cache entry's
    /// expiry: the cache tells a scope its Crawl-delay once per entry).
    pub(crate) pinned_until: Option<Instant>,
}

impl RobotsContribution {
    pub(super) fn for_config(
        crawl_delay: Duration,
        config: &ScopeConfig,
        explicit: bool,
        pinned_until: Option<Instant>,
    ) -> Self {
        RobotsContribution {
            crawl_delay,
            limits_concurrency: !(explicit && config.set_by_user.concurrency),
            limits_delay: !(explicit && config.set_by_user.delay),
            pinned_until,
        }
    }

    pub(crate) fn applies(&self) -> bool {
        self.limits_concurrency || self.limits_delay
    }
}
