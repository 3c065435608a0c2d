//! The response future of [`Backoff`](super::Backoff).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;

use super::classify::{ErrorView, ResponseHead};
use super::layer::Shared;
use crate::registry::Feedback;
use crate::scope::Scopes;

pin_project! {
    /// Drives the inner future and reports what its output says about the
    /// request's scopes.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        scopes: Scopes,
        shared: Arc<Shared>,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(inner: F, scopes: Scopes, shared: Arc<Shared>) -> Self {
        ResponseFuture {
            inner,
            scopes,
            shared,
        }
    }
}

impl<F, ResBody, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
    E: 'static,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let output = ready!(this.inner.poll(cx));
        let shared: &Shared = this.shared;
        match &output {
            Ok(response) => {
                let head = ResponseHead::of(response);
                let registry = &shared.registry;
                registry.feedback_each(this.scopes, |config| (shared.on_response)(&head, config));
            }
            Err(error) => {
                let feedback: Feedback = (shared.on_error)(&ErrorView::of(error));
                shared.registry.feedback_each(this.scopes, |_| feedback);
            }
        }
        Poll::Ready(output)
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}
