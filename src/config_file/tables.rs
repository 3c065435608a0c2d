//! The file's shape (every key optional) and the two conversions: a file
//! into resolved scope configs, and resolved configs back into the
//! canonical file, which writes only what differs from what a key would
//! otherwise be.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::values::{OneOrPair, Seconds, Switch};
use crate::registry::{AutoThrottleConfig, BackoffConfig, Jitter, RampupConfig};
use crate::registry::{GlobalSettings, Setting};
use crate::ScopeConfig;

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileTable {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_concurrency: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_queued: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) quota_window: Option<Seconds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) idle_ttl: Option<Seconds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_hold: Option<Seconds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_scopes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) delayed_warn_threshold: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) metrics_per_scope: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) jitter_seed: Option<u64>,
    #[serde(default, skip_serializing_if = "ScopeTable::is_empty")]
    pub(crate) default_scope: ScopeTable,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ip_scopes: Option<ScopeTable>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) scopes: BTreeMap<String, ScopeTable>,
}

/// One scope, or the default scope.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScopeTable {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) concurrency: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) delay: Option<Seconds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) delay_per_slot: Option<Seconds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) jitter: Option<OneOrPair<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ignore_robots_txt: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) count_whole_transfers: Option<bool>,
    /// The 0.1 key, read as the opposite of `count_whole_transfers` and
    /// never written.
    #[serde(skip_serializing)]
    pub(crate) release_at_head: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) quota: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) window: Option<Seconds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_wait: Option<Seconds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_waiting: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) backoff: Option<BackoffTable>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) autothrottle: Option<Switch<AutoThrottleTable>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rampup: Option<Switch<RampupTable>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BackoffTable {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) http_codes: Option<Vec<u16>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) delay_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) min_delay: Option<Seconds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_delay: Option<Seconds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) jitter: Option<OneOrPair<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) window: Option<Seconds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) concurrency_factor: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AutoThrottleTable {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) target_concurrency: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) start_delay: Option<Seconds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_delay: Option<Seconds>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RampupTable {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) backoff_target: Option<OneOrPair<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) window: Option<Seconds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) min_delay: Option<Seconds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_delay: Option<Seconds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) factor: Option<f64>,
}

impl ScopeTable {
    fn is_empty(&self) -> bool {
        *self == ScopeTable::default()
    }
}

/// `Some(new)` when it differs from `old`: what the canonical file writes.
fn changed<T: PartialEq, U>(new: T, old: T, wrap: impl FnOnce(T) -> U) -> Option<U> {
    (new != old).then(|| wrap(new))
}

/// `Some(table)` unless the table is empty.
fn non_empty<T: Default + PartialEq>(table: T) -> Option<T> {
    (table != T::default()).then_some(table)
}

// ---- file → configs ----

/// The global settings a file gives, the rest at their defaults.
pub(crate) fn global_settings(file: &FileTable) -> GlobalSettings {
    let default = GlobalSettings::default();
    GlobalSettings {
        max_concurrency: file.max_concurrency.unwrap_or(default.max_concurrency),
        max_queued: file.max_queued.unwrap_or(default.max_queued),
        quota_window: file.quota_window.map(|w| w.0).or(default.quota_window),
        idle_ttl: file.idle_ttl.map_or(default.idle_ttl, |ttl| ttl.0),
        max_hold: file.max_hold.map_or(default.max_hold, |max| max.0),
        max_scopes: file.max_scopes.unwrap_or(default.max_scopes),
        delayed_warn_threshold: file
            .delayed_warn_threshold
            .unwrap_or(default.delayed_warn_threshold),
        metrics_per_scope: file.metrics_per_scope.unwrap_or(default.metrics_per_scope),
        jitter_seed: file.jitter_seed.or(default.jitter_seed),
    }
}

