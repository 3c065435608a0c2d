//! The checks a registry runs on its configs when it is built and when a
//! scope's config is set: a scope key its resolver can never give a
//! request is an error; a setting that can never take effect is a
//! [`ConfigWarning`], logged and kept for
//! [`Registry::config_warnings`](super::Registry::config_warnings).

use std::fmt;
use std::time::Duration;

use super::config::ScopeConfig;
use crate::error::ConfigError;
use crate::ip::IP_SCOPE_PREFIX;
use crate::scope::ScopeResolver;

/// A setting of the registry's configs that can never take effect, found
/// when the registry was built or a scope's config was set. Each one is
/// also logged once through `tracing` (level `WARN`, target
/// `tower_throttle`); [`Registry::config_warnings`](super::Registry::config_warnings)
/// lists them.
///
/// ```
/// use tower_throttle::{Registry, ScopeConfig};
///
/// let registry = Registry::builder()
///     .max_concurrency(4)
///     .scope("api.example", ScopeConfig::default().concurrency(32))
///     .build()?;
/// let warnings = registry.config_warnings();
/// assert_eq!(warnings.len(), 1);
/// assert_eq!(warnings[0].config(), r#"scope "api.example""#);
/// assert_eq!(
///     warnings[0].to_string(),
///     r#"scope "api.example": concurrency 32 can never take effect: max_concurrency (4) caps it"#
/// );
/// # Ok::<(), tower_throttle::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigWarning {
    config: String,
    message: String,
}

impl ConfigWarning {
    /// The config it is about: `default scope`, `ip scopes`, or
    /// `scope "NAME"`.
    pub fn config(&self) -> &str {
        &self.config
    }

    /// What can never take effect, and why, in words.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.config, self.message)
    }
}

/// How the checks name a config: `default scope`, `ip scopes`, or
/// `scope "NAME"`, as [`ConfigError`]'s fields do.
pub(crate) fn scope_config_name(key: &str) -> String {
    format!("scope {key:?}")
}

/// Whether `resolver` can ever give a request the scope `key`: an error
/// naming the key otherwise. IP scopes (`ip:…`) are added by the
/// [`ip`](crate::ip) layer whatever the resolver, so they always pass.
pub(crate) fn check_key(resolver: &dyn ScopeResolver, key: &str) -> Result<(), ConfigError> {
    if key.starts_with(IP_SCOPE_PREFIX) {
        return Ok(());
    }
    resolver
        .check_key(key)
        .map_err(|why| ConfigError::with_reason("scope key", key, why))
}

/// The settings of `config` (completed from the default scope's) that can
/// never take effect, each logged once. `name` says which config it is
/// (see [`ConfigWarning::config`]); only settings the config sets itself
/// are looked at, so a default scope's setting is reported once, not
/// again for every scope that inherits it.
pub(crate) fn warnings_of(name: &str, config: &ScopeConfig, max_concurrency: u32) -> Vec<ConfigWarning> {
    let own = config.set_by_user;
    let mut messages = Vec::new();
    if own.concurrency && config.concurrency > max_concurrency {
        messages.push(format!(
            "concurrency {} can never take effect: max_concurrency ({max_concurrency}) caps it",
            config.concurrency
        ));
    }
    let (below, above) = (config.jitter.below(), config.jitter.above());
    let longest_lane_gap = config.delay_per_slot.as_secs_f64() * (1.0 + above);
    let shortest_scope_gap = config.delay.as_secs_f64() * (1.0 - below);
    if own.delay_per_slot && !config.delay_per_slot.is_zero() && longest_lane_gap <= shortest_scope_gap {
        messages.push(format!(
            "delay_per_slot ({}) can never take effect: the scope's delay between any two sends ({}) is \
             always longer",
            words(config.delay_per_slot),
            words(config.delay)
        ));
    }
    if let Some(message) = delay_without_effect(config, max_concurrency) {
        messages.push(message);
    }
    messages
        .into_iter()
        .map(|message| {
            tracing::warn!(target: "tower_throttle", config = name, "{message}");
            ConfigWarning {
                config: name.to_owned(),
                message,
            }
        })
        .collect()
}

/// A `delay` this config sets that its one lane never lets take effect: a
/// lane waits `delay_per_slot` after its own last send, and here that is
/// longer. (A scope paced by rampup or a custom manager, which replace
/// the configured pace, is not checked.)
fn delay_without_effect(config: &ScopeConfig, max_concurrency: u32) -> Option<String> {
    let lanes = config.concurrency.clamp(1, max_concurrency.max(1));
    let paced_otherwise = config.manager.is_some() || config.get_rampup().is_some();
    if paced_otherwise || !config.set_by_user.delay || lanes > 1 || config.delay_per_slot <= config.delay {
        return None;
    }
    let from = if config.set_by_user.delay_per_slot {
        ""
    } else {
        ", set on the default scope"
    };
    Some(format!(
        "delay ({}) has no effect on one lane: the lane waits delay_per_slot ({}{from}) after its own last \
         send; set delay_per_slot on this scope too for the delay to take effect",
        words(config.delay),
        words(config.delay_per_slot)
    ))
}

/// A duration as a person writes it: `1.5 s`, `200 ms`, `0 s`.
fn words(duration: Duration) -> String {
    if duration.is_zero() {
        "0 s".to_owned()
    } else if duration < Duration::from_secs(1) && duration.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{} ms", duration.as_millis())
    } else {
        format!("{} s", duration.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(words(Duration::ZERO), "0 s");
        assert_eq!(words(Duration::from_millis(200)), "200 ms");
        assert_eq!(words(Duration::from_secs(1)), "1 s");
        assert_eq!(words(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(words(Duration::from_micros(1500)), "0.0015 s");
    }
}
