//! Exponential backoff: its settings and the per-scope state machine.
//!
//! A backoff *step* multiplies the scope's delay by `delay_factor` (at least
//! `min_delay`, at most `max_delay`) and its concurrency by
//! `concurrency_factor` (at least 1). After `window` without new backoff
//! feedback the scope takes one step back (delay divided by the factor,
//! concurrency multiplied back up to its config); once the delay would fall
//! below `min_delay` the scope is back on its configured limits. Recovery is
//! computed from the instant of the last step whenever the limits are read,
//! so no timer runs for it.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::ConfigError;
use crate::store::backend::{BackoffStep, FleetBackoff};
use crate::time::{saturating_add, validate_delay, Jitter};

/// Status codes that are backoff feedback by default: 429, 502, 503, 504
/// and Cloudflare's 520–524.
pub const DEFAULT_BACKOFF_CODES: [u16; 9] = [429, 502, 503, 504, 520, 521, 522, 523, 524];

/// How a scope backs off when the server pushes back (Scrapy's `BACKOFF_*`
/// settings). Set it for every scope through the default scope config, or
/// per scope with [`ScopeConfig::backoff`](crate::ScopeConfig::backoff).
///
/// | setting | default |
/// |---|---|
/// | `http_codes` | 429, 502, 503, 504, 520–524 |
/// | `delay_factor` | 2.0 |
/// | `min_delay` | 1 s |
/// | `max_delay` | 300 s |
/// | `jitter` | ±0.1 (replaces the scope's jitter while backing off) |
/// | `window` | 60 s without backoff feedback before one step back |
/// | `concurrency_factor` | 0.5 |
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::{ScopeConfig};
/// use tower_throttle::registry::BackoffConfig;
///
/// let patient = ScopeConfig::default().backoff(
///     BackoffConfig::default()
///         .min_delay(Duration::from_secs(5))
///         .delay_factor(3.0)
///         .http_codes([429, 503]),
/// );
/// # drop(patient);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BackoffConfig {
    pub(crate) http_codes: Vec<u16>,
    pub(crate) delay_factor: f64,
    pub(crate) min_delay: Duration,
    pub(crate) max_delay: Duration,
    pub(crate) jitter: Jitter,
    pub(crate) window: Duration,
    pub(crate) concurrency_factor: f64,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            http_codes: DEFAULT_BACKOFF_CODES.to_vec(),
            delay_factor: 2.0,
            min_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(300),
            jitter: Jitter::symmetric(0.1),
            window: Duration::from_secs(60),
            concurrency_factor: 0.5,
        }
    }
}

impl BackoffConfig {
    /// Response status codes that are backoff feedback.
    #[must_use]
    pub fn http_codes(mut self, codes: impl IntoIterator<Item = u16>) -> Self {
        self.http_codes = codes.into_iter().collect();
        self
    }

    /// Each step multiplies the delay by this (at least 1.0).
    #[must_use]
    pub fn delay_factor(mut self, factor: f64) -> Self {
        self.delay_factor = factor;
        self
    }

    /// The smallest delay while backing off; below it the scope is back on
    /// its configured limits.
    #[must_use]
    pub fn min_delay(mut self, delay: Duration) -> Self {
        self.min_delay = delay;
        self
    }

    /// The largest delay backoff sets; also caps Retry-After holds.
    #[must_use]
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// Jitter of waits while backing off.
    #[must_use]
    pub fn jitter(mut self, jitter: impl Into<Jitter>) -> Self {
        self.jitter = jitter.into();
        self
    }

    /// Quiet time after which the scope takes one step back.
    #[must_use]
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Each step multiplies the concurrency by this (in `(0, 1]`, floor 1).
    #[must_use]
    pub fn concurrency_factor(mut self, factor: f64) -> Self {
        self.concurrency_factor = factor;
        self
    }

    /// `concurrency` after one step: times the factor, at least 1.
    fn reduced(&self, concurrency: u32) -> u32 {
        ((f64::from(concurrency) * self.concurrency_factor).floor() as u32).max(1)
    }

    /// These settings with the scope's delay before backoff, as a fleet's
    /// store steps them.
    pub(crate) fn step_terms(&self, base_delay: Duration) -> BackoffStep {
        BackoffStep {
            base_delay,
            delay_factor: self.delay_factor,
            min_delay: self.min_delay,
            max_delay: self.max_delay,
            window: self.window,
        }
    }

