//! A scope's one manager: how it reacts to backoff feedback.
//!
//! Every scope has exactly one, chosen by its config
//! ([`ScopeConfig::manager_kind`]): the built-in exponential backoff, the
//! built-in rampup search, or a custom [`ScopeManager`](crate::registry::manager::ScopeManager).
//! Its state is one [`Manager`] in the scope's contributions; the built-ins
//! are dispatched statically (a `match`), a custom one through its box.
//! The public [`ExponentialBackoff`](crate::registry::manager::ExponentialBackoff)
//! and [`Rampup`](crate::registry::manager::Rampup) managers run the same
//! state machines ([`BackoffState`], [`RampupState`]).

use std::borrow::Cow;

use tokio::time::Instant;

use crate::registry::backoff::BackoffState;
use crate::registry::config::ScopeConfig;
use crate::registry::feedback::{Feedback, FeedbackKind};
use crate::registry::manager::{CustomManager, ManagerFactory, DEFAULT_MANAGER_NAME, PENDING_MANAGER_NAME};
use crate::registry::rampup::{RampupConfig, RampupState};

/// Which manager a config gives its scopes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ManagerKind<'a> {
    /// Exponential backoff with quiet-window recovery (the default).
    Backoff,
    /// The rampup search for the fastest accepted pace.
    Rampup(&'a RampupConfig),
    /// A custom manager, made by this factory on the scope's first feedback.
    Custom(&'a ManagerFactory),
}

impl ScopeConfig {
    /// The one place that decides a scope's manager: a custom factory wins,
    /// then rampup, then the built-in backoff.
    pub(crate) fn manager_kind(&self) -> ManagerKind<'_> {
        match (&self.manager, self.get_rampup()) {
            (Some(factory), _) => ManagerKind::Custom(factory),
            (None, Some(rampup)) => ManagerKind::Rampup(rampup),
            (None, None) => ManagerKind::Backoff,
        }
    }
}

impl ManagerKind<'_> {
    /// Whether the manager hears successes too (and wants their latency):
    /// only a custom one does.
    pub(crate) fn hears_successes(&self) -> bool {
        matches!(self, ManagerKind::Custom(_))
    }

    /// Whether the manager is told of `feedback`: the built-ins hear
    /// backoff feedback only, a custom manager everything but
    /// [`FeedbackKind::Ignore`].
    pub(crate) fn hears(&self, feedback: &Feedback) -> bool {
        match self {
            ManagerKind::Backoff | ManagerKind::Rampup(_) => feedback.kind() == FeedbackKind::Backoff,
            ManagerKind::Custom(_) => feedback.kind() != FeedbackKind::Ignore,
        }
    }
}

/// The state of a scope's manager. `None` in the scope means none kept:
/// the built-in backoff before its first step and after full recovery, a
/// custom manager before its first feedback (which keeps idle scopes
/// small).
#[derive(Debug)]
pub(crate) enum Manager {
    /// Exponential backoff after its last step.
    Backoff(BackoffState),
    /// The rampup controller (made with the scope: it paces from the start).
    Rampup(Box<RampupState>),
    /// A custom manager.
    Custom(CustomManager),
}

impl Manager {
    /// The state a scope with `config` starts with: rampup's controller, or
    /// nothing yet.
    pub(crate) fn initial(config: &ScopeConfig, now: Instant) -> Option<Manager> {
        match config.manager_kind() {
            ManagerKind::Rampup(_) => Some(Manager::Rampup(Box::new(RampupState::new(config.delay, now)))),
            ManagerKind::Backoff | ManagerKind::Custom(_) => None,
        }
    }

    /// What a scope keeps of `kept` when its config changes from `old` to
    /// `new`: the state if the manager stays the same kind (the same
    /// factory, for a custom one), else the new config's initial state.
    pub(crate) fn across_config_change(
        kept: Option<Manager>,
        old: &ScopeConfig,
        new: &ScopeConfig,
        now: Instant,
    ) -> Option<Manager> {
        let same = match (old.manager_kind(), new.manager_kind()) {
            (ManagerKind::Backoff, ManagerKind::Backoff)
            | (ManagerKind::Rampup(_), ManagerKind::Rampup(_)) => true,
            (ManagerKind::Custom(old), ManagerKind::Custom(new)) => old == new,
            _ => false,
        };
        match kept {
            Some(state) if same => Some(state),
            _ => Manager::initial(new, now),
        }
    }

    /// Tells the manager a request of its scope is sent at `now`.
    pub(crate) fn on_send(&mut self, now: Instant, config: &ScopeConfig) {
        match self {
            Manager::Backoff(_) => {}
            Manager::Rampup(rampup) => {
                if let Some(rampup_config) = config.get_rampup() {
                    rampup.roll(now, rampup_config);
                }
            }
            Manager::Custom(custom) => custom.on_send(now),
        }
    }

    /// The name [`ScopeStats::manager`](crate::ScopeStats::manager) shows.
    pub(crate) fn name_in_stats(manager: Option<&Manager>, config: &ScopeConfig) -> Cow<'static, str> {
        match (manager, config.manager_kind()) {
            (Some(Manager::Custom(custom)), _) => Cow::Owned(custom.name().to_owned()),
            (_, ManagerKind::Custom(_)) => Cow::Borrowed(PENDING_MANAGER_NAME),
            _ => Cow::Borrowed(DEFAULT_MANAGER_NAME),
        }
    }
}
