use std::time::Duration;

use super::autothrottle::AutoThrottleConfig;
use super::backoff::BackoffConfig;
use super::manager::{ManagerFactory, ScopeManager};
use super::rampup::RampupConfig;
use crate::error::ConfigError;
use crate::time::{validate_delay, Jitter};

fn default_backoff() -> &'static BackoffConfig {
    static DEFAULT: std::sync::OnceLock<BackoffConfig> = std::sync::OnceLock::new();
    DEFAULT.get_or_init(BackoffConfig::default)
}

/// How one scope is throttled. Defaults follow Scrapy's: one request at a
/// time, at least 1 s between sends, ±50 % jitter.
///
/// | setting | default | meaning |
/// |---|---|---|
/// | [`concurrency`](Self::concurrency) | 1 | lanes ("slots"); each lane has at most one request in flight |
/// | [`delay`](Self::delay) | 1 s | minimum time between the sends of any two requests of the scope |
/// | [`delay_per_slot`](Self::delay_per_slot) | 1 s | minimum time between two sends on the same lane |
/// | [`jitter`](Self::jitter) | ±0.5 | every wait is multiplied by a factor in `[1 - 0.5, 1 + 0.5]` |
/// | [`count_whole_transfers`](Self::count_whole_transfers) | false | keep the lane until the response body ends, not only until its head |
///
/// Values are checked when the registry is built (or when
/// [`Registry::set_scope`](crate::Registry::set_scope) is called):
/// a bad value is a [`ConfigError`] naming the field.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::ScopeConfig;
///
/// let fast = ScopeConfig::default()
///     .concurrency(16)
///     .delay(Duration::ZERO)
///     .delay_per_slot(Duration::ZERO)
///     .jitter(0.0);
/// # drop(fast);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ScopeConfig {
    pub(crate) concurrency: u32,
    pub(crate) delay: Duration,
    pub(crate) delay_per_slot: Duration,
    pub(crate) jitter: Jitter,
    pub(crate) backoff: Option<BackoffConfig>,
    pub(crate) autothrottle: Setting<AutoThrottleConfig>,
    pub(crate) rampup: Setting<RampupConfig>,
    pub(crate) ignore_robots_txt: bool,
    pub(crate) count_whole_transfers: bool,
    pub(crate) quota: Option<f64>,
    pub(crate) window: Option<Duration>,
    /// How long a request of the scope may wait (see `bounded.rs`).
    pub(crate) max_wait: Option<Duration>,
    /// How many requests of the scope may wait (see `bounded.rs`).
    pub(crate) max_waiting: Option<usize>,
    /// The scope's custom manager (`None`: the built-in one). Not
    /// serialisable; equal when it is the same factory.
    pub(crate) manager: Option<ManagerFactory>,
    /// Which limits were set by a builder call (not left at their default):
    /// robots.txt only yields to limits a scope config actually sets.
    pub(crate) set_by_user: SetByUser,
}

/// How long a quota window lasts when neither the scope nor the registry
/// says (the seeds' `THROTTLING_WINDOW`).
pub const DEFAULT_QUOTA_WINDOW: Duration = Duration::from_secs(60);

/// The limits a [`ScopeConfig`] sets explicitly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SetByUser {
    pub(crate) concurrency: bool,
    pub(crate) delay: bool,
    pub(crate) delay_per_slot: bool,
}

/// A setting a scope config may leave to the default scope's config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Setting<T> {
    Inherit,
    Off,
    On(T),
}

impl<T: Clone> Setting<T> {
    fn or_inherit(&self, default: &Setting<T>) -> Setting<T> {
        match self {
            Setting::Inherit => default.clone(),
            set => set.clone(),
        }
    }

    pub(crate) fn get(&self) -> Option<&T> {
        match self {
            Setting::On(value) => Some(value),
            _ => None,
        }
    }
}

