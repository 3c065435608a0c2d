//! The frontier itself: a `Stream` of results that sends each pending
//! request once its scopes would admit it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::handle::FrontierHandle;
use super::in_flight::InFlight;
use super::queues::Slot;
use super::redirects::Chain;
use super::shared::{Shared, State};
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

/// What a poll of the stream gives.
type Polled<T, R, E> = Poll<Option<Fetched<T, R, E>>>;

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
            in_flight: InFlight::default(),
            budget: self.in_flight,
            timer: None,
            timer_at: None,
            precise: PreciseWake::default(),
            wake_at: None,
            source: None,
            service_busy: false,
            hop_queued: false,
            batch_full: false,
            global_wait: None,
            follow: None,
        };
        Ok((frontier, FrontierHandle { shared }))
    }
}

/// What the frontier keeps beside a request in the service: its tag, its
/// scope's queue, and its chain of redirects when they are followed.
struct Sending<T> {
    tag: T,
    slot: Slot,
    chain: Option<Box<Chain>>,
}

/// Why no request may go now.
enum NotNow {
    /// No scope has requests pending.
    Empty,
    /// The first scope's instant, not come yet.
    Until(Instant),
    /// Every global permit is taken: look again then.
    GlobalPermits(Instant),
}

/// Takes out of the ready order the scope whose head goes next: the first
/// whose instant has come and whose prediction says *now* (scopes that
/// must wait are put back at their instant on the way).
fn next_admitted<B, T>(registry: &Registry, state: &mut State<B, T>) -> Result<Slot, NotNow> {
    loop {
        let at = state.queues.next_instant().ok_or(NotNow::Empty)?;
        let now = state.clock.reached(at).ok_or(NotNow::Until(at))?;
        let slot = state.queues.pop_first(now).ok_or(NotNow::Empty)?;
        let Some((head, key)) = state.queues.head(slot) else {
            state.queues.forget_if_idle(slot);
            continue;
        };
        let prediction = registry.predict_queued(head, key, now);
        if !prediction.wait.is_zero() {
            state.queues.schedule(slot, prediction.at);
            continue;
        }
        if prediction.cause == Some(WaitCause::GlobalConcurrency) {
            // Every global permit is taken (by requests of others: the
            // budget is below `max_concurrency` otherwise): when one frees
            // is not known. Look again soon, or when one of ours ends.
            let now = state.clock.now();
            state.queues.schedule(slot, now);
            return Err(NotNow::GlobalPermits(now + GLOBAL_RETRY));
        }
        return Ok(slot);
    }
}

/// A request's tag: the one it was pushed with, or its URI (made by
/// `uri_tag`, which [`FrontierHandle::push`] sets).
fn tag_of<B, T>(
    tag: Option<Box<T>>,
    request: &http::Request<B>,
    uri_tag: Option<fn(&http::Request<B>) -> T>,
) -> T {
    match tag {
        Some(tag) => *tag,
        None => (uri_tag.expect("an untagged request came by `push`"))(request),
    }
}

