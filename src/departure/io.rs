//! [`StampingConnector`] and [`StampedIo`]: departures stamped when the
//! connection's socket write returns.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::stamp::{take_armed, WriteStamp};

/// A connector (a `Service<Uri>`, as hyper-util's client takes) whose
/// connections stamp each request's departure when the socket write that
/// carries its head returns: with
/// [`DepartureStampLayer::at_socket_write`](super::DepartureStampLayer::at_socket_write),
/// the scope's next gap runs from when the bytes were with the kernel.
///
/// Wrap the TCP connector (under the TLS connector, for https, so the
/// stamp is the write of the encrypted bytes).
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::Empty;
/// use hyper_util::client::legacy::{connect::HttpConnector, Client};
/// use hyper_util::rt::TokioExecutor;
/// use tower::ServiceBuilder;
/// use tower_throttle::departure::{DepartureStampLayer, StampedBody, StampingConnector};
/// use tower_throttle::{Registry, ThrottleLayer};
///
/// # fn main() -> Result<(), tower_throttle::ConfigError> {
/// let registry = Registry::builder().build()?;
/// let client = Client::builder(TokioExecutor::new())
///     .build::<_, StampedBody<Empty<Bytes>>>(StampingConnector::new(HttpConnector::new()));
/// let service = ServiceBuilder::new()
///     .layer(ThrottleLayer::new(registry))
///     .layer(DepartureStampLayer::new().at_socket_write())
///     .service(client);
/// # let _ = service;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct StampingConnector<C> {
    inner: C,
}

impl<C> StampingConnector<C> {
    /// `inner`, its connections stamping their writes.
    pub fn new(inner: C) -> Self {
        StampingConnector { inner }
    }
}

impl<C> Service<Uri> for StampingConnector<C>
where
    C: Service<Uri>,
{
    type Response = StampedIo<C::Response>;
    type Error = C::Error;
    type Future = Connecting<C::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, destination: Uri) -> Self::Future {
        Connecting {
            inner: self.inner.call(destination),
        }
    }
}

pin_project! {
    /// A connection being made by a [`StampingConnector`].
    #[must_use = "futures do nothing unless polled"]
    #[derive(Debug)]
    pub struct Connecting<F> {
        #[pin]
        inner: F,
    }
}

impl<F, T, E> Future for Connecting<F>
where
    F: Future<Output = Result<T, E>>,
{
    type Output = Result<StampedIo<T>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx).map_ok(StampedIo::new)
    }
}

pin_project! {
    /// A connection that stamps the departure of the request whose head it
    /// writes, when the write returns (see [`StampingConnector`]).
    #[derive(Debug)]
    pub struct StampedIo<T> {
        #[pin]
        inner: T,
        // Armed for a write that could not be made at once: stamped when
        // this connection's next write returns.
        waiting: Option<Arc<WriteStamp>>,
    }
}

impl<T> StampedIo<T> {
    fn new(inner: T) -> Self {
        StampedIo { inner, waiting: None }
    }
}

/// Stamps what a write made with `written` was for: the stamp armed on
/// this thread (its request's head is in this write), or the one this
/// connection keeps from a write that had to wait.
fn stamp_written<R>(waiting: &mut Option<Arc<WriteStamp>>, written: &Poll<io::Result<R>>) {
    if let Some(armed) = take_armed() {
        if let Some(earlier) = waiting.replace(armed) {
            earlier.stamp();
        }
    }
    if let Poll::Ready(Ok(_)) = written {
        if let Some(stamp) = waiting.take() {
            stamp.stamp();
        }
    }
}

impl<T: Write> Write for StampedIo<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.project();
        let written = this.inner.poll_write(cx, buf);
        stamp_written(this.waiting, &written);
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let written = this.inner.poll_write_vectored(cx, bufs);
        stamp_written(this.waiting, &written);
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

impl<T: Read> Read for StampedIo<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_read(cx, buf)
    }
}

impl<T: Connection> Connection for StampedIo<T> {
    fn connected(&self) -> Connected {
        self.inner.connected()
    }
}