impl Default for ScopeConfig {
    fn default() -> Self {
        ScopeConfig {
            concurrency: 1,
            delay: Duration::from_secs(1),
            delay_per_slot: Duration::from_secs(1),
            jitter: Jitter::symmetric(0.5),
            backoff: None,
            autothrottle: Setting::Inherit,
            rampup: Setting::Inherit,
            ignore_robots_txt: false,
            count_whole_transfers: false,
            quota: None,
            window: None,
            max_wait: None,
            max_waiting: None,
            manager: None,
            set_by_user: SetByUser::default(),
        }
    }
}

impl ScopeConfig {
    /// Lanes: how many requests of the scope may be in flight at once
    /// (at least 1; capped by the registry's `max_concurrency`).
    #[must_use]
    pub fn concurrency(mut self, lanes: u32) -> Self {
        self.concurrency = lanes;
        self.set_by_user.concurrency = true;
        self
    }

    /// Minimum time between the sends of any two requests of the scope.
    ///
    /// The per-lane delay ([`delay_per_slot`](Self::delay_per_slot), 1 s
    /// by default) applies as well: on one lane a `delay` shorter than it
    /// has no effect, so set both to go faster than one request a second:
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::ScopeConfig;
    ///
    /// // Five requests a second on one lane.
    /// let config = ScopeConfig::default()
    ///     .delay(Duration::from_millis(200))
    ///     .delay_per_slot(Duration::from_millis(200));
    /// # drop(config);
    /// ```
    #[must_use]
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self.set_by_user.delay = true;
        self
    }

    /// Minimum time between two sends on the same lane, measured from the
    /// previous send on that lane.
    ///
    /// With `c` lanes the scope sends at most `c / delay_per_slot` requests
    /// a second, so when `delay_per_slot / c` is longer than the
    /// [`delay`](Self::delay), this per-lane delay sets the pace. The
    /// registry warns once (target `tower_throttle`, when it is built or
    /// the config is set) when that happens on a single lane, and on
    /// several lanes when `delay_per_slot` was left at its default; a
    /// per-lane delay set on purpose across several lanes (the staggered
    /// pattern: 2 lanes, delay 0.3 s, per slot 1 s) is left alone.
    #[must_use]
    pub fn delay_per_slot(mut self, delay: Duration) -> Self {
        self.delay_per_slot = delay;
        self.set_by_user.delay_per_slot = true;
        self
    }

    /// Random variation of every wait: a symmetric factor (`0.5` means
    /// `[0.5, 1.5] × wait`), a `[below, above]` pair, or [`Jitter::NONE`].
    /// `0.0` disables it.
    #[must_use]
    pub fn jitter(mut self, jitter: impl Into<Jitter>) -> Self {
        self.jitter = jitter.into();
        self
    }

    /// How this scope backs off. Unless set, the default scope's backoff
    /// applies (and [`BackoffConfig::default`] when that is unset too).
    #[must_use]
    pub fn backoff(mut self, backoff: BackoffConfig) -> Self {
        self.backoff = Some(backoff);
        self
    }

    /// Turns AutoThrottle on for this scope. Set on the default scope, it
    /// applies to every scope whose config does not say otherwise.
    #[must_use]
    pub fn autothrottle(mut self, autothrottle: AutoThrottleConfig) -> Self {
        self.autothrottle = Setting::On(autothrottle);
        self
    }

    /// Turns AutoThrottle off for this scope even when the default scope
    /// has it on.
    #[must_use]
    pub fn without_autothrottle(mut self) -> Self {
        self.autothrottle = Setting::Off;
        self
    }

    /// Turns rampup on for this scope: it searches for the fastest pace the
    /// server accepts, aiming at `backoff_target` backoff feedbacks per
    /// window (see [`RampupConfig`]). Backoff feedback then drives rampup
    /// instead of exponential backoff.
    #[must_use]
    pub fn rampup(mut self, rampup: RampupConfig) -> Self {
        self.rampup = Setting::On(rampup);
        self
    }

    /// Turns rampup off for this scope even when the default scope has it
    /// on.
    #[must_use]
    pub fn without_rampup(mut self) -> Self {
        self.rampup = Setting::Off;
        self
    }

    /// The rampup settings, when rampup is on.
    pub(crate) fn get_rampup(&self) -> Option<&RampupConfig> {
        self.rampup.get()
    }

    /// Spends at most `quota` units per [`window`](Self::window) in this
    /// scope (default: no quota). Each request spends its expected cost for
    /// the scope (from its [`Scopes`](crate::Scopes), 1.0 by default) when
    /// it is sent, and waits while that cost does not fit what is left of
    /// the current window. A request whose cost alone exceeds the quota is
    /// sent at the start of an empty window rather than never. Feedback may
    /// correct the spending with the actual cost
    /// ([`Feedback::with_actual_cost`](crate::registry::Feedback::with_actual_cost))
    /// or what the server says is left
    /// ([`Feedback::with_remaining_quota`](crate::registry::Feedback::with_remaining_quota)).
    ///
    /// A window starts with the first send after the previous one ended and
    /// lasts `window`; then the spending starts again from zero.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::{Registry, ScopeConfig};
    ///
    /// // At most 500 units per minute on the API.
    /// let registry = Registry::builder()
    ///     .scope("api.example", ScopeConfig::default().quota(500.0).window(Duration::from_secs(60)))
    ///     .build()?;
    /// # Ok::<(), tower_throttle::ConfigError>(())
    /// ```
    #[must_use]
    pub fn quota(mut self, quota: f64) -> Self {
        self.quota = Some(quota);
        self
    }

    /// The length of this scope's quota windows (default: the registry's
    /// [`quota_window`](crate::registry::RegistryBuilder::quota_window), 60 s).
    #[must_use]
    pub fn window(mut self, window: Duration) -> Self {
        self.window = Some(window);
        self
    }

    /// The quota per window, if the scope has one.
    pub(crate) fn get_quota(&self) -> Option<f64> {
        self.quota
    }

    /// Whether lanes are the scope's only limit: no delay, no per-lane
    /// delay, no quota, and no rampup or AutoThrottle (which make delays of
    /// their own). The admission of such a scope skips computing its
    /// limits while nothing else contributes to them.
    pub(crate) fn is_plain(&self) -> bool {
        self.delay.is_zero()
            && self.delay_per_slot.is_zero()
            && self.quota.is_none()
            && self.get_rampup().is_none()
            && self.get_autothrottle().is_none()
    }

    /// The length of the scope's quota windows.
    pub(crate) fn get_window(&self) -> Duration {
        self.window.unwrap_or(DEFAULT_QUOTA_WINDOW)
    }

    /// Replaces how this scope reacts to feedback: `factory` makes the
    /// scope's [`ScopeManager`] on its first feedback (and again after the
    /// scope was evicted). Set on the default scope, or with
    /// [`RegistryBuilder::scope_manager`](crate::registry::RegistryBuilder::scope_manager),
    /// it applies to every scope whose config does not set its own. The
    /// scope then runs neither the exponential backoff nor rampup; see the
    /// [`manager`](crate::registry::manager) module.
    ///
    /// Configs compare equal only when they hold the *same* factory (a
    /// clone of this config does); closures cannot be compared.
    ///
    /// ```
    /// use tokio::time::Instant;
    /// use tower_throttle::{ScopeConfig};
    /// use tower_throttle::registry::manager::{BaseLimits, ManagerFeedback, ManagerLimits, ScopeManager};
    ///
    /// /// Never slows down, whatever the server says.
    /// struct Stubborn;
    ///
    /// impl ScopeManager for Stubborn {
    ///     fn name(&self) -> &str {
    ///         "stubborn"
    ///     }
    ///     fn on_feedback(&mut self, _feedback: &ManagerFeedback) {}
    ///     fn limits(&self, _now: Instant, _base: &BaseLimits) -> ManagerLimits {
    ///         ManagerLimits::none()
    ///     }
    /// }
    ///
    /// let config = ScopeConfig::default().manager(|_scope| Box::new(Stubborn));
    /// assert_eq!(config, config.clone());
    /// ```
    #[must_use]
    pub fn manager<F>(mut self, factory: F) -> Self
    where
        F: Fn(&crate::Scope) -> Box<dyn ScopeManager> + Send + Sync + 'static,
    {
        self.manager = Some(ManagerFactory::new(factory));
        self
    }

    /// Silences the warning logged when robots.txt asks for a Crawl-delay
    /// that this scope's own config overrides. (A scope config given with
    /// [`RegistryBuilder::scope`](crate::registry::RegistryBuilder::scope) or
    /// [`Registry::set_scope`](crate::Registry::set_scope) keeps the
    /// `concurrency` and `delay` it sets explicitly; robots.txt still applies
    /// to the ones it leaves at their defaults.)
    #[must_use]
    pub fn ignore_robots_txt(mut self, ignore: bool) -> Self {
        self.ignore_robots_txt = ignore;
        self
    }

    /// Counts a lane as busy for the whole transfer: a request keeps its
    /// lane (and its global permit) until its response body has been read
    /// to the end, has failed or has been dropped, not only until the
    /// response head arrives (the default).
    ///
    /// By default a lane goes back when the response head arrives (or the
    /// error does), as tower's `ConcurrencyLimit` gives its permit back
    /// when the response future completes: the caller may keep a response
    /// as long as it likes without holding anything of the scope. Turn this
    /// on for crawls of large or slow bodies, where what the server sees
    /// as one request in progress lasts until the body's last byte: a
    /// scope of 2 lanes then never has more than 2 bodies streaming at
    /// once. A request of several scopes keeps its lanes for the whole
    /// transfer when any one of its scopes counts whole transfers.
    ///
    /// **Read or drop each response before awaiting more requests of the
    /// scope.** With this on, a response kept unread keeps its lane, so
    /// code that collects responses before reading them waits for good:
    ///
    /// ```text
    /// // 2 lanes, whole transfers counted: the third request never goes,
    /// // because the first two responses hold both lanes, unread, until
    /// // join_all has all three.
    /// let responses = join_all([a, b, c].map(|r| client.clone().oneshot(r))).await;
    /// ```
    ///
    /// Read each body as its response comes instead (or drop it, or call
    /// [`ThrottledBody::into_inner`](crate::throttle::ThrottledBody::into_inner)
    /// to give the lane back at once). When every lane of such a scope has
    /// been held for 10 s by responses whose bodies were not polled since
    /// their heads while its requests wait, the registry logs a warning
    /// (target `tower_throttle`) naming the scope, once per scope.
    ///
    /// AutoThrottle's latency is the time to the response head either way.
    #[must_use]
    pub fn count_whole_transfers(mut self, whole: bool) -> Self {
        self.count_whole_transfers = whole;
        self
    }

    /// Whether the scope counts a lane busy until the response body ends
    /// (see [`count_whole_transfers`](Self::count_whole_transfers)).
    pub fn get_count_whole_transfers(&self) -> bool {
        self.count_whole_transfers
    }

    /// Frees a request's lane at the response head when `true`, which is
    /// now the default; `false` counts whole transfers.
    #[deprecated(
        since = "0.2.0",
        note = "lanes go back at the response head by default now; use `count_whole_transfers(!release)`"
    )]
    #[must_use]
    pub fn release_at_head(self, release: bool) -> Self {
        self.count_whole_transfers(!release)
    }

    /// Whether the scope frees lanes at the response head: the opposite
    /// of [`get_count_whole_transfers`](Self::get_count_whole_transfers).
    #[deprecated(since = "0.2.0", note = "use `get_count_whole_transfers`, its opposite")]
    pub fn get_release_at_head(&self) -> bool {
        !self.count_whole_transfers
    }

    /// The backoff settings in force (the default ones when unset).
    pub(crate) fn get_backoff(&self) -> &BackoffConfig {
        self.backoff.as_ref().unwrap_or_else(|| default_backoff())
    }

    /// The AutoThrottle settings, when AutoThrottle is on.
    pub(crate) fn get_autothrottle(&self) -> Option<&AutoThrottleConfig> {
        self.autothrottle.get()
    }

    /// Fills the settings this config leaves to the default scope's.
    pub(crate) fn inherit_from(&self, default: &ScopeConfig) -> ScopeConfig {
        ScopeConfig {
            backoff: self.backoff.clone().or_else(|| default.backoff.clone()),
            autothrottle: self.autothrottle.or_inherit(&default.autothrottle),
            rampup: self.rampup.or_inherit(&default.rampup),
            quota: self.quota.or(default.quota),
            window: self.window.or(default.window),
            max_wait: self.max_wait.or(default.max_wait),
            max_waiting: self.max_waiting.or(default.max_waiting),
            manager: self.manager.clone().or_else(|| default.manager.clone()),
            ..self.clone()
        }
    }

    /// Checks every value; `name` says which scope config this is
    /// (`default scope` or `scope "api"`) so errors name the field fully.
    pub(crate) fn validate(&self, name: &str) -> Result<(), ConfigError> {
        if self.concurrency == 0 {
            return Err(ConfigError::new(
                format!("{name} concurrency"),
                self.concurrency,
                "must be at least 1",
            ));
        }
        validate_delay(&format!("{name} delay"), self.delay)?;
        validate_delay(&format!("{name} delay_per_slot"), self.delay_per_slot)?;
        self.jitter.validate(&format!("{name} jitter"))?;
        if let Some(backoff) = &self.backoff {
            backoff.validate(name)?;
        }
        if let Some(autothrottle) = self.autothrottle.get() {
            autothrottle.validate(name)?;
        }
        if let Some(rampup) = self.rampup.get() {
            rampup.validate(name)?;
        }
        if let Some(quota) = self.quota {
            if !(quota.is_finite() && quota > 0.0) {
                return Err(ConfigError::new(
                    format!("{name} quota"),
                    quota,
                    "must be a finite number above 0",
                ));
            }
        }
        if let Some(window) = self.window {
            validate_window(&format!("{name} window"), window)?;
        }
        self.validate_bounds(name)
    }
}