/// What the stream gives for a request the service is done with: its
/// tag, with `output` (made the redirect's error when one fails), or
/// nothing when it was a redirect followed (its next hop queued in the
/// frontier, with its tag). Its scope looks again now.
#[inline]
fn answer<B, T, R, E>(
    shared: &Shared<B, T>,
    follow: Option<&Follow<R, B, E>>,
    Sending { tag, slot, chain }: Sending<T>,
    output: &mut Result<R, E>,
) -> Option<T> {
    let mut guard = shared.lock();
    let state = &mut *guard;
    let clock = &mut state.clock;
    state.queues.finished(slot, || clock.now());
    let (Some(follow), Ok(response), Some(mut chain)) = (follow, &*output, chain) else {
        return Some(tag);
    };
    match follow(response, &mut chain) {
        Ok(None) => Some(tag),
        Ok(Some(hop)) => {
            let hop = state.spare_boxes.boxed(hop);
            shared.enqueue(state, (hop, Some(Box::new(tag)), Some(chain)));
            None
        }
        Err(error) => {
            drop(guard);
            *output = Err(error);
            Some(tag)
        }
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
    in_flight: InFlight<S::Future, Sending<T>>,
    budget: usize,
    /// The one timer: the next instant a scope may go (made on first use,
    /// so a frontier can be built outside a runtime).
    timer: Option<Pin<Box<Sleep>>>,
    timer_at: Option<Instant>,
    /// The timer's instant, kept to the microsecond (tokio's timer wakes
    /// up to a millisecond late, which a short gap would lose each time).
    precise: PreciseWake,
    /// Where the last [`send_ready`](Self::send_ready) left the timer to
    /// aim: the next instant a scope may go, when the budget has room and
    /// nothing else wakes the frontier sooner.
    wake_at: Option<Instant>,
    source: Option<BoxStream<'static, (http::Request<B>, T)>>,
    /// Whether the service said `Pending` to the last request that could
    /// go: it wakes the frontier when it is ready, and no timer is needed.
    service_busy: bool,
    /// Whether a pass over the requests in the service queued a
    /// redirect's next hop (it may go now).
    hop_queued: bool,
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
        self.in_flight.len()
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
                    let request = state.spare_boxes.boxed(request);
                    self.shared
                        .enqueue(&mut state, (request, Some(Box::new(tag)), None));
                }
                Poll::Ready(None) => self.source = None,
                Poll::Pending => return,
            }
        }
    }

    /// Sends every request whose scopes would admit it now, while the
    /// budget has room, and leaves in `wake_at` when the timer is to wake
    /// the frontier. `Some` with a request the service refused.
    fn send_ready(&mut self, cx: &mut Context<'_>) -> Option<Fetched<T, S::Response, S::Error>> {
        self.service_busy = false;
        self.batch_full = false;
        self.wake_at = None;
        if self.global_waiting() {
            return None;
        }
        let refused = self.hand_over_ready(cx);
        if self.in_flight.len() >= self.budget {
            // A request's end wakes the frontier, not the timer.
            self.wake_at = None;
        }
        refused
    }

    /// Hands over the requests that may go now, at most
    /// [`HANDOVERS_PER_POLL`], while the budget has room.
    fn hand_over_ready(&mut self, cx: &mut Context<'_>) -> Option<Fetched<T, S::Response, S::Error>> {
        let mut handed_over = 0;
        while self.in_flight.len() < self.budget {
            if handed_over == HANDOVERS_PER_POLL {
                self.batch_full = true;
                return None;
            }
            match self.hand_over_next(cx) {
                HandOver::Sent { more: true } => handed_over += 1,
                HandOver::Sent { more: false } | HandOver::Stop => return None,
                HandOver::Refused(fetched) => return Some(fetched),
            }
        }
        None
    }

    /// Whether every global permit was taken when the frontier last
    /// looked, and it is not yet time to look again (the timer then aims
    /// at that time, or later).
    fn global_waiting(&mut self) -> bool {
        let Some(until) = self.global_wait else {
            return false;
        };
        if Instant::now() >= until {
            self.global_wait = None;
            return false;
        }
        self.wake_at = self.shared.lock().queues.next_instant().map(|at| at.max(until));
        true
    }

    /// Hands the service the request that goes next, if one may go now:
    /// the head of the scope ready longest whose prediction says *now*.
    fn hand_over_next(&mut self, cx: &mut Context<'_>) -> HandOver<Fetched<T, S::Response, S::Error>> {
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        state.queued_since_look = false;
        let slot = match next_admitted(&self.shared.registry, state) {
            Ok(slot) => slot,
            Err(not_now) => {
                drop(guard);
                self.wait_for(not_now);
                return HandOver::Stop;
            }
        };
        match self.service.poll_ready(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(error)) => {
                let entry = state.queues.take_head(slot).expect("the head was there");
                let clock = &mut state.clock;
                state.queues.finished(slot, || clock.now());
                state.wake_pushers();
                let tag = tag_of(entry.tag, &entry.request, state.uri_tag);
                return HandOver::Refused((tag, Err(error)));
            }
            Poll::Pending => {
                let now = state.clock.now();
                state.queues.schedule(slot, now);
                self.service_busy = true;
                return HandOver::Stop;
            }
        }
        let entry = state.queues.take_head(slot).expect("the head was there");
        // Its next request is looked at again at once (the lanes may
        // allow another now; the prediction says when if not).
        let clock = &mut state.clock;
        state.queues.look_again(slot, || clock.now());
        state.wake_pushers();
        // Whether another may go now, seen under this lock (a request
        // queued from now on is seen before the frontier sleeps).
        let next = state.queues.next_instant();
        let more = next.is_some_and(|at| state.clock.reached(at).is_some());
        if !more {
            self.wake_at = next;
        }
        let uri_tag = state.uri_tag;
        let request = state.spare_boxes.unboxed(entry.request);
        drop(guard);
        let chain = match (&self.follow, entry.chain) {
            (None, _) => None,
            (Some(_), Some(chain)) => Some(chain),
            (Some(_), None) => Some(Chain::start(&request)),
        };
        let tag = tag_of(entry.tag, &request, uri_tag);
        let future = self.service.call(request);
        self.in_flight.push(future, Sending { tag, slot, chain });
        HandOver::Sent { more }
    }

    /// Notes why no request may go now: the timer is to wake the
    /// frontier at the instant given.
    fn wait_for(&mut self, not_now: NotNow) {
        match not_now {
            NotNow::Empty => {}
            NotNow::Until(at) => self.wake_at = Some(at),
            NotNow::GlobalPermits(until) => {
                self.global_wait = Some(until);
                self.wake_at = Some(until);
            }
        }
    }

    /// Polls the requests in the service that were woken or just sent,
    /// until one gives the stream an item (`Ready`). A redirect followed
    /// instead sets `hop_queued`.
    #[inline]
    fn poll_in_flight(&mut self) -> Polled<T, S::Response, S::Error> {
        let Frontier {
            in_flight,
            shared,
            follow,
            global_wait,
            hop_queued,
            ..
        } = self;
        in_flight.poll_pass(|sending, output| {
            // A global permit of ours is free.
            *global_wait = None;
            let tag = answer(shared, follow.as_ref(), sending, output);
            *hop_queued |= tag.is_none();
            tag
        })
    }

    /// Aims the one timer where the last [`send_ready`](Self::send_ready)
    /// left `wake_at`; true when that instant has come.
    fn timer_fired(&mut self, cx: &mut Context<'_>) -> bool {
        // A precise wake-up aimed earlier may stay: it costs one poll.
        let Some(at) = self.wake_at.take() else {
            return false;
        };
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

/// What one hand-over gave.
enum HandOver<I> {
    /// A request went into the service; `more`: another may go now.
    Sent { more: bool },
    /// The service failed its readiness: an item for the stream.
    Refused(I),
    /// Nothing goes now (none ready, the service busy, or every global
    /// permit taken).
    Stop,
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
        this.in_flight.take_woken();
        // Whether the requests just sent are what the next pass polls:
        // when it gives nothing, the frontier sleeps.
        let mut after_send = false;
        loop {
            match this.poll_in_flight() {
                Poll::Pending => {}
                fetched => return fetched,
            }
            // A hop queued may go now: round again.
            let hop_queued = std::mem::take(&mut this.hop_queued);
            if after_send && !hop_queued {
                match this.rest(cx) {
                    Rest::Waiting => return Poll::Pending,
                    Rest::Ended => return Poll::Ready(None),
                    Rest::LookAgain => {}
                }
            }
            this.pull_source(cx);
            this.shared.queue_looked_up(cx);
            if let Some(refused) = this.send_ready(cx) {
                return Poll::Ready(Some(refused));
            }
            after_send = !this.timer_fired(cx);
        }
    }
}