    /// Whether `status` is backoff feedback.
    pub fn is_backoff_status(&self, status: u16) -> bool {
        self.http_codes.contains(&status)
    }

    /// The backoff statuses.
    pub(crate) fn codes(&self) -> &[u16] {
        &self.http_codes
    }

    pub(crate) fn validate(&self, name: &str) -> Result<(), ConfigError> {
        let field = |f: &str| format!("{name} backoff {f}");
        if !self.delay_factor.is_finite() || self.delay_factor < 1.0 {
            return Err(ConfigError::new(
                field("delay_factor"),
                self.delay_factor,
                "must be finite and at least 1.0",
            ));
        }
        if !(self.concurrency_factor > 0.0 && self.concurrency_factor <= 1.0) {
            return Err(ConfigError::new(
                field("concurrency_factor"),
                self.concurrency_factor,
                "must be in (0, 1]",
            ));
        }
        validate_delay(&field("min_delay"), self.min_delay)?;
        validate_delay(&field("max_delay"), self.max_delay)?;
        validate_delay(&field("window"), self.window)?;
        if self.min_delay > self.max_delay {
            return Err(ConfigError::new(
                field("min_delay"),
                self.min_delay,
                "must not exceed max_delay",
            ));
        }
        if self.window.is_zero() {
            return Err(ConfigError::new(field("window"), self.window, "must be positive"));
        }
        if let Some(bad) = self.http_codes.iter().find(|code| !(100..=599).contains(*code)) {
            return Err(ConfigError::new(
                field("http_codes"),
                bad,
                "must be HTTP status codes (100-599)",
            ));
        }
        self.jitter.validate(&field("jitter"))
    }
}

/// The backoff of one scope after its last step. `None` in the scope means
/// no backoff, which keeps idle scopes small.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BackoffState {
    /// Steps taken and not yet recovered, as of `last_step`.
    pub(crate) level: u32,
    pub(crate) delay: Duration,
    pub(crate) concurrency: u32,
    pub(crate) last_step: Instant,
    /// The level last announced in a tracing event, so each step back is
    /// reported once.
    pub(crate) reported_level: u32,
}

/// The backoff limits in force at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BackoffNow {
    pub(crate) level: u32,
    pub(crate) delay: Duration,
    pub(crate) concurrency: u32,
    /// When the next step back happens.
    pub(crate) next_step_back: Instant,
}

impl BackoffState {
    /// One step from the limits in force at `now`: `base_delay` and
    /// `base_concurrency` are the scope's limits without backoff.
    pub(crate) fn step(
        current: Option<BackoffNow>,
        now: Instant,
        config: &BackoffConfig,
        base_delay: Duration,
        base_concurrency: u32,
    ) -> BackoffState {
        let (level, delay, concurrency) = match current {
            Some(now) => (now.level, now.delay, now.concurrency),
            None => (0, base_delay, base_concurrency),
        };
        let (level, delay) = config.step_terms(base_delay).step(Some((level, delay)));
        BackoffState {
            level,
            reported_level: level,
            delay,
            concurrency: config.reduced(concurrency),
            last_step: now,
        }
    }

    /// The limits at `now`, after the steps back that quiet windows since
    /// the last step earned; `None` once back on the configured limits.
    pub(crate) fn at(
        &self,
        now: Instant,
        config: &BackoffConfig,
        base_concurrency: u32,
    ) -> Option<BackoffNow> {
        let quiet = now.saturating_duration_since(self.last_step);
        let recovered = config
            .step_terms(Duration::ZERO)
            .recovered(self.level, self.delay, quiet)?;
        let steps_back = self.level - recovered.level;
        let regrowth = (1.0 / config.concurrency_factor).powi(steps_back.min(1_000) as i32);
        let concurrency = (f64::from(self.concurrency) * regrowth).min(f64::from(base_concurrency)) as u32;
        Some(BackoffNow {
            level: recovered.level,
            delay: recovered.delay,
            concurrency: concurrency.clamp(1, base_concurrency.max(1)),
            next_step_back: saturating_add(now, recovered.next_step_back),
        })
    }

