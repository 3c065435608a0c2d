//! The response body of [`Throttle`](super::Throttle): the inner service's
//! body, holding the request's lanes until the transfer is over when one
//! of its scopes counts whole transfers.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use super::ticket::Ticket;
use crate::registry::{Outcome, Registry};
use crate::scope::Scopes;

pin_project! {
    /// The body of a response from [`Throttle`](super::Throttle): the inner
    /// service's body `B`, passed through unchanged (frames, trailers, size
    /// hint, end of stream).
    ///
    /// By default it holds nothing: the request's lanes and global permit
    /// went back when the response head arrived, and the caller may keep
    /// the response, read or not, as long as it likes.
    ///
    /// For a request of a scope that
    /// [counts whole transfers](crate::ScopeConfig::count_whole_transfers),
    /// it keeps the request's lanes and global permit taken until the
    /// transfer is over, which is when the body
    /// - yields its last frame (the inner body then says `is_end_stream`),
    ///   or `None`;
    /// - fails (yields an error);
    /// - is dropped, read or not.
    ///
    /// So there a response read to its end, or dropped, frees its lanes; a
    /// response kept unread keeps them. A body that is not an
    /// [`http_body::Body`] (a test's `()`, say) frees them when dropped.
    ///
    /// The latency fed to AutoThrottle is the time to the response head in
    /// both cases.
    pub struct ThrottledBody<B> {
        #[pin]
        inner: B,
        transfer: Option<Transfer>,
    }
}

/// A request whose response head arrived and whose body still streams:
/// its ticket (lanes, global permit, store lease) and how it answered,
/// reported to the registry when the transfer ends (dropped).
pub(crate) struct Transfer {
    ticket: Ticket,
    outcome: Outcome,
    /// When the head came (its stamp is the outcome's): the lanes count
    /// from there.
    head: Instant,
    /// Until the body is first polled: the registry counts the response
    /// as held unread (see [`Registry::note_unread_head`]).
    unread: Option<UnreadMark>,
}

impl Transfer {
    /// The transfer of the request of `ticket` with `scopes`, which
    /// answered with `outcome` at `head`.
    pub(crate) fn new(ticket: Ticket, outcome: Outcome, head: Instant, scopes: Box<Scopes>) -> Self {
        let unread = ticket
            .registry_handle()
            .map(|registry| UnreadMark::new(registry, scopes, head));
        Transfer {
            ticket,
            outcome,
            head,
            unread,
        }
    }

    /// Notes that the body was polled: it is no longer held unread.
    fn note_polled(&mut self) {
        self.unread = None;
    }
}

/// A response held unread, as its registry counts it until this is
/// dropped.
struct UnreadMark {
    registry: Registry,
    scopes: Box<Scopes>,
}

impl UnreadMark {
    fn new(registry: Registry, scopes: Box<Scopes>, head: Instant) -> Self {
        registry.note_unread_head(&scopes, head);
        UnreadMark { registry, scopes }
    }
}

impl Drop for UnreadMark {
    fn drop(&mut self) {
        self.registry.note_read(&self.scopes);
    }
}

impl Drop for Transfer {
    fn drop(&mut self) {
        // The response's one report: latency to the head, status, and the
        // lanes freed, under one lock.
        self.ticket.finish_transfer(self.outcome, self.head);
    }
}

impl<B> ThrottledBody<B> {
    /// `inner`, holding `transfer` until its end.
    pub(crate) fn holding(inner: B, transfer: Transfer) -> Self {
        ThrottledBody {
            inner,
            transfer: Some(transfer),
        }
    }

    /// `inner`, whose request freed its lanes already.
    pub(crate) fn released(inner: B) -> Self {
        ThrottledBody {
            inner,
            transfer: None,
        }
    }

    /// Whether this body still holds its request's lanes (its end has not
    /// been seen yet).
    pub fn holds_lanes(&self) -> bool {
        self.transfer.is_some()
    }

    /// The inner body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// The inner body, mutably. Reading it this way does not free the
    /// lanes at its end: only dropping this body then does.
    pub fn get_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// Unwraps the inner body, freeing the request's lanes now: whatever
    /// is read from it afterwards is not counted as a transfer in progress.
    pub fn into_inner(self) -> B {
        let ThrottledBody { inner, transfer } = self;
        drop(transfer);
        inner
    }
}

impl<B: Body> Body for ThrottledBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        if let Some(transfer) = this.transfer.as_mut() {
            transfer.note_polled();
        }
        let polled = this.inner.as_mut().poll_frame(cx);
        if this.transfer.is_some() {
            let over = match &polled {
                Poll::Ready(None | Some(Err(_))) => true,
                // Readers may stop at `is_end_stream` without asking for
                // the `None` that would follow: the last frame ends it.
                Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
                Poll::Pending => false,
            };
            if over {
                drop(this.transfer.take());
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: fmt::Debug> fmt::Debug for ThrottledBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottledBody")
            .field("inner", &self.inner)
            .field("holds_lanes", &self.holds_lanes())
            .finish()
    }
}