/// Logs a warning for each setting of `config` (for scope `name`) that can
/// never take effect, so a user does not wait for a limit that will not
/// come: a concurrency above the registry's `max_concurrency`, a
/// `delay_per_slot` set explicitly that the scope's own `delay` always
/// outlasts (each lane's sends are at least one scope gap apart), or a
/// `delay` that the per-lane delay outlasts (see [`warn_if_delay_per_slot_paces`]).
/// `default` is the default scope's config, which `config` inherits
/// rampup from.
pub(crate) fn warn_about_settings_without_effect(
    name: &str,
    config: &ScopeConfig,
    default: &ScopeConfig,
    max_concurrency: u32,
) {
    warn_if_delay_per_slot_paces(name, config, default, max_concurrency);
    if config.concurrency > max_concurrency {
        tracing::warn!(
            target: "tower_throttle",
            scope = name,
            concurrency = config.concurrency,
            max_concurrency,
            "scope concurrency can never take effect: max_concurrency caps it"
        );
    }
    let (below, above) = (config.jitter.below(), config.jitter.above());
    let longest_lane_gap = config.delay_per_slot.as_secs_f64() * (1.0 + above);
    let shortest_scope_gap = config.delay.as_secs_f64() * (1.0 - below);
    if config.set_by_user.delay_per_slot
        && !config.delay_per_slot.is_zero()
        && longest_lane_gap <= shortest_scope_gap
    {
        tracing::warn!(
            target: "tower_throttle",
            scope = name,
            delay_per_slot_ms = config.delay_per_slot.as_millis() as u64,
            delay_ms = config.delay.as_millis() as u64,
            "delay_per_slot can never take effect: the scope's delay between any two sends is always longer"
        );
    }
}

