//! Predictions for users: when a request could go, and why not sooner.

use std::time::Duration;

use tokio::time::Instant;

use super::scope_state::ScopeForecast;
use super::{LimitSource, Registry};
use crate::scope::{Priority, Scopes};
use crate::waited::WaitCause;

/// When a request could be admitted, from the state the registry decides
/// on now: its scopes' holds, their gaps from their last sends (with the
/// jitter already drawn, or the shortest gap the jitter allows for sends
/// still to come), their lanes and per-lane gaps, their quota windows,
/// pacing and robots.txt delays, the requests waiting ahead of it (in the
/// order they go) and the global limit. A prediction takes nothing: no
/// queue place, lane, gap or quota.
///
/// The instant is the earliest the request could go if nothing changes.
/// When a busy lane's end binds, the instant rests on an estimate (the
/// scope's latency average since each busy request left), and so it does
/// when a gap runs from a departure still to come, when a global permit
/// must free first, or when a limit may relax on its own before then:
/// [`exact`](Self::exact) is false.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::waited::WaitCause;
/// use tower_throttle::{Registry, Scopes};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let registry = Registry::default();
/// registry.hold("api.example", Duration::from_secs(30));
/// let prediction = registry.predict(&Scopes::from(["api.example"]));
/// assert_eq!(prediction.wait, Duration::from_secs(30));
/// assert_eq!(prediction.cause, Some(WaitCause::Hold));
/// assert!(prediction.exact);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Prediction {
    /// The earliest instant the request could be admitted.
    pub at: Instant,
    /// The wait until then (zero: it could go now).
    pub wait: Duration,
    /// What accounts for most of the wait (`None` when there is none).
    pub cause: Option<WaitCause>,
    /// Who set the limit behind [`cause`](Self::cause), when one did.
    pub source: Option<LimitSource>,
    /// Whether the instant is exact (see above) rather than an estimate.
    pub exact: bool,
}

impl Prediction {
    /// A scheduler's forecast at `now`, for users.
    pub(crate) fn of(forecast: ScopeForecast, now: Instant) -> Self {
        Prediction {
            at: forecast.at,
            wait: forecast.at.saturating_duration_since(now),
            cause: forecast.cause.map(|(cause, _)| cause),
            source: forecast.cause.and_then(|(_, source)| source),
            exact: forecast.exact,
        }
    }
}

impl Registry {
    /// When a request of `scopes` (with the default priority) could be
    /// admitted if it came now. See [`Prediction`].
    pub fn predict(&self, scopes: &Scopes) -> Prediction {
        self.predict_with_priority(scopes, Priority::default())
    }

    /// When `request` could be admitted if a [`Throttle`](crate::Throttle)
    /// of this registry were called with it now: its scopes resolved as the
    /// throttle resolves them (its [`Scopes`] extension, or the resolver),
    /// at its [`Priority`].
    pub fn predict_request<B>(&self, request: &http::Request<B>) -> Prediction {
        let priority = request
            .extensions()
            .get::<Priority>()
            .copied()
            .unwrap_or_default();
        self.predict_with_priority(&self.resolve(request), priority)
    }

    fn predict_with_priority(&self, scopes: &Scopes, priority: Priority) -> Prediction {
        self.with_scheduler(|scheduler, now, _| {
            Prediction::of(scheduler.forecast_new(scopes, priority.0, now), now)
        })
    }
}
