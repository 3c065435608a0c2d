//! Why a request waited: its wait, from the moment it asked the throttle
//! to the moment the inner service had it, broken down by cause.
//!
//! A response whose request waited carries a [`Waited`] in its
//! extensions; read it with [`Waited::from_extensions`], which gives an
//! empty record (zero, no cause) for a request that went at once.
//!
//! ```
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_throttle::waited::{WaitCause, Waited};
//! use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = Registry::builder()
//!     .default_scope(ScopeConfig::default().delay(Duration::from_secs(1)).jitter(0.0))
//!     .build()?;
//! let client = ServiceBuilder::new()
//!     .layer(ThrottleLayer::new(registry))
//!     .service(tower::service_fn(|_request: http::Request<()>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(()))
//!     }));
//! let get = || http::Request::get("http://example.com/").body(()).unwrap();
//! let first = client.clone().oneshot(get()).await?;
//! assert_eq!(Waited::from_extensions(first.extensions()).total(), Duration::ZERO);
//! drop(first); // a lane is busy until its response is read or dropped
//! let second = client.oneshot(get()).await?;
//! let waited = Waited::from_extensions(second.extensions());
//! assert_eq!(waited.total(), Duration::from_secs(1));
//! let (cause, _source, time) = waited.causes().next().unwrap();
//! assert_eq!((cause, time), (WaitCause::Delay, Duration::from_secs(1)));
//! # Ok(())
//! # }
//! ```
//!
//! # How the time is attributed
//!
//! As it passes, with no sampling: each scope with waiters keeps a short
//! log of what held its queue since its oldest waiter came (its lanes, its
//! delay, a hold, another scope, ...), written at the moments the
//! scheduler looks at the scope anyway. A request admitted after waiting
//! reads the part of the log that covers its own wait. So the causes of a
//! request are what held *its scope's queue* while it was in it: a request
//! fifth in line behind a 1 s delay waited 5 s on `Delay`, though four
//! other requests went first.
//!
//! A request with several scopes waited in each of their queues at once.
//! At each instant its cause is the one of the scope that held it: a scope
//! ready for it says [`WaitCause::OtherScope`] (it waits for another of its
//! scopes), so the other scope's cause (its delay, its hold, ...) is taken.
//! What stays `OtherScope` is time when every one of its scopes was ready
//! for it but it waited behind another request that another scope held
//! (the waiters with its scopes ahead of it, in FIFO order).
//!
//! The causes add up to [`total`](Waited::total). The first and last
//! causes, [`Queue`](WaitCause::Queue) and
//! [`HandOver`](WaitCause::HandOver), are measured by the request's own
//! service and future, with the same clock (tokio's, so paused-time tests
//! see exact figures).
//!
//! # Cost
//!
//! A request that goes at once (the common case) records nothing and its
//! response carries no extension: adding one to every response would cost
//! about 40 % of the throttle's own per-request work.
//! [`Waited::from_extensions`] makes the two cases look alike.

use std::fmt;
use std::time::Duration;

use crate::registry::LimitSource;

/// What a request waited on. See the [module docs](self). Displayed as
/// its name in `snake_case` (`delay`, `other_scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum WaitCause {
    /// No queue place was free (the registry's `max_queued`): backpressure
    /// in `poll_ready`, before the request was even queued.
    Queue,
    /// Every scope allowed the request, but the registry's global
    /// `max_concurrency` did not.
    GlobalConcurrency,
    /// The scope's lanes were all in flight.
    Lanes,
    /// The gap since the scope's (or a lane's) last send.
    Delay,
    /// The scope's quota window had no room for the request's cost.
    Quota,
    /// A hold: `Retry-After`, a rate-limit reset, a custom manager's hold
    /// or `Registry::hold`.
    Hold,
    /// The delay of pacing to a rate-limit policy the server announced.
    Pacing,
    /// The scope's next gap runs from an instant still to come: an earlier
    /// request admitted but not yet handed over, or the answer to a request
    /// that opened a connection (a cold scope's first, or a name's first in
    /// the scope of the server it shares).
    Departure,
    /// Its scopes were ready, but the request waited behind (or for)
    /// another request another of its scopes held back: all-or-nothing
    /// admission, or FIFO order behind a waiter that is held.
    OtherScope,
    /// The fleet's [scope store](crate::store) had its say (a reservation
    /// round trip, or the fleet's own limits).
    Store,
    /// Admitted, until the inner service had the request: the task's turn
    /// to run, and the inner service's `poll_ready`.
    HandOver,
    /// [`RobotsDelay`](crate::RobotsDelay) waited for the origin's
    /// robots.txt.
    Robots,
}

