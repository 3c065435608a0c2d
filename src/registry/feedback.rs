//! What the feedback layers report about a response or an error, and what
//! a server announced about its limits.

use std::time::Duration;

use tokio::time::Instant;

/// What a response (or an error) says about its scopes. Built by the
/// backoff layer's classifier, or by your own hook:
///
/// ```
/// use tower_throttle::registry::Feedback;
///
/// // A scraping API that forwards the target site's status in a header.
/// fn classify(response: &http::Response<()>) -> Feedback {
///     let upstream = response
///         .headers()
///         .get("X-Upstream-Status-Code")
///         .and_then(|value| value.to_str().ok())
///         .and_then(|value| value.parse::<u16>().ok());
///     let feedback = match upstream {
///         Some(429 | 503) => Feedback::backoff(),
///         _ => Feedback::success(),
///     };
///     // The API reports what the request really cost.
///     match response.headers().get("X-Actual-Cost").and_then(|v| v.to_str().ok()) {
///         Some(cost) => match cost.parse::<f64>() {
///             Ok(cost) => feedback.with_actual_cost(cost),
///             Err(_) => feedback,
///         },
///         None => feedback,
///     }
/// }
/// # let response = http::Response::builder().header("X-Upstream-Status-Code", "429").body(()).unwrap();
/// # assert!(classify(&response).is_backoff());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Feedback {
    kind: FeedbackKind,
    actual_cost: Option<f64>,
    remaining_quota: Option<f64>,
    status: Option<http::StatusCode>,
    error_kind: Option<ErrorKind>,
    latency: Option<Duration>,
}

/// What kind of error a [`Feedback`] is about, for a
/// [`ScopeManager`](crate::registry::manager::ScopeManager) that reacts to errors differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request timed out.
    Timeout,
    /// The connection failed (refused, reset, aborted, not established).
    Connection,
    /// Any other error.
    Other,
}

/// The verdict part of a [`Feedback`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FeedbackKind {
    /// The server answered normally.
    Success,
    /// The server pushed back (rate limit, overload, timeout): slow down.
    Backoff,
    /// Say nothing about the scope.
    Ignore,
}

impl Feedback {
    /// The server answered normally.
    pub fn success() -> Self {
        Feedback::of_kind(FeedbackKind::Success)
    }

    /// The server pushed back: the request's scopes take a backoff step.
    pub fn backoff() -> Self {
        Feedback::of_kind(FeedbackKind::Backoff)
    }

    /// Nothing to report.
    pub fn ignore() -> Self {
        Feedback::of_kind(FeedbackKind::Ignore)
    }

    fn of_kind(kind: FeedbackKind) -> Self {
        Feedback {
            kind,
            actual_cost: None,
            remaining_quota: None,
            status: None,
            error_kind: None,
            latency: None,
        }
    }

    /// Adds the status of the response the feedback is about (the backoff
    /// layer adds it), for the scope's [`ScopeManager`](crate::registry::manager::ScopeManager).
    #[must_use]
    pub(crate) fn with_status(mut self, status: http::StatusCode) -> Self {
        self.status = Some(status);
        self
    }

    /// Adds what kind of error the feedback is about: the backoff layer
    /// adds it, for the scope's manager.
    #[must_use]
    pub(crate) fn with_error_kind(mut self, kind: ErrorKind) -> Self {
        self.error_kind = Some(kind);
        self
    }

    /// Adds the request's latency, from its send to its response or error:
    /// the backoff layer measures it, for the scope's manager.
    #[must_use]
    pub(crate) fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = Some(latency);
        self
    }

    /// The response status, if reported.
    pub fn status(&self) -> Option<http::StatusCode> {
        self.status
    }

    /// The kind of error, if reported.
    pub fn error_kind(&self) -> Option<ErrorKind> {
        self.error_kind
    }

    /// The latency, if reported.
    pub fn latency(&self) -> Option<Duration> {
        self.latency
    }

    /// Adds what the request really cost in its scopes' quota units (an API
    /// that reports it in a header, say). Values that are not finite or are
    /// negative are dropped. In a scope with a
    /// [quota](crate::ScopeConfig::quota), the difference from the expected
    /// cost the request was sent with is applied to the current window
    /// (expected 2, actual 2.5: the window shows 0.5 more spent). The
    /// registry also keeps the sum per scope
    /// ([`ScopeStats::reported_cost`](crate::ScopeStats::reported_cost)).
    #[must_use]
    pub fn with_actual_cost(mut self, cost: f64) -> Self {
        self.actual_cost = (cost.is_finite() && cost >= 0.0).then_some(cost);
        self
    }

    /// Adds what the server says is left of the scope's quota in the
    /// current window: in a scope with a [quota](crate::ScopeConfig::quota),
    /// the window's spending becomes `quota − remaining` (quota 10,
    /// remaining 3: 7 spent). Values that are not finite or are negative are
    /// dropped.
    #[must_use]
    pub fn with_remaining_quota(mut self, remaining: f64) -> Self {
        self.remaining_quota = (remaining.is_finite() && remaining >= 0.0).then_some(remaining);
        self
    }

    /// The verdict.
    pub fn kind(&self) -> FeedbackKind {
        self.kind
    }

    /// Whether this is backoff feedback.
    pub fn is_backoff(&self) -> bool {
        self.kind == FeedbackKind::Backoff
    }

    /// The reported actual cost, if any.
    pub fn actual_cost(&self) -> Option<f64> {
        self.actual_cost
    }

    /// The reported remaining quota, if any.
    pub fn remaining_quota(&self) -> Option<f64> {
        self.remaining_quota
    }

    /// Whether the registry has anything to do with this feedback.
    pub(crate) fn says_something(&self) -> bool {
        self.is_backoff() || self.actual_cost.is_some() || self.remaining_quota.is_some()
    }
}

/// What a server last announced about its rate limits for a scope
/// (`RateLimit`, `RateLimit-Policy`, `X-RateLimit-*` headers), as
/// [`ScopeStats::announced`](crate::ScopeStats::announced) shows it.
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
    /// Limits with every field given (the rate-limit header layer reads
    /// them from a response).
    pub(crate) fn new(
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
