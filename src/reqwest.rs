//! [reqwest] support (feature `reqwest`): throttle a `reqwest::Client` and
//! keep reqwest's `Request`, `Response` and `Error` types.
//!
//! The layers of this crate work on `http::Request`/`http::Response`, so a
//! reqwest client goes between two adapters:
//!
//! - [`HttpClient`] at the bottom: a `reqwest::Client` as a
//!   `Service<http::Request<B>>` answering `http::Response<reqwest::Body>`;
//! - [`ReqwestLayer`] at the top: the whole stack as a
//!   `Service<reqwest::Request>` answering `reqwest::Response`.
//!
//! Build requests with the `reqwest::Client` as usual
//! (`http.get(url).header(..).timeout(..).build()?`) and send them through
//! the throttled service. The response's `url()`, headers and body are
//! reqwest's. One request at a time, five lines around the client (the
//! README's quick start crawls through a
//! [`Frontier`](crate::frontier::Frontier) instead, over [`HttpClient`]):
//!
//! ```no_run
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_throttle::reqwest::{HttpClient, ReqwestLayer};
//! use tower_throttle::{Registry, ThrottleLayer};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), reqwest::Error> {
//!     let http = reqwest::Client::new();
//!     let registry = Registry::default(); // one scope per host: 1 lane, 1 s ± 50 % apart
//!     let mut client = ServiceBuilder::new()
//!         .layer(ReqwestLayer::new())
//!         .layer(ThrottleLayer::new(registry.clone()))
//!         .service(HttpClient::new(http.clone()));
//!
//!     for page in 1..=3 {
//!         let request = http.get(format!("https://quotes.toscrape.com/page/{page}/")).build()?;
//!         let response: reqwest::Response = client.ready().await?.call(request).await?;
//!         println!("{} {} bytes", response.status(), response.text().await?.len());
//!     }
//!     Ok(())
//! }
//! ```
//!
//! It is `no_run` because it needs the network and TLS: add reqwest with
//! its default features (or the TLS feature you use) to your own
//! `Cargo.toml`; this crate depends on reqwest without default features.
//!
//! The full stack (robots.txt, Retry-After, backoff and retries) goes
//! between the same two adapters; `examples/reqwest.rs` shows it.
//!
//! # Departures
//!
//! A scope's gaps run from each request's departure (see
//! [`departure`](crate::departure)). Called by a throttle, [`HttpClient`]
//! times it when hyper, under reqwest, takes the request to write its head
//! (it asks the body whether it is empty then, in the connection's task),
//! not when reqwest got it: a request that waits for a connection to be
//! made (a second lane's first request, on a long round trip) or for the
//! client's runtime to run the connection's task reaches the site that
//! much later, and the next gap runs from then. Timed from the hand-over,
//! a site would see two requests closer than the delay:
//! `tests/reqwest.rs` has three lanes 100 ms apart, with new connections
//! 40 ms to set up, arrive 101 ms apart by the site's kernel stamps, where
//! the hand-over gave 59 ms.
//!
//! For that the request's body goes to reqwest as a stream
//! (`reqwest::Body::wrap`, one allocation more beside the stamp's), so
//! reqwest's own redirects and retries cannot replay a body that is not
//! empty: follow redirects and retry with this crate's layers, as above
//! and below. A request no throttle calls goes as it is.
//!
//! # Transfers and redirects
//!
//! A request keeps its lanes until the `reqwest::Response`'s body has been
//! read to the end (`text()`, `bytes()`, `chunk()` until `None`) or the
//! response is dropped: the site sees one transfer per lane.
//!
//! The adapter does not follow redirects, and its client must not either:
//! build it with `redirect(reqwest::redirect::Policy::none())`
//! ([`HttpClient::default`] does). A client that follows them sends each
//! hop inside one call, where no scope admitted it. Following redirects
//! in the adapter itself would have needed an error of its own for a loop
//! (reqwest's `Error` cannot be made outside reqwest) and would have
//! duplicated tower-http's `FollowRedirect`: put that layer, with the
//! `redirect::FailOnLoops` policy (feature `follow-redirect`), between
//! [`ReqwestLayer`] and the throttle instead, and every hop is a request
//! of the stack, in the scope of the host it goes to. A
//! [`Frontier`](crate::frontier::Frontier) follows them itself
//! (`follow_redirects`), as the README's quick start does.
//!
//! # Why a tower adapter and not `reqwest-middleware`
//!
//! The layers need an inner service that is `Clone + 'static` (the throttle
//! readies a clone per request, robots.txt is fetched on a task of its
//! own). `reqwest-middleware`'s `Next` borrows the middleware chain for one
//! call, so the stack cannot sit inside it without bypassing the rest of
//! the chain, and it would turn every error into `reqwest_middleware::Error`.
//! A tower service composes with `ServiceBuilder`, `tower::retry` and
//! `tower::timeout`, and keeps reqwest's error type.
//!
//! # Errors: what the caller sees
//!
//! | stack | error type | what it holds |
//! |---|---|---|
//! | `Throttle`, `RetryAfter`, `Backoff`, `tower::retry` | `reqwest::Error` | reqwest's error, unchanged |
//! | plus `RobotsDelay` | [`tower_throttle::Error`](crate::Error) | [`is_robots_disallowed()`](crate::Error::is_robots_disallowed): refused by robots.txt, never sent; [`is_inner()`](crate::Error::is_inner): reqwest failed, and [`into_inner()`](crate::Error::into_inner) gives a box that downcasts to `reqwest::Error` |
//!
//! ```
//! fn reqwest_error(err: tower_throttle::Error) -> Option<reqwest::Error> {
//!     err.into_inner()?.downcast::<reqwest::Error>().ok().map(|err| *err)
//! }
//! # let _ = reqwest_error;
//! ```
//!
//! A `reqwest::Request` whose URL `http` cannot represent, and an
//! `http::Request` whose URI reqwest cannot parse, fail with reqwest's
//! builder error (`is_builder()`) without being sent.
//!
//! With this feature, [`BackoffLayer`](crate::BackoffLayer)'s default error
//! rule treats reqwest errors that are `is_timeout()` or `is_connect()` as
//! backoff feedback, and [`BackoffRetry`](crate::backoff::BackoffRetry)
//! replays `reqwest::Body`s held in memory (a streamed body is not retried).
//!
//! [reqwest]: https://docs.rs/reqwest

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use ::reqwest::{Body, ResponseBuilderExt};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::backoff::TryCloneBody;
use crate::departure::stamp;
use crate::departure::{StampedBody, StampedBy};
use crate::throttle::ThrottledBody;