/// The default scope's config: the built-in defaults, then the table's
/// keys; its quota window is the registry's `quota_window` unless it sets
/// one (as the builder does it).
pub(crate) fn default_scope(table: &ScopeTable, quota_window: Option<Duration>) -> ScopeConfig {
    let mut config = apply(ScopeConfig::default(), table, &ScopeConfig::default());
    config.window = config.window.or(quota_window);
    // A default scope's `false` is its built-in state: nothing to inherit.
    if config.autothrottle == Setting::Off {
        config.autothrottle = Setting::Inherit;
    }
    if config.rampup == Setting::Off {
        config.rampup = Setting::Inherit;
    }
    config
}

/// A scope's config: every key it leaves out is the default scope's (as
/// for a config given in Rust). Only the keys it writes count as set
/// (robots.txt yields to those alone).
pub(crate) fn scope(table: &ScopeTable, default: &ScopeConfig) -> ScopeConfig {
    apply(ScopeConfig::default(), table, default)
}

/// `base` with the table's keys applied; sub-tables start from the
/// default scope's settings (or the built-in ones).
fn apply(base: ScopeConfig, table: &ScopeTable, default: &ScopeConfig) -> ScopeConfig {
    let mut config = base;
    if let Some(lanes) = table.concurrency {
        config = config.concurrency(lanes);
    }
    if let Some(delay) = table.delay {
        config = config.delay(delay.0);
    }
    if let Some(delay) = table.delay_per_slot {
        config = config.delay_per_slot(delay.0);
    }
    if let Some(jitter) = table.jitter {
        config = config.jitter(Jitter::from(jitter));
    }
    if let Some(ignore) = table.ignore_robots_txt {
        config = config.ignore_robots_txt(ignore);
    }
    if let Some(release) = table.release_at_head {
        config = config.count_whole_transfers(!release);
    }
    if let Some(whole) = table.count_whole_transfers {
        config = config.count_whole_transfers(whole);
    }
    if let Some(quota) = table.quota {
        config = config.quota(quota);
    }
    if let Some(window) = table.window {
        config = config.window(window.0);
    }
    if let Some(bound) = table.max_wait {
        config = config.max_wait(bound.0);
    }
    if let Some(waiting) = table.max_waiting {
        config = config.max_waiting(waiting);
    }
    if let Some(backoff) = &table.backoff {
        config = config.backoff(apply_backoff(default.get_backoff().clone(), backoff));
    }
    match &table.autothrottle {
        None => {}
        Some(Switch::Off) => config = config.without_autothrottle(),
        Some(Switch::On) => config = config.autothrottle(default_autothrottle(default)),
        Some(Switch::With(table)) => {
            config = config.autothrottle(apply_autothrottle(default_autothrottle(default), table))
        }
    }
    match &table.rampup {
        None => {}
        Some(Switch::Off) => config = config.without_rampup(),
        Some(Switch::On) => config = config.rampup(default_rampup(default)),
        Some(Switch::With(table)) => config = config.rampup(apply_rampup(default_rampup(default), table)),
    }
    config.inherit_from(default)
}

fn default_autothrottle(default: &ScopeConfig) -> AutoThrottleConfig {
    default.get_autothrottle().copied().unwrap_or_default()
}

fn default_rampup(default: &ScopeConfig) -> RampupConfig {
    default.get_rampup().cloned().unwrap_or_default()
}

fn apply_backoff(mut backoff: BackoffConfig, table: &BackoffTable) -> BackoffConfig {
    if let Some(codes) = &table.http_codes {
        backoff = backoff.http_codes(codes.iter().copied());
    }
    if let Some(factor) = table.delay_factor {
        backoff = backoff.delay_factor(factor);
    }
    if let Some(delay) = table.min_delay {
        backoff = backoff.min_delay(delay.0);
    }
    if let Some(delay) = table.max_delay {
        backoff = backoff.max_delay(delay.0);
    }
    if let Some(jitter) = table.jitter {
        backoff = backoff.jitter(Jitter::from(jitter));
    }
    if let Some(window) = table.window {
        backoff = backoff.window(window.0);
    }
    if let Some(factor) = table.concurrency_factor {
        backoff = backoff.concurrency_factor(factor);
    }
    backoff
}

