//! Rampup: find the fastest pace a server accepts, without being told.
//!
//! A rampup scope paces itself with its own delay (and enough lanes for
//! that pace at the observed latency), aiming at `backoff_target` backoff
//! feedbacks per window:
//!
//! - a window with fewer backoffs than the target proves the current pace
//!   safe; the next window *probes* a faster pace;
//! - the first backoff while probing proves the probe too fast: the scope
//!   returns to the fastest pace known to be safe at once, and remembers
//!   the probe as the slowest pace known to trigger backoff;
//! - backoffs beyond the target at a pace believed safe mean the server got
//!   stricter (or latency jitter makes arrivals bunch up): the scope forgets
//!   what it knew and slows down, by 5 % at first and more each time it
//!   happens again, up to `factor`.
//!
//! Probes go to the middle (in rate) between the fastest safe pace and the
//! slowest unsafe one, but always at least 1 % faster than the safe pace, so
//! the search narrows like a bisection instead of ping-ponging between
//! halving and doubling, and keeps testing the boundary (which is how it
//! notices when the server allows more). With no unsafe pace known, probes
//! double the rate. Against a server that rejects above a fixed rate R it
//! settles within a few percent below R with about one backoff per window.

use std::ops::RangeInclusive;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::ConfigError;
use crate::time::validate_delay;

/// Rampup settings; enable per scope with
/// [`ScopeConfig::rampup`](crate::ScopeConfig::rampup).
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::{ScopeConfig};
/// use tower_throttle::registry::RampupConfig;
///
/// // Aim at one to three rate-limit responses per minute.
/// let api = ScopeConfig::default().rampup(RampupConfig::default().backoff_target(1..=3));
/// # drop(api);
/// ```
///
/// | setting | default |
/// |---|---|
/// | `backoff_target` | `1..=1` backoff feedbacks per window |
/// | `window` | 60 s |
/// | `min_delay` | 0 (only the server limits it) |
/// | `max_delay` | 300 s |
/// | `factor` | 2.0 |
///
/// Values are checked when the registry is built (or when
/// [`Registry::set_scope`](crate::Registry::set_scope) is called): a bad
/// value is a [`ConfigError`] naming the field.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RampupConfig {
    backoff_target: RangeInclusive<u32>,
    window: Duration,
    min_delay: Duration,
    max_delay: Duration,
    factor: f64,
}

impl Default for RampupConfig {
    fn default() -> Self {
        RampupConfig {
            backoff_target: 1..=1,
            window: Duration::from_secs(60),
            min_delay: Duration::ZERO,
            max_delay: Duration::from_secs(300),
            factor: 2.0,
        }
    }
}

impl RampupConfig {
    /// Backoff feedbacks per window to aim at (default `1..=1`; must not be
    /// empty). Both bounds are used: fewer means "go faster", more means
    /// "slow down".
    #[must_use]
    pub fn backoff_target(mut self, target: RangeInclusive<u32>) -> Self {
        self.backoff_target = target;
        self
    }

    /// The window backoffs are counted over (default 60 s; must be
    /// positive).
    #[must_use]
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// The smallest delay rampup sets (default 0: only the server limits
    /// it; must not exceed `max_delay`).
    #[must_use]
    pub fn min_delay(mut self, delay: Duration) -> Self {
        self.min_delay = delay;
        self
    }

    /// The largest delay rampup sets when slowing down (default 300 s).
    #[must_use]
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// How much slower to go, at most, when backoffs exceed the target at a
    /// pace believed safe (default 2.0; must be finite and above 1.0).
    #[must_use]
    pub fn factor(mut self, factor: f64) -> Self {
        self.factor = factor;
        self
    }

    /// The backoff feedbacks per window aimed at.
    #[cfg(feature = "serde")]
    pub(crate) fn get_backoff_target(&self) -> &RangeInclusive<u32> {
        &self.backoff_target
    }

    /// The window backoffs are counted over.
    #[cfg(feature = "serde")]
    pub(crate) fn get_window(&self) -> Duration {
        self.window
    }

    /// The smallest delay rampup sets.
    #[cfg(feature = "serde")]
    pub(crate) fn get_min_delay(&self) -> Duration {
        self.min_delay
    }

    /// The largest delay rampup sets.
    #[cfg(feature = "serde")]
    pub(crate) fn get_max_delay(&self) -> Duration {
        self.max_delay
    }

    /// The largest slow-down factor.
    #[cfg(feature = "serde")]
    pub(crate) fn get_factor(&self) -> f64 {
        self.factor
    }