impl WaitCause {
    /// The cause's name in `snake_case` (what `Display` writes): the label
    /// of the metrics.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            WaitCause::Queue => "queue",
            WaitCause::GlobalConcurrency => "global_concurrency",
            WaitCause::Lanes => "lanes",
            WaitCause::Delay => "delay",
            WaitCause::Quota => "quota",
            WaitCause::Hold => "hold",
            WaitCause::Pacing => "pacing",
            WaitCause::Departure => "departure",
            WaitCause::OtherScope => "other_scope",
            WaitCause::Store => "store",
            WaitCause::HandOver => "hand_over",
            WaitCause::Robots => "robots",
        }
    }
}

impl fmt::Display for WaitCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One line of a [`Waited`]: a cause, who set the limit that bound (when
/// one did), and the time.
pub type WaitPart = (WaitCause, Option<LimitSource>, Duration);

/// A cause and the source of the limit that bound: how the scheduler
/// notes what holds a queue.
pub(crate) type CauseKey = (WaitCause, Option<LimitSource>);

/// How long a request waited, and on what. See the [module docs](self).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Waited {
    /// In the order each cause first held the request (inline for the
    /// usual one or two: a record costs no allocation of its own).
    parts: smallvec::SmallVec<[WaitPart; 2]>,
    total: Duration,
    attempts: u32,
    earlier_attempts: Duration,
}

impl Waited {
    /// The record in a response's `extensions` (of an `http::Response`, a
    /// `reqwest::Response`, ...): the one the throttle (or a layer around
    /// it) left there, or an empty one (zero, no cause) for a request that
    /// went at once or did not go through a throttle.
    pub fn from_extensions(extensions: &http::Extensions) -> Waited {
        extensions.get::<Waited>().cloned().unwrap_or_default()
    }

    /// The whole wait of the last attempt: from `poll_ready` waiting for a
    /// queue place (or from `call`, when a place was free) to the hand-over
    /// to the inner service, plus any wait for robots.txt around it.
    pub fn total(&self) -> Duration {
        self.total
    }

    /// Each cause with the source of the limit that bound, and its time,
    /// in the order the causes first held the request. They add up to
    /// [`total`](Self::total).
    pub fn causes(&self) -> impl Iterator<Item = WaitPart> + '_ {
        self.parts.iter().copied()
    }

    /// The time spent on `cause`, whatever its source: the sum of the
    /// [`causes`](Self::causes) with that cause.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::waited::WaitCause;
    /// use tower_throttle::Waited;
    ///
    /// # fn report(response: &http::Response<()>) {
    /// let waited = Waited::from_extensions(response.extensions());
    /// let on_lanes: Duration = waited.of_cause(WaitCause::Lanes);
    /// println!("waited {on_lanes:?} for a free lane");
    /// # }
    /// ```
    pub fn of_cause(&self, cause: WaitCause) -> Duration {
        self.parts
            .iter()
            .filter(|(part, _, _)| *part == cause)
            .map(|(_, _, time)| *time)
            .sum()
    }

    /// The cause the request waited on longest (summed over sources), and
    /// its time; `None` when it did not wait.
    pub(crate) fn top_cause(&self) -> Option<(WaitCause, Duration)> {
        let mut best: Option<(WaitCause, Duration)> = None;
        for (cause, _, _) in &self.parts {
            let time = self.of_cause(*cause);
            if best.is_none_or(|(_, longest)| time > longest) {
                best = Some((*cause, time));
            }
        }
        best.filter(|(_, time)| !time.is_zero())
    }

    /// How many times the request was sent: 1, or more when
    /// [`BackoffRetry`](crate::backoff::BackoffRetry) re-sent it. The other
    /// figures are the last attempt's.
    pub fn attempts(&self) -> u32 {
        self.attempts.max(1)
    }

    /// The time from the first attempt's start to the last one's, when the
    /// request was re-sent: the earlier attempts and the waits between
    /// them. Not part of [`total`](Self::total).
    pub fn earlier_attempts(&self) -> Duration {
        self.earlier_attempts
    }

    /// Adds `time` on `cause` (merged with a part of the same cause and
    /// source).
    pub(crate) fn add(&mut self, cause: WaitCause, source: Option<LimitSource>, time: Duration) {
        if time.is_zero() {
            return;
        }
        self.total += time;
        match self
            .parts
            .iter_mut()
            .find(|(known, known_source, _)| *known == cause && *known_source == source)
        {
            Some((_, _, sum)) => *sum += time,
            None => self.parts.push((cause, source, time)),
        }
    }

    /// Records the retries of [`BackoffRetry`](crate::backoff::BackoffRetry).
    pub(crate) fn set_attempts(&mut self, attempts: u32, earlier: Duration) {
        self.attempts = attempts;
        self.earlier_attempts = earlier;
    }

    /// Whether there is anything to say: a wait or a retry.
    pub(crate) fn is_empty(&self) -> bool {
        self.total.is_zero() && self.attempts <= 1
    }

    /// Leaves the record in `extensions`, merged with the one a layer
    /// inside left there: this record is an outer layer's, whose wait came
    /// first, so its causes come first. Nothing when empty.
    pub(crate) fn merge_into(mut self, extensions: &mut http::Extensions) {
        if self.is_empty() {
            return;
        }
        if let Some(inner) = extensions.get_mut::<Waited>() {
            for (cause, source, time) in inner.parts.drain(..) {
                self.add(cause, source, time);
            }
            if self.attempts <= 1 {
                self.attempts = inner.attempts;
                self.earlier_attempts = inner.earlier_attempts;
            }
        }
        extensions.insert(self);
    }
}

