use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;

use tower_service::Service;

use super::body::ThrottledBody;
use super::errors::{ErrorMode, InnerErrors};
use super::future::ResponseFuture;
use super::handles::Handle;

use super::ticket::Ticket;
use crate::readiness::take_readied;
use crate::registry::{PlaceHandle, RequestBound};
use crate::scope::{AutoThrottleExempt, Priority, Scopes};
#[cfg(doc)]
use crate::waited::WaitCause;

/// Holds each request until its scopes allow it, then sends it through the
/// inner service. See the [module docs](crate::throttle).
///
/// # Panics
///
/// `call` panics when `poll_ready` did not return `Ready(Ok(()))` first, as
/// the tower contract requires. Waiting uses tokio's timers, so requests
/// that have to wait must be polled inside a tokio runtime with time
/// enabled (`#[tokio::main]` has it), as for `tower::timeout`.
///
/// # Errors
///
/// The inner service's errors, passed through; with `M` =
/// [`StoreErrors`](super::StoreErrors)
/// ([`ThrottleLayer::store_errors`](super::ThrottleLayer::store_errors)),
/// the crate's [`Error`](crate::Error), which can also report that the
/// registry's scope store is unreachable.
///
/// # Clone
///
/// A clone shares the registry (and so every limit) but not the readiness
/// this handle already reserved: each clone calls `poll_ready` for itself.
pub struct Throttle<S, M = InnerErrors> {
    inner: S,
    /// The registry, and the handle its requests keep (see `handles.rs`).
    handle: Arc<Handle>,
    fixed: Option<Scopes>,
    pub(super) record_scopes: bool,
    /// Reserves queue places; each clone has its own (it keeps the state of
    /// a pending reservation, and the place reserved until `call`).
    places: PlaceHandle,
    reserved: Reserved,
    /// Since when `poll_ready` waited for a queue place: the next
    /// request's [`WaitCause::Queue`] lasts from then until it is queued.
    place_wait: Option<Instant>,
    mode: PhantomData<fn() -> M>,
}

enum Reserved {
    Nothing,
    /// General mode: a queue place (the handle holds it), and the inner
    /// service was ready.
    Place,
    /// Fixed-scope mode: a ticket, waiting, already sent or failed for its
    /// bound, and when it was queued.
    Ticket(Ticket, Instant),
}

impl<S: fmt::Debug, M> fmt::Debug for Throttle<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttle")
            .field("inner", &self.inner)
            .field("registry", self.handle.registry())
            .field("fixed", &self.fixed)
            .finish_non_exhaustive()
    }
}

impl<S: Clone, M> Clone for Throttle<S, M> {
    fn clone(&self) -> Self {
        Throttle {
            inner: self.inner.clone(),
            handle: self.handle.clone(),
            fixed: self.fixed.clone(),
            record_scopes: self.record_scopes,
            places: self.handle.registry().queue_places(),
            reserved: Reserved::Nothing,
            place_wait: None,
            mode: PhantomData,
        }
    }
}

impl<S, M> Throttle<S, M> {
    pub(crate) fn with_mode(inner: S, handle: Arc<Handle>, fixed: Option<Scopes>) -> Self {
        let places = handle.registry().queue_places();
        Throttle {
            inner,
            handle,
            places,
            fixed,
            record_scopes: false,
            reserved: Reserved::Nothing,
            place_wait: None,
            mode: PhantomData,
        }
    }

    /// Reserves a queue place, and notes since when it waits for one.
    fn poll_queue_place(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let polled = self.places.poll_reserve(cx);
        if polled.is_pending() {
            self.note_place_wait_start();
        }
        polled
    }

    #[cold]
    fn note_place_wait_start(&mut self) {
        self.place_wait.get_or_insert_with(Instant::now);
    }

