//! The whole registry config as a TOML or JSON file (feature `serde`), in
//! the shape of Scrapy's `THROTTLING_SCOPES`.
//!
//! [`RegistryConfig::from_toml_str`] (or [`from_json_str`](RegistryConfig::from_json_str))
//! reads a file, checks every value with the same rules as
//! [`RegistryBuilder::build`], and [`build`](RegistryConfig::build)s the
//! registry (or [`into_builder`](RegistryConfig::into_builder) gives the
//! builder, to add a resolver). [`Registry::config`] reads the config of a
//! running registry back, including scopes replaced with
//! [`Registry::set_scope`], and [`to_toml_string`](RegistryConfig::to_toml_string)
//! writes it.
//!
//! ```
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_throttle::{ThrottleLayer};
//! use tower_throttle::config_file::RegistryConfig;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = RegistryConfig::from_toml_str(
//!     r#"
//!     max_concurrency = 32
//!
//!     [default_scope]
//!     delay = "500ms"
//!     backoff = { max_delay = "2m" }
//!
//!     [scopes."quotes.toscrape.com"]
//!     concurrency = 16
//!     delay = 0
//!
//!     [scopes."api.toscrape.com"]
//!     rampup = true
//!     quota = 500
//!     "#,
//! )?;
//! let registry = config.build()?;
//!
//! let client = ServiceBuilder::new()
//!     .layer(ThrottleLayer::new(registry.clone()))
//!     .service(tower::service_fn(|_request: http::Request<()>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(()))
//!     }));
//! client.oneshot(http::Request::get("https://quotes.toscrape.com/").body(())?).await?;
//! assert_eq!(registry.scope_stats("quotes.toscrape.com").unwrap().sent, 1);
//!
//! // The config of the running registry, as a file again.
//! assert!(registry.config().to_toml_string()?.contains("concurrency = 16"));
//! # Ok(())
//! # }
//! ```
//!
//! # Keys
//!
//! Every key is optional; the table's second part is the keys of
//! `[default_scope]`, of `[ip_scopes]` (every IP scope without its own,
//! `ip:…`: see [`crate::ip`] and [`RegistryBuilder::ip_scopes`]) and of each
//! `[scopes."NAME"]` (an address or network too: `[scopes."ip:203.0.113.0/24"]`). Durations are seconds
//! as a number (`1.5`) or a string with a unit: `"1.5s"`, `"250ms"`,
//! `"2m"`, `"1h"` (digits, an optional fraction, the unit; nothing
//! negative, no spaces). Jitter is a factor (`0.5`: every wait times
//! `[0.5, 1.5]`) or `[below, above]`.
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `max_concurrency` | 16 | requests in flight over all scopes; caps every scope's `concurrency` |
//! | `max_queued` | 10 000 | requests admitted but not yet sent; at the bound `poll_ready` waits |
//! | `quota_window` | 60 s | quota window of every scope that sets no `window` |
//! | `idle_ttl` | 1 h | how long a scope with nothing in flight or queued is kept |
//! | `max_hold` | 1 h | the longest a `Retry-After`, a RateLimit reset or `Registry::hold` may hold a scope (at most 24 h); longer is capped, with a warning |
//! | `max_scopes` | 100 000 | past this many scopes, idle ones are evicted least recently used first |
//! | `delayed_warn_threshold` | 500 | warn when more requests than this wait for their scopes |
//! | `metrics_per_scope` | false | label metrics with the scope (feature `metrics`) |
//! | `jitter_seed` | random | seed of the jitter's random numbers, for reproducible runs |
//! | `default_scope.KEY`, `scopes."NAME".KEY`: | | |
//! | `concurrency` | 1 | lanes: requests of the scope in flight at once |
//! | `delay` | 1 s | minimum time between the sends of any two requests of the scope |
//! | `delay_per_slot` | the `delay` | minimum time between two sends on the same lane; unless the scope or `[default_scope]` sets it, the scope's `delay` |
//! | `jitter` | 0.5 | random variation of every wait: a factor or `[below, above]`; `0` disables |
//! | `ignore_robots_txt` | false | silence the warning when this scope's own limits override robots.txt's Crawl-delay |
//! | `count_whole_transfers` | false | keep a request's lane until its response body ends, not only until the head (large or slow bodies): see `ScopeConfig::count_whole_transfers`; the 0.1 key `release_at_head` is still read, as its opposite |
//! | `quota` | none | units the scope may spend per `window` |
//! | `window` | `quota_window` | length of the scope's quota windows |
//! | `max_wait` | none | the longest a request of the scope may wait: one predicted to wait longer fails at once (see `ScopeConfig::max_wait`) |
//! | `max_waiting` | none | how many requests of the scope may wait: one more fails at once (see `ScopeConfig::max_waiting`) |
//! | `backoff.http_codes` | `[429, 502, 503, 504, 520, 521, 522, 523, 524]` | statuses that are backoff feedback |
//! | `backoff.delay_factor` | 2.0 | each step multiplies the delay by this (≥ 1) |
//! | `backoff.min_delay` | 1 s | the smallest delay while backing off |
//! | `backoff.max_delay` | 300 s | the largest delay backoff sets (and the largest pacing delay); holds are capped by `max_hold` |
//! | `backoff.jitter` | 0.1 | jitter while backing off |
//! | `backoff.window` | 60 s | quiet time after which the scope takes one step back |
//! | `backoff.concurrency_factor` | 0.5 | each step multiplies the lanes by this (in `(0, 1]`) |
//! | `autothrottle` | off | `true`, `false` or a table: Scrapy's latency-adaptive delay |
//! | `autothrottle.target_concurrency` | 1.0 | requests the scope should have in flight on average |
//! | `autothrottle.start_delay` | 5 s | the delay before the first response adjusts it |
//! | `autothrottle.max_delay` | 60 s | the largest delay AutoThrottle sets |
//! | `rampup` | off | `true`, `false` or a table: search the fastest pace the server accepts |
//! | `rampup.backoff_target` | 1 | backoff feedbacks per window to aim at: a count or `[low, high]` |
//! | `rampup.window` | 60 s | the window backoffs are counted over |
//! | `rampup.min_delay` | 0 | the smallest delay rampup sets |
//! | `rampup.max_delay` | 300 s | the largest delay rampup sets |
//! | `rampup.factor` | 2.0 | the largest slow-down when backoffs exceed the target (> 1) |
//!
//! **Inheritance.** A key a scope leaves out is the `[default_scope]`'s
//! value, as Scrapy's `THROTTLING_SCOPES` entries fall back to the global
//! settings (and as a [`ScopeConfig`] given in Rust takes what it leaves out
//! from the default scope); inside `backoff`, `autothrottle` and `rampup` tables too
//! (`autothrottle = true` turns it on with the default scope's settings).
//! The built-in defaults above apply where `[default_scope]` is silent.
//! Only the `concurrency`, `delay` and `delay_per_slot` a scope writes
//! itself take precedence over a robots.txt Crawl-delay; inherited ones
//! yield to it.
//!
//! # Errors
//!
//! Unknown keys, values of the wrong type and values out of range are a
//! [`ConfigFileError`] that names the key path and the value:
//!
//! ```
//! use tower_throttle::config_file::RegistryConfig;
//!
//! let err = RegistryConfig::from_toml_str(
//!     r#"
//!     [scopes."api.example".backoff]
//!     delay_factor = 0.5
//!     "#,
//! )
//! .unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     r#"scopes."api.example".backoff.delay_factor: must be finite and at least 1.0, got 0.5"#
//! );
//! ```
//!
//! # Writing a config back
//!
//! [`to_toml_string`](RegistryConfig::to_toml_string) writes the
//! *canonical* file: a key is written only when its value differs from
//! what it would be without it (the built-in default at the top level and
//! in `[default_scope]`, the default scope's value in a scope), except a
//! scope's own `concurrency`, `delay` and `delay_per_slot`, which are
//! written whenever the scope set them (they rank above robots.txt).
//! Durations are written as seconds, as a string (`"0.1000000001s"`) when
//! a number would not read back as the same duration. Two configs are
//! equal (`==`) when their canonical files are, so reading the canonical
//! file of a config gives an equal config, and the canonical file of a
//! registry built from any file is a fixed point. A scope set through the
//! Rust API takes what it does not set from the default scope, as a
//! file's scope does, so its file holds only what it sets or changes.
//!
//! The entry points are pure functions of their text, with no I/O, so a
//! fuzz target can call them directly.