impl<S, B, T> Frontier<S, B, T>
where
    S: Service<http::Request<B>>,
{
    /// What the frontier does when nothing more can be done in this poll:
    /// wait, with what wakes it in place (or woken at once when more may
    /// go after the runtime has run), or end; or look again, when a
    /// request was queued since it last looked.
    fn rest(&mut self, cx: &mut Context<'_>) -> Rest {
        if self.batch_full || self.in_flight.woken_before_sleep(cx) {
            // More may go now, or a request in the service was woken
            // since its pass: after the runtime has run the tasks that
            // write what was just handed over (or other tasks).
            cx.waker().wake_by_ref();
            return Rest::Waiting;
        }
        let mut state = self.shared.lock();
        if std::mem::take(&mut state.queued_since_look) {
            return Rest::LookAgain;
        }
        let done =
            state.handles == 0 && self.source.is_none() && state.pending() == 0 && self.in_flight.is_empty();
        if done {
            return Rest::Ended;
        }
        state.frontier = Some(cx.waker().clone());
        Rest::Waiting
    }
}

/// What the frontier does when nothing more can be done in a poll.
enum Rest {
    /// `Pending`: something wakes it.
    Waiting,
    /// The stream ends.
    Ended,
    /// Round again: a request came in since it last looked.
    LookAgain,
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
        // `in_flight`, which gives back their lanes and places.
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
            .field("in_flight", &self.in_flight.len())
            .field("budget", &self.budget)
            .finish()
    }
}
