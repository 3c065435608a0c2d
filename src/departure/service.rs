use std::task::{Context, Poll};

use tower_service::Service;

use super::body::{StampedBody, StampedBy};
use super::stamp;

/// Hands the client each request with a [`StampedBody`], so that the
/// [`Throttle`](crate::Throttle) outside times the request's departure by
/// the instant the client takes it to be written. See the
/// [module docs](crate::departure).
///
/// Its response future is the client's own: it adds nothing after `call`.
#[derive(Debug, Clone)]
pub struct DepartureStamp<S> {
    inner: S,
    on_socket_write: bool,
}

impl<S> DepartureStamp<S> {
    /// `inner`, stamping at the socket write (see
    /// [`DepartureStampLayer::at_socket_write`](super::DepartureStampLayer::at_socket_write)).
    pub(crate) fn at_socket_write(inner: S, on_socket_write: bool) -> Self {
        DepartureStamp {
            inner,
            on_socket_write,
        }
    }
}

impl<S, B> Service<http::Request<B>> for DepartureStamp<S>
where
    S: Service<http::Request<StampedBody<B>>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // The throttle calling this on this thread, if any, takes the stamp.
        let stamp = stamp::claim();
        let by = match self.on_socket_write {
            true => StampedBy::SocketWrite,
            false => StampedBy::FirstQuestion,
        };
        self.inner
            .call(request.map(|body| StampedBody::new(body, stamp, by)))
    }
}
