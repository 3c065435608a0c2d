//! Replacing a scope's config at run time ([`Registry::set_scope`]), and
//! the warnings the config checks found ([`Registry::config_warnings`]).

use std::sync::atomic::Ordering;
use std::sync::PoisonError;

use super::checks::{self, ConfigWarning};
use super::{Registry, ScopeConfig};
use crate::error::ConfigError;
use crate::scope::Scope;

impl Registry {
    /// Replaces the config of scope `key` (or sets one for a scope not seen
    /// yet). Waiting requests re-evaluate at once. As with
    /// [`RegistryBuilder::scope`](super::RegistryBuilder::scope), every setting `config` does not set is
    /// the default scope's, and what can never take effect is logged and
    /// listed by [`config_warnings`](Self::config_warnings).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field when a value is invalid, or the
    /// key when the registry's resolver can never give a request that
    /// scope; the old config then stays.
    pub fn set_scope(&self, key: impl Into<Scope>, config: ScopeConfig) -> Result<(), ConfigError> {
        let key = key.into();
        checks::check_key(&*self.shared.resolver, key.as_str())?;
        let name = checks::scope_config_name(key.as_str());
        config.validate(&name)?;
        if config.manager_kind().hears_successes() {
            self.shared.managers_hear_successes.store(true, Ordering::Relaxed);
        }
        // Before the config takes effect: a response judged by it must not
        // skip the lock.
        self.shared.backoff_statuses.add(&config);
        let completed = config.inherit_from(&self.shared.configs.default_config());
        if completed.count_whole_transfers {
            self.shared
                .whole_transfers_somewhere
                .store(true, Ordering::Relaxed);
        }
        let warnings = checks::warnings_of(&name, &completed, self.shared.settings.max_concurrency);
        self.with_scheduler(|scheduler, now, wake| {
            // Under the scheduler's lock: two calls for one scope list the
            // warnings of the config that stays.
            let mut listed = self
                .shared
                .config_warnings
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            listed.retain(|warning| warning.config() != name);
            listed.extend(warnings);
            drop(listed);
            scheduler.set_scope(key, config, now, wake);
        });
        Ok(())
    }

    /// Every warning the config checks found, in words: settings that are
    /// valid but can never take effect, as the registry was built and as
    /// [`set_scope`](Self::set_scope) changed it since (a config replaced
    /// takes its warnings with it). Each was also logged once through
    /// `tracing` (level `WARN`, target `tower_throttle`), which shows
    /// nothing unless the program installs a subscriber.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::{Registry, ScopeConfig};
    ///
    /// let registry = Registry::builder()
    ///     .scope(
    ///         "api.example",
    ///         ScopeConfig::default().delay(Duration::from_secs(2)).delay_per_slot(Duration::from_millis(500)).jitter(0.0),
    ///     )
    ///     .build()?;
    /// for warning in registry.config_warnings() {
    ///     eprintln!("warning: {warning}");
    /// }
    /// assert_eq!(
    ///     registry.config_warnings()[0].message(),
    ///     "delay_per_slot (500 ms) can never take effect: the scope's delay between any two sends (2 s) is always longer"
    /// );
    /// # Ok::<(), tower_throttle::ConfigError>(())
    /// ```
    pub fn config_warnings(&self) -> Vec<ConfigWarning> {
        self.shared
            .config_warnings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
