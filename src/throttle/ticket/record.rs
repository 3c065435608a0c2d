//! The record of why a request waited, kept by its ticket only when it
//! waits (or somebody listens to its span), and its timer.

use std::time::Duration;

use tokio::time::Instant;

use super::{Ticket, WakeTimer};
use crate::error::Error;
use crate::registry::{LimitSource, Refusal, WaitedInScheduler};
use crate::scope::Scopes;
use crate::waited::{WaitCause, Waited, WouldWait};

/// What a ticket keeps only when it waits.
#[derive(Default)]
pub(super) struct Waiting {
    pub(super) timer: Option<Box<WakeTimer>>,
    /// Why the request waited, while it is recorded.
    clock: Option<WaitClock>,
    /// Why the registry failed the request for its bounds, once it did
    /// (the ticket is finished then).
    refused: Option<Box<Refusal>>,
}

impl Waiting {
    /// What a new ticket keeps from the start: the record of its wait when
    /// it waited for a queue place since `place_wait`, when its registry
    /// has a store (`fleet`: the store's say is timed from now), or when
    /// somebody listens to its span. Nothing, in the common case (made at
    /// once, not changed after: a change would cost the common path a copy
    /// of the ticket).
    #[inline(always)]
    pub(super) fn for_request(
        place_wait: Option<Instant>,
        scopes: &Scopes,
        fleet: bool,
    ) -> Option<Box<Waiting>> {
        if place_wait.is_none()
            && !fleet
            && !tracing::enabled!(target: "tower_throttle", tracing::Level::DEBUG)
        {
            return None;
        }
        Some(Self::recording(place_wait, scopes))
    }

    #[cold]
    #[inline(never)]
    fn recording(place_wait: Option<Instant>, scopes: &Scopes) -> Box<Waiting> {
        let now = Instant::now();
        let mut waited = Waited::default();
        if let Some(since) = place_wait {
            waited.add(WaitCause::Queue, None, now.saturating_duration_since(since));
        }
        let span =
            tracing::enabled!(target: "tower_throttle", tracing::Level::DEBUG).then(|| request_span(scopes));
        Box::new(Waiting {
            timer: None,
            refused: None,
            clock: Some(WaitClock {
                waited,
                since: now,
                span,
            }),
        })
    }
}

/// The span of a request with `scopes` (`tower_throttle`, debug): its
/// wait's breakdown is recorded at the hand-over (see [`crate::waited`]).
fn request_span(scopes: &Scopes) -> tracing::Span {
    tracing::debug_span!(
        target: "tower_throttle",
        "throttle",
        scopes = ?scopes,
        waited_ms = tracing::field::Empty,
        top_cause = tracing::field::Empty,
        wait_queue_ms = tracing::field::Empty,
        wait_global_concurrency_ms = tracing::field::Empty,
        wait_lanes_ms = tracing::field::Empty,
        wait_delay_ms = tracing::field::Empty,
        wait_quota_ms = tracing::field::Empty,
        wait_hold_ms = tracing::field::Empty,
        wait_pacing_ms = tracing::field::Empty,
        wait_departure_ms = tracing::field::Empty,
        wait_other_scope_ms = tracing::field::Empty,
        wait_store_ms = tracing::field::Empty,
        wait_hand_over_ms = tracing::field::Empty,
        wait_robots_ms = tracing::field::Empty,
    )
}

/// A request's wait as it is recorded: the parts so far, the end of the
/// last one (where the next part starts), and the request's span when
/// somebody listens.
#[derive(Debug)]
struct WaitClock {
    waited: Waited,
    since: Instant,
    span: Option<tracing::Span>,
}

impl Ticket {
    /// Notes that the registry failed the request for its bounds: it holds
    /// nothing there any more.
    #[cold]
    pub(super) fn note_refusal(&mut self, refusal: Box<Refusal>) {
        self.waiting.get_or_insert_with(Box::default).refused = Some(refusal);
    }

    /// Whether the registry failed the request for its bounds.
    #[inline(always)]
    pub(crate) fn is_refused(&self) -> bool {
        self.waiting
            .as_ref()
            .is_some_and(|waiting| waiting.refused.is_some())
    }