mod error;
mod tables;
#[cfg(test)]
mod tests;
mod values;

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use error::ConfigFileError;

use crate::registry::GlobalSettings;
use crate::registry::RegistryBuilder;
use crate::{Registry, ScopeConfig};
use tables::FileTable;

/// A registry's whole config: the global settings, the default scope and
/// every scope's own config. Read it from a file with
/// [`from_toml_str`](Self::from_toml_str) or
/// [`from_json_str`](Self::from_json_str), from a running registry with
/// [`Registry::config`]; see the [module docs](self) for the keys.
///
/// Deserializing it with serde directly (from another format) reads the
/// keys and types but checks no range: [`build`](Self::build) and
/// [`into_builder`](Self::into_builder) do.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RegistryConfig {
    settings: GlobalSettings,
    default_scope: ScopeConfig,
    ip_scopes: Option<ScopeConfig>,
    scopes: BTreeMap<String, ScopeConfig>,
}

impl Default for RegistryConfig {
    /// The config of `Registry::builder().build()`.
    fn default() -> Self {
        RegistryConfig::from_file(&FileTable::default())
    }
}

impl RegistryConfig {
    /// Reads and checks a TOML config.
    ///
    /// # Errors
    ///
    /// A [`ConfigFileError`] for a syntax error (with its line and
    /// column), an unknown key, a value of the wrong type or out of range
    /// (with its key path).
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigFileError> {
        let file = parse_toml(text)?;
        Self::checked(RegistryConfig::from_file(&file))
    }

