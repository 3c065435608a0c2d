//! Which limit set a scope's pace: named in its stats, in a request's
//! [`Waited`](crate::Waited) and in the wait metrics. Apart from the scope's
//! state, which uses [`waited`](crate::waited), so that `waited` can name
//! it without using the state back.

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
    /// The scope's [quota](crate::ScopeConfig::quota): the first waiter's
    /// cost does not fit what is left of the current window.
    Quota,
    /// A hold: `Retry-After` or a rate-limit reset the server announced
    /// (or [`Registry::hold`](crate::Registry::hold)).
    Hold,
    /// A backoff another worker of the fleet reported to the registry's
    /// [scope store](crate::store).
    Fleet,
    /// The scope's custom [`ScopeManager`](crate::registry::manager::ScopeManager): its delay,
    /// concurrency or hold is the one in force. (A source of its own rather
    /// than `Backoff` or `Rampup`: those name the built-in manager's
    /// settings, which a custom manager does not use.)
    Manager,
}

impl LimitSource {
    /// The source's name in `snake_case`: the `source` label of the wait
    /// metrics, and the fetch tool's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitSource::Config => "config",
            LimitSource::MaxConcurrency => "max_concurrency",
            LimitSource::Backoff => "backoff",
            LimitSource::AutoThrottle => "autothrottle",
            LimitSource::Robots => "robots",
            LimitSource::Rampup => "rampup",
            LimitSource::RateLimitPolicy => "rate_limit_policy",
            LimitSource::Quota => "quota",
            LimitSource::Hold => "hold",
            LimitSource::Fleet => "fleet",
            LimitSource::Manager => "manager",
        }
    }
}
