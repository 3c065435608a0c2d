//! The scheduler's settings, given once by the registry's builder.

use std::sync::Arc;
use std::time::Duration;

use super::{Eviction, Scheduler};
use crate::registry::config::ScopeConfig;
use crate::registry::metrics::Metrics;

impl Scheduler {
    /// Reports to the `metrics` facade (with the `metrics` feature).
    pub(crate) fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Warns when more than `threshold` requests wait (once each time the
    /// count passes it).
    pub(crate) fn with_delayed_warn_threshold(mut self, threshold: usize) -> Self {
        self.delayed_warn_threshold = threshold;
        self
    }

    /// IP scopes without a config of their own run with `config`
    /// (completed from the default).
    pub(crate) fn with_ip_scopes(self, config: Option<ScopeConfig>) -> Self {
        let config = config.map(|config| Arc::new(config.inherit_from(&self.configs.default_config())));
        self.configs.set_ip_scopes(config);
        self
    }

    /// Evicts scopes idle for `idle_ttl`, and idle ones first past
    /// `max_scopes`; see the `eviction` module.
    pub(crate) fn with_eviction(mut self, idle_ttl: Duration, max_scopes: usize) -> Self {
        self.eviction = Eviction::new(idle_ttl, max_scopes);
        self
    }

    /// Sends rampup's backoffs to the fleet's search and AutoThrottle's
    /// samples to the fleet's delay (see [`crate::store`]'s "What the fleet
    /// learns").
    pub(crate) fn with_fleet_learning(mut self, learns: bool) -> Self {
        self.fleet_learns = learns;
        self
    }

    /// Caps every hold at `max_hold`.
    pub(crate) fn with_max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = max_hold;
        self
    }
}