    /// Reads and checks a JSON config (the same keys as TOML).
    ///
    /// # Errors
    ///
    /// As [`from_toml_str`](Self::from_toml_str).
    pub fn from_json_str(text: &str) -> Result<Self, ConfigFileError> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let file: FileTable = serde_path_to_error::deserialize(&mut deserializer)
            .map_err(|err| ConfigFileError::new(error::key_path(err.path()), err.inner().to_string()))?;
        deserializer
            .end()
            .map_err(|err| ConfigFileError::new("", err.to_string()))?;
        Self::checked(RegistryConfig::from_file(&file))
    }

    /// The canonical TOML file of this config (see the
    /// [module docs](self#writing-a-config-back)).
    ///
    /// # Errors
    ///
    /// A [`ConfigFileError`] if TOML cannot hold a value: a `jitter_seed`
    /// above `i64::MAX` (TOML integers are signed 64-bit).
    pub fn to_toml_string(&self) -> Result<String, ConfigFileError> {
        toml::to_string(self).map_err(|err| ConfigFileError::new("", err.to_string()))
    }

    /// The canonical file of this config as pretty-printed JSON.
    ///
    /// # Errors
    ///
    /// None in practice (every value has a JSON form); the `Result` keeps
    /// the two writers alike.
    pub fn to_json_string(&self) -> Result<String, ConfigFileError> {
        serde_json::to_string_pretty(self).map_err(|err| ConfigFileError::new("", err.to_string()))
    }

    /// Checks every value with the rules of [`RegistryBuilder::build`]:
    /// a [`ConfigFileError`] naming the key path and the value of the first
    /// value out of range.
    pub(crate) fn validate(&self) -> Result<(), ConfigFileError> {
        self.builder_unchecked()
            .check_global_settings()
            .map_err(|err| ConfigFileError::invalid("", &err))?;
        let prefix = "default_scope";
        self.default_scope
            .validate("")
            .map_err(|err| ConfigFileError::invalid(prefix, &err))?;
        if let Some(config) = &self.ip_scopes {
            config
                .validate("")
                .map_err(|err| ConfigFileError::invalid("ip_scopes", &err))?;
        }
        for (key, config) in &self.scopes {
            config
                .validate("")
                .map_err(|err| ConfigFileError::invalid(&format!("scopes.{}", error::toml_key(key)), &err))?;
        }
        Ok(())
    }

    /// A builder with every setting of this config, to add what a file
    /// cannot hold (a [resolver](RegistryBuilder::resolver), a
    /// [scope manager](RegistryBuilder::scope_manager)) before building.
    ///
    /// # Errors
    ///
    /// A [`ConfigFileError`] naming the key path and the value of the first
    /// value out of range.
    pub fn into_builder(self) -> Result<RegistryBuilder, ConfigFileError> {
        self.validate()?;
        Ok(self.builder_unchecked())
    }

    /// Builds the registry (with the default host resolver).
    ///
    /// # Errors
    ///
    /// A [`ConfigFileError`] naming the key path and the value of the first
    /// value out of range, or the `scopes."NAME"` the host resolver never
    /// gives a request (`scopes."Example.com:8080"`), with the name it would
    /// match instead. With a resolver of your own, use
    /// [`into_builder`](Self::into_builder): its keys are then the
    /// resolver's call.
    pub fn build(self) -> Result<Registry, ConfigFileError> {
        // Built with the host resolver: a scope name it never gives a
        // request is an error at the scope's own key path.
        for key in self.scopes.keys() {
            crate::registry::check_key(&crate::scope::HostResolver, key).map_err(|err| {
                ConfigFileError::new(format!("scopes.{}", error::toml_key(key)), err.reason())
            })?;
        }
        let builder = self.into_builder()?;
        // Every value was checked above, with the file's key paths.
        builder.build().map_err(|err| ConfigFileError::invalid("", &err))
    }

    fn checked(config: RegistryConfig) -> Result<Self, ConfigFileError> {
        config.validate()?;
        Ok(config)
    }

    fn from_file(file: &FileTable) -> Self {
        let settings = tables::global_settings(file);
        let default_scope = tables::default_scope(&file.default_scope, settings.quota_window);
        let scopes = file
            .scopes
            .iter()
            .map(|(key, table)| (key.clone(), tables::scope(table, &default_scope)))
            .collect();
        let ip_scopes = file
            .ip_scopes
            .as_ref()
            .map(|table| tables::scope(table, &default_scope));
        RegistryConfig {
            settings,
            default_scope,
            ip_scopes,
            scopes,
        }
    }

    fn canonical_file(&self) -> FileTable {
        tables::canonical_file(
            &self.settings,
            &self.default_scope,
            self.ip_scopes.as_ref(),
            &self.scopes,
        )
    }

    fn builder_unchecked(&self) -> RegistryBuilder {
        let settings = &self.settings;
        let mut builder = Registry::builder()
            .max_concurrency(settings.max_concurrency)
            .max_queued(settings.max_queued)
            .idle_ttl(settings.idle_ttl)
            .max_hold(settings.max_hold)
            .max_scopes(settings.max_scopes)
            .delayed_warn_threshold(settings.delayed_warn_threshold)
            .metrics_per_scope(settings.metrics_per_scope)
            .default_scope(self.default_scope.clone());
        if let Some(config) = &self.ip_scopes {
            builder = builder.ip_scopes(config.clone());
        }
        if let Some(window) = settings.quota_window {
            builder = builder.quota_window(window);
        }
        if let Some(seed) = settings.jitter_seed {
            builder = builder.jitter_seed(seed);
        }
        for (key, config) in &self.scopes {
            builder = builder.scope(key.as_str(), config.clone());
        }
        builder
    }
}

