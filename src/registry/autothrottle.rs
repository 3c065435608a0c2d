//! AutoThrottle: Scrapy's latency-adaptive delay, rule for rule.
//!
//! On every response of a scope (latency = send to response head):
//!
//! 1. `target = latency / target_concurrency`;
//! 2. `new = max(target, (old + target) / 2)`;
//! 3. `new` is clamped to `[configured delay, max_delay]`;
//! 4. a response whose status is not 200 may not lower the delay: if
//!    `new <= old`, the delay stays `old`.
//!
//! The delay starts at `max(configured delay, start_delay)`. A request
//! carrying the [`AutoThrottleExempt`](crate::scope::AutoThrottleExempt)
//! extension does not adjust it; a request with several scopes adjusts each.

use std::time::Duration;

use crate::error::ConfigError;
use crate::store::backend::AutoThrottleSample;
use crate::time::validate_delay;

/// AutoThrottle settings (Scrapy's `AUTOTHROTTLE_*`). Enable it per scope
/// with [`ScopeConfig::autothrottle`](crate::ScopeConfig::autothrottle), or
/// for every scope through the default scope config.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::{Registry, ScopeConfig};
/// use tower_throttle::registry::AutoThrottleConfig;
///
/// let registry = Registry::builder()
///     .default_scope(
///         ScopeConfig::default().autothrottle(AutoThrottleConfig::default().target_concurrency(2.0)),
///     )
///     .build()?;
/// # Ok::<(), tower_throttle::ConfigError>(())
/// ```
///
/// | setting | default |
/// |---|---|
/// | `target_concurrency` | 1.0 |
/// | `start_delay` | 5 s |
/// | `max_delay` | 60 s |
///
/// Values are checked when the registry is built (or when
/// [`Registry::set_scope`](crate::Registry::set_scope) is called): a bad
/// value is a [`ConfigError`] naming the field.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct AutoThrottleConfig {
    target_concurrency: f64,
    start_delay: Duration,
    max_delay: Duration,
}

impl Default for AutoThrottleConfig {
    fn default() -> Self {
        AutoThrottleConfig {
            target_concurrency: 1.0,
            start_delay: Duration::from_secs(5),
            max_delay: Duration::from_secs(60),
        }
    }
}

impl AutoThrottleConfig {
    /// Requests the scope should have in flight on average (default 1.0;
    /// must be finite and above 0).
    #[must_use]
    pub fn target_concurrency(mut self, target: f64) -> Self {
        self.target_concurrency = target;
        self
    }

    /// The delay before the first response adjusts it (default 5 s); the
    /// configured delay wins when larger.
    #[must_use]
    pub fn start_delay(mut self, delay: Duration) -> Self {
        self.start_delay = delay;
        self
    }

    /// The largest delay AutoThrottle sets (default 60 s).
    #[must_use]
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// Requests the scope should have in flight on average.
    #[cfg(feature = "serde")]
    pub(crate) fn get_target_concurrency(&self) -> f64 {
        self.target_concurrency
    }

    /// The delay before the first response adjusts it.
    #[cfg(feature = "serde")]
    pub(crate) fn get_start_delay(&self) -> Duration {
        self.start_delay
    }

    /// The largest delay AutoThrottle sets.
    #[cfg(feature = "serde")]
    pub(crate) fn get_max_delay(&self) -> Duration {
        self.max_delay
    }

    pub(crate) fn validate(&self, name: &str) -> Result<(), ConfigError> {
        if !(self.target_concurrency.is_finite() && self.target_concurrency > 0.0) {
            return Err(ConfigError::new(
                format!("{name} autothrottle target_concurrency"),
                self.target_concurrency,
                "must be finite and greater than 0",
            ));
        }
        validate_delay(&format!("{name} autothrottle start_delay"), self.start_delay)?;
        validate_delay(&format!("{name} autothrottle max_delay"), self.max_delay)
    }

    /// The delay before any response: `max(configured delay, start_delay)`.
    pub(crate) fn start(&self, configured_delay: Duration) -> Duration {
        configured_delay.max(self.start_delay)
    }

    /// The delay after a response with `latency` and status `status`.
    pub(crate) fn next_delay(
        &self,
        old: Duration,
        latency: Duration,
        status: u16,
        configured_delay: Duration,
    ) -> Duration {
        self.sample(latency, status, configured_delay)
            .next_delay(Some(old))
    }

    /// A response's sample with these settings, as a fleet's store takes
    /// it (the rule itself lives with it, so both apply the same one).
    pub(crate) fn sample(
        &self,
        latency: Duration,
        status: u16,
        configured_delay: Duration,
    ) -> AutoThrottleSample {
        AutoThrottleSample {
            latency,
            status,
            configured_delay,
            start_delay: self.start(configured_delay),
            max_delay: self.max_delay,
            target_concurrency: self.target_concurrency,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    /// Scrapy's own test table: (latency, target concurrency, old delay,
    /// status, min delay, max delay) → new delay.
    #[test]
    fn reproduces_scrapys_adjustment_table() {
        let rows: [(f64, f64, f64, u16, f64, f64, f64); 8] = [
            (2.0, 2.0, 1.0, 200, 0.0, 60.0, 1.0),
            (1.0, 2.0, 1.0, 200, 0.0, 60.0, 0.75),
            (4.0, 2.0, 1.0, 200, 0.0, 60.0, 2.0),
            (2.0, 4.0, 1.0, 200, 0.0, 60.0, 0.75),
            (2.0, 2.0, 2.0, 200, 0.0, 60.0, 1.5),
            (2.0, 2.0, 1.0, 200, 0.25, 0.5, 0.5),
            (1.0, 2.0, 1.0, 400, 0.0, 60.0, 1.0),
            (4.0, 2.0, 1.0, 400, 0.0, 60.0, 2.0),
        ];
        for (latency, target, old, status, min, max, expected) in rows {
            let config = AutoThrottleConfig {
                target_concurrency: target,
                start_delay: Duration::ZERO,
                max_delay: secs(max),
            };
            let new = config.next_delay(secs(old), secs(latency), status, secs(min));
            assert_eq!(
                new,
                secs(expected),
                "latency {latency}, target {target}, old {old}, status {status}"
            );
        }
    }

    /// Scrapy's start-delay table: (configured delay, start delay) → first
    /// delay; "unset" is Scrapy's default (0 and 5 s).
    #[test]
    fn reproduces_scrapys_start_delay_table() {
        let rows = [
            (None, None, 5.0),
            (Some(6.0), None, 6.0),
            (None, Some(4.0), 4.0),
            (Some(7.0), Some(6.0), 7.0),
            (Some(6.0), Some(7.0), 7.0),
        ];
        for (min, start, expected) in rows {
            let mut config = AutoThrottleConfig::default();
            if let Some(start) = start {
                config.start_delay = secs(start);
            }
            assert_eq!(
                config.start(secs(min.unwrap_or(0.0))),
                secs(expected),
                "{min:?} {start:?}"
            );
        }
    }

    #[test]
    fn target_concurrency_must_be_finite_and_positive() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let config = AutoThrottleConfig {
                target_concurrency: bad,
                ..AutoThrottleConfig::default()
            };
            let err = config.validate("default scope").unwrap_err();
            assert_eq!(err.field(), "default scope autothrottle target_concurrency");
        }
    }
}