/// The trap of a short `delay` with the default `delay_per_slot`:
/// `ScopeConfig::default().delay(200 ms)` on one lane still sends one
/// request a second, because each lane waits `delay_per_slot` (1 s) after
/// its own last send. With `lanes` lanes (the scope's concurrency capped at
/// `max_concurrency`) the lanes together send at most `lanes /
/// delay_per_slot` requests a second, so the scope runs slower than its
/// `delay` says whenever `delay_per_slot / lanes > delay`.
///
/// It warns when that holds on **one lane** (there the `delay` has no
/// effect at all, whoever set the per-lane delay), and on **several lanes
/// when `delay_per_slot` was left at its default** (a per-lane delay set
/// on purpose with several lanes is the seeds' staggered pattern, such as
/// concurrency 2, delay 0.3 s, per slot 1 s, where the delay does shape the
/// sends). A scope paced by rampup or a custom manager (which replace the
/// configured pace) is not checked.
fn warn_if_delay_per_slot_paces(
    name: &str,
    config: &ScopeConfig,
    default: &ScopeConfig,
    max_concurrency: u32,
) {
    if config.manager.is_some() || config.rampup.or_inherit(&default.rampup).get().is_some() {
        return;
    }
    let lanes = config.concurrency.clamp(1, max_concurrency.max(1));
    if lanes > 1 && config.set_by_user.delay_per_slot {
        return;
    }
    if config.delay_per_slot / lanes <= config.delay {
        return;
    }
    tracing::warn!(
        target: "tower_throttle",
        scope = name,
        delay_ms = config.delay.as_millis() as u64,
        delay_per_slot_ms = config.delay_per_slot.as_millis() as u64,
        lanes,
        "the scope's delay_per_slot paces it, not its delay: each lane waits delay_per_slot after its own last send, \
         so the scope sends at most lanes / delay_per_slot requests a second; set delay_per_slot too \
         (for example to the delay times the lanes) for the delay to take effect"
    );
}

