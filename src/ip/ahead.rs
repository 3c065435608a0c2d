//! Resolving a request ahead of the stack, for a caller above it (the
//! [`Frontier`](crate::frontier::Frontier)) that orders requests by their
//! scopes: the request gets its IP scope before it is ordered, from the
//! same cache and lookups as the layer's services, which then find its
//! name known.

use std::net::IpAddr;

use futures::future::{BoxFuture, FutureExt};
use tokio::time::Instant;

use super::attach::with_server;
use super::cache::{Answer, Found};
use super::layer::IpScopeLayer;
use super::service::server_host;

/// A finished lookup, for [`IpScopeLayer::settle_ahead`].
pub(crate) struct LookedUp(Answer);

/// Where a request stands when resolved ahead.
pub(crate) enum Ahead<B> {
    /// Its IP scope is in its [`Scopes`](crate::Scopes) (or it has no
    /// name to resolve, or its name's lookup failed: the layer's service
    /// fails it when it is sent).
    Ready(http::Request<B>),
    /// Its host is being looked up: `lookup` ends with the answer, for
    /// every request of that host.
    Wait {
        host: String,
        lookup: BoxFuture<'static, LookedUp>,
        request: http::Request<B>,
    },
}

impl IpScopeLayer {
    /// `request` with its IP scope added when its host is known (or an IP
    /// literal), else the lookup to wait for. Reads the layer's cache, and
    /// starts a lookup there when none is in flight.
    pub(crate) fn resolve_ahead<B>(&self, request: http::Request<B>) -> Ahead<B> {
        let Some(host) = server_host(&request) else {
            return Ahead::Ready(request);
        };
        let shared = self.shared();
        let scopes = shared.registry.scopes_of(&request);
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(address) = literal.parse::<IpAddr>() {
            return Ahead::Ready(with_server(request, &scopes, shared.cache.server_at(address)));
        }
        match shared.cache.find(&host, Instant::now()) {
            Found::Now(Ok(server)) => Ahead::Ready(with_server(request, &scopes, server)),
            Found::Now(Err(_)) => Ahead::Ready(request),
            Found::Wait { lookup, .. } => Ahead::Wait {
                host,
                lookup: lookup.map(LookedUp).boxed(),
                request,
            },
        }
    }

    /// `request` once its host's lookup ended: with its IP scope, or as it
    /// was when the lookup failed.
    pub(crate) fn settle_ahead<B>(&self, answer: &LookedUp, request: http::Request<B>) -> http::Request<B> {
        match &answer.0 {
            Ok(server) => {
                let scopes = self.shared().registry.scopes_of(&request);
                with_server(request, &scopes, server.clone())
            }
            Err(_) => request,
        }
    }
}