    pub(crate) fn validate(&self, name: &str) -> Result<(), ConfigError> {
        let field = |f: &str| format!("{name} rampup {f}");
        if self.backoff_target.start() > self.backoff_target.end() {
            return Err(ConfigError::new(
                field("backoff_target"),
                &self.backoff_target,
                "must not be empty",
            ));
        }
        if self.window.is_zero() {
            return Err(ConfigError::new(field("window"), self.window, "must be positive"));
        }
        validate_delay(&field("window"), self.window)?;
        validate_delay(&field("max_delay"), self.max_delay)?;
        if self.min_delay > self.max_delay {
            return Err(ConfigError::new(
                field("min_delay"),
                self.min_delay,
                "must not exceed max_delay",
            ));
        }
        if !(self.factor.is_finite() && self.factor > 1.0) {
            return Err(ConfigError::new(
                field("factor"),
                self.factor,
                "must be finite and above 1.0",
            ));
        }
        Ok(())
    }
}

/// How much faster than the safe pace a probe goes, at least.
const MIN_PROBE_STEP: f64 = 0.99;

/// For how many gaps of an abandoned pace (a failed probe's, or the one
/// slowed down from) a refused request still counts as sent at it.
const ABANDONED_GAPS: u32 = 8;

/// The rampup controller of one scope.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RampupState {
    /// The pace in force.
    pub(crate) delay: Duration,
    /// The smallest delay known safe (a full window under target).
    safe: Option<Duration>,
    /// The largest delay known to trigger backoff.
    unsafe_: Option<Duration>,
    window_start: Instant,
    backoffs: u32,
    /// Backoffs this window at the pace believed safe (not while probing):
    /// only these say the safe pace is not.
    backoffs_when_safe: u32,
    /// Whether the current window is probing a pace faster than `safe`.
    probing: bool,
    /// Windows completed, for stats and tests.
    pub(crate) windows: u64,
    /// Slow-downs at a pace believed safe since a window last ended within
    /// the target.
    slowdowns: u32,
    /// When the pace last slowed down (a retreat from a probe, or a
    /// slow-down): a backoff for a request sent before then was answered
    /// by that change already.
    slowed_at: Option<Instant>,
    /// The version of the fleet's shared search this state is (0: none;
    /// see [`crate::store`]'s learnt state).
    pub(crate) fleet_version: u64,
}

impl RampupState {
    pub(crate) fn new(start_delay: Duration, now: Instant) -> Self {
        RampupState {
            delay: start_delay,
            safe: None,
            unsafe_: None,
            window_start: now,
            backoffs: 0,
            backoffs_when_safe: 0,
            probing: false,
            windows: 0,
            slowdowns: 0,
            slowed_at: None,
            fleet_version: 0,
        }
    }

    /// The state as the fleet's store keeps it: a line of numbers, the
    /// window's start as its age at `now` (the workers' clocks differ; ages
    /// do not).
    pub(crate) fn encode(&self, now: Instant) -> String {
        let nanos = |delay: Option<Duration>| delay.map_or(-1i128, |delay| delay.as_nanos() as i128);
        let slowed_age = self.slowed_at.map(|at| now.saturating_duration_since(at));
        format!(
            "r1 {} {} {} {} {} {} {} {} {} {}",
            self.delay.as_nanos(),
            nanos(self.safe),
            nanos(self.unsafe_),
            now.saturating_duration_since(self.window_start).as_nanos(),
            self.backoffs,
            self.backoffs_when_safe,
            u8::from(self.probing),
            self.windows,
            self.slowdowns,
            nanos(slowed_age),
        )
    }

    /// The state [`encode`](Self::encode) wrote, read at `now` when the
    /// store kept it for `age`; `None` for a line that is not one.
    pub(crate) fn decode(line: &str, age: Duration, now: Instant) -> Option<Self> {
        let mut fields = line.split(' ');
        if fields.next()? != "r1" {
            return None;
        }
        let mut next = || fields.next()?.parse::<i128>().ok();
        let duration = |nanos: i128| u64::try_from(nanos).ok().map(Duration::from_nanos);
        let delay = duration(next()?)?;
        let safe = next()?;
        let unsafe_ = next()?;
        let window_age = duration(next()?)?;
        let state = RampupState {
            delay,
            safe: if safe < 0 { None } else { Some(duration(safe)?) },
            unsafe_: if unsafe_ < 0 {
                None
            } else {
                Some(duration(unsafe_)?)
            },
            window_start: now.checked_sub(window_age.saturating_add(age)).unwrap_or(now),
            backoffs: u32::try_from(next()?).ok()?,
            backoffs_when_safe: u32::try_from(next()?).ok()?,
            probing: next()? != 0,
            windows: u64::try_from(next()?).ok()?,
            slowdowns: u32::try_from(next()?).ok()?,
            slowed_at: match next()? {
                nanos if nanos < 0 => None,
                nanos => Some(
                    now.checked_sub(duration(nanos)?.saturating_add(age))
                        .unwrap_or(now),
                ),
            },
            fleet_version: 0,
        };
        Some(state)
    }

