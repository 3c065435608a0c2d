//! The built-in rampup search, as a [`ScopeManager`] of its own.

use std::time::Duration;

use tokio::time::Instant;

use super::{BaseLimits, ManagerFeedback, ManagerLimits, ScopeManager};
use crate::registry::rampup::{RampupConfig, RampupState};

/// The built-in rampup search as a [`ScopeManager`]: the same pace search,
/// computed by the same code, as a scope with
/// [`ScopeConfig::rampup`](crate::ScopeConfig::rampup) runs (see
/// [`RampupConfig`]). It answers with a [pace](ManagerLimits::pace), so it
/// may go faster than the scope's configured delay, and sizes the lanes to
/// the pace and the scope's latency as the built-in one does.
///
/// Differences from the built-in rampup, all from being made on the scope's
/// first feedback (as every manager is): its windows start then, not when
/// the scope was created, and it starts from the scope's delay at that
/// moment; until then the scope runs on its config. Like the built-in
/// one's, what it learnt goes with the scope when an idle scope is evicted
/// (a pace is not a limit in force).
/// [`ScopeStats`](crate::ScopeStats) shows its pace as
/// [`LimitSource::Manager`](crate::registry::LimitSource::Manager).
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::registry::manager::Rampup;
/// use tower_throttle::{Registry, ScopeConfig, Scopes};
/// use tower_throttle::registry::{Feedback, LimitSource, RampupConfig};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), tower_throttle::ConfigError> {
/// let registry = Registry::builder()
///     .scope(
///         "api.example",
///         ScopeConfig::default()
///             .delay(Duration::from_secs(1))
///             .manager(|_scope| Box::new(Rampup::new(RampupConfig::default()))),
///     )
///     .build()?;
/// // The first feedback makes the manager; its pace starts at the delay.
/// registry.feedback(&Scopes::from("api.example"), Feedback::success());
/// let stats = registry.scope_stats("api.example").unwrap();
/// assert_eq!((stats.delay, stats.delay_limited_by), (Duration::from_secs(1), LimitSource::Manager));
/// assert_eq!(stats.manager, "rampup");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Rampup {
    config: RampupConfig,
    state: Option<RampupState>,
}

impl Rampup {
    /// A manager searching as `config` says. The config is not checked
    /// here: build it from a [`RampupConfig`] the registry accepted, or
    /// keep to the ranges its methods document.
    pub fn new(config: RampupConfig) -> Self {
        Rampup { config, state: None }
    }

    /// Lanes to keep the pace at the scope's latency, at least its own
    /// (the built-in rule).
    fn lanes(delay: Duration, base: &BaseLimits) -> u32 {
        let latency = base.latency().unwrap_or_default().as_secs_f64();
        let needed = (latency / delay.as_secs_f64().max(1e-6)).ceil() + 1.0;
        (needed.min(f64::from(u32::MAX)) as u32).max(base.concurrency())
    }
}

impl ScopeManager for Rampup {
    fn name(&self) -> &str {
        "rampup"
    }

    fn on_feedback(&mut self, feedback: &ManagerFeedback) {
        let now = feedback.now();
        let state = self
            .state
            .get_or_insert_with(|| RampupState::new(feedback.base().delay(), now));
        if feedback.feedback().is_backoff() {
            let sent = feedback
                .feedback()
                .latency()
                .and_then(|latency| now.checked_sub(latency));
            state.on_backoff_sent(now, sent, &self.config);
        }
    }

    fn limits(&self, _now: Instant, base: &BaseLimits) -> ManagerLimits {
        match &self.state {
            Some(state) => ManagerLimits::none().pace(state.delay, Self::lanes(state.delay, base)),
            None => ManagerLimits::none(),
        }
    }

    fn on_send(&mut self, now: Instant) {
        if let Some(state) = &mut self.state {
            state.roll(now, &self.config);
        }
    }
}
