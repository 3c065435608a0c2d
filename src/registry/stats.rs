use std::time::Duration;

use tokio::time::Instant;

use crate::scope::Scope;

/// What set an effective limit of a scope, so you can see *why* a scope is
/// slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LimitSource {
    /// The scope's [`ScopeConfig`](crate::ScopeConfig) (or the default one).
    Config,
    /// The registry's global `max_concurrency`, which caps every scope.
    MaxConcurrency,
    /// Exponential backoff after backoff feedback (429, 503, timeouts, ...).
    Backoff,
    /// AutoThrottle's latency-adaptive delay.
    AutoThrottle,
    /// robots.txt Crawl-delay.
    Robots,
    /// Rampup's search for the fastest accepted pace.
    Rampup,
    /// Pacing to a rate-limit policy the server announced
    /// (`RateLimit-Policy`), spreading the remaining quota until its reset.
    RateLimitPolicy,
}

/// What a server last announced about its rate limits for a scope
/// (`RateLimit`, `RateLimit-Policy`, `X-RateLimit-*` headers).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct AnnouncedLimits {
    /// Quota units per window (`q` of `RateLimit-Policy`).
    pub quota: Option<u64>,
    /// The policy's window (`w`).
    pub window: Option<Duration>,
    /// Quota units left (`r`, `X-RateLimit-Remaining`).
    pub remaining: Option<u64>,
    /// When the quota resets.
    pub reset_at: Option<Instant>,
}

impl AnnouncedLimits {
    /// Limits with every field given.
    pub fn new(
        quota: Option<u64>,
        window: Option<Duration>,
        remaining: Option<u64>,
        reset_at: Option<Instant>,
    ) -> Self {
        AnnouncedLimits {
            quota,
            window,
            remaining,
            reset_at,
        }
    }
}

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