pub(crate) fn validate_window(field: &str, window: Duration) -> Result<(), ConfigError> {
    if window.is_zero() {
        return Err(ConfigError::new(field, window, "must be longer than zero"));
    }
    validate_delay(field, window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_seeds() {
        let config = ScopeConfig::default();
        assert_eq!(config.concurrency, 1);
        assert_eq!(config.delay, Duration::from_secs(1));
        assert_eq!(config.delay_per_slot, Duration::from_secs(1));
        assert_eq!(config.jitter, Jitter::symmetric(0.5));
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases: Vec<(ScopeConfig, &str)> = vec![
            (ScopeConfig::default().concurrency(0), "s concurrency"),
            (ScopeConfig::default().jitter(-0.1), "s jitter"),
            (ScopeConfig::default().jitter(f64::NAN), "s jitter"),
            (ScopeConfig::default().jitter(f64::INFINITY), "s jitter"),
            (ScopeConfig::default().jitter([1.5, 0.0]), "s jitter"),
            (
                ScopeConfig::default().delay(Duration::from_secs(8 * 24 * 3600)),
                "s delay",
            ),
            (
                ScopeConfig::default().delay_per_slot(Duration::MAX),
                "s delay_per_slot",
            ),
            (ScopeConfig::default().quota(0.0), "s quota"),
            (ScopeConfig::default().quota(-5.0), "s quota"),
            (ScopeConfig::default().quota(f64::NAN), "s quota"),
            (ScopeConfig::default().quota(f64::INFINITY), "s quota"),
            (ScopeConfig::default().window(Duration::ZERO), "s window"),
            (
                ScopeConfig::default().window(Duration::from_secs(8 * 24 * 3600)),
                "s window",
            ),
        ];
        for (config, field) in cases {
            let err = config.validate("s").unwrap_err();
            assert_eq!(err.field(), field, "{err}");
        }
    }
}
