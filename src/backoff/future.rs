//! The response future of [`Backoff`](super::Backoff).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;

use super::classify::{ErrorView, ResponseHead};
use super::judged::Judged;
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
        let mut output = ready!(this.inner.poll(cx));
        let shared: &Shared = this.shared;
        match &mut output {
            Ok(response) => {
                let head = ResponseHead::of(response);
                let registry = &shared.registry;
                // A request with several scopes is judged once per scope;
                // the response carries backoff when any scope got it.
                let mut verdict: Option<Feedback> = None;
                let cost_from_header = shared
                    .cost_header
                    .as_ref()
                    .and_then(|name| header_cost(&head, name));
                registry.feedback_each(this.scopes, |config| {
                    let feedback = (shared.on_response)(&head, config);
                    let feedback = match (feedback.actual_cost(), cost_from_header) {
                        (None, Some(cost)) => feedback.with_actual_cost(cost),
                        _ => feedback,
                    };
                    if verdict.is_none_or(|kept| !kept.is_backoff() && feedback.is_backoff()) {
                        verdict = Some(feedback);
                    }
                    feedback
                });
                if let Some(feedback) = verdict {
                    response.extensions_mut().insert(Judged::new(feedback));
                }
            }
            Err(error) => {
                let feedback: Feedback = (shared.on_error)(&ErrorView::of(error));
                shared.registry.feedback_each(this.scopes, |_| feedback);
            }
        }
        Poll::Ready(output)
    }
}

/// The cost header's value, when it is a finite number ≥ 0.
fn header_cost(head: &ResponseHead<'_>, name: &http::HeaderName) -> Option<f64> {
    let cost: f64 = head.headers.get(name)?.to_str().ok()?.trim().parse().ok()?;
    (cost.is_finite() && cost >= 0.0).then_some(cost)
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}
