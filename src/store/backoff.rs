//! The built-in backoff for a fleet: one level per scope, stepped up in the
//! store by every worker's backoff feedback and stepped back by quiet
//! windows the same way in every worker (see the [module docs](super#what-the-fleet-learns)).

use std::time::Duration;

/// A scope's backoff settings with its delay before backoff: what a store
/// needs to step the fleet's backoff up ([`ScopeStore::step_backoff`](super::ScopeStore::step_backoff))
/// and to tell the level in force at any later instant.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct BackoffStep {
    /// The scope's delay without backoff: the first step grows it.
    pub base_delay: Duration,
    /// Each step multiplies the delay by this (at least 1.0).
    pub delay_factor: f64,
    /// The smallest delay while backing off; below it the backoff is over.
    pub min_delay: Duration,
    /// The largest delay a step sets.
    pub max_delay: Duration,
    /// Quiet time after which the level takes one step back.
    pub window: Duration,
}

/// The backoff in force in a scope: its level, its delay, and the time
/// until the next step back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FleetBackoff {
    /// Steps up not yet stepped back (at least 1).
    pub level: u32,
    /// Each gap is at least this.
    pub delay: Duration,
    /// When the next step back comes, from now.
    pub next_step_back: Duration,
}

impl FleetBackoff {
    /// The backoff at `level` with `delay`, stepping back in
    /// `next_step_back`.
    pub fn new(level: u32, delay: Duration, next_step_back: Duration) -> Self {
        FleetBackoff {
            level,
            delay,
            next_step_back,
        }
    }
}

impl BackoffStep {
    /// One step up from the backoff in force (`None`: none; its level and
    /// delay): one level more, the delay (or the base delay) times the
    /// factor, within `[min_delay, max_delay]`.
    pub fn step(&self, current: Option<(u32, Duration)>) -> (u32, Duration) {
        let (level, delay) = current.unwrap_or((0, self.base_delay));
        let grown =
            Duration::try_from_secs_f64(delay.as_secs_f64() * self.delay_factor).unwrap_or(self.max_delay);
        (
            level.saturating_add(1),
            grown.max(self.min_delay).min(self.max_delay),
        )
    }

    /// The backoff in force `quiet` after a step that left `level` and
    /// `delay`: one step back per whole window (the delay divided by the
    /// factor), over once the level is spent or the delay falls below
    /// `min_delay` (`None`).
    pub fn recovered(&self, level: u32, delay: Duration, quiet: Duration) -> Option<FleetBackoff> {
        let steps_back = (quiet.as_nanos() / self.window.as_nanos().max(1)).min(u128::from(u32::MAX)) as u32;
        if steps_back >= level {
            return None;
        }
        let divisor = self.delay_factor.powi(steps_back.min(1_000) as i32);
        let delay = Duration::try_from_secs_f64(delay.as_secs_f64() / divisor).unwrap_or(Duration::ZERO);
        if delay < self.min_delay {
            return None;
        }
        let next_step_back = self
            .window
            .checked_mul(steps_back + 1)
            .unwrap_or(Duration::MAX)
            .saturating_sub(quiet);
        Some(FleetBackoff {
            level: level - steps_back,
            delay,
            next_step_back,
        })
    }
}
