//! Durations and jitter: the leaf every other registry module imports
//! (config, backoff, rampup, AutoThrottle and the scheduler), so imports
//! point one way.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::ConfigError;

/// The longest delay any setting accepts. Longer values are almost certainly
/// a unit mistake (milliseconds given as seconds) and would overflow timers.
pub const MAX_CONFIG_DELAY: Duration = Duration::from_secs(7 * 24 * 3600);

/// `at + gap`, or [`MAX_CONFIG_DELAY`] after `at` when `gap` is too large to
/// add (`Duration::MAX` from an unbounded setting): never a panic.
pub(crate) fn saturating_add(at: Instant, gap: Duration) -> Instant {
    at.checked_add(gap)
        .or_else(|| at.checked_add(MAX_CONFIG_DELAY))
        .unwrap_or(at)
}

/// `gap` multiplied by a jitter `factor`, or [`MAX_CONFIG_DELAY`] when the
/// product does not fit a `Duration`.
pub(crate) fn scale(gap: Duration, factor: f64) -> Duration {
    if factor == 1.0 {
        return gap;
    }
    Duration::try_from_secs_f64(gap.as_secs_f64() * factor).unwrap_or(MAX_CONFIG_DELAY)
}

/// Random variation applied to every computed wait: each wait is multiplied
/// by a factor drawn uniformly from `[1 - below, 1 + above]`.
///
/// The factor is drawn anew for every send and never stored, so the *mean*
/// gap between sends equals the configured delay when the jitter is
/// symmetric.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Jitter {
    below: f64,
    above: f64,
}

impl Jitter {
    /// No variation.
    pub const NONE: Jitter = Jitter {
        below: 0.0,
        above: 0.0,
    };

    /// `±factor`: waits vary in `[1 - factor, 1 + factor] × wait`.
    pub const fn symmetric(factor: f64) -> Self {
        Jitter {
            below: factor,
            above: factor,
        }
    }

    /// Waits vary in `[1 - below, 1 + above] × wait`.
    pub const fn range(below: f64, above: f64) -> Self {
        Jitter { below, above }
    }

    /// How far below 1 the factor may go.
    pub fn below(&self) -> f64 {
        self.below
    }

    /// How far above 1 the factor may go.
    pub fn above(&self) -> f64 {
        self.above
    }

    /// Whether this jitter changes nothing.
    pub fn is_none(&self) -> bool {
        self.below == 0.0 && self.above == 0.0
    }

    pub(crate) fn validate(&self, field: &str) -> Result<(), ConfigError> {
        let Jitter { below, above } = *self;
        if !below.is_finite() || !above.is_finite() {
            return Err(ConfigError::new(field, (below, above), "must be finite"));
        }
        if below < 0.0 || above < 0.0 {
            return Err(ConfigError::new(field, (below, above), "must not be negative"));
        }
        if above > 100.0 {
            return Err(ConfigError::new(
                field,
                (below, above),
                "the part above 1 must be at most 100",
            ));
        }
        if below > 1.0 {
            return Err(ConfigError::new(
                field,
                (below, above),
                "the part below 1 must be at most 1 (waits cannot be negative)",
            ));
        }
        Ok(())
    }

    /// The factor at position `draw` (uniform in `[0, 1)`) of this
    /// jitter's range `[1 - below, 1 + above]`.
    pub(crate) fn factor(&self, draw: f64) -> f64 {
        if self.is_none() {
            return 1.0;
        }
        (1.0 - self.below + draw * (self.below + self.above)).max(0.0)
    }
}

impl From<f64> for Jitter {
    fn from(factor: f64) -> Self {
        Jitter::symmetric(factor)
    }
}

impl From<[f64; 2]> for Jitter {
    fn from([below, above]: [f64; 2]) -> Self {
        Jitter::range(below, above)
    }
}

impl From<(f64, f64)> for Jitter {
    fn from((below, above): (f64, f64)) -> Self {
        Jitter::range(below, above)
    }
}

pub(crate) fn validate_delay(field: &str, delay: Duration) -> Result<(), ConfigError> {
    if delay > MAX_CONFIG_DELAY {
        return Err(ConfigError::new(field, delay, "must be at most 7 days"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_its_range() {
        let mut rng = fastrand::Rng::with_seed(7);
        let jitter = Jitter::range(0.25, 0.5);
        let factors: Vec<f64> = (0..10_000).map(|_| jitter.factor(rng.f64())).collect();
        assert!(factors.iter().all(|f| (0.75..=1.5).contains(f)));
        let mean = factors.iter().sum::<f64>() / factors.len() as f64;
        assert!((mean - 1.125).abs() < 0.01, "mean factor {mean}");
        assert_eq!(Jitter::NONE.factor(0.3), 1.0);
    }
}
