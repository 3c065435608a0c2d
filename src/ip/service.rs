//! [`IpScope`], the service [`IpScopeLayer`](super::IpScopeLayer) makes.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;
use tower_service::Service;

use super::attach::with_server;
use super::cache::Found;
use super::future::ResponseFuture;
use super::shared::IpShared;
use crate::error::{BoxError, Error};
use crate::readiness::{release_readied, take_readied};

/// Adds the scope of the server address a request will connect to: see
/// [`IpScopeLayer`](super::IpScopeLayer).
pub struct IpScope<S> {
    inner: S,
    shared: Arc<IpShared>,
}

impl<S: Clone> Clone for IpScope<S> {
    fn clone(&self) -> Self {
        IpScope {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for IpScope<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpScope").field("inner", &self.inner).finish()
    }
}

impl<S> IpScope<S> {
    pub(crate) fn from_shared(inner: S, shared: Arc<IpShared>) -> Self {
        IpScope { inner, shared }
    }
}

impl<S, B> Service<http::Request<B>> for IpScope<S>
where
    S: Service<http::Request<B>> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = Error;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Error::inner)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let Some(host) = server_host(&request) else {
            // Nothing to resolve (no host): the request goes as it is.
            return ResponseFuture::calling(take_readied(&mut self.inner).call(request));
        };
        let scopes = self.shared.registry.scopes_of(&request);
        if let Ok(address) = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            let request = with_server(request, &scopes, self.shared.cache.server_at(address));
            return ResponseFuture::calling(take_readied(&mut self.inner).call(request));
        }
        match self.shared.cache.find(&host, Instant::now()) {
            Found::Now(Ok(server)) => {
                let request = with_server(request, &scopes, server);
                ResponseFuture::calling(take_readied(&mut self.inner).call(request))
            }
            Found::Now(Err(failure)) => ResponseFuture::failed(Error::dns(failure)),
            Found::Wait { lookup, started } => {
                // A request that waits for its lookup holds nothing.
                let service = release_readied(&mut self.inner);
                let report = started.then(|| scopes.clone());
                ResponseFuture::resolving(lookup, service, request, (self.shared.clone(), scopes, report))
            }
        }
    }
}

/// The host the request will connect to, lower-cased, without port: the
/// URI's, or for an origin-form URI the `Host` header's.
pub(super) fn server_host<B>(request: &http::Request<B>) -> Option<String> {
    let host = match request.uri().host() {
        Some(host) => host.to_owned(),
        None => {
            let header = request.headers().get(http::header::HOST)?.to_str().ok()?;
            let authority: http::uri::Authority = header.parse().ok()?;
            authority.host().to_owned()
        }
    };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}
