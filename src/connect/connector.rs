//! [`PinnedConnector`]: dials the address a request was throttled for.

use std::task::{Context, Poll};

use http::Uri;
use tower_service::Service;

use super::userinfo::dial_target;

/// A connector (a `Service<Uri>`, as hyper-util's client takes) that dials
/// the server address [`PinServer`](super::PinServer) wrote into the URI,
/// and resolves the name as `inner` does when there is none: see the
/// [module docs](super).
///
/// It wraps the TCP connector, hyper-util's `HttpConnector`; a TLS
/// connector goes around it, so the TLS server name stays the URI's host.
/// The connection, its errors and its future are the inner connector's.
///
/// ```
/// use hyper_util::client::legacy::{connect::HttpConnector, Client};
/// use hyper_util::rt::TokioExecutor;
/// use tower_throttle::connect::PinnedConnector;
///
/// let client = Client::builder(TokioExecutor::new())
///     .build::<_, http_body_util::Empty<hyper::body::Bytes>>(PinnedConnector::new(HttpConnector::new()));
/// # let _ = client;
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct PinnedConnector<C> {
    inner: C,
}

impl<C> PinnedConnector<C> {
    /// `inner`, dialling pinned addresses.
    pub fn new(inner: C) -> Self {
        PinnedConnector { inner }
    }
}

impl<C> Service<Uri> for PinnedConnector<C>
where
    C: Service<Uri>,
{
    type Response = C::Response;
    type Error = C::Error;
    type Future = C::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, destination: Uri) -> Self::Future {
        let target = dial_target(&destination).unwrap_or(destination);
        self.inner.call(target)
    }
}
