//! Errors.

use std::fmt;

/// A configuration value was rejected when the registry was built or a scope
/// config was replaced. The message names the field and the value.
///
/// ```
/// use tower_throttle::{Registry, ScopeConfig};
///
/// let err = Registry::builder()
///     .scope("api", ScopeConfig::default().concurrency(0))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.field(), "scope \"api\" concurrency");
/// assert_eq!(err.to_string(), "invalid scope \"api\" concurrency = 0: must be at least 1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: String,
    value: String,
    reason: &'static str,
}

impl ConfigError {
    pub(crate) fn new(field: impl Into<String>, value: impl fmt::Debug, reason: &'static str) -> Self {
        ConfigError {
            field: field.into(),
            value: format!("{value:?}"),
            reason,
        }
    }

    /// The rejected field, e.g. `max_concurrency` or `scope "api" jitter`.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The rejected value, as written in Rust debug notation.
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} = {}: {}", self.field, self.value, self.reason)
    }
}

impl std::error::Error for ConfigError {}
