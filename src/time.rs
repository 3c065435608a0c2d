//! Durations, jitter and 8-byte instants (stamps): the leaf the registry's
//! modules (config, backoff, rampup, AutoThrottle, the scheduler), the
//! stores and the robots.txt cache import, so imports point one way.

use std::num::NonZeroU64;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::ConfigError;

/// The longest delay any setting accepts. Longer values are almost certainly
/// a unit mistake (milliseconds given as seconds) and would overflow timers.
pub const MAX_CONFIG_DELAY: Duration = Duration::from_secs(7 * 24 * 3600);

/// A jitter as a user writes it, for error messages: the factor when it is
/// symmetric (`0.5`), `[below, above]` otherwise.
struct AsWritten(Jitter);

impl std::fmt::Debug for AsWritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Jitter { below, above } = self.0;
        if below == above {
            write!(f, "{below:?}")
        } else {
            write!(f, "[{below:?}, {above:?}]")
        }
    }
}

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

/// An instant in 8 bytes, for what every scope keeps (its last sends, when it
/// went idle): a million scopes make each byte count, and a
/// `tokio::time::Instant` takes 16.
///
/// It counts nanoseconds from an origin fixed once per process, offset by
/// [`STAMP_BIAS`] so that instants up to ~146 years before the origin fit as
/// well as those after it (a paused test runtime may start before another
/// one fixed the origin). Conversion either way is exact to the nanosecond,
/// so nothing scheduled moves, and `Option<Stamp>` is 8 bytes too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Stamp(NonZeroU64);

/// Where the origin sits in a stamp's range: half way up, roughly.
const STAMP_BIAS: u64 = 1 << 62;

/// The origin of every [`Stamp`]. Any instant would do (results never
/// depend on it, only differences do); the first one asked for is used.
static STAMP_ORIGIN: OnceLock<Instant> = OnceLock::new();

fn stamp_origin(first_use: Instant) -> Instant {
    *STAMP_ORIGIN.get_or_init(|| first_use)
}

/// `duration` in nanoseconds, saturating (at 584 years), without the
/// 128-bit arithmetic of `as_nanos`: this is on every request's path.
fn nanos_saturating(duration: Duration) -> u64 {
    duration
        .as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(duration.subsec_nanos()))
}

impl Stamp {
    /// The earliest stamp: no gap that runs from it blocks anything now.
    pub(crate) const EARLIEST: Stamp = Stamp(NonZeroU64::MIN);
    /// The latest stamp, centuries past any instant a run reaches: a
    /// marker, never a send.
    pub(crate) const LATEST: Stamp = Stamp(NonZeroU64::MAX);

    /// The stamp of `instant`.
    pub(crate) fn of(instant: Instant) -> Stamp {
        let origin = stamp_origin(instant);
        // One subtraction on the common path (an instant after the origin).
        let biased = match instant.checked_duration_since(origin) {
            Some(since) => STAMP_BIAS.saturating_add(nanos_saturating(since)),
            None => STAMP_BIAS.saturating_sub(nanos_saturating(origin - instant)),
        };
        Stamp(NonZeroU64::new(biased).unwrap_or(NonZeroU64::MIN))
    }

    /// The instant this stamp stands for.
    pub(crate) fn instant(self) -> Instant {
        // A stamp exists only once `of` fixed the origin, so the fallback
        // is never taken.
        let origin = STAMP_ORIGIN.get().copied().unwrap_or_else(Instant::now);
        let biased = self.0.get();
        if biased >= STAMP_BIAS {
            saturating_add(origin, Duration::from_nanos(biased - STAMP_BIAS))
        } else {
            origin
                .checked_sub(Duration::from_nanos(STAMP_BIAS - biased))
                .unwrap_or(origin)
        }
    }

    /// `gap` later (saturating far in the future: a gap too large to add is
    /// one that never ends).
    pub(crate) fn after(self, gap: Duration) -> Stamp {
        let later = self.0.get().saturating_add(nanos_saturating(gap));
        Stamp(NonZeroU64::new(later).unwrap_or(self.0))
    }

    /// The time from `earlier` to this stamp (zero if `earlier` is later).
    pub(crate) fn since(self, earlier: Stamp) -> Duration {
        Duration::from_nanos(self.0.get().saturating_sub(earlier.0.get()))
    }

    /// The stamp's value, for an atomic (never 0).
    pub(crate) fn value(self) -> u64 {
        self.0.get()
    }

    /// The stamp of a [`value`](Self::value); `None` for 0 (an atomic
    /// that holds no stamp yet).
    pub(crate) fn from_value(value: u64) -> Option<Stamp> {
        NonZeroU64::new(value).map(Stamp)
    }

    /// The stamp `secs` whole seconds after the origin.
    pub(crate) fn from_coarse_secs(secs: u32) -> Stamp {
        let biased = STAMP_BIAS + u64::from(secs) * 1_000_000_000;
        Stamp(NonZeroU64::new(biased).unwrap_or(NonZeroU64::MIN))
    }

    /// Whole seconds since the origin, as a coarse 4-byte instant (saturating;
    /// 0 for instants before the origin).
    pub(crate) fn coarse_secs(self) -> u32 {
        let secs = self.0.get().saturating_sub(STAMP_BIAS) / 1_000_000_000;
        u32::try_from(secs).unwrap_or(u32::MAX)
    }
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
    pub(crate) fn below(&self) -> f64 {
        self.below
    }

    /// How far above 1 the factor may go.
    pub(crate) fn above(&self) -> f64 {
        self.above
    }

    /// Whether this jitter changes nothing.
    pub(crate) fn is_none(&self) -> bool {
        self.below == 0.0 && self.above == 0.0
    }

    pub(crate) fn validate(&self, field: &str) -> Result<(), ConfigError> {
        let Jitter { below, above } = *self;
        let reject = |reason| Err(ConfigError::new(field, AsWritten(*self), reason));
        if !below.is_finite() || !above.is_finite() {
            return reject("must be finite");
        }
        if below < 0.0 || above < 0.0 {
            return reject("must not be negative");
        }
        if above > 100.0 {
            return reject("the part above 1 must be at most 100");
        }
        if below > 1.0 {
            return reject("the part below 1 must be at most 1 (waits cannot be negative)");
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
