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
/// | [`delay_per_slot`](Self::delay_per_slot) | the `delay` | minimum time between two sends on the same lane |
/// | [`jitter`](Self::jitter) | ±0.5 | every wait is multiplied by a factor in `[1 - 0.5, 1 + 0.5]` |
/// | [`count_whole_transfers`](Self::count_whole_transfers) | false | keep the lane until the response body ends, not only until its head |
///
/// # What a scope's config leaves out
///
/// A config given for one scope (with
/// [`RegistryBuilder::scope`](crate::registry::RegistryBuilder::scope),
/// [`RegistryBuilder::ip_scopes`](crate::registry::RegistryBuilder::ip_scopes),
/// [`Registry::set_scope`](crate::Registry::set_scope) or a config file's
/// `[scopes."NAME"]`) takes **every setting it does not set from the
/// default scope's config**; the built-in defaults above apply only where
/// the default scope does not set them either. So
/// `ScopeConfig::default().concurrency(2)` means "two lanes, and otherwise
/// as the default scope", wherever it is given.
///
/// [`delay_per_slot`](Self::delay_per_slot) follows the scope's `delay`
/// unless it is set, on the scope or on the default scope: `delay(500 ms)`
/// alone sends one request every 500 ms on one lane.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::{Registry, ScopeConfig};
///
/// let registry = Registry::builder()
///     .default_scope(ScopeConfig::default().delay(Duration::from_millis(500)).jitter(0.0))
///     .scope("api.example", ScopeConfig::default().concurrency(2))
///     .build()?;
/// let api = registry.scope_config("api.example");
/// assert_eq!(api.get_concurrency(), 2);
/// assert_eq!(api.get_delay(), Duration::from_millis(500)); // the default scope's
/// assert_eq!(api.get_delay_per_slot(), Duration::from_millis(500)); // follows the delay
/// # Ok::<(), tower_throttle::ConfigError>(())
/// ```
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
    /// Which plain settings a builder call set (the others are taken from
    /// the default scope's config); robots.txt, too, yields only to limits
    /// a scope config sets itself.
    pub(crate) set_by_user: SetByUser,
}

/// How long a quota window lasts when neither the scope nor the registry
/// says (the seeds' `THROTTLING_WINDOW`).
pub const DEFAULT_QUOTA_WINDOW: Duration = Duration::from_secs(60);