    /// The error of a request the registry failed for its bounds, with
    /// what it waited when it waited (the ticket is finished then).
    #[cold]
    pub(crate) fn take_refusal(&mut self) -> Option<Error> {
        let waiting = self.waiting.as_mut()?;
        let refusal = waiting.refused.take()?;
        let clock = waiting.clock.take();
        Some(match *refusal {
            Refusal::QueueFull { scope, max_waiting } => {
                Error::queue_full(scope.as_str().to_owned(), max_waiting)
            }
            Refusal::WouldWait {
                wait,
                cause,
                exact,
                bound,
                waited,
            } => {
                let waited = waited.map(|parts| {
                    let mut waited = clock.map(|clock| clock.waited).unwrap_or_default();
                    for (cause, source, time) in parts {
                        waited.add(cause, source, time);
                    }
                    waited
                });
                Error::would_wait(Box::new(WouldWait {
                    retry_after: wait,
                    cause: cause.map(|(cause, _)| cause),
                    source: cause.and_then(|(_, source)| source),
                    exact,
                    bound,
                    waited,
                }))
            }
        })
    }

    /// Fails, at `now`, a request the registry's store would send only
    /// after its deadline: `wait` from now (`exact` when the store granted
    /// that instant), past its `bound`; `bound_passed`: the deadline came
    /// while it waited (its wait so far goes into the error, the last part
    /// on the store). The caller then finishes the ticket.
    #[cold]
    pub(crate) fn refuse_in_store(
        &mut self,
        (wait, exact): (Duration, bool),
        bound: Duration,
        bound_passed: bool,
    ) {
        let now = Instant::now();
        let store = (WaitCause::Store, Some(LimitSource::Fleet));
        let waited = bound_passed.then(|| {
            let since = self.clock_mut().map_or(now, |clock| clock.since);
            std::iter::once((store.0, store.1, now.saturating_duration_since(since))).collect()
        });
        self.note_refusal(Box::new(Refusal::WouldWait {
            wait,
            cause: Some(store),
            exact,
            bound,
            waited,
        }));
    }

    /// Notes the store's say, which ended now.
    pub(crate) fn note_store_done(&mut self) {
        if let Some(clock) = self.clock_mut() {
            let now = Instant::now();
            let time = now.saturating_duration_since(clock.since);
            clock.waited.add(WaitCause::Store, Some(LimitSource::Fleet), time);
            clock.since = now;
        }
    }

    /// Notes the hand-over to the inner service at `at`, which ends the
    /// record: gives it to the request's span and to the metrics.
    #[inline]
    pub(crate) fn note_hand_over(&mut self, at: Instant) {
        if let Some(clock) = self.clock_mut() {
            end_wait(clock, at);
        }
    }

    /// Whether the request records a wait (or a span).
    #[inline]
    pub(crate) fn records_a_wait(&self) -> bool {
        self.waiting
            .as_ref()
            .is_some_and(|waiting| waiting.clock.is_some())
    }

    fn clock_mut(&mut self) -> Option<&mut WaitClock> {
        self.waiting.as_mut().and_then(|waiting| waiting.clock.as_mut())
    }

    /// Leaves the record of why the request waited in its response's
    /// extensions, if it waited.
    #[cold]
    pub(crate) fn leave_record<B, E>(&mut self, output: &mut Result<http::Response<B>, E>) {
        let clock = self.waiting.as_mut().and_then(|waiting| waiting.clock.take());
        if let (Some(clock), Ok(response)) = (clock, output) {
            clock.waited.merge_into(response.extensions_mut());
        }
    }

    /// The request's span, when somebody listens.
    #[inline]
    pub(crate) fn span(&self) -> Option<&tracing::Span> {
        self.waiting
            .as_ref()
            .and_then(|waiting| waiting.clock.as_ref())
            .and_then(|clock| clock.span.as_ref())
    }

    /// The record of the request's wait, started at `now` if needed.
    #[cold]
    fn wait_clock(&mut self, now: Instant) -> &mut WaitClock {
        self.waiting
            .get_or_insert_with(Box::default)
            .clock
            .get_or_insert_with(|| WaitClock {
                waited: Waited::default(),
                since: now,
                span: None,
            })
    }

    /// Notes what the scheduler said of the request's wait up to its
    /// admission.
    #[cold]
    pub(super) fn note_scheduler_wait(&mut self, waited: WaitedInScheduler) {
        let clock = self.wait_clock(waited.admitted_at);
        for (cause, source, time) in waited.parts {
            clock.waited.add(cause, source, time);
        }
        clock.since = waited.admitted_at;
    }
}

/// Ends the record of a wait at the hand-over `at`, and reports it. A
/// request that waited for nothing before (its clock runs only for its
/// span) did not wait for its hand-over either: it went at once.
#[cold]
fn end_wait(clock: &mut WaitClock, at: Instant) {
    if !clock.waited.total().is_zero() {
        let time = at.saturating_duration_since(clock.since);
        clock.waited.add(WaitCause::HandOver, None, time);
    }
    clock.since = at;
    crate::waited::report(&clock.waited, clock.span.as_ref());
}
