use std::task::{Context, Poll};

use tower_service::Service;

use super::future::ResponseFuture;
use super::observe::{Observer, Settings};
use crate::registry::Registry;

/// Reads the rate-limit headers of each response and holds or paces the
/// request's scopes accordingly. See the [module docs](crate::retry_after).
///
/// It adds no failure mode: errors of the inner service pass through
/// unchanged, and a malformed header only costs a debug event.
///
/// # Clone
///
/// A clone shares the registry (and so every hold it sets); the inner
/// service is cloned.
#[derive(Debug, Clone)]
pub struct RetryAfter<S> {
    inner: S,
    registry: Registry,
    settings: Settings,
}

impl<S> RetryAfter<S> {
    pub(crate) fn with_settings(inner: S, registry: Registry, settings: Settings) -> Self {
        RetryAfter {
            inner,
            registry,
            settings,
        }
    }
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for RetryAfter<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        // Read before the request is moved into the inner service: the
        // scopes a throttle above is handing over, or what the resolver says.
        let scopes = self.registry.scopes_of(&request);
        let observer = Observer::new(self.registry.clone(), scopes, self.settings);
        ResponseFuture::new(self.inner.call(request), observer)
    }
}
