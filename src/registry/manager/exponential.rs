//! The built-in exponential backoff, as a [`ScopeManager`] of its own.

use tokio::time::Instant;

use super::{BaseLimits, ManagerFeedback, ManagerLimits, ScopeManager};
use crate::registry::backoff::{BackoffConfig, BackoffState};

/// The built-in exponential backoff with quiet-window recovery, as a
/// [`ScopeManager`]: the same steps, computed by the same code, as a scope
/// without a custom manager takes (see [`BackoffConfig`]). Use it to build
/// a manager that adds to the built-in behaviour (delegate to it, then
/// adjust its answer), or to give some scopes a backoff policy other than
/// their config's.
///
/// Two differences from the built-in manager, both of presentation: the
/// scope's own jitter applies to its delay (the built-in one switches to the
/// backoff `jitter`), and [`ScopeStats`](crate::ScopeStats) shows its steps
/// as [`LimitSource::Manager`](crate::registry::LimitSource::Manager), not in
/// `backoff_level`.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::registry::manager::ExponentialBackoff;
/// use tower_throttle::{Registry, ScopeConfig, Scopes};
/// use tower_throttle::registry::{BackoffConfig, Feedback};
///
/// let registry = Registry::builder()
///     .scope_manager(|_scope| {
///         Box::new(ExponentialBackoff::new(BackoffConfig::default().delay_factor(3.0)))
///     })
///     .build()?;
/// registry.feedback(&Scopes::from("api"), Feedback::backoff());
/// registry.feedback(&Scopes::from("api"), Feedback::backoff());
/// // The default scope's 1 s delay, times 3 per step.
/// assert_eq!(registry.scope_stats("api").unwrap().delay, Duration::from_secs(9));
/// # Ok::<(), tower_throttle::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ExponentialBackoff {
    config: BackoffConfig,
    state: Option<BackoffState>,
}

impl ExponentialBackoff {
    /// A manager stepping as `config` says. The config is not checked
    /// here: use one the registry accepted in a
    /// [`ScopeConfig`](crate::ScopeConfig), or keep to the ranges its
    /// methods document.
    pub fn new(config: BackoffConfig) -> Self {
        ExponentialBackoff { config, state: None }
    }
}

impl ScopeManager for ExponentialBackoff {
    fn name(&self) -> &str {
        "exponential-backoff"
    }

    fn on_feedback(&mut self, feedback: &ManagerFeedback) {
        if !feedback.feedback().is_backoff() {
            return;
        }
        let (now, base) = (feedback.now(), feedback.base());
        let current = self
            .state
            .and_then(|state| state.at(now, &self.config, base.concurrency()));
        self.state = Some(BackoffState::step(
            current,
            now,
            &self.config,
            base.delay(),
            base.concurrency(),
        ));
    }

    fn limits(&self, now: Instant, base: &BaseLimits) -> ManagerLimits {
        match self
            .state
            .and_then(|state| state.at(now, &self.config, base.concurrency()))
        {
            Some(current) => ManagerLimits::none()
                .delay(current.delay)
                .concurrency(current.concurrency)
                .review_at(current.next_step_back),
            None => ManagerLimits::none(),
        }
    }
}
