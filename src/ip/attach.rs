//! What a request gets once its server is known: its server address and
//! IP scope, or its DNS error (a leaf: the service and its future use it).

use std::sync::Arc;

use super::cache::Answer;
use super::shared::IpShared;
use super::{Server, ServerAddr};
use crate::error::Error;
use crate::registry::Feedback;
use crate::scope::Scopes;

/// The request with its server address and its IP scope added (once: a
/// request that comes through again, as a retry does, has it already).
pub(crate) fn with_server<B>(
    mut request: http::Request<B>,
    scopes: &Scopes,
    server: Server,
) -> http::Request<B> {
    let with_ip = if scopes.contains(server.scope.as_str()) {
        scopes.clone()
    } else {
        Scopes::with_costs(
            scopes
                .iter()
                .map(|(scope, cost)| (scope.clone(), cost))
                .chain(std::iter::once((server.scope, 1.0))),
        )
    };
    request.extensions_mut().insert(with_ip);
    request.extensions_mut().insert(ServerAddr(server.address));
    request
}

/// What a finished lookup means for the request that waited: its server,
/// or a DNS error (the request that started the lookup reports the failure
/// as backoff feedback on its own scopes, once per lookup).
pub(crate) fn settle<B>(
    answer: Answer,
    request: http::Request<B>,
    (shared, scopes, report): &(Arc<IpShared>, Scopes, Option<Scopes>),
) -> Result<http::Request<B>, Error> {
    match answer {
        Ok(server) => Ok(with_server(request, scopes, server)),
        Err(failure) => {
            if let Some(scopes) = report {
                tracing::debug!(
                    target: "tower_throttle",
                    host = %failure.host,
                    error = %failure.message,
                    "lookup failed: backoff feedback for the request's scopes"
                );
                shared.registry.feedback(scopes, Feedback::backoff());
            }
            Err(Error::dns(failure))
        }
    }
}
