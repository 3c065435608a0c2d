//! The response future of [`Throttle`](super::Throttle).

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower_service::Service;

use tokio::time::Instant;

use super::body::{ThrottledBody, Transfer};
use super::errors::{ErrorMode, InnerErrors};
use super::store_admission::{Stopped, StoreAdmission};
use super::ticket::Ticket;
use crate::departure::{self, stamp::WriteStamp};
use crate::registry::{collect, Outcome, RequestBound};
use crate::scope::{handover, Scopes};
use crate::time::Stamp;

pin_project! {
    /// Waits for the request's turn (in the registry, then in its scope
    /// store if it has one), then drives the inner service's future.
    /// Dropping it at any point releases the request's queue place, lanes,
    /// global permit and store leases. Once the response head arrives, the
    /// request's lanes go back (by default), or, for a request of a scope
    /// that [counts whole transfers](crate::ScopeConfig::count_whole_transfers),
    /// the response's [`ThrottledBody`] holds them until its end.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, Req, M = InnerErrors>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req, S::Future>,
        // Moved into the response's body when the transfer outlasts the
        // head.
        ticket: Option<Ticket>,
        // The client's write stamp, when a `DepartureStamp` inside gives
        // one: the departure waits for it.
        write_stamp: Option<Arc<WriteStamp>>,
        adjust_autothrottle: bool,
        // The request's scopes when one of them counts whole transfers:
        // the response's body then holds the lanes until its end (and
        // tells the registry whether it is read). `None`: the lanes go
        // back at the head.
        whole_transfer: Option<Box<Scopes>>,
        // Whether the scopes also go into the request's extensions (kept
        // here, where padding has room, not in the parked request).
        record_scopes: bool,
        mode: PhantomData<fn() -> M>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req, F> {
        // Waiting for the scopes to admit the request, then for the inner
        // service to be ready. The handle was never readied, or gave its
        // readiness back: a waiting request holds nothing of the inner
        // service (no `ConcurrencyLimit` permit, no `Buffer` slot).
        Waiting {
            // Boxed so the future stays small for the common case of a
            // request sent at once; taken exactly once, when it is sent.
            waiting: Option<Box<Parked<S, Req>>>,
        },
        Calling {
            #[pin]
            future: F,
        },
        Done,
    }
}

/// A request waiting for its turn, with the handle that will send it and
/// the scopes it goes with.
struct Parked<S, Req> {
    service: S,
    request: Req,
    scopes: Scopes,
    /// Its reservation in the registry's store, when there is one (boxed:
    /// a waiting request without a store pays 8 bytes for it).
    fleet: Option<Box<StoreAdmission>>,
}

impl<S, ReqBody, M> ResponseFuture<S, http::Request<ReqBody>, M>
where
    S: Service<http::Request<ReqBody>>,
{
    /// `readied` is the handle `Throttle::poll_ready` readied; `scopes`
    /// are handed over with the request (and `record`ed in its extensions
    /// too when asked: see [`hand_over`]). `bound`: the request's own, as
    /// its ticket was queued with it, and when it was queued (`None`: now),
    /// for the registry's store, whose step comes after the scheduler's.
    #[inline(always)]
    pub(crate) fn new(
        readied: S,
        request: http::Request<ReqBody>,
        (scopes, record_scopes): (Scopes, bool),
        (mut ticket, bound): (Ticket, (RequestBound, Option<Instant>)),
        (adjust_autothrottle, whole_transfer): (bool, Option<Box<Scopes>>),
    ) -> Self
    where
        S: Clone,
    {
        // The common case: the request could be sent at once, so the inner
        // call starts now and the waiting state is never entered. With a
        // store, the store has its say first.
        // A request failed for its bounds is not sent: it parks, and fails
        // at its first poll (nothing reaches the inner service).
        let (state, write_stamp) = if ticket.is_sent() && !ticket.has_fleet() {
            let (future, write_stamp) =
                hand_over(readied, request, ticket.registry_id(), scopes, record_scopes);
            (State::Calling { future }, write_stamp)
        } else {
            ticket.note_parked();
            (
                park(
                    readied,
                    request,
                    scopes,
                    (ticket.has_fleet(), ticket.is_refused()),
                    (&ticket, bound),
                ),
                None,
            )
        };
        ResponseFuture {
            state,
            ticket: Some(ticket),
            write_stamp,
            adjust_autothrottle,
            whole_transfer,
            record_scopes,
            mode: PhantomData,
        }
    }
}

