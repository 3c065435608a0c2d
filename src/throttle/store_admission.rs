//! A request's passage through the registry's scope store, after the local
//! scheduler admitted it: reserve in the store, sleep until the granted
//! instant (or until the store says to ask again), then go. See the
//! [`store`](crate::store) module docs for the protocol.
//!
//! A bounded request (`max_wait`, `MaxWait`) keeps its deadline here, the
//! one the scheduler gave it as it came: an answer that would send it
//! after the deadline (a grant, or a busy store's next try) fails it then,
//! with the store's wait as its `retry_after`. Its lease, if it had one,
//! goes back unsent; the instant the store granted it stays spent (a
//! store cannot take a grant back), as for a request dropped there.

use std::fmt;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use super::lease::HeldLease;
use super::ticket::Ticket;
use super::wake_timer::WakeTimer;
use crate::scope::Scope;
use crate::store::{
    backend::{Answer, Grant, LeaseId, StoreFuture},
    StoreError, StoreFailure,
};
use crate::time::saturating_add;

/// How long a request that cannot report a store failure waits before it
/// asks the store again.
const ASK_AGAIN_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// How late after its granted instant a request may still go. A send late
/// by `x` shortens the gap to the next worker's send by `x`, so a request
/// woken later than this (a busy runtime, a slow answer) gives its instant
/// up and reserves again.
const LATE_TOLERANCE: Duration = Duration::from_micros(1_500);

/// Instants a request gives up before it goes however late it is: a worker
/// too loaded to keep any instant must not starve.
const MAX_FORFEITS: u8 = 3;

/// How much earlier than a busy answer's retry instant a request asks
/// again, so that its reservation is in place by that instant rather than
/// a round trip (and the timer's rounding up to a whole millisecond) after
/// it: each such lateness would lengthen a gap of the fleet.
const ASK_AHEAD: Duration = Duration::from_millis(2);

/// Retry waits shorter than this are not shortened: asking ahead must not
/// turn a short wait into a fast polling loop.
const ASK_AHEAD_FROM: Duration = Duration::from_millis(10);

fn ask_ahead_of(retry_in: Duration) -> Duration {
    if retry_in >= ASK_AHEAD_FROM {
        retry_in - ASK_AHEAD
    } else {
        retry_in
    }
}

/// Where a request stands with the store.
pub(crate) struct StoreAdmission {
    /// The name of the lease this request takes (the same on every try).
    lease: LeaseId,
    /// The scopes of the reservation with their gaps and first-request
    /// flags, for the lease once granted.
    terms: Vec<(Scope, Duration, bool)>,
    /// Whether a late send must give its instant up: a scope has a delay
    /// and more than one lane, so another worker may already hold the next
    /// instant. (With one lane nobody reserves before this lease is
    /// released, and the release carries the gap from the real departure.)
    forfeit_when_late: bool,
    /// Granted instants given up for lateness.
    forfeits: u8,
    /// The instant by which a bounded request must go, and its bound.
    deadline: Option<(Instant, Duration)>,
    step: Step,
}

/// Why a request leaves the store's step without being sent.
#[derive(Debug)]
pub(crate) enum Stopped {
    /// The store failed, and the registry fails closed.
    Store(StoreError),
    /// The store would send it only after its deadline: the ticket holds
    /// the refusal (see `Ticket::refuse_in_store`).
    Bound,
}

enum Step {
    Ask,
    Asking(StoreFuture<Grant>),
    Sleeping { timer: Box<WakeTimer>, then: Then },
    Done,
}

#[derive(Clone, Copy)]
enum Then {
    Send,
    AskAgain,
}

impl fmt::Debug for StoreAdmission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let step = match self.step {
            Step::Ask => "ask",
            Step::Asking(_) => "asking",
            Step::Sleeping { .. } => "sleeping",
            Step::Done => "done",
        };
        f.debug_struct("StoreAdmission")
            .field("lease", &self.lease)
            .field("step", &step)
            .finish()
    }
}

impl StoreAdmission {
    /// `deadline`: the instant by which a bounded request must go, and its
    /// bound.
    pub(crate) fn new(deadline: Option<(Instant, Duration)>) -> Self {
        StoreAdmission {
            lease: LeaseId(fastrand::u64(..)),
            terms: Vec::new(),
            forfeit_when_late: false,
            forfeits: 0,
            deadline,
            step: Step::Ask,
        }
    }