fn parse_toml(text: &str) -> Result<FileTable, ConfigFileError> {
    let deserializer = toml::Deserializer::parse(text).map_err(|err| toml_error(text, &err, ""))?;
    serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let path = error::key_path(err.path());
        toml_error(text, err.inner(), &path)
    })
}

/// A TOML error: at its key path when it is about a key, else at its line
/// and column.
fn toml_error(text: &str, err: &toml::de::Error, key_path: &str) -> ConfigFileError {
    match err.span() {
        Some(span) if key_path.is_empty() => {
            let (line, column) = error::line_and_column(text, span.start);
            ConfigFileError::new("", format!("line {line}, column {column}: {}", err.message()))
        }
        _ => ConfigFileError::new(key_path, err.message()),
    }
}

impl PartialEq for RegistryConfig {
    /// Equal when their canonical files are.
    fn eq(&self, other: &Self) -> bool {
        self.canonical_file() == other.canonical_file()
    }
}

impl Serialize for RegistryConfig {
    /// Writes the canonical file.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.canonical_file().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RegistryConfig {
    /// Reads the keys and their types; ranges are checked by
    /// [`into_builder`](RegistryConfig::into_builder) and [`build`](RegistryConfig::build).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        FileTable::deserialize(deserializer).map(|file| RegistryConfig::from_file(&file))
    }
}

impl Registry {
    /// The registry's config as it is now, including scopes replaced with
    /// [`set_scope`](Self::set_scope), ready to be written as a file with
    /// [`RegistryConfig::to_toml_string`]. (The resolver is not part of it.
    /// Scope managers are code, not settings: they stay in the returned
    /// config but are not written to files, so a file read back has none.)
    #[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
    pub fn config(&self) -> RegistryConfig {
        let (default_scope, scopes) = self.scope_configs();
        RegistryConfig {
            settings: self.global_settings(),
            default_scope,
            ip_scopes: self.ip_scopes_config(),
            scopes: scopes
                .into_iter()
                .map(|(key, config)| (key.as_str().to_owned(), config))
                .collect(),
        }
    }
}
