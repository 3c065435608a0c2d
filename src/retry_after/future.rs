//! The response future of [`RetryAfter`](super::RetryAfter).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::observe::Observer;

pin_project! {
    /// Drives the inner service's future; when it resolves with a response,
    /// reads its rate-limit headers and reports them to the registry before
    /// handing the response on. Errors pass through untouched.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        // Taken when the response arrives, so it is read once.
        observer: Option<Observer>,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(inner: F, observer: Observer) -> Self {
        ResponseFuture {
            inner,
            observer: Some(observer),
        }
    }
}

impl<F, ResBody, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let output = std::task::ready!(this.inner.poll(cx));
        if let (Ok(response), Some(observer)) = (&output, this.observer.take()) {
            observer.observe(response.status(), response.headers());
        }
        Poll::Ready(output)
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("observer", &self.observer)
            .finish_non_exhaustive()
    }
}