/// A `reqwest::Client` as a `Service<http::Request<B>>`, the inner service
/// of this crate's layers. Any body reqwest accepts (`Into<reqwest::Body>`:
/// `reqwest::Body`, `String`, `Vec<u8>`, `Bytes`, ...) can be sent; the
/// response body is a `reqwest::Body`. See the [module docs](self).
///
/// The response carries the URL it came from, so a `reqwest::Response`
/// made from it (by [`ReqwestLayer`]) has the right `url()`. A request a
/// throttle calls departs when hyper, under reqwest, writes it (see
/// [Departures](self#departures)).
///
/// # Redirects
///
/// Give it a client built with `redirect(reqwest::redirect::Policy::none())`
/// ([`HttpClient::default`] is one). A client that follows redirects
/// itself (reqwest's default: up to 10) sends every hop inside one call,
/// where no scope admitted it: a hop to another host, or back to the same
/// one, skips the throttle. To follow redirects, put
/// `redirect::FollowRedirectLayer` between [`ReqwestLayer`] and the throttle: each
/// hop is then a request of the stack, in the scope of the host it goes
/// to (see `docs/transfers-and-redirects.md`).
///
/// # Errors
///
/// The `reqwest::Error` of the request; a URI that reqwest cannot parse is
/// a builder error.
///
/// # Clone
///
/// A clone shares the client's connection pool.
#[derive(Debug, Clone)]
pub struct HttpClient {
    client: ::reqwest::Client,
}