/// The waiting state of a request that cannot be sent yet (its scopes do
/// not allow it, or the registry's store has its say first). Out of line:
/// the common path, a request sent at once, moves the request only into
/// the inner call.
#[cold]
#[inline(never)]
fn park<S, Req>(
    readied: S,
    request: Req,
    scopes: Scopes,
    (has_fleet, refused): (bool, bool),
    (ticket, (bound, queued_at)): (&Ticket, (RequestBound, Option<Instant>)),
) -> State<S, Req, S::Future>
where
    S: Service<Req> + Clone,
{
    if refused {
        // Failed for its bounds: nothing to keep, it fails at its first
        // poll.
        return State::Waiting { waiting: None };
    }
    // Give the readiness back while the request waits: a clone is not
    // ready, and dropping the readied handle releases whatever it
    // reserved, so other scopes' requests can use it meanwhile.
    let unreadied = readied.clone();
    drop(readied);
    let fleet = has_fleet.then(|| {
        Box::new(StoreAdmission::new(store_deadline(
            ticket, &scopes, bound, queued_at,
        )))
    });
    State::Waiting {
        waiting: Some(Box::new(Parked {
            service: unreadied,
            request,
            scopes,
            fleet,
        })),
    }
}

/// The deadline of a request of `scopes` queued at `queued_at` (`None`:
/// now) with `bound`, for its store's step, and the bound: the one the
/// scheduler kept while it waited (see `scheduler/bounds.rs`).
fn store_deadline(
    ticket: &Ticket,
    scopes: &Scopes,
    bound: RequestBound,
    queued_at: Option<Instant>,
) -> Option<(Instant, std::time::Duration)> {
    let bound = ticket.registry_handle()?.bound_of(scopes, bound)?;
    let queued_at = queued_at.unwrap_or_else(Instant::now);
    Some((crate::time::saturating_add(queued_at, bound), bound))
}

/// Calls `service` with `request` and the `scopes` the throttle of
/// registry `registry` decided for it, handed to the inner layers through
/// the hand-over slot (see [`handover`]) during the
/// call, and in the request's extensions too when `record` (see
/// [`ThrottleLayer::record_scopes`](super::ThrottleLayer::record_scopes)).
/// Returns the inner future, and the write stamp a
/// [`DepartureStamp`](crate::departure::DepartureStamp) inside gave, if
/// any.
#[inline(always)]
fn hand_over<S, B>(
    mut service: S,
    mut request: http::Request<B>,
    registry: usize,
    scopes: Scopes,
    record: bool,
) -> (S::Future, Option<Arc<WriteStamp>>)
where
    S: Service<http::Request<B>>,
{
    if record {
        request.extensions_mut().insert(scopes.clone());
    }
    let _handing_over = handover::handing_over(registry, scopes);
    // A `DepartureStamp` inside takes the offer (see `departure`).
    let offer = departure::stamp::offer();
    let future = service.call(request);
    (future, offer.take())
}

impl<S, M, ReqBody, ResBody> Future for ResponseFuture<S, http::Request<ReqBody>, M>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>> + Clone,
    M: ErrorMode<S::Error>,
{
    type Output = Result<http::Response<ThrottledBody<ResBody>>, M::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // The common case, a request sent at once without a span, takes the
        // path that has no wait to record.
        let records = self.ticket.as_ref().is_some_and(Ticket::records_a_wait);
        if records || matches!(self.state, State::Waiting { .. }) {
            return self.poll_recording(cx);
        }
        self.poll_steps::<false>(cx)
    }
}