    /// Closes the windows that ended by `now`, deciding the next pace.
    pub(crate) fn roll(&mut self, now: Instant, config: &RampupConfig) {
        if now.saturating_duration_since(self.window_start) < config.window {
            return;
        }
        self.close_window(config);
        // Windows without any event are skipped: they change nothing.
        let elapsed = now.saturating_duration_since(self.window_start);
        let whole = (elapsed.as_nanos() / config.window.as_nanos()).min(u128::from(u32::MAX)) as u32;
        self.window_start += config.window * whole;
    }

    /// Rolls every window that ended by `now`, one at a time, as a busy
    /// worker's sends would have: the state the fleet's store kept since
    /// its last write, caught up with the windows that ended since (each
    /// worker rolls its own copy at its sends, and nothing is written at a
    /// window's end). At most 1 000 windows one by one, the rest at once.
    pub(crate) fn catch_up(&mut self, now: Instant, config: &RampupConfig) {
        for _ in 0..1_000 {
            if now.saturating_duration_since(self.window_start) < config.window {
                return;
            }
            self.close_window(config);
            self.window_start += config.window;
        }
        self.roll(now, config);
    }

    /// Judges the window that ended by its backoffs, and starts the next.
    fn close_window(&mut self, config: &RampupConfig) {
        let below_target = self.backoffs < *config.backoff_target.start();
        let within_target = self.backoffs <= *config.backoff_target.end();
        if below_target {
            self.safe = Some(self.delay);
        }
        if within_target {
            self.slowdowns = 0;
        }
        if below_target || (within_target && self.retreated_from_probe()) {
            self.start_probe(config);
        }
        self.windows += 1;
        self.backoffs = 0;
        self.backoffs_when_safe = 0;
    }

    fn retreated_from_probe(&self) -> bool {
        self.backoffs > 0 && !self.probing && self.safe == Some(self.delay)
    }

    fn start_probe(&mut self, config: &RampupConfig) {
        let safe = self.safe.unwrap_or(self.delay);
        let probe = match self.unsafe_ {
            Some(unsafe_) if unsafe_ < safe => {
                // Midpoint in rate: 2 / (1/a + 1/b), the harmonic mean.
                let middle =
                    2.0 / (1.0 / unsafe_.as_secs_f64().max(1e-9) + 1.0 / safe.as_secs_f64().max(1e-9));
                middle.min(safe.as_secs_f64() * MIN_PROBE_STEP)
            }
            // A pace at least as fast as the one believed unsafe proved
            // safe: the boundary is further than thought, but not far
            // (doubling the rate here overshot it by half). Step past it
            // twice as far as the safe pace already is, from 1 % to half.
            Some(unsafe_) => {
                let past = 1.0 - safe.as_secs_f64() / unsafe_.as_secs_f64().max(1e-9);
                let step = (2.0 * past).clamp(1.0 - MIN_PROBE_STEP, 0.5);
                safe.as_secs_f64() * (1.0 - step)
            }
            None => safe.as_secs_f64() / 2.0,
        };
        self.delay = Duration::try_from_secs_f64(probe)
            .unwrap_or(config.min_delay)
            .max(config.min_delay);
        self.probing = self.delay < safe;
    }

    /// A backoff feedback at `now`.
    #[cfg(test)]
    pub(crate) fn on_backoff(&mut self, now: Instant, config: &RampupConfig) {
        self.on_backoff_sent(now, None, config);
    }