fn apply_autothrottle(mut autothrottle: AutoThrottleConfig, table: &AutoThrottleTable) -> AutoThrottleConfig {
    if let Some(target) = table.target_concurrency {
        autothrottle = autothrottle.target_concurrency(target);
    }
    if let Some(delay) = table.start_delay {
        autothrottle = autothrottle.start_delay(delay.0);
    }
    if let Some(delay) = table.max_delay {
        autothrottle = autothrottle.max_delay(delay.0);
    }
    autothrottle
}

fn apply_rampup(mut rampup: RampupConfig, table: &RampupTable) -> RampupConfig {
    if let Some(OneOrPair(low, high)) = table.backoff_target {
        rampup = rampup.backoff_target(low..=high);
    }
    if let Some(window) = table.window {
        rampup = rampup.window(window.0);
    }
    if let Some(delay) = table.min_delay {
        rampup = rampup.min_delay(delay.0);
    }
    if let Some(delay) = table.max_delay {
        rampup = rampup.max_delay(delay.0);
    }
    if let Some(factor) = table.factor {
        rampup = rampup.factor(factor);
    }
    rampup
}

// ---- configs → canonical file ----

/// The canonical file: only what differs from what each key would
/// otherwise be.
pub(crate) fn canonical_file(
    settings: &GlobalSettings,
    default: &ScopeConfig,
    ip_scopes: Option<&ScopeConfig>,
    scopes: &BTreeMap<String, ScopeConfig>,
) -> FileTable {
    let built_in = GlobalSettings::default();
    FileTable {
        max_concurrency: changed(settings.max_concurrency, built_in.max_concurrency, |v| v),
        max_queued: changed(settings.max_queued, built_in.max_queued, |v| v),
        quota_window: settings.quota_window.map(Seconds),
        idle_ttl: changed(settings.idle_ttl, built_in.idle_ttl, Seconds),
        max_hold: changed(settings.max_hold, built_in.max_hold, Seconds),
        max_scopes: changed(settings.max_scopes, built_in.max_scopes, |v| v),
        delayed_warn_threshold: changed(
            settings.delayed_warn_threshold,
            built_in.delayed_warn_threshold,
            |v| v,
        ),
        metrics_per_scope: changed(settings.metrics_per_scope, built_in.metrics_per_scope, |v| v),
        jitter_seed: settings.jitter_seed,
        default_scope: default_scope_table(default, settings.quota_window),
        ip_scopes: ip_scopes.map(|config| scope_table(config, default)),
        scopes: scopes
            .iter()
            .map(|(key, config)| (key.clone(), scope_table(config, default)))
            .collect(),
    }
}

fn default_scope_table(config: &ScopeConfig, quota_window: Option<Duration>) -> ScopeTable {
    let built_in = ScopeConfig::default();
    ScopeTable {
        window: changed(config.window, quota_window, |w| w.map(Seconds)).flatten(),
        backoff: config
            .backoff
            .as_ref()
            .and_then(|backoff| non_empty(backoff_table(backoff, &BackoffConfig::default()))),
        autothrottle: config
            .get_autothrottle()
            .map(|on| switch_on(autothrottle_table(on, &AutoThrottleConfig::default()))),
        rampup: config
            .get_rampup()
            .map(|on| switch_on(rampup_table(on, &RampupConfig::default()))),
        ..limits_table(config, &built_in, None)
    }
}

fn scope_table(config: &ScopeConfig, default: &ScopeConfig) -> ScopeTable {
    ScopeTable {
        window: changed(config.window, default.window, |w| w.map(Seconds)).flatten(),
        backoff: non_empty(backoff_table(config.get_backoff(), default.get_backoff())),
        autothrottle: switch_table(
            config.get_autothrottle(),
            default.get_autothrottle(),
            |on, base| autothrottle_table(on, base.unwrap_or(&AutoThrottleConfig::default())),
        ),
        rampup: switch_table(config.get_rampup(), default.get_rampup(), |on, base| {
            rampup_table(on, base.unwrap_or(&RampupConfig::default()))
        }),
        ..limits_table(config, default, Some(default))
    }
}

