//! Snapshots of the registry for users: what each scope's limits are now
//! and which source set them.

use std::time::Duration;

use tokio::time::Instant;

use super::feedback::AnnouncedLimits;
use super::scheduler::{Scheduler, ScopeEntry};
use super::scope_state::LimitSource;
use crate::scope::Scope;

/// A snapshot of one scope, from [`Registry::scope_stats`](crate::Registry::scope_stats).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ScopeStats {
    /// The scope.
    pub scope: Scope,
    /// Requests sent and not yet answered.
    pub in_flight: u32,
    /// Requests waiting for this scope (and possibly others) to allow them.
    pub queued: usize,
    /// Lanes the scope may use now.
    pub concurrency: u32,
    /// What set [`concurrency`](Self::concurrency).
    pub concurrency_limited_by: LimitSource,
    /// Minimum time between two sends of the scope now (before jitter).
    pub delay: Duration,
    /// What set [`delay`](Self::delay).
    pub delay_limited_by: LimitSource,
    /// Minimum time between two sends on one lane now (before jitter).
    pub delay_per_slot: Duration,
    /// Time left on a hold (Retry-After, rate-limit reset), if one is active.
    pub held_for: Option<Duration>,
    /// Requests sent since the scope was first seen.
    pub sent: u64,
    /// Backoff steps in force (0: none).
    pub backoff_level: u32,
    /// The delay backoff contributes now, if backing off.
    pub backoff_delay: Option<Duration>,
    /// Backoff feedbacks received since the scope was first seen.
    pub backoff_feedbacks: u64,
    /// AutoThrottle's delay contribution, when AutoThrottle is on.
    pub autothrottle_delay: Option<Duration>,
    /// The robots.txt Crawl-delay known for the scope.
    pub robots_delay: Option<Duration>,
    /// Whether that Crawl-delay limits the scope: a scope config of its own
    /// keeps the `concurrency` and `delay` it sets, and when it sets both
    /// the Crawl-delay does not apply.
    pub robots_delay_applies: bool,
    /// The pace rampup has set, when rampup is on.
    pub rampup_delay: Option<Duration>,
    /// Rampup windows completed.
    pub rampup_windows: u64,
    /// Moving average of latency (send to response head), once a response
    /// was seen.
    pub latency: Option<Duration>,
    /// Sum of actual costs reported by feedback.
    pub reported_cost: f64,
    /// The delay contributed by pacing to an announced rate-limit policy,
    /// while it applies.
    pub pacing_delay: Option<Duration>,
    /// What the server last announced about its limits.
    pub announced: Option<AnnouncedLimits>,
}

/// A snapshot of the whole registry, from [`Registry::stats`](crate::Registry::stats).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Stats {
    /// Requests in flight over all scopes.
    pub in_flight: u32,
    /// The global cap on requests in flight.
    pub max_concurrency: u32,
    /// Requests waiting to be sent.
    pub waiting: usize,
    /// Every known scope, sorted by name.
    pub scopes: Vec<ScopeStats>,
}

impl Scheduler {
    pub(crate) fn scope_stats(&self, key: &str, now: Instant) -> Option<ScopeStats> {
        Some(self.scope(key)?.stats(now, self.max_concurrency()))
    }

    pub(crate) fn stats(&self, now: Instant) -> Stats {
        let max_concurrency = self.max_concurrency();
        let mut scopes: Vec<ScopeStats> = self
            .scopes()
            .map(|scope| scope.stats(now, max_concurrency))
            .collect();
        scopes.sort_by(|a, b| a.scope.cmp(&b.scope));
        Stats {
            in_flight: self.in_flight(),
            max_concurrency,
            waiting: self.waiting(),
            scopes,
        }
    }
}

impl ScopeEntry {
    fn stats(&self, now: Instant, max_concurrency: u32) -> ScopeStats {
        let scope = &self.state;
        let effective = scope.effective(now, max_concurrency);
        let contributions = &scope.contributions;
        ScopeStats {
            scope: scope.key.clone(),
            in_flight: scope.in_flight,
            queued: self.queued(),
            concurrency: effective.concurrency,
            concurrency_limited_by: effective.concurrency_source,
            delay: effective.delay,
            delay_limited_by: effective.delay_source,
            delay_per_slot: effective.delay_per_slot,
            held_for: contributions
                .hold_until
                .map(|until| until.saturating_duration_since(now))
                .filter(|left| !left.is_zero()),
            sent: scope.sent,
            backoff_level: effective.backoff.map_or(0, |backoff| backoff.level),
            backoff_delay: effective.backoff.map(|backoff| backoff.delay),
            backoff_feedbacks: scope.backoff_feedbacks,
            autothrottle_delay: contributions.autothrottle_delay,
            robots_delay: contributions.robots.map(|robots| robots.crawl_delay),
            robots_delay_applies: contributions.robots.is_some_and(|robots| robots.applies()),
            rampup_delay: contributions.rampup.as_ref().map(|rampup| rampup.delay),
            rampup_windows: contributions.rampup.as_ref().map_or(0, |rampup| rampup.windows),
            latency: scope.latency,
            reported_cost: scope.reported_cost,
            pacing_delay: contributions
                .pacing
                .filter(|(_, until)| now < *until)
                .map(|(delay, _)| delay),
            announced: contributions.announced.as_deref().cloned(),
        }
    }
}