impl<S, M, ReqBody, ResBody> ResponseFuture<S, http::Request<ReqBody>, M>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>> + Clone,
    M: ErrorMode<S::Error>,
{
    /// [`poll_steps`](Self::poll_steps) for a request that waits or
    /// records its wait, inside its span when it has one (its own handle:
    /// the ticket changes while it is entered).
    #[cold]
    fn poll_recording(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<http::Response<ThrottledBody<ResBody>>, M::Error>> {
        let span = self.ticket.as_ref().and_then(Ticket::span);
        let _span = span.cloned().map(tracing::Span::entered);
        self.poll_steps::<true>(cx)
    }

    /// Waits for the turn, hands the request over, drives the inner future.
    /// `RECORDING`: whether the request may record a wait (always, for a
    /// request that still waits: a wait starts its record).
    #[inline(always)]
    fn poll_steps<const RECORDING: bool>(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<http::Response<ThrottledBody<ResBody>>, M::Error>> {
        let mut this = self.project();
        let ticket = this
            .ticket
            .as_mut()
            .expect("ResponseFuture polled after completion");
        loop {
            match this.state.as_mut().project() {
                StateProj::Waiting { waiting } => {
                    if ticket.poll_send(cx).is_pending() {
                        return Poll::Pending;
                    }
                    if let Some(error) = ticket.take_refusal() {
                        this.state.set(State::Done);
                        // Only a throttle that can say it has its requests
                        // failed for their bounds (see `RequestBound`).
                        let error =
                            M::refused(error).expect("a throttle that cannot fail requests applies no bound");
                        return Poll::Ready(Err(error));
                    }
                    let Some(parked) = waiting.as_mut() else {
                        this.state.set(State::Done);
                        continue;
                    };
                    if let Some(fleet) = &mut parked.fleet {
                        match fleet.poll(ticket, cx) {
                            Poll::Pending => return Poll::Pending,
                            Poll::Ready(Ok(())) => ticket.note_store_done(),
                            Poll::Ready(Err(Stopped::Bound)) => {
                                ticket.finish(Outcome::NoResponse);
                                this.state.set(State::Done);
                                let error = ticket.take_refusal().expect("the store's step refused it");
                                let error = M::refused(error)
                                    .expect("a throttle that cannot fail requests applies no bound");
                                return Poll::Ready(Err(error));
                            }
                            Poll::Ready(Err(Stopped::Store(error))) => match M::store(error) {
                                Ok(error) => {
                                    ticket.finish(Outcome::NoResponse);
                                    this.state.set(State::Done);
                                    return Poll::Ready(Err(error));
                                }
                                // This throttle cannot say the store failed:
                                // fail closed by waiting for it.
                                Err(_) => {
                                    fleet.ask_again_later();
                                    continue;
                                }
                            },
                        }
                    }
                    // Admitted: the request keeps its lanes while the inner
                    // service gets ready (its own limits come after ours).
                    match parked.service.poll_ready(cx) {
                        Poll::Ready(Ok(())) => {}
                        Poll::Ready(Err(error)) => {
                            ticket.finish(Outcome::NoResponse);
                            this.state.set(State::Done);
                            return Poll::Ready(Err(M::inner(error)));
                        }
                        // Not leaving yet: the scopes' next gaps run from
                        // its departure, whenever that comes.
                        Poll::Pending => return Poll::Pending,
                    }
                    let Parked {
                        service,
                        request,
                        scopes,
                        fleet: _,
                    } = *waiting.take().expect("checked above");
                    let registry = ticket.registry_id();
                    let (future, write_stamp) =
                        hand_over(service, request, registry, scopes, *this.record_scopes);
                    ticket.note_called();
                    *this.write_stamp = write_stamp;
                    this.state.set(State::Calling { future });
                }
                StateProj::Calling { future } => {
                    // The feedback layers inside leave their reports for
                    // the completion's lock (see `registry::report::collect`).
                    let registry = ticket.registry_id();
                    let (polled, left) = collect::collecting(registry, || future.poll(cx));
                    // The hand-over is the inner future's first poll: see
                    // the module docs of `throttle`. Free after the first.
                    // With a write stamp, the departure is the later of the
                    // two (see `departure`).
                    let departed = match this.write_stamp {
                        None => ticket.depart(),
                        Some(stamp) => ticket.depart_on_write(stamp, cx),
                    };
                    if let (true, Some(handed_over)) = (RECORDING, departed) {
                        ticket.note_hand_over(handed_over);
                    }
                    let mut output = match polled {
                        Poll::Ready(output) => output,
                        Poll::Pending => {
                            // Left by a layer inside that retried.
                            if left {
                                ticket.apply_reports(&collect::take(registry));
                            }
                            return Poll::Pending;
                        }
                    };
                    if let Some(stamp) = this.write_stamp {
                        ticket.settle_write(stamp);
                    }
                    if RECORDING && ticket.records_a_wait() {
                        ticket.leave_record(&mut output);
                    }
                    this.state.set(State::Done);
                    let response = match output {
                        Ok(response) => response,
                        Err(error) => {
                            if left {
                                ticket.finish_reported(
                                    Outcome::NoResponse,
                                    departed,
                                    &collect::take(registry),
                                );
                            } else {
                                ticket.finish_at(Outcome::NoResponse, departed);
                            }
                            return Poll::Ready(Err(M::inner(error)));
                        }
                    };
                    let status = response.status().as_u16();
                    let adjust_autothrottle = *this.adjust_autothrottle;
                    let Some(scopes) = this.whole_transfer.take() else {
                        let outcome = Outcome::Response {
                            status,
                            adjust_autothrottle,
                            answered_at: None,
                        };
                        if left {
                            ticket.finish_reported(outcome, departed, &collect::take(registry));
                        } else {
                            ticket.finish_at(outcome, departed);
                        }
                        return Poll::Ready(Ok(response.map(ThrottledBody::released)));
                    };
                    // The transfer goes on: what the layers inside reported
                    // applies now (a hold must stop the scope's other lanes
                    // while this body streams), and the lanes, with the
                    // latency to this head, go back at the body's end.
                    if left {
                        ticket.apply_head_reports(&collect::take(registry));
                    }
                    // Answered in the poll that handed it over: its
                    // departure's reading (and stamp) is the head's too.
                    let head = departed.unwrap_or_else(Instant::now);
                    let answered_at = match (departed, this.write_stamp.is_none()) {
                        (Some(_), true) => ticket.departure_stamp(),
                        _ => None,
                    }
                    .unwrap_or_else(|| Stamp::of(head));
                    let outcome = Outcome::Response {
                        status,
                        adjust_autothrottle,
                        answered_at: Some(answered_at),
                    };
                    let ticket = this.ticket.take().expect("the ticket is taken only here");
                    let transfer = Transfer::new(ticket, outcome, head, scopes);
                    return Poll::Ready(Ok(response.map(|body| ThrottledBody::holding(body, transfer))));
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

impl<S, Req, M> fmt::Debug for ResponseFuture<S, Req, M>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Waiting { .. } => "waiting",
            State::Calling { .. } => "calling",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("ticket", &self.ticket)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiting request's memory is budgeted at 256 bytes beyond its
    /// body (docs/performance.md, `cargo bench --bench memory`: 246.2). What the
    /// parked request keeps beside the request and the inner service's
    /// handle is part of it: its scopes and the store pointer, nothing
    /// more (parking the whole hand-over, registry identity and record
    /// flag included, took the bench to 262.2).
    #[test]
    fn a_parked_request_keeps_only_its_scopes_and_store_pointer_beside_it() {
        let beside =
            std::mem::size_of::<Parked<(), http::Request<()>>>() - std::mem::size_of::<http::Request<()>>();
        assert_eq!(
            beside,
            std::mem::size_of::<Scopes>() + std::mem::size_of::<Option<Box<StoreAdmission>>>()
        );
        assert!(beside <= 40, "{beside} bytes");
    }
}