/// The plain keys of a scope table, against `base` (the built-in
/// defaults for the default scope, else the default scope's config). In
/// a scope's own table (`default` is `Some`), the limits it sets
/// explicitly are written even when they equal the default scope's. The
/// per-lane delay is compared with what it would be without its key.
fn limits_table(config: &ScopeConfig, base: &ScopeConfig, default: Option<&ScopeConfig>) -> ScopeTable {
    let explicit = |set: bool| default.is_some() && set;
    let limit = |value: Duration, base: Duration, set: bool| {
        (explicit(set) || value != base).then_some(Seconds(value))
    };
    ScopeTable {
        concurrency: (explicit(config.set_by_user.concurrency) || config.concurrency != base.concurrency)
            .then_some(config.concurrency),
        delay: limit(config.delay, base.delay, config.set_by_user.delay),
        delay_per_slot: limit(
            config.delay_per_slot,
            config.delay_per_slot_unless_set(default),
            config.set_by_user.delay_per_slot,
        ),
        jitter: changed(config.jitter, base.jitter, OneOrPair::from),
        ignore_robots_txt: changed(config.ignore_robots_txt, base.ignore_robots_txt, |v| v),
        count_whole_transfers: changed(config.count_whole_transfers, base.count_whole_transfers, |v| v),
        quota: changed(config.quota, base.quota, |q| q).flatten(),
        max_wait: changed(config.max_wait, base.max_wait, |w| w.map(Seconds)).flatten(),
        max_waiting: changed(config.max_waiting, base.max_waiting, |n| n).flatten(),
        ..ScopeTable::default()
    }
}

/// A scope's feature switch against the default scope's: nothing when
/// they agree, `false` to turn off what the default turns on, else the
/// keys that differ (`true` when none does).
fn switch_table<C: PartialEq, T: Default + PartialEq>(
    scope: Option<&C>,
    default: Option<&C>,
    table: impl FnOnce(&C, Option<&C>) -> T,
) -> Option<Switch<T>> {
    match (scope, default) {
        (None, None) => None,
        (None, Some(_)) => Some(Switch::Off),
        (Some(on), base) if Some(on) == base => None,
        (Some(on), base) => Some(switch_on(table(on, base))),
    }
}

fn switch_on<T: Default + PartialEq>(table: T) -> Switch<T> {
    match non_empty(table) {
        Some(table) => Switch::With(table),
        None => Switch::On,
    }
}

fn backoff_table(backoff: &BackoffConfig, base: &BackoffConfig) -> BackoffTable {
    BackoffTable {
        http_codes: changed(backoff.http_codes.clone(), base.http_codes.clone(), |c| c),
        delay_factor: changed(backoff.delay_factor, base.delay_factor, |f| f),
        min_delay: changed(backoff.min_delay, base.min_delay, Seconds),
        max_delay: changed(backoff.max_delay, base.max_delay, Seconds),
        jitter: changed(backoff.jitter, base.jitter, OneOrPair::from),
        window: changed(backoff.window, base.window, Seconds),
        concurrency_factor: changed(backoff.concurrency_factor, base.concurrency_factor, |f| f),
    }
}

fn autothrottle_table(autothrottle: &AutoThrottleConfig, base: &AutoThrottleConfig) -> AutoThrottleTable {
    AutoThrottleTable {
        target_concurrency: changed(
            autothrottle.get_target_concurrency(),
            base.get_target_concurrency(),
            |t| t,
        ),
        start_delay: changed(autothrottle.get_start_delay(), base.get_start_delay(), Seconds),
        max_delay: changed(autothrottle.get_max_delay(), base.get_max_delay(), Seconds),
    }
}

fn rampup_table(rampup: &RampupConfig, base: &RampupConfig) -> RampupTable {
    let target = |r: &RampupConfig| OneOrPair(*r.get_backoff_target().start(), *r.get_backoff_target().end());
    RampupTable {
        backoff_target: changed(target(rampup), target(base), |t| t),
        window: changed(rampup.get_window(), base.get_window(), Seconds),
        min_delay: changed(rampup.get_min_delay(), base.get_min_delay(), Seconds),
        max_delay: changed(rampup.get_max_delay(), base.get_max_delay(), Seconds),
        factor: changed(rampup.get_factor(), base.get_factor(), |f| f),
    }
}
