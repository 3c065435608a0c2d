//! The frontier itself: a `Stream` of results that sends each pending
//! request once its scopes would admit it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream::{BoxStream, FuturesUnordered};
use futures::{Stream, StreamExt};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::handle::FrontierHandle;
use super::queues::Slot;
use super::shared::Shared;
use crate::error::ConfigError;
use crate::registry::Registry;

/// How many requests a frontier keeps in its service at once unless told.
pub const DEFAULT_IN_FLIGHT: usize = 64;
/// How many requests a frontier holds pending unless told.
pub const DEFAULT_MAX_PENDING: usize = 1_000_000;

/// A frontier and the first handle that pushes into it.
pub type Built<S, B, T> = (Frontier<S, B, T>, FrontierHandle<B, T>);

/// What a frontier gives for each request: its tag and what the service
/// answered.
pub type Fetched<T, R, E> = (T, Result<R, E>);

/// Builds a [`Frontier`].
#[derive(Debug, Clone)]
pub struct FrontierBuilder {
    registry: Registry,
    in_flight: usize,
    max_pending: usize,
}

impl FrontierBuilder {
    /// A builder for a frontier of `registry`'s scopes: the registry of the
    /// throttle in the service it is built around.
    pub fn new(registry: Registry) -> Self {
        FrontierBuilder {
            registry,
            in_flight: DEFAULT_IN_FLIGHT,
            max_pending: DEFAULT_MAX_PENDING,
        }
    }

    /// At most `budget` requests in the service at once (at least 1;
    /// [`DEFAULT_IN_FLIGHT`] unless set).
    #[must_use]
    pub fn in_flight(mut self, budget: usize) -> Self {
        self.in_flight = budget;
        self
    }

    /// At most `max` requests pending (at least 1;
    /// [`DEFAULT_MAX_PENDING`] unless set): a push waits, and a source
    /// stream is not polled, while the frontier holds that many.
    #[must_use]
    pub fn max_pending(mut self, max: usize) -> Self {
        self.max_pending = max;
        self
    }

    /// The frontier around `service` (the throttled stack), and a handle to
    /// push requests into it.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `in_flight` or `max_pending` when it is 0.
    pub fn build<S, B, T>(self, service: S) -> Result<Built<S, B, T>, ConfigError>
    where
        S: Service<http::Request<B>>,
    {
        if self.in_flight == 0 {
            return Err(ConfigError::new("frontier in_flight", 0, "must be at least 1"));
        }
        if self.max_pending == 0 {
            return Err(ConfigError::new("frontier max_pending", 0, "must be at least 1"));
        }
        let shared = Arc::new(Shared::new(self.registry, self.max_pending));
        let frontier = Frontier {
            service,
            shared: shared.clone(),
            sending: FuturesUnordered::new(),
            budget: self.in_flight,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            timer_at: None,
            source: None,
            service_busy: false,
        };
        Ok((frontier, FrontierHandle { shared }))
    }
}

pin_project! {
    /// A request in the service: its future, its tag and its scope's queue.
    struct Sending<F, T> {
        #[pin]
        future: F,
        tag: Option<T>,
        slot: Slot,
    }
}

impl<F: Future, T> Future for Sending<F, T> {
    type Output = (Slot, T, F::Output);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let output = std::task::ready!(this.future.poll(cx));
        let tag = this.tag.take().expect("polled after completion");
        Poll::Ready((*this.slot, tag, output))
    }
}

/// A crawl's pending requests, fed to a throttled service in readiness
/// order: a `Stream` of `(tag, result)`. See the [module docs](super).
#[must_use = "streams do nothing unless polled"]
pub struct Frontier<S, B, T = http::Uri>
where
    S: Service<http::Request<B>>,
{
    service: S,
    shared: Arc<Shared<B, T>>,
    sending: FuturesUnordered<Sending<S::Future, T>>,
    budget: usize,
    /// The one timer: the next instant a scope may go.
    timer: Pin<Box<Sleep>>,
    timer_at: Option<Instant>,
    source: Option<BoxStream<'static, (http::Request<B>, T)>>,
    /// Whether the service said `Pending` to the last request that could
    /// go: it wakes the frontier when it is ready, and no timer is needed.
    service_busy: bool,
}