    /// A backoff feedback at `now` for a request sent at `sent` (when
    /// known). A request sent before the pace last slowed down was sent at
    /// a pace given up already: its backoff changes nothing (with several
    /// requests in flight, a failed probe is refused more than once, and
    /// the later refusals must not count against the safe pace it went
    /// back to).
    pub(crate) fn on_backoff_sent(&mut self, now: Instant, sent: Option<Instant>, config: &RampupConfig) {
        self.roll(now, config);
        if let (Some(sent), Some(slowed)) = (sent, self.slowed_at) {
            // Requests reserved at the abandoned pace (the failed probe's, or
            // the one slowed down from: `unsafe_`) are still sent at it for
            // a few of its gaps after the change (granted instants ahead,
            // workers of a fleet that take the change at their next ask):
            // their refusals were answered by the change too. Refusals that
            // go on after that count.
            let abandoned = self.unsafe_.unwrap_or_default().saturating_mul(ABANDONED_GAPS);
            if slowed.checked_add(abandoned).is_none_or(|until| sent < until) {
                return;
            }
        }
        self.backoffs += 1;
        if self.probing {
            self.unsafe_ = Some(self.delay);
            self.delay = self.safe.unwrap_or(self.delay);
            self.probing = false;
            self.slowed_at = Some(now);
            return;
        }
        self.backoffs_when_safe += 1;
        if self.backoffs_when_safe > *config.backoff_target.end() {
            // The pace believed safe is not. Near the boundary that is
            // usually latency jitter (a late arrival makes the next gap
            // short), so slow down gently first, and harder each time it
            // happens again before a window ends within the target: 5 %,
            // 10 %, 20 %, 40 %, 80 %, then `factor`.
            self.slowdowns = self.slowdowns.saturating_add(1);
            let step = (1.0 + 0.05 * 2f64.powi(self.slowdowns.min(16) as i32 - 1)).min(config.factor);
            self.unsafe_ = Some(self.delay);
            self.safe = None;
            let slower = self.delay.as_secs_f64().max(0.001) * step;
            self.delay = Duration::try_from_secs_f64(slower)
                .unwrap_or(config.max_delay)
                .min(config.max_delay);
            self.slowed_at = Some(now);
            self.backoffs = 0;
            self.backoffs_when_safe = 0;
            self.window_start = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Simulates a server that rejects any request sooner than `1 / rate`
    /// after the last accepted one, sending at the controller's pace.
    fn simulate(rate: f64, windows: u32) -> (RampupState, Vec<(u32, u32)>) {
        let config = RampupConfig::default();
        let start = Instant::now();
        let mut state = RampupState::new(Duration::from_secs(1), start);
        let interval = Duration::from_secs_f64(1.0 / rate);
        let mut now = start;
        let mut last_accepted: Option<Instant> = None;
        let mut per_window = vec![(0u32, 0u32); windows as usize];
        while now < start + config.window * windows {
            state.roll(now, &config);
            let window = ((now - start).as_nanos() / config.window.as_nanos()) as usize;
            if last_accepted.is_some_and(|last| now - last < interval) {
                per_window[window].1 += 1;
                state.on_backoff(now, &config);
            } else {
                per_window[window].0 += 1;
                last_accepted = Some(now);
            }
            now += state.delay.max(Duration::from_millis(1));
        }
        (state, per_window)
    }

    #[test]
    fn converges_near_a_fixed_server_rate_with_about_one_backoff_per_window() {
        let (state, per_window) = simulate(20.0, 30);
        let settled = &per_window[15..];
        let served: u32 = settled.iter().map(|w| w.0).sum();
        let rejected: u32 = settled.iter().map(|w| w.1).sum();
        let served_rate = f64::from(served) / (settled.len() as f64 * 60.0);
        assert!(served_rate >= 0.9 * 20.0, "served {served_rate}/s");
        assert!(f64::from(rejected) <= 0.02 * f64::from(served + rejected));
        assert!(settled.iter().all(|w| w.1 <= 1), "{settled:?}");
        assert!(state.delay >= Duration::from_millis(49), "{:?}", state.delay);
    }

    #[test]
    fn more_backoffs_than_the_target_at_a_safe_pace_slow_down() {
        let config = RampupConfig::default();
        let now = Instant::now();
        let mut state = RampupState::new(Duration::from_millis(100), now);
        state.on_backoff(now, &config);
        assert_eq!(
            state.delay,
            Duration::from_millis(100),
            "one backoff is the target"
        );
        state.on_backoff(now, &config);
        let close = |a: Duration, b: Duration| a.abs_diff(b) < Duration::from_micros(1);
        assert!(
            close(state.delay, Duration::from_millis(105)),
            "gently at first: {:?}",
            state.delay
        );
        state.on_backoff(now, &config);
        state.on_backoff(now, &config);
        // 100 ms × 1.05 × 1.10.
        assert!(
            close(state.delay, Duration::from_micros(115_500)),
            "harder when it goes on: {:?}",
            state.delay
        );
    }

    #[test]
    fn refusals_of_requests_sent_at_a_pace_given_up_change_nothing() {
        let config = RampupConfig::default();
        let start = Instant::now();
        let ms = Duration::from_millis;
        let mut state = RampupState::new(ms(100), start);
        state.roll(start + config.window, &config);
        // No backoff in the first window: a probe at twice the rate.
        assert_eq!(state.delay, ms(50));
        let t = start + config.window + ms(500);
        state.on_backoff_sent(t, Some(t - ms(10)), &config);
        assert_eq!(state.delay, ms(100), "back to the safe pace");
        // Two more refusals of requests sent during the probe: already
        // answered by going back, so no slow-down of the safe pace.
        state.on_backoff_sent(t + ms(5), Some(t - ms(5)), &config);
        state.on_backoff_sent(t + ms(9), Some(t - ms(1)), &config);
        assert_eq!(state.delay, ms(100));
        // Sent after going back, but within 8 gaps of the probe's pace (a
        // reservation made at it, a worker of the fleet that had not taken
        // the change yet): still the probe's.
        state.on_backoff_sent(t + ms(200), Some(t + ms(100)), &config);
        state.on_backoff_sent(t + ms(450), Some(t + ms(390)), &config);
        assert_eq!(state.delay, ms(100));
        // Sent later, they count: the second slows it down.
        state.on_backoff_sent(t + ms(600), Some(t + ms(500)), &config);
        assert_eq!(state.delay, ms(100));
        state.on_backoff_sent(t + ms(700), Some(t + ms(600)), &config);
        assert!(state.delay > ms(100), "{:?}", state.delay);
    }

    #[test]
    fn a_safe_pace_past_the_one_believed_unsafe_probes_on_gently() {
        let config = RampupConfig::default();
        let ms = Duration::from_secs_f64;
        let mut state = RampupState::new(ms(0.0594), Instant::now());
        state.safe = Some(ms(0.0594));
        state.unsafe_ = Some(ms(0.060));
        state.start_probe(&config);
        // 1 % past 60 ms: the next probe 2 % faster, not twice the rate.
        assert!(
            (state.delay.as_secs_f64() - 0.0594 * 0.98).abs() < 1e-9,
            "{:?}",
            state.delay
        );
        assert!(state.probing);
        // Far past it, at most half the delay.
        state.safe = Some(ms(0.030));
        state.start_probe(&config);
        assert!(
            (state.delay.as_secs_f64() - 0.015).abs() < 1e-9,
            "{:?}",
            state.delay
        );
    }

    #[test]
    fn a_state_goes_through_the_store_and_keeps_its_window_by_age() {
        let config = RampupConfig::default();
        let start = Instant::now();
        let mut state = RampupState::new(Duration::from_millis(100), start);
        state.on_backoff(start, &config);
        state.on_backoff(start, &config);
        let line = state.encode(start + Duration::from_secs(10));
        // Read 5 s later (the store kept it 2 s) by a worker whose clock
        // is its own: the window started 17 s before its now.
        let elsewhere = start + Duration::from_secs(500);
        let read = RampupState::decode(&line, Duration::from_secs(2), elsewhere).unwrap();
        assert_eq!(read.window_start, elsewhere - Duration::from_secs(12));
        // The slow-down happened at the window's start too.
        assert_eq!(read.slowed_at, Some(elsewhere - Duration::from_secs(12)));
        assert_eq!(
            RampupState {
                window_start: state.window_start,
                slowed_at: state.slowed_at,
                ..read
            },
            state
        );
        assert!(RampupState::decode("r1 1 2", Duration::ZERO, start).is_none());
        assert!(RampupState::decode("x", Duration::ZERO, start).is_none());
        assert!(RampupState::decode("r1 -5 -1 -1 0 0 0 0 0 0", Duration::ZERO, start).is_none());
    }

    #[test]
    fn invalid_settings_name_their_field() {
        #[allow(clippy::reversed_empty_ranges)]
        let empty = RampupConfig {
            backoff_target: 3..=1,
            ..RampupConfig::default()
        };
        assert_eq!(
            empty.validate("s").unwrap_err().field(),
            "s rampup backoff_target"
        );
        let factor = RampupConfig {
            factor: 1.0,
            ..RampupConfig::default()
        };
        assert_eq!(factor.validate("s").unwrap_err().field(), "s rampup factor");
    }
}
