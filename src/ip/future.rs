//! The response future of [`IpScope`](super::IpScope).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tower_service::Service;

use super::attach::settle;
use super::cache::SharedLookup;
use super::shared::IpShared;
use crate::error::{BoxError, Error};
use crate::scope::Scopes;

/// What a waiting request keeps to settle its lookup: the layer's shared
/// state, its scopes, and its scopes again if it reports a failure.
type Settling = (Arc<IpShared>, Scopes, Option<Scopes>);

pin_project! {
    /// Waits for the request's lookup when its name is not known yet (the
    /// requests of one name share it), then readies the inner service and
    /// drives its future. Dropping it while it waits leaves the lookup to
    /// the other requests of the name, and holds nothing.
    pub struct ResponseFuture<S, B>
    where
        S: Service<http::Request<B>>,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<http::Request<B>>,
    {
        Resolving {
            lookup: SharedLookup,
            // Taken once, when the lookup ends.
            service: Option<S>,
            request: Option<http::Request<B>>,
            settling: Settling,
        },
        Readying {
            service: S,
            request: Option<http::Request<B>>,
        },
        Calling {
            #[pin]
            future: S::Future,
        },
        Failed {
            error: Option<Error>,
        },
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<http::Request<B>>,
{
    pub(crate) fn calling(future: S::Future) -> Self {
        ResponseFuture {
            state: State::Calling { future },
        }
    }

    pub(crate) fn failed(error: Error) -> Self {
        ResponseFuture {
            state: State::Failed { error: Some(error) },
        }
    }

    pub(crate) fn resolving(
        lookup: SharedLookup,
        service: S,
        request: http::Request<B>,
        settling: Settling,
    ) -> Self {
        ResponseFuture {
            state: State::Resolving {
                lookup,
                service: Some(service),
                request: Some(request),
                settling,
            },
        }
    }
}

impl<S, B> std::fmt::Debug for ResponseFuture<S, B>
where
    S: Service<http::Request<B>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Resolving { .. } => "Resolving",
            State::Readying { .. } => "Readying",
            State::Calling { .. } => "Calling",
            State::Failed { .. } => "Failed",
        };
        f.debug_struct("ResponseFuture").field("state", &state).finish()
    }
}

impl<S, B> Future for ResponseFuture<S, B>
where
    S: Service<http::Request<B>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Resolving {
                    lookup,
                    service,
                    request,
                    settling,
                } => {
                    let answer = ready!(Pin::new(lookup).poll(cx));
                    let (Some(service), Some(request)) = (service.take(), request.take()) else {
                        unreachable!("taken once, when the state is left")
                    };
                    match settle(answer, request, settling) {
                        Ok(request) => this.state.set(State::Readying {
                            service,
                            request: Some(request),
                        }),
                        Err(error) => this.state.set(State::Failed { error: Some(error) }),
                    }
                }
                StateProj::Readying { service, request } => {
                    ready!(service.poll_ready(cx)).map_err(Error::inner)?;
                    let Some(request) = request.take() else {
                        unreachable!("taken once, when the state is left")
                    };
                    let future = service.call(request);
                    this.state.set(State::Calling { future });
                }
                StateProj::Calling { future } => return future.poll(cx).map_err(Error::inner),
                StateProj::Failed { error } => {
                    return Poll::Ready(Err(error.take().expect("ResponseFuture polled after completion")));
                }
            }
        }
    }
}
