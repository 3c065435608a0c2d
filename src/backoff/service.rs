use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_service::Service;

use super::future::ResponseFuture;
use super::shared::BackoffShared;

/// Reports backoff feedback for each response and error of the inner
/// service; see the [module docs](crate::backoff). Responses and errors
/// pass through unchanged.
///
/// # Clone
///
/// Clones share the registry and the classification hooks.
pub struct Backoff<S> {
    inner: S,
    shared: Arc<BackoffShared>,
}

impl<S: Clone> Clone for Backoff<S> {
    fn clone(&self) -> Self {
        Backoff {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Backoff<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backoff")
            .field("inner", &self.inner)
            .field("registry", &self.shared.registry)
            .finish_non_exhaustive()
    }
}

impl<S> Backoff<S> {
    pub(crate) fn from_shared(inner: S, shared: Arc<BackoffShared>) -> Self {
        Backoff { inner, shared }
    }
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for Backoff<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Error: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        // Read before the request moves into the inner service: the scopes
        // a throttle above is handing over, or what the resolver says.
        let scopes = self.shared.registry.scopes_of(&request);
        ResponseFuture::new(self.inner.call(request), scopes, self.shared.clone())
    }
}