/// What a request failed for its bound learnt: the details of an
/// [`Error::is_would_wait`](crate::Error::is_would_wait).
#[derive(Debug)]
pub(crate) struct WouldWait {
    /// The wait the registry predicted when it failed the request.
    pub(crate) retry_after: Duration,
    pub(crate) cause: Option<WaitCause>,
    pub(crate) source: Option<LimitSource>,
    /// Whether the prediction was exact (see `Prediction::exact`).
    pub(crate) exact: bool,
    /// The bound it had.
    pub(crate) bound: Duration,
    /// What it waited, when it was failed after waiting.
    pub(crate) waited: Option<Waited>,
}

impl crate::error::Refused for WouldWait {
    fn retry_after(&self) -> Duration {
        self.retry_after
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl fmt::Display for WouldWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cause = self.cause.map_or("its scopes", WaitCause::as_str);
        match &self.waited {
            Some(waited) => write!(
                f,
                "waited {:?} for its scopes, its bound of {:?}, and would wait {:?} more ({cause})",
                waited.total(),
                self.bound,
                self.retry_after
            ),
            None => write!(
                f,
                "would wait {:?} for its scopes ({cause}), past its bound of {:?}",
                self.retry_after, self.bound
            ),
        }
    }
}

impl crate::Error {
    fn would_wait_details(&self) -> Option<&WouldWait> {
        self.refused()?.downcast_ref::<WouldWait>()
    }

    /// For a request that [would wait](crate::Error::is_would_wait): what
    /// accounts for most of the predicted wait (a hold, the delay, lanes,
    /// ...), and who set that limit.
    pub fn wait_cause(&self) -> Option<(WaitCause, Option<LimitSource>)> {
        let details = self.would_wait_details()?;
        details.cause.map(|cause| (cause, details.source))
    }

    /// For a request that [would wait](crate::Error::is_would_wait) and
    /// was failed after waiting: what it waited until then, by cause.
    pub fn waited(&self) -> Option<&Waited> {
        self.would_wait_details()?.waited.as_ref()
    }

    /// For a request that [would wait](crate::Error::is_would_wait):
    /// whether its predicted wait was exact (see
    /// [`Prediction::exact`](crate::registry::Prediction::exact)).
    pub fn is_exact_prediction(&self) -> Option<bool> {
        Some(self.would_wait_details()?.exact)
    }
}

