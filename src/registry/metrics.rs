//! Counters and gauges through the [`metrics`](https://docs.rs/metrics)
//! facade, with the `metrics` feature; without it every function here is
//! empty and compiles away.
//!
//! | name | kind | what |
//! |---|---|---|
//! | `tower_throttle_requests_sent_total` | counter | requests handed to the inner service |
//! | `tower_throttle_backoffs_total` | counter | backoff feedbacks received |
//! | `tower_throttle_holds_total` | counter | holds set (Retry-After, rate-limit resets, `Registry::hold`) |
//! | `tower_throttle_evictions_total` | counter | idle scopes evicted |
//! | `tower_throttle_requests_waiting` | gauge | requests waiting for their scopes |
//! | `tower_throttle_requests_in_flight` | gauge | requests sent and not answered |
//! | `tower_throttle_scopes_tracked` | gauge | scopes the registry holds |
//! | `tower_throttle_wait_seconds` | histogram | each part of a request's wait, labelled `cause` and `source` (see [`crate::waited`]; `source` is `none` for causes without one) |
//!
//! The wait histogram is recorded for requests that waited, once each when
//! handed to the inner service (and by `RobotsDelay` for its own wait); its
//! labels are bounded: 12 causes by 12 sources at most.
//!
//! The counters carry a `scope` label only with
//! [`RegistryBuilder::metrics_per_scope`](super::RegistryBuilder::metrics_per_scope):
//! a broad crawl has millions of scopes, which most metrics back ends
//! cannot hold as label values.

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
