//! The response future of [`Backoff`](super::Backoff).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;

use super::classify::{error_kind, ErrorView, ResponseHead};
use super::judged::Judged;
use super::shared::BackoffShared;
use crate::registry::{BackoffConfig, Feedback, ScopeReport};
use crate::scope::Scopes;

pin_project! {
    /// Drives the inner future and reports what its output says about the
    /// request's scopes.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        scopes: Scopes,
        shared: Arc<BackoffShared>,
        // When the request went to the inner service: the feedback's
        // latency, for scope managers (read only when the registry has
        // any, so other users pay no clock reads).
        sent_at: Option<Instant>,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(inner: F, scopes: Scopes, shared: Arc<BackoffShared>) -> Self {
        let sent_at = shared.registry.managers_hear_successes().then(Instant::now);
        ResponseFuture {
            inner,
            scopes,
            shared,
            sent_at,
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
        let shared: &BackoffShared = this.shared;
        let latency = this.sent_at.map(|sent_at| sent_at.elapsed());
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
                let mut judge = |backoff: &BackoffConfig| {
                    let feedback = with_facts((shared.on_response)(&head, backoff), head.status, latency);
                    let feedback = match (feedback.actual_cost(), cost_from_header) {
                        (None, Some(cost)) => feedback.with_actual_cost(cost),
                        _ => feedback,
                    };
                    if verdict.is_none_or(|kept| !kept.is_backoff() && feedback.is_backoff()) {
                        verdict = Some(feedback);
                    }
                    feedback
                };
                let surely_success = !shared.custom_on_response
                    && cost_from_header.is_none()
                    && !registry.managers_hear_successes()
                    && !registry.may_back_off_on(head.status.as_u16());
                if surely_success {
                    // The built-in rule says success in every scope, which
                    // changes nothing in the registry: nothing to report.
                    verdict = Some(with_facts(Feedback::success(), head.status, latency));
                } else {
                    // Judged now, outside the lock (the user's hook may call
                    // the registry); applied under the lock the throttle's
                    // completion takes, or under one of its own.
                    registry.report_on_completion(this.scopes, |_, config| {
                        ScopeReport::new().feedback(judge(config.get_backoff()))
                    });
                }
                if let Some(feedback) = verdict {
                    response.extensions_mut().insert(Judged::new(feedback));
                }
            }
            Err(error) => {
                let view = ErrorView::of(error);
                let mut feedback: Feedback = (shared.on_error)(&view);
                if feedback.error_kind().is_none() {
                    feedback = feedback.with_error_kind(error_kind(&view));
                }
                if let (None, Some(latency)) = (feedback.latency(), latency) {
                    feedback = feedback.with_latency(latency);
                }
                shared
                    .registry
                    .report_on_completion(this.scopes, |_, _| ScopeReport::new().feedback(feedback));
            }
        }
        Poll::Ready(output)
    }
}

/// Adds the response's status and latency to what a hook reported, unless
/// it said otherwise.
fn with_facts(
    feedback: Feedback,
    status: http::StatusCode,
    latency: Option<std::time::Duration>,
) -> Feedback {
    let feedback = match feedback.status() {
        Some(_) => feedback,
        None => feedback.with_status(status),
    };
    match (feedback.latency(), latency) {
        (None, Some(latency)) => feedback.with_latency(latency),
        _ => feedback,
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