/// The plain settings a [`ScopeConfig`] sets explicitly. (Its optional
/// settings, such as `backoff` or `quota`, say so by being `Some`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SetByUser {
    pub(crate) concurrency: bool,
    pub(crate) delay: bool,
    pub(crate) delay_per_slot: bool,
    pub(crate) jitter: bool,
    pub(crate) ignore_robots_txt: bool,
    pub(crate) count_whole_transfers: bool,
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
    /// Unless [`delay_per_slot`](Self::delay_per_slot) is set (on this
    /// config or the default scope's), the per-lane delay is this delay
    /// too, so a `delay` alone is the pace of one lane:
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::ScopeConfig;
    ///
    /// // Five requests a second on one lane.
    /// let config = ScopeConfig::default().delay(Duration::from_millis(200));
    /// assert_eq!(config.get_delay_per_slot(), Duration::from_millis(200));
    /// ```
    #[must_use]
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self.set_by_user.delay = true;
        if !self.set_by_user.delay_per_slot {
            self.delay_per_slot = delay;
        }
        self
    }

    /// Minimum time between two sends on the same lane, measured from the
    /// previous send on that lane. Unless set (here or on the default
    /// scope), it is the scope's [`delay`](Self::delay).
    ///
    /// With `c` lanes the scope sends at most `c / delay_per_slot` requests
    /// a second, so when `delay_per_slot / c` is longer than the
    /// [`delay`](Self::delay), this per-lane delay sets the pace. Set it
    /// for the seeds' staggered pattern: 2 lanes, a delay of 0.3 s and
    /// 1 s per lane send at 0.0, 0.3 and 1.0 s. The registry warns
    /// ([`Registry::config_warnings`](crate::Registry::config_warnings))
    /// when a per-lane delay this config sets can never take effect, and
    /// when a scope's own delay has no effect on its one lane because the
    /// per-lane delay is longer.
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
        self.set_by_user.jitter = true;
        self
    }

    /// The lanes (see [`concurrency`](Self::concurrency)).
    pub fn get_concurrency(&self) -> u32 {
        self.concurrency
    }

    /// The delay between any two sends (see [`delay`](Self::delay)).
    pub fn get_delay(&self) -> Duration {
        self.delay
    }

    /// The delay between two sends on one lane (see
    /// [`delay_per_slot`](Self::delay_per_slot)).
    pub fn get_delay_per_slot(&self) -> Duration {
        self.delay_per_slot
    }

    /// The jitter (see [`jitter`](Self::jitter)).
    pub fn get_jitter(&self) -> Jitter {
        self.jitter
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
        self.set_by_user.ignore_robots_txt = true;
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
        self.set_by_user.count_whole_transfers = true;
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

    /// Fills the settings this config leaves to the default scope's: every
    /// one it does not set. The per-lane delay, unless set here or on the
    /// default scope, is the delay this gives. Which settings this config
    /// set stays as it was (robots.txt yields to those alone), so filling
    /// a filled config again changes nothing.
    pub(crate) fn inherit_from(&self, default: &ScopeConfig) -> ScopeConfig {
        fn pick<T>(set: bool, mine: T, theirs: T) -> T {
            if set {
                mine
            } else {
                theirs
            }
        }
        let own = self.set_by_user;
        let delay = pick(own.delay, self.delay, default.delay);
        let delay_per_slot = if own.delay_per_slot {
            self.delay_per_slot
        } else if default.set_by_user.delay_per_slot {
            default.delay_per_slot
        } else {
            delay
        };
        ScopeConfig {
            concurrency: pick(own.concurrency, self.concurrency, default.concurrency),
            delay,
            delay_per_slot,
            jitter: pick(own.jitter, self.jitter, default.jitter),
            ignore_robots_txt: pick(
                own.ignore_robots_txt,
                self.ignore_robots_txt,
                default.ignore_robots_txt,
            ),
            count_whole_transfers: pick(
                own.count_whole_transfers,
                self.count_whole_transfers,
                default.count_whole_transfers,
            ),
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

    /// The per-lane delay this config would have without setting one
    /// itself: the default scope's, when that one sets it, else this
    /// config's delay. (`None`: this is the default scope's config.)
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn delay_per_slot_unless_set(&self, default: Option<&ScopeConfig>) -> Duration {
        match default {
            Some(default) if default.set_by_user.delay_per_slot => default.delay_per_slot,
            _ => self.delay,
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
    fn the_per_lane_delay_follows_the_delay_unless_set() {
        let ms = Duration::from_millis;
        assert_eq!(ScopeConfig::default().delay(ms(500)).delay_per_slot, ms(500));
        assert_eq!(
            ScopeConfig::default()
                .delay_per_slot(ms(100))
                .delay(ms(500))
                .delay_per_slot,
            ms(100),
            "set first, it stays"
        );
        // Completed from a default scope that sets only a delay: the scope's
        // own delay is its per-lane delay.
        let default = ScopeConfig::default().delay(ms(2000));
        let scope = ScopeConfig::default().delay(ms(300)).inherit_from(&default);
        assert_eq!((scope.delay, scope.delay_per_slot), (ms(300), ms(300)));
        let silent = ScopeConfig::default().inherit_from(&default);
        assert_eq!((silent.delay, silent.delay_per_slot), (ms(2000), ms(2000)));
        // A default scope that sets the per-lane delay gives it to scopes
        // that do not set their own.
        let default = ScopeConfig::default().delay_per_slot(Duration::ZERO);
        let scope = ScopeConfig::default().delay(ms(300)).inherit_from(&default);
        assert_eq!(scope.delay_per_slot, Duration::ZERO);
    }

    #[test]
    fn completing_a_config_takes_every_unset_setting_and_keeps_what_was_set() {
        let default = ScopeConfig::default()
            .concurrency(4)
            .delay(Duration::from_millis(700))
            .jitter(0.0)
            .ignore_robots_txt(true)
            .count_whole_transfers(true)
            .quota(10.0);
        let own = ScopeConfig::default().concurrency(2).count_whole_transfers(false);
        let completed = own.inherit_from(&default);
        assert_eq!(completed.concurrency, 2);
        assert_eq!(completed.delay, Duration::from_millis(700));
        assert_eq!(completed.jitter, Jitter::NONE);
        assert!(completed.ignore_robots_txt);
        assert!(!completed.count_whole_transfers, "set to false on the scope");
        assert_eq!(completed.quota, Some(10.0));
        assert_eq!(
            completed.set_by_user, own.set_by_user,
            "robots.txt yields to the scope's own alone"
        );
        assert_eq!(
            completed.inherit_from(&default),
            completed,
            "completing twice changes nothing"
        );
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
