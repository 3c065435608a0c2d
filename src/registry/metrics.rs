//! Counters and gauges through the [`metrics`](https://docs.rs/metrics)
//! facade, with the `metrics` feature; without it every function here is
//! empty and compiles away.
//!
//! The names, kinds and labels are listed in the [registry](super#metrics)
//! docs.

use crate::scope::Scope;

/// Where the scheduler reports to: whether counters carry the scope.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Metrics {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) per_scope: bool,
}

#[cfg(feature = "metrics")]
impl Metrics {
    fn count(self, name: &'static str, scope: &Scope) {
        if self.per_scope {
            metrics::counter!(name, "scope" => scope.to_string()).increment(1);
        } else {
            metrics::counter!(name).increment(1);
        }
    }

    pub(crate) fn sent(self, scope: &Scope) {
        self.count("tower_throttle_requests_sent_total", scope);
    }

    pub(crate) fn backoff(self, scope: &Scope) {
        self.count("tower_throttle_backoffs_total", scope);
    }

    pub(crate) fn hold(self, scope: &Scope) {
        self.count("tower_throttle_holds_total", scope);
    }

    pub(crate) fn evicted(self, scope: &Scope) {
        self.count("tower_throttle_evictions_total", scope);
    }

    pub(crate) fn levels(self, waiting: usize, in_flight: u32, scopes: usize) {
        metrics::gauge!("tower_throttle_requests_waiting").set(waiting as f64);
        metrics::gauge!("tower_throttle_requests_in_flight").set(f64::from(in_flight));
        metrics::gauge!("tower_throttle_scopes_tracked").set(scopes as f64);
    }

    /// The in-flight gauge alone: what a request on an open scope's word
    /// changes (see `fast_path`), read only with the feature (reading it
    /// reads every pool of permits).
    pub(crate) fn in_flight(self, in_flight: impl FnOnce() -> u32) {
        metrics::gauge!("tower_throttle_requests_in_flight").set(f64::from(in_flight()));
    }
}

#[cfg(not(feature = "metrics"))]
impl Metrics {
    #[inline(always)]
    pub(crate) fn sent(self, _scope: &Scope) {}

    #[inline(always)]
    pub(crate) fn backoff(self, _scope: &Scope) {}

    #[inline(always)]
    pub(crate) fn hold(self, _scope: &Scope) {}

    #[inline(always)]
    pub(crate) fn evicted(self, _scope: &Scope) {}

    #[inline(always)]
    pub(crate) fn levels(self, _waiting: usize, _in_flight: u32, _scopes: usize) {}

    #[inline(always)]
    pub(crate) fn in_flight(self, _in_flight: impl FnOnce() -> u32) {}
}
