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
use super::redirects::Chain;
use super::shared::Shared;
use crate::error::ConfigError;
use crate::ip::IpScopeLayer;
use crate::precise_wake::PreciseWake;
use crate::registry::Registry;
use crate::waited::WaitCause;

/// How many requests a frontier keeps in its service at once unless told.
pub const DEFAULT_IN_FLIGHT: usize = 64;
/// How many requests a frontier hands over in one poll before it lets the
/// runtime run (the client's connection tasks write what it handed over:
/// a large batch would be written late, its last requests later than the
/// first, and a site would see two of its requests closer than the
/// throttle sent them).
const HANDOVERS_PER_POLL: usize = 4;

/// How soon a frontier looks again when every global permit is taken.
const GLOBAL_RETRY: Duration = Duration::from_millis(10);

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
    ip_scopes: Option<IpScopeLayer>,
}

impl FrontierBuilder {
    /// A builder for a frontier of `registry`'s scopes: the registry of the
    /// throttle in the service it is built around.
    pub fn new(registry: Registry) -> Self {
        FrontierBuilder {
            registry,
            in_flight: DEFAULT_IN_FLIGHT,
            max_pending: DEFAULT_MAX_PENDING,
            ip_scopes: None,
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

    /// Resolves each request's server before it is queued, through
    /// `layer` (the [`IpScopeLayer`] of the stack, or a clone: they share
    /// its cache and lookups), so a request is ordered by its server's IP
    /// scope as well as its own, and sent only when both would admit it. A
    /// request whose name is being looked up waits for it in the frontier
    /// (it counts as pending); the layer in the stack then finds the name
    /// known. A request whose lookup failed is queued as it is, and the
    /// layer fails it when it is sent.
    #[must_use]
    pub fn ip_scopes(mut self, layer: IpScopeLayer) -> Self {
        self.ip_scopes = Some(layer);
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
        let shared = Arc::new(Shared::new(self.registry, self.max_pending, self.ip_scopes));
        let frontier = Frontier {
            service,
            shared: shared.clone(),
            sending: FuturesUnordered::new(),
            budget: self.in_flight,
            timer: None,
            timer_at: None,
            precise: PreciseWake::default(),
            source: None,
            service_busy: false,
            batch_full: false,
            global_wait: None,
            follow: None,
        };
        Ok((frontier, FrontierHandle { shared }))
    }
}

pin_project! {
    /// A request in the service: its future, its tag, its scope's queue,
    /// and its chain of redirects when they are followed.
    struct Sending<F, T> {
        #[pin]
        future: F,
        tag: Option<T>,
        slot: Slot,
        chain: Option<Box<Chain>>,
    }
}

/// A request the service is done with.
struct Sent<T, O> {
    slot: Slot,
    tag: T,
    output: O,
    chain: Option<Box<Chain>>,
}

impl<F: Future, T> Future for Sending<F, T> {
    type Output = Sent<T, F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let output = std::task::ready!(this.future.poll(cx));
        Poll::Ready(Sent {
            slot: *this.slot,
            tag: this.tag.take().expect("polled after completion"),
            output,
            chain: this.chain.take(),
        })
    }
}

/// What makes the next hop of a redirect, when the frontier follows them
/// (see [`Frontier::follow_redirects`]).
type Follow<R, B, E> = Box<dyn Fn(&R, &mut Chain) -> Result<Option<http::Request<B>>, E> + Send + Sync>;

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
    /// The one timer: the next instant a scope may go (made on first use,
    /// so a frontier can be built outside a runtime).
    timer: Option<Pin<Box<Sleep>>>,
    timer_at: Option<Instant>,
    /// The timer's instant, kept to the microsecond (tokio's timer wakes
    /// up to a millisecond late, which a short gap would lose each time).
    precise: PreciseWake,
    source: Option<BoxStream<'static, (http::Request<B>, T)>>,
    /// Whether the service said `Pending` to the last request that could
    /// go: it wakes the frontier when it is ready, and no timer is needed.
    service_busy: bool,
    /// Whether the last pass stopped at [`HANDOVERS_PER_POLL`]: the frontier
    /// wakes itself to go on once the runtime has run.
    batch_full: bool,
    /// Until when no request is sent because every global permit was
    /// taken (one of ours ending ends it sooner).
    global_wait: Option<Instant>,
    follow: Option<Follow<S::Response, B, S::Error>>,
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
        self.shared.lock().pending()
    }

    /// Takes what the source stream has ready, while there is room.
    fn pull_source(&mut self, cx: &mut Context<'_>) {
        while let Some(source) = self.source.as_mut() {
            if self.shared.lock().pending() >= self.shared.max_pending {
                return;
            }
            match source.poll_next_unpin(cx) {
                Poll::Ready(Some((request, tag))) => {
                    let mut state = self.shared.lock();
                    self.shared
                        .enqueue(&mut state, (request, Some(Box::new(tag)), None));
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
        if self.global_wait.is_some_and(|until| Instant::now() < until) {
            return None;
        }
        self.global_wait = None;
        self.batch_full = false;
        let mut handed_over = 0;
        while self.sending.len() < self.budget {
            if handed_over == HANDOVERS_PER_POLL {
                self.batch_full = true;
                return None;
            }
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
            if prediction.cause == Some(WaitCause::GlobalConcurrency) {
                // Every global permit is taken (by requests of others: the
                // budget is below `max_concurrency` otherwise): when one
                // frees is not known. Look again soon, or when one of ours
                // ends.
                state.queues.schedule(slot, now);
                self.global_wait = Some(now + GLOBAL_RETRY);
                return None;
            }
            match self.service.poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(error)) => {
                    let entry = state.queues.take_head(slot).expect("the head was there");
                    state.queues.finished(slot, now);
                    state.wake_pushers();
                    let tag = match entry.tag {
                        Some(tag) => *tag,
                        None => (state.uri_tag.expect("an untagged request came by `push`"))(&entry.request),
                    };
                    return Some((tag, Err(error)));
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
            let uri_tag = state.uri_tag;
            drop(state);
            let chain = match (&self.follow, entry.chain) {
                (None, _) => None,
                (Some(_), Some(chain)) => Some(chain),
                (Some(_), None) => Some(Chain::start(&entry.request)),
            };
            let tag = match entry.tag {
                Some(tag) => *tag,
                None => (uri_tag.expect("an untagged request came by `push`"))(&entry.request),
            };
            let future = self.service.call(*entry.request);
            handed_over += 1;
            self.sending.push(Sending {
                future,
                tag: Some(tag),
                slot,
                chain,
            });
        }
        None
    }

    /// What the stream gives for a request the service is done with: its
    /// result, or nothing when it was a redirect followed (its next hop
    /// queued in the frontier, with its tag). Its scope looks again now.
    fn answer(
        &mut self,
        sent: Sent<T, Result<S::Response, S::Error>>,
    ) -> Option<Fetched<T, S::Response, S::Error>> {
        let Sent {
            slot,
            tag,
            output,
            chain,
        } = sent;
        // A global permit of ours is free.
        self.global_wait = None;
        let mut state = self.shared.lock();
        state.queues.finished(slot, Instant::now());
        let (Some(follow), Ok(response), Some(mut chain)) = (&self.follow, &output, chain) else {
            return Some((tag, output));
        };
        match follow(response, &mut chain) {
            Ok(None) => Some((tag, output)),
            Ok(Some(hop)) => {
                self.shared
                    .enqueue(&mut state, (hop, Some(Box::new(tag)), Some(chain)));
                None
            }
            Err(error) => Some((tag, Err(error))),
        }
    }

    /// Aims the one timer at the next instant a scope may go, when the
    /// budget has room; true when that instant has come.
    fn timer_fired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.sending.len() >= self.budget || self.service_busy || self.batch_full {
            return false;
        }
        let Some(at) = self.shared.lock().queues.next_instant() else {
            self.timer_at = None;
            self.precise.cancel();
            return false;
        };
        let at = self.global_wait.map_or(at, |until| until.max(at));
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if self.timer_at != Some(at) {
            timer.as_mut().reset(at);
            self.timer_at = Some(at);
        }
        // Tokio's clock decides; the precise wake-up only makes the
        // frontier look as soon as it may.
        if timer.as_mut().poll(cx).is_ready() || Instant::now() >= at {
            self.timer_at = None;
            return true;
        }
        self.precise.aim(at, cx.waker());
        false
    }
}

#[cfg(feature = "follow-redirect")]
impl<S, B, T, R> Frontier<S, B, T>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Error: From<crate::redirect::RedirectError>,
    B: Default,
{
    /// Follows redirects (301, 302, 303, 307, 308 with a `Location`)
    /// through the frontier: each hop goes back into its queues and waits
    /// its turn in its own scope like any request, so a hop to a site that
    /// must wait takes no slot. The stream gives the last response of the
    /// chain, with the first request's tag. A loop, or a chain of more than
    /// `max` redirects, gives a [`RedirectError`](crate::redirect::RedirectError)
    /// (converted into the service's error), as
    /// [`FailOnLoops`](crate::redirect::FailOnLoops) does.
    ///
    /// A hop carries the first request's headers (credentials dropped once
    /// the chain leaves the first origin) and an empty body
    /// (`B::default()`); 301 and 302 turn a `POST` into a `GET`, 303 anything
    /// but `HEAD`. The first request's extensions (its `Scopes`, say) do not
    /// follow: a hop's scopes are its own host's.
    pub fn follow_redirects(mut self, max: usize) -> Self {
        self.follow = Some(Box::new(move |response, chain| {
            super::redirects::next_hop(response, chain, max).map_err(S::Error::from)
        }));
        self
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
            if let Poll::Ready(Some(sent)) = this.sending.poll_next_unpin(cx) {
                match this.answer(sent) {
                    Some(fetched) => return Poll::Ready(Some(fetched)),
                    None => continue,
                }
            }
            this.pull_source(cx);
            {
                let mut state = this.shared.lock();
                this.shared.queue_looked_up(&mut state, cx);
            }
            if let Some(refused) = this.send_ready(cx) {
                return Poll::Ready(Some(refused));
            }
            if this.timer_fired(cx) {
                continue;
            }
            if !this.sending.is_empty() {
                // Polled once more: the requests just sent have not been.
                if let Poll::Ready(Some(sent)) = this.sending.poll_next_unpin(cx) {
                    match this.answer(sent) {
                        Some(fetched) => return Poll::Ready(Some(fetched)),
                        None => continue,
                    }
                }
            }
            if this.batch_full {
                // More may go now: after the runtime has run the tasks
                // that write what was just handed over.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let mut state = this.shared.lock();
            let done = state.handles == 0
                && this.source.is_none()
                && state.pending() == 0
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
        state.resolving = Default::default();
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