    /// Resolves when the store lets the request (admitted locally, holding
    /// `ticket`) be sent, or with the store's error when the registry fails
    /// closed. Under `FailLocal` a store error resolves `Ok`: local limits
    /// alone decide. A bounded request the store would send after its
    /// deadline resolves [`Stopped::Bound`].
    pub(crate) fn poll(&mut self, ticket: &mut Ticket, cx: &mut Context<'_>) -> Poll<Result<(), Stopped>> {
        let Some(fleet) = ticket.fleet() else {
            return Poll::Ready(Ok(()));
        };
        loop {
            match &mut self.step {
                Step::Ask => {
                    let reservation = ticket.fleet_reservation(self.lease, &fleet);
                    self.terms = reservation
                        .scopes
                        .iter()
                        .map(|terms| (terms.scope.clone(), terms.delay, terms.first))
                        .collect();
                    self.forfeit_when_late = reservation
                        .scopes
                        .iter()
                        .any(|terms| !terms.delay.is_zero() && terms.concurrency > 1);
                    self.step = Step::Asking(fleet.store.reserve(reservation));
                }
                Step::Asking(asking) => match ready!(asking.as_mut().poll(cx)) {
                    Ok(grant) => {
                        fleet.note_answer();
                        ticket.apply_shared_facts(&grant.facts);
                        // The gap after this send is at least the fleet's
                        // backoff delay, which the store spaced it by but
                        // this worker may not have known when it asked.
                        for ((_, gap, _), facts) in self.terms.iter_mut().zip(&grant.facts) {
                            *gap = (*gap).max(facts.backoff_delay);
                        }
                        let (wait, then) = match grant.answer {
                            Answer::Granted { wait } => {
                                fleet.track(
                                    self.lease,
                                    self.terms.iter().map(|(scope, ..)| scope.clone()).collect(),
                                );
                                ticket.hold_lease(HeldLease::new(self.lease, self.terms.clone()));
                                (wait, Then::Send)
                            }
                            Answer::Busy { retry_in } => {
                                if self.past_deadline(ticket, retry_in, false) {
                                    return Poll::Ready(Err(Stopped::Bound));
                                }
                                (ask_ahead_of(retry_in), Then::AskAgain)
                            }
                        };
                        // The lease just held goes back as the caller
                        // finishes the ticket.
                        if let (Then::Send, true) = (then, self.past_deadline(ticket, wait, true)) {
                            return Poll::Ready(Err(Stopped::Bound));
                        }
                        // Counted from the answer, not from the question:
                        // the store's now lies in between, and a deadline
                        // counted too early would send early.
                        self.sleep(wait, then);
                    }
                    Err(error) => {
                        fleet.note_failure(&error);
                        self.step = Step::Done;
                        return Poll::Ready(match fleet.failure {
                            StoreFailure::FailLocal => Ok(()),
                            StoreFailure::FailClosed => Err(Stopped::Store(error)),
                        });
                    }
                },
                Step::Sleeping { timer, then } => {
                    if Instant::now() < timer.deadline() {
                        ready!(timer.poll(cx));
                        continue;
                    }
                    let (deadline, then) = (timer.deadline(), *then);
                    self.wake_up(deadline, then);
                }
                Step::Done => return Poll::Ready(Ok(())),
            }
        }
    }

    /// Whether a bounded request the store would send (`exact`: a grant)
    /// or let ask again `wait` from now goes past its deadline: then the
    /// ticket is refused and the step done.
    fn past_deadline(&mut self, ticket: &mut Ticket, wait: Duration, exact: bool) -> bool {
        let Some((deadline, bound)) = self.deadline else {
            return false;
        };
        let now = Instant::now();
        if saturating_add(now, wait) <= deadline {
            return false;
        }
        ticket.refuse_in_store((wait, exact), bound, now >= deadline);
        self.step = Step::Done;
        true
    }

    /// For a request that fails closed but cannot report the error: wait
    /// a while and ask the store again (nothing is sent meanwhile).
    pub(crate) fn ask_again_later(&mut self) {
        self.sleep(ASK_AGAIN_AFTER_FAILURE, Then::AskAgain);
    }

    fn sleep(&mut self, wait: Duration, then: Then) {
        self.sleep_until(Instant::now() + wait, then);
    }

    fn sleep_until(&mut self, deadline: Instant, then: Then) {
        if Instant::now() >= deadline {
            self.wake_up(deadline, then);
            return;
        }
        self.step = Step::Sleeping {
            timer: WakeTimer::new(deadline),
            then,
        };
    }

    /// `deadline` has come: go, or give a granted instant up if it is
    /// already too far behind (see [`LATE_TOLERANCE`]), or ask again.
    fn wake_up(&mut self, deadline: Instant, then: Then) {
        let late = Instant::now().saturating_duration_since(deadline);
        self.step = match then {
            Then::Send if self.forfeit_when_late && late > LATE_TOLERANCE && self.forfeits < MAX_FORFEITS => {
                self.forfeits += 1;
                tracing::debug!(
                    target: "tower_throttle",
                    late_us = late.as_micros() as u64,
                    "fleet send instant missed: reserving again"
                );
                Step::Ask
            }
            Then::Send => Step::Done,
            Then::AskAgain => Step::Ask,
        };
    }
}
