//! Predictions for users: when a request could go, and why not sooner.

use std::borrow::Cow;
use std::time::Duration;

use tokio::time::Instant;

use super::fast_path::hot;
use super::scope_state::ScopeForecast;
use super::{LimitSource, Registry};
use crate::scope::{Priority, Scope, Scopes};
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
/// [`exact`](Self::exact) is false. A gap that runs from the answer to a
/// request that opened a connection (see the registry's "Cold start")
/// ends a latency average after that request left, and never sooner than
/// the same gap from now while the answer has not come: a prediction
/// does not say *now* while the scope would admit nothing.
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
    /// A request that could go at once, at `now`: no wait, no cause.
    fn now(now: Instant) -> Self {
        Prediction {
            at: now,
            wait: Duration::ZERO,
            cause: None,
            source: None,
            exact: true,
        }
    }

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
        if let Some(authority) = self.word_authority(request) {
            let name = crate::scope::host_scope_name(authority);
            if let Some(prediction) = self.prediction_on_word(&name, Instant::now) {
                return prediction;
            }
        }
        self.predict_on_lock(request)
    }

    /// [`predict_request`](Self::predict_request) for a request whose
    /// first scope's name the caller has (`first`, as
    /// [`first_scope_name`](Self::first_scope_name) gave it), at `now`:
    /// the name is not found again, nor the clock read, when the answer is
    /// *now* on a lock-free word.
    pub(crate) fn predict_queued<B>(
        &self,
        request: &http::Request<B>,
        first: &str,
        now: Instant,
    ) -> Prediction {
        if self.word_authority(request).is_some() {
            // Its first scope is its host's: `first` names it.
            if let Some(prediction) = self.prediction_on_word(first, || now) {
                return prediction;
            }
        }
        self.predict_on_lock(request)
    }

    /// A prediction of *now* (at `now`, the clock read only then) when
    /// `name`'s open lock-free word (cached by this thread, or in the
    /// registry's directory) would admit a
    /// request now (a lane and a global permit free, nobody waiting): the
    /// answer the lock would give, without the lock. `None` says nothing:
    /// the lock decides.
    #[inline]
    fn prediction_on_word(&self, name: &str, now: impl FnOnce() -> Instant) -> Option<Prediction> {
        (hot::would_admit(self.shared.uid, name) || self.shared.words.would_admit(name))
            .then(|| Prediction::now(now()))
    }

    /// The authority of `request` when its one scope is its host's, which
    /// may have a lock-free word (words in use, and see
    /// [`host_scope_authority`](Self::host_scope_authority)).
    #[inline]
    fn word_authority<'a, B>(&self, request: &'a http::Request<B>) -> Option<&'a http::uri::Authority> {
        if !self.shared.global.words_exist() {
            return None;
        }
        self.host_scope_authority(request)
    }

    /// The authority of `request` when the built-in host resolver gives
    /// its scope (it has no [`Scopes`] extension): its first scope is then
    /// named by [`host_scope_name`](crate::scope::host_scope_name) of that
    /// authority, and only by it.
    #[inline]
    pub(crate) fn host_scope_authority<'a, B>(
        &self,
        request: &'a http::Request<B>,
    ) -> Option<&'a http::uri::Authority> {
        if !self.shared.resolves_hosts || request.extensions().get::<Scopes>().is_some() {
            return None;
        }
        request.uri().authority()
    }

    /// The prediction for `request` under the scheduler's lock (out of
    /// the way of [`predict_queued`](Self::predict_queued)'s answer on a
    /// word, which the frontier asks of every request it hands over).
    #[cold]
    #[inline(never)]
    fn predict_on_lock<B>(&self, request: &http::Request<B>) -> Prediction {
        let priority = request
            .extensions()
            .get::<Priority>()
            .copied()
            .unwrap_or_default();
        self.predict_with_priority(&self.resolve(request), priority)
    }

    /// The first scope a throttle of this registry resolves for `request`
    /// (its [`Scopes`] extension, or the resolver's): by name alone when
    /// the built-in host resolver names its host, so that finding the
    /// scope among others costs no new key.
    pub(crate) fn first_scope_name<'a, B>(&self, request: &'a http::Request<B>) -> ScopeName<'a> {
        match self.host_scope_authority(request) {
            Some(authority) => ScopeName::Host(crate::scope::host_scope_name(authority)),
            None => ScopeName::Resolved(self.resolve(request).first().clone()),
        }
    }

    fn predict_with_priority(&self, scopes: &Scopes, priority: Priority) -> Prediction {
        self.with_scheduler(|scheduler, now, _| {
            Prediction::of(scheduler.forecast_new(scopes, priority.0, now), now)
        })
    }
}

/// A request's first scope, as [`Registry::first_scope_name`] finds it: a
/// host's name (a key made only if wanted), or the key the resolver gave.
#[derive(Debug)]
pub(crate) enum ScopeName<'a> {
    Host(Cow<'a, str>),
    Resolved(Scope),
}

impl std::borrow::Borrow<str> for ScopeName<'_> {
    fn borrow(&self) -> &str {
        match self {
            ScopeName::Host(name) => name,
            ScopeName::Resolved(scope) => scope.as_str(),
        }
    }
}

impl From<ScopeName<'_>> for Scope {
    fn from(name: ScopeName<'_>) -> Self {
        match name {
            ScopeName::Host(name) => Scope::from(name),
            ScopeName::Resolved(scope) => scope,
        }
    }
}
