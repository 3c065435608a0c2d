//! The response future of [`RobotsDelay`](super::RobotsDelay).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tower_service::Service;

use super::cache::OriginEntry;
use super::shared::RobotsShared;
use crate::error::{BoxError, Error};
use crate::registry::LimitSource;
use crate::scope::Scopes;
use crate::waited::{WaitCause, Waited};
use tokio::time::Instant;

pin_project! {
    /// Waits for the origin's robots.txt when it is not known yet, then
    /// readies the inner service and drives its future. Dropping it while
    /// it waits leaves the fetch running for the requests that come next.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<http::Request<ReqBody>>,
    {
        #[pin]
        state: State<S, http::Request<ReqBody>, S::Future>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req, F> {
        Waiting {
            wait: Wait,
            // The three are taken exactly once, when the rules are known.
            turn: Option<Turn>,
            service: Option<S>,
            request: Option<Req>,
            // When the request started to wait (its `WaitCause::Robots`).
            since: Instant,
        },
        WaitingTurn {
            turn: Option<Turn>,
            service: Option<S>,
            request: Option<Req>,
            since: Instant,
        },
        Readying {
            service: S,
            request: Option<Req>,
            // Ends when the request is handed on (this state is left).
            turn: Option<Turn>,
            waited: Duration,
        },
        Calling {
            #[pin]
            future: F,
            // The wait for robots.txt and the origin's turn, if any: added
            // to the response's `Waited`.
            waited: Option<Duration>,
        },
        Failed {
            error: Option<Error>,
        },
        Done,
    }
}

/// A request's place among those waiting for an origin's fetch. Dropping it
/// gives the place up.
struct Wait {
    shared: Arc<RobotsShared>,
    entry: Arc<OriginEntry>,
    /// The number of fetches the entry had finished when the request came.
    round: u64,
    /// The waiter's key in the entry, once polled.
    waiter: Option<usize>,
    scopes: Scopes,
}

/// A request's turn to go on after the requests that came before it (see
/// the robots cache's turnstile). Dropping it ends the turn.
pub(super) struct Turn {
    entry: Arc<OriginEntry>,
    turn: u64,
}

impl Turn {
    pub(super) fn new(entry: Arc<OriginEntry>, turn: u64) -> Self {
        Turn { entry, turn }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.entry.end_turn(self.turn);
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        if let Some(waiter) = self.waiter.take() {
            self.entry.leave(self.round, waiter);
        }
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<http::Request<ReqBody>>,
{
    pub(super) fn calling(future: S::Future) -> Self {
        ResponseFuture {
            state: State::Calling { future, waited: None },
        }
    }

    pub(super) fn failed(error: Error) -> Self {
        ResponseFuture {
            state: State::Failed { error: Some(error) },
        }
    }

    pub(super) fn waiting(
        shared: Arc<RobotsShared>,
        entry: Arc<OriginEntry>,
        round: u64,
        turn: u64,
        scopes: Scopes,
        service: S,
        request: http::Request<ReqBody>,
    ) -> Self {
        ResponseFuture {
            state: State::Waiting {
                turn: Some(Turn::new(entry.clone(), turn)),
                wait: Wait {
                    shared,
                    entry,
                    round,
                    waiter: None,
                    scopes,
                },
                service: Some(service),
                request: Some(request),
                since: Instant::now(),
            },
        }
    }

    /// A request allowed by known rules, going on once the requests that
    /// came before it have.
    pub(super) fn waiting_turn(turn: Turn, service: S, request: http::Request<ReqBody>) -> Self {
        ResponseFuture {
            state: State::WaitingTurn {
                turn: Some(turn),
                service: Some(service),
                request: Some(request),
                since: Instant::now(),
            },
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Waiting {
                    wait,
                    turn,
                    service,
                    request,
                    since,
                } => {
                    let known = match wait.entry.poll_known(
                        cx,
                        wait.round,
                        &mut wait.waiter,
                        &wait.scopes,
                        &wait.shared.registry,
                    ) {
                        Poll::Ready(known) => known,
                        Poll::Pending => return Poll::Pending,
                    };
                    let (Some(service), Some(request)) = (service.take(), request.take()) else {
                        this.state.set(State::Done);
                        continue;
                    };
                    let checked = known.check(&wait.shared.config, wait.entry.origin(), &request);
                    match checked {
                        Ok(()) => {
                            let (turn, since) = (turn.take(), *since);
                            this.state.set(State::WaitingTurn {
                                turn,
                                service: Some(service),
                                request: Some(request),
                                since,
                            })
                        }
                        Err(error) => this.state.set(State::Failed { error: Some(error) }),
                    }
                }
                StateProj::WaitingTurn {
                    turn,
                    service,
                    request,
                    since,
                } => {
                    if let Some(held) = turn.as_ref() {
                        if held.entry.poll_turn(cx, held.turn).is_pending() {
                            return Poll::Pending;
                        }
                    }
                    let (Some(service), Some(request)) = (service.take(), request.take()) else {
                        this.state.set(State::Done);
                        continue;
                    };
                    let (turn, since) = (turn.take(), *since);
                    this.state.set(State::Readying {
                        service,
                        request: Some(request),
                        turn,
                        waited: since.elapsed(),
                    });
                }
                StateProj::Readying {
                    service,
                    request,
                    waited,
                    ..
                } => {
                    match service.poll_ready(cx) {
                        Poll::Ready(Ok(())) => {}
                        Poll::Ready(Err(err)) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(Error::inner(err)));
                        }
                        Poll::Pending => return Poll::Pending,
                    }
                    let Some(request) = request.take() else {
                        this.state.set(State::Done);
                        continue;
                    };
                    let waited = Some(*waited);
                    let future = service.call(request);
                    this.state.set(State::Calling { future, waited });
                }
                StateProj::Calling { future, waited } => {
                    let mut output = match future.poll(cx) {
                        Poll::Ready(output) => output,
                        Poll::Pending => return Poll::Pending,
                    };
                    if let (Some(waited), Ok(response)) = (*waited, &mut output) {
                        leave_robots_wait(waited, response);
                    }
                    this.state.set(State::Done);
                    return Poll::Ready(output.map_err(Error::inner));
                }
                StateProj::Failed { error } => {
                    let error = error.take();
                    this.state.set(State::Done);
                    if let Some(error) = error {
                        return Poll::Ready(Err(error));
                    }
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

/// Adds the wait for robots.txt (and for the origin's earlier requests to
/// go on) to the response's [`Waited`], and to the metrics.
#[cold]
fn leave_robots_wait<B>(waited: Duration, response: &mut http::Response<B>) {
    let mut record = Waited::default();
    record.add(WaitCause::Robots, Some(LimitSource::Robots), waited);
    crate::waited::record_metrics(record.causes());
    record.merge_into(response.extensions_mut());
}

impl<S, ReqBody> fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<http::Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Waiting { .. } => "waiting for robots.txt",
            State::WaitingTurn { .. } => "waiting for earlier requests to go on",
            State::Readying { .. } => "readying",
            State::Calling { .. } => "calling",
            State::Failed { .. } => "failed",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture").field("state", &state).finish()
    }
}