    /// Waits, in `poll_ready`, for the fixed scopes to admit the next
    /// request; `bounded`: whether the throttle can fail a request, and so
    /// applies the scopes' `max_wait` (the request, not known yet, can
    /// bring no bound of its own). Ready with a ticket failed for its
    /// bound too: its `call` then fails at once.
    fn poll_fixed_scope_admission(
        &mut self,
        cx: &mut Context<'_>,
        scopes: Scopes,
        bounded: bool,
    ) -> Poll<()> {
        if let Reserved::Nothing = self.reserved {
            if self.poll_queue_place(cx).is_pending() {
                return Poll::Pending;
            }
            // `call` may come later than the admission: the departure is
            // recorded once the inner service has the request.
            let place = self.places.take_reserved().expect("a place was just reserved");
            let place = (place, self.place_wait.take());
            let bound = RequestBound {
                max_wait: None,
                enforced: bounded,
            };
            let ticket = Ticket::enqueue(&self.handle, place, scopes, (Priority(0), bound));
            self.reserved = Reserved::Ticket(ticket, Instant::now());
        }
        match &mut self.reserved {
            Reserved::Ticket(ticket, _) => ticket.poll_send(cx),
            _ => Poll::Ready(()),
        }
    }
}

impl<S, M, ReqBody, ResBody> Service<http::Request<ReqBody>> for Throttle<S, M>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>> + Clone,
    M: ErrorMode<S::Error>,
{
    type Response = http::Response<ThrottledBody<ResBody>>;
    type Error = M::Error;
    type Future = ResponseFuture<S, http::Request<ReqBody>, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Our own reservation comes first and the inner service is readied
        // last, so nothing of the inner service (a `ConcurrencyLimit`
        // permit, a `Buffer` slot) is held while this caller waits on us.
        if let Some(scopes) = self.fixed.clone() {
            if self
                .poll_fixed_scope_admission(cx, scopes, M::REFUSES)
                .is_pending()
            {
                return Poll::Pending;
            }
            // Failed for its bound: `call` fails at once, and calls nothing.
            if let Reserved::Ticket(ticket, _) = &self.reserved {
                if ticket.is_refused() {
                    return Poll::Ready(Ok(()));
                }
            }
        } else if let Reserved::Nothing = self.reserved {
            match self.poll_queue_place(cx) {
                Poll::Ready(()) => self.reserved = Reserved::Place,
                Poll::Pending => return Poll::Pending,
            }
        }
        self.inner.poll_ready(cx).map_err(M::inner)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let reserved = std::mem::replace(&mut self.reserved, Reserved::Nothing);
        // Scopes the request carries are already in its extensions (a
        // fixed-scope throttle records its own): looked up only to record.
        let record =
            self.record_scopes && !(self.fixed.is_none() && request.extensions().get::<Scopes>().is_some());
        // Matched on the reservation alone: the common case (a place)
        // moves no ticket through a tuple.
        let (queued, scopes) = match reserved {
            Reserved::Place => {
                let priority = request
                    .extensions()
                    .get::<Priority>()
                    .copied()
                    .unwrap_or_default();
                let place = self.places.take_reserved().expect("poll_ready reserved a place");
                let place = (place, self.place_wait.take());
                // A throttle that cannot fail requests does not even look
                // for a request's bound (its scopes' bounds are warned of).
                let bound = match M::REFUSES {
                    true => RequestBound::of(&request, true),
                    false => RequestBound::NONE,
                };
                let (ticket, scopes) =
                    Ticket::enqueue_resolved(&self.handle, place, &request, (priority, bound));
                ((ticket, (bound, None)), scopes)
            }
            Reserved::Ticket(mut ticket, queued_at) => match &self.fixed {
                Some(scopes) => {
                    ticket.note_called();
                    let bound = RequestBound {
                        max_wait: None,
                        enforced: M::REFUSES,
                    };
                    ((ticket, (bound, Some(queued_at))), scopes.clone())
                }
                None => panic!("poll_ready must be called first"),
            },
            Reserved::Nothing => panic!("poll_ready must be called first"),
        };
        let adjust_autothrottle = request.extensions().get::<AutoThrottleExempt>().is_none();
        let whole_transfer = self
            .handle
            .registry()
            .counts_whole_transfers(&scopes)
            .then(|| Box::new(scopes.clone()));
        let inner = take_readied(&mut self.inner);
        ResponseFuture::new(
            inner,
            request,
            (scopes, record),
            queued,
            (adjust_autothrottle, whole_transfer),
        )
    }
}
