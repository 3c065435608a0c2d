//! AutoThrottle for a fleet: one delay per scope, kept in the store and
//! moved by every worker's responses (see the [module docs](super#what-the-fleet-learns)).

use std::time::Duration;

/// One response's AutoThrottle sample, with the scope's settings: what a
/// store needs to apply Scrapy's rule to the fleet's delay
/// ([`ScopeStore::autothrottle`](super::ScopeStore::autothrottle)).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct AutoThrottleSample {
    /// From the send to the response head.
    pub latency: Duration,
    /// The response's status (only a 200 may lower the delay).
    pub status: u16,
    /// The scope's configured delay: the delay never goes below it.
    pub configured_delay: Duration,
    /// The delay before any sample: the configured delay or AutoThrottle's
    /// start delay, whichever is longer.
    pub start_delay: Duration,
    /// AutoThrottle's largest delay (the configured delay if longer).
    pub max_delay: Duration,
    /// The number of requests the server should have in hand at once.
    pub target_concurrency: f64,
}

impl AutoThrottleSample {
    /// Scrapy's rule from the delay `old` (`None`: none yet, the start
    /// delay): `target = latency / target_concurrency`, `new = max(target,
    /// (old + target) / 2)` within `[configured_delay, max_delay]`, and a
    /// response whose status is not 200 may not lower it.
    pub fn next_delay(&self, old: Option<Duration>) -> Duration {
        let old = old.unwrap_or(self.start_delay);
        let target = self.latency.as_secs_f64() / self.target_concurrency;
        let averaged = (old.as_secs_f64() + target) / 2.0;
        let ceiling = self.max_delay.max(self.configured_delay);
        let new = Duration::try_from_secs_f64(target.max(averaged))
            .unwrap_or(ceiling)
            .max(self.configured_delay)
            .min(ceiling);
        if self.status != 200 && new <= old {
            return old;
        }
        new
    }
}