impl HttpClient {
    /// Wraps `client`.
    pub fn new(client: ::reqwest::Client) -> Self {
        HttpClient { client }
    }
}

impl Default for HttpClient {
    /// A client that follows no redirects (see [Redirects](Self#redirects)),
    /// otherwise reqwest's defaults.
    fn default() -> Self {
        let client = ::reqwest::Client::builder()
            .redirect(::reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        HttpClient::new(client)
    }
}

impl From<::reqwest::Client> for HttpClient {
    fn from(client: ::reqwest::Client) -> Self {
        HttpClient::new(client)
    }
}

impl<B: Into<Body>> Service<http::Request<B>> for HttpClient {
    type Response = http::Response<Body>;
    type Error = ::reqwest::Error;
    type Future = ResponseFuture<ClientFuture, ::reqwest::Response, http::Response<Body>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::<::reqwest::Request>::poll_ready(&mut self.client, cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match ::reqwest::Request::try_from(stamped_at_the_write(request)) {
            Ok(request) => ResponseFuture::calling(self.client.call(request), into_http_response),
            Err(error) => ResponseFuture::failed(error),
        }
    }
}

/// The request with its body as reqwest takes it. Called by a throttle,
/// the body is a [`StampedBody`]: hyper, under reqwest, asks it whether it
/// is empty in the connection's task, right before it writes the request's
/// head, and that instant is the departure (see [`departure`](crate::departure)),
/// rather than the hand-over, which comes before the connection is made
/// or free and before the client's runtime runs its task. Without a
/// throttle calling (or with a [`DepartureStampLayer`](crate::departure::DepartureStampLayer)
/// between, which stamps it first), the body goes as it is.
fn stamped_at_the_write<B: Into<Body>>(request: http::Request<B>) -> http::Request<Body> {
    match stamp::claim() {
        Some(stamp) => {
            request.map(|body| Body::wrap(StampedBody::new(body.into(), Some(stamp), StampedBy::NotItsSize)))
        }
        None => request.map(Into::into),
    }
}

/// reqwest does not export the name of its client's future.
type ClientFuture = <::reqwest::Client as Service<::reqwest::Request>>::Future;

fn into_http_response(response: ::reqwest::Response) -> http::Response<Body> {
    let url = response.url().clone();
    let mut converted = http::Response::<Body>::from(response);
    // reqwest's own conversion drops the URL; its response builder is the
    // one public way to attach it where `reqwest::Response::from` looks.
    let with_url = http::Response::builder()
        .url(url)
        .body(())
        .expect("a builder with only a URL is valid");
    converted
        .extensions_mut()
        .extend(with_url.into_parts().0.extensions);
    converted
}

/// Turns a service of `http::Request<reqwest::Body>` (the throttled stack
/// around an [`HttpClient`]) into a `Service<reqwest::Request>` answering
/// `reqwest::Response`. Put it first in the `ServiceBuilder`. See the
/// [module docs](self).
///
/// # Clone
///
/// The layer is a unit value; cloning it costs nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReqwestLayer {
    _private: (),
}

impl ReqwestLayer {
    /// The layer.
    pub fn new() -> Self {
        ReqwestLayer { _private: () }
    }
}

impl<S> Layer<S> for ReqwestLayer {
    type Service = Reqwest<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Reqwest { inner }
    }
}

