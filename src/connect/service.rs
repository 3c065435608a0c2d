//! [`PinServer`], the service [`PinServerLayer`](super::PinServerLayer) makes.

use std::task::{Context, Poll};

use tower_service::Service;

use super::userinfo::with_server_in_userinfo;
use crate::ip::ServerAddr;

/// Writes a request's [`ServerAddr`] into its URI's userinfo (and removes
/// any other userinfo): see [`PinServerLayer`](super::PinServerLayer).
///
/// It adds no failure and no wait of its own: its response future is the
/// inner service's.
#[derive(Debug, Clone)]
pub struct PinServer<S> {
    inner: S,
}

impl<S> PinServer<S> {
    /// `inner`, with its requests pinned to their servers.
    pub(crate) fn new(inner: S) -> Self {
        PinServer { inner }
    }
}

impl<S, B> Service<http::Request<B>> for PinServer<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let server = request.extensions().get::<ServerAddr>().map(|server| server.0);
        if let Some(pinned) = with_server_in_userinfo(request.uri(), server) {
            *request.uri_mut() = pinned;
        }
        self.inner.call(request)
    }
}