    /// The state a worker takes from its fleet's backoff `fleet` (read at
    /// `now`): the fleet's level and delay, the concurrency those steps
    /// give `base_concurrency`, and the step back when the fleet's comes.
    pub(crate) fn of_fleet(
        fleet: FleetBackoff,
        now: Instant,
        config: &BackoffConfig,
        base_concurrency: u32,
    ) -> Self {
        let mut concurrency = base_concurrency.max(1);
        for _ in 0..fleet.level.min(64) {
            concurrency = config.reduced(concurrency);
        }
        let since_step = config.window.saturating_sub(fleet.next_step_back);
        BackoffState {
            level: fleet.level,
            delay: fleet.delay,
            concurrency,
            last_step: now.checked_sub(since_step).unwrap_or(now),
            reported_level: fleet.level,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn steps(
        config: &BackoffConfig,
        base_delay: Duration,
        base_concurrency: u32,
        count: usize,
    ) -> Vec<BackoffState> {
        let now = Instant::now();
        let mut state: Option<BackoffState> = None;
        let mut seen = Vec::new();
        for _ in 0..count {
            let current = state.and_then(|s| s.at(now, config, base_concurrency));
            let next = BackoffState::step(current, now, config, base_delay, base_concurrency);
            seen.push(next);
            state = Some(next);
        }
        seen
    }

    #[test]
    fn three_steps_from_no_delay_give_1_2_4_seconds() {
        let delays: Vec<_> = steps(&BackoffConfig::default(), Duration::ZERO, 1, 3)
            .iter()
            .map(|s| s.delay)
            .collect();
        assert_eq!(delays, vec![secs(1), secs(2), secs(4)]);
    }

    #[test]
    fn factor_10_with_max_5_caps_at_5_seconds() {
        let config = BackoffConfig::default().delay_factor(10.0).max_delay(secs(5));
        let delays: Vec<_> = steps(&config, Duration::ZERO, 1, 2)
            .iter()
            .map(|s| s.delay)
            .collect();
        assert_eq!(delays, vec![secs(1), secs(5)]);
    }

    #[test]
    fn min_5_factor_3_gives_5_then_15_seconds() {
        let config = BackoffConfig::default().min_delay(secs(5)).delay_factor(3.0);
        let delays: Vec<_> = steps(&config, Duration::ZERO, 1, 2)
            .iter()
            .map(|s| s.delay)
            .collect();
        assert_eq!(delays, vec![secs(5), secs(15)]);
    }

    #[test]
    fn concurrency_halves_per_step_with_a_floor_of_1() {
        let lanes: Vec<_> = steps(&BackoffConfig::default(), Duration::ZERO, 8, 5)
            .iter()
            .map(|s| s.concurrency)
            .collect();
        assert_eq!(lanes, vec![4, 2, 1, 1, 1]);
    }

    #[test]
    fn quiet_windows_step_back_then_return_to_the_config() {
        let config = BackoffConfig::default();
        let state = *steps(&config, Duration::ZERO, 8, 2).last().unwrap();
        assert_eq!((state.delay, state.concurrency), (secs(2), 2));
        let t0 = state.last_step;
        let during = state.at(t0 + secs(59), &config, 8).unwrap();
        assert_eq!((during.level, during.delay, during.concurrency), (2, secs(2), 2));
        let one_back = state.at(t0 + secs(60), &config, 8).unwrap();
        assert_eq!(
            (one_back.level, one_back.delay, one_back.concurrency),
            (1, secs(1), 4)
        );
        assert_eq!(one_back.next_step_back, t0 + secs(120));
        assert_eq!(state.at(t0 + secs(120), &config, 8), None);
    }

    #[test]
    fn invalid_settings_name_their_field() {
        let cases = [
            (
                BackoffConfig::default().delay_factor(0.5),
                "s backoff delay_factor",
            ),
            (
                BackoffConfig::default().delay_factor(f64::NAN),
                "s backoff delay_factor",
            ),
            (
                BackoffConfig::default().concurrency_factor(0.0),
                "s backoff concurrency_factor",
            ),
            (
                BackoffConfig::default().concurrency_factor(1.5),
                "s backoff concurrency_factor",
            ),
            (
                BackoffConfig::default().min_delay(secs(400)),
                "s backoff min_delay",
            ),
            (
                BackoffConfig::default().window(Duration::ZERO),
                "s backoff window",
            ),
            (
                BackoffConfig::default().http_codes([429, 1000]),
                "s backoff http_codes",
            ),
            (BackoffConfig::default().jitter(-1.0), "s backoff jitter"),
        ];
        for (config, field) in cases {
            assert_eq!(config.validate("s").unwrap_err().field(), field);
        }
    }
}