/// A service of `http` types seen as a `Service<reqwest::Request>`, made
/// by [`ReqwestLayer`].
///
/// # Errors
///
/// The inner service's error, unchanged (`reqwest::Error`, or
/// [`tower_throttle::Error`](crate::Error) with `RobotsDelay` in the
/// stack); a `reqwest::Request` that cannot become an `http::Request` is
/// reqwest's builder error, converted with `From`.
///
/// # Clone
///
/// A clone clones the inner service (the layers share their registry).
#[derive(Debug, Clone)]
pub struct Reqwest<S> {
    inner: S,
}

impl<S, B> Service<::reqwest::Request> for Reqwest<S>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    S::Error: From<::reqwest::Error>,
    B: Into<Body>,
{
    type Response = ::reqwest::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, http::Response<B>, ::reqwest::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: ::reqwest::Request) -> Self::Future {
        // On a failed conversion the readiness reserved by `poll_ready`
        // stays with this service and serves its next call.
        match http::Request::<Body>::try_from(request) {
            Ok(request) => ResponseFuture::calling(self.inner.call(request), ::reqwest::Response::from),
            Err(error) => ResponseFuture::failed(error),
        }
    }
}

pin_project! {
    /// The response future of [`HttpClient`] and [`Reqwest`]: the inner
    /// call with its response `R` converted to `T`, or the request's
    /// conversion error.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<F, R, T> {
        #[pin]
        state: State<F, R, T>,
    }
}

pin_project! {
    #[project = StateProjection]
    enum State<F, R, T> {
        Calling {
            #[pin]
            future: F,
            convert: fn(R) -> T,
        },
        Failed {
            error: Option<::reqwest::Error>,
        },
    }
}

impl<F, R, T> ResponseFuture<F, R, T> {
    fn calling(future: F, convert: fn(R) -> T) -> Self {
        ResponseFuture {
            state: State::Calling { future, convert },
        }
    }

    fn failed(error: ::reqwest::Error) -> Self {
        ResponseFuture {
            state: State::Failed { error: Some(error) },
        }
    }
}

impl<F, R, T> fmt::Debug for ResponseFuture<F, R, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, R, E, T> Future for ResponseFuture<F, R, T>
where
    F: Future<Output = Result<R, E>>,
    E: From<::reqwest::Error>,
{
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProjection::Calling { future, convert } => {
                let response = ready!(future.poll(cx))?;
                Poll::Ready(Ok(convert(response)))
            }
            StateProjection::Failed { error } => {
                let error = error.take().expect("polled after completion");
                Poll::Ready(Err(E::from(error)))
            }
        }
    }
}

/// A throttled response's body as reqwest's: the `reqwest::Response`
/// keeps the request's lanes until its body is read to the end or the
/// response is dropped (see [`ThrottledBody`]).
impl<B> From<ThrottledBody<B>> for Body
where
    B: http_body::Body + Send + Sync + 'static,
    B::Data: Into<bytes::Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn from(body: ThrottledBody<B>) -> Body {
        Body::wrap(body)
    }
}

impl TryCloneBody for Body {
    /// A body held in memory is copied; a streamed body cannot be replayed.
    fn try_clone_body(&self) -> Option<Self> {
        self.as_bytes()
            .map(|bytes| Body::from(bytes::Bytes::copy_from_slice(bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_keep_their_url_through_both_conversions() {
        let url = ::reqwest::Url::parse("http://site.example/page").unwrap();
        let original = ::reqwest::Response::from(
            http::Response::builder()
                .status(201)
                .url(url.clone())
                .body("hello")
                .unwrap(),
        );
        let back = ::reqwest::Response::from(into_http_response(original));
        assert_eq!(back.url(), &url);
        assert_eq!(back.status(), 201);
    }

    #[test]
    fn bodies_in_memory_are_replayable_and_streams_are_not() {
        let body = Body::from("form=data");
        assert_eq!(body.try_clone_body().unwrap().as_bytes(), Some(&b"form=data"[..]));
        let streamed = Body::wrap(http_body_util::Empty::<bytes::Bytes>::new());
        assert!(streamed.try_clone_body().is_none());
    }
}