impl<S, B, T> Frontier<S, B, T>
where
    S: Service<http::Request<B>>,
{
    /// Takes requests from `source` too, as the frontier has room for
    /// them (`max_pending`), besides those pushed through handles.
    pub fn with_source<St>(mut self, source: St) -> Self
    where
        St: Stream<Item = (http::Request<B>, T)> + Send + 'static,
    {
        self.source = Some(source.boxed());
        self
    }

    /// Requests in the service now.
    pub fn in_flight(&self) -> usize {
        self.sending.len()
    }

    /// Requests pending (not yet in the service).
    pub fn pending(&self) -> usize {
        self.shared.lock().queues.pending()
    }

    /// Takes what the source stream has ready, while there is room.
    fn pull_source(&mut self, cx: &mut Context<'_>) {
        while let Some(source) = self.source.as_mut() {
            if self.shared.lock().queues.pending() >= self.shared.max_pending {
                return;
            }
            match source.poll_next_unpin(cx) {
                Poll::Ready(Some((request, tag))) => {
                    let mut state = self.shared.lock();
                    self.shared.enqueue(&mut state, request, tag);
                }
                Poll::Ready(None) => self.source = None,
                Poll::Pending => return,
            }
        }
    }

    /// Sends every request whose scopes would admit it now, while the
    /// budget has room. `Some` with a request the service refused.
    fn send_ready(&mut self, cx: &mut Context<'_>) -> Option<Fetched<T, S::Response, S::Error>> {
        self.service_busy = false;
        while self.sending.len() < self.budget {
            let now = Instant::now();
            let mut state = self.shared.lock();
            let slot = state.queues.pop_ready(now)?;
            let Some(head) = state.queues.head(slot) else {
                state.queues.forget_if_idle(slot);
                continue;
            };
            let prediction = self.shared.registry.predict_request(head);
            if !prediction.wait.is_zero() {
                state.queues.schedule(slot, prediction.at);
                continue;
            }
            match self.service.poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(error)) => {
                    let entry = state.queues.take_head(slot).expect("the head was there");
                    state.queues.finished(slot, now);
                    state.wake_pushers();
                    return Some((entry.tag, Err(error)));
                }
                Poll::Pending => {
                    state.queues.schedule(slot, now);
                    self.service_busy = true;
                    return None;
                }
            }
            let entry = state.queues.take_head(slot).expect("the head was there");
            // Its next request is looked at again at once (the lanes may
            // allow another now; the prediction says when if not).
            state.queues.schedule(slot, now);
            state.wake_pushers();
            drop(state);
            let future = self.service.call(*entry.request);
            self.sending.push(Sending {
                future,
                tag: Some(entry.tag),
                slot,
            });
        }
        None
    }

    /// Aims the one timer at the next instant a scope may go, when the
    /// budget has room; true when that instant has come.
    fn timer_fired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.sending.len() >= self.budget || self.service_busy {
            return false;
        }
        let Some(at) = self.shared.lock().queues.next_instant() else {
            self.timer_at = None;
            return false;
        };
        if self.timer_at != Some(at) {
            self.timer.as_mut().reset(at);
            self.timer_at = Some(at);
        }
        if self.timer.as_mut().poll(cx).is_ready() {
            self.timer_at = None;
            return true;
        }
        false
    }
}

impl<S, B, T> Stream for Frontier<S, B, T>
where
    S: Service<http::Request<B>> + Unpin,
{
    type Item = Fetched<T, S::Response, S::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Poll::Ready(Some((slot, tag, output))) = this.sending.poll_next_unpin(cx) {
                this.shared.lock().queues.finished(slot, Instant::now());
                return Poll::Ready(Some((tag, output)));
            }
            this.pull_source(cx);
            if let Some(refused) = this.send_ready(cx) {
                return Poll::Ready(Some(refused));
            }
            if this.timer_fired(cx) {
                continue;
            }
            if !this.sending.is_empty() {
                // Polled once more: the requests just sent have not been.
                if let Poll::Ready(Some((slot, tag, output))) = this.sending.poll_next_unpin(cx) {
                    this.shared.lock().queues.finished(slot, Instant::now());
                    return Poll::Ready(Some((tag, output)));
                }
            }
            let mut state = this.shared.lock();
            let done = state.handles == 0
                && this.source.is_none()
                && state.queues.pending() == 0
                && this.sending.is_empty();
            if done {
                return Poll::Ready(None);
            }
            state.frontier = Some(cx.waker().clone());
            return Poll::Pending;
        }
    }
}

impl<S, B, T> Drop for Frontier<S, B, T>
where
    S: Service<http::Request<B>>,
{
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.closed = true;
        state.wake_pushers();
        // The pending requests go now; those in the service go with
        // `sending`, which gives back their lanes and places.
        state.queues = Default::default();
    }
}

impl<S, B, T> fmt::Debug for Frontier<S, B, T>
where
    S: Service<http::Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Frontier")
            .field("in_flight", &self.sending.len())
            .field("budget", &self.budget)
            .finish()
    }
}