/// Gives a finished wait to the request's `span` (its total, its top
/// cause and a field per cause, in milliseconds) and to the metrics.
pub(crate) fn report(waited: &Waited, span: Option<&tracing::Span>) {
    if let Some(span) = span {
        span.record("waited_ms", millis(waited.total()));
        if let Some((cause, _)) = waited.top_cause() {
            span.record("top_cause", cause.as_str());
        }
        for cause in waited.parts.iter().map(|(cause, _, _)| *cause) {
            span.record(span_field(cause), millis(waited.of_cause(cause)));
        }
    }
    record_metrics(waited.causes());
}

/// The span field of `cause`: `wait_<cause>_ms`.
fn span_field(cause: WaitCause) -> &'static str {
    match cause {
        WaitCause::Queue => "wait_queue_ms",
        WaitCause::GlobalConcurrency => "wait_global_concurrency_ms",
        WaitCause::Lanes => "wait_lanes_ms",
        WaitCause::Delay => "wait_delay_ms",
        WaitCause::Quota => "wait_quota_ms",
        WaitCause::Hold => "wait_hold_ms",
        WaitCause::Pacing => "wait_pacing_ms",
        WaitCause::Departure => "wait_departure_ms",
        WaitCause::OtherScope => "wait_other_scope_ms",
        WaitCause::Store => "wait_store_ms",
        WaitCause::HandOver => "wait_hand_over_ms",
        WaitCause::Robots => "wait_robots_ms",
    }
}

/// Milliseconds, with the microseconds as a fraction.
pub(crate) fn millis(time: Duration) -> f64 {
    time.as_secs_f64() * 1e3
}

/// Records each part in the `tower_throttle_wait_seconds` histogram,
/// labelled by cause and source (feature `metrics`).
#[cfg(feature = "metrics")]
pub(crate) fn record_metrics(parts: impl Iterator<Item = WaitPart>) {
    for (cause, source, time) in parts {
        let source = source.map_or("none", LimitSource::as_str);
        metrics::histogram!("tower_throttle_wait_seconds", "cause" => cause.as_str(), "source" => source)
            .record(time.as_secs_f64());
    }
}

/// Without the `metrics` feature: nothing.
#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(crate) fn record_metrics(_parts: impl Iterator<Item = WaitPart>) {}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn parts_of_one_cause_and_source_merge_and_add_up_to_the_total() {
        let mut waited = Waited::default();
        waited.add(WaitCause::Lanes, Some(LimitSource::Config), 300 * MS);
        waited.add(WaitCause::Delay, Some(LimitSource::Backoff), 100 * MS);
        waited.add(WaitCause::Delay, Some(LimitSource::Config), 200 * MS);
        waited.add(WaitCause::Lanes, Some(LimitSource::Config), 50 * MS);
        waited.add(WaitCause::Hold, None, Duration::ZERO);
        assert_eq!(waited.total(), 650 * MS);
        assert_eq!(waited.causes().count(), 3);
        assert_eq!(waited.of_cause(WaitCause::Delay), 300 * MS);
        assert_eq!(waited.top_cause(), Some((WaitCause::Lanes, 350 * MS)));
        assert_eq!(
            waited.causes().map(|(_, _, time)| time).sum::<Duration>(),
            waited.total()
        );
    }

    #[test]
    fn an_empty_record_is_not_left_in_the_extensions_and_a_record_merges_into_one_there() {
        let mut extensions = http::Extensions::new();
        Waited::default().merge_into(&mut extensions);
        assert!(extensions.get::<Waited>().is_none());
        assert_eq!(Waited::from_extensions(&extensions).total(), Duration::ZERO);
        assert_eq!(Waited::from_extensions(&extensions).attempts(), 1);

        let mut inner = Waited::default();
        inner.add(WaitCause::Delay, Some(LimitSource::Config), MS);
        inner.merge_into(&mut extensions);
        let mut outer = Waited::default();
        outer.add(WaitCause::Robots, None, 2 * MS);
        outer.merge_into(&mut extensions);
        let both = Waited::from_extensions(&extensions);
        assert_eq!(both.total(), 3 * MS);
        let causes: Vec<_> = both.causes().map(|(cause, _, _)| cause).collect();
        // The outer layer's wait came first.
        assert_eq!(causes, [WaitCause::Robots, WaitCause::Delay]);
    }
}
