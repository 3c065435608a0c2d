use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::{HeaderValue, USER_AGENT};
use http_body::Body;
use tokio::time::Instant;
use tower_service::Service;

use super::cache::{Arrival, Origin};
use super::fetch::{spawn_fetch, FetchTemplate};
use super::future::{ResponseFuture, Turn};
use super::shared::RobotsShared;
use super::Config;
use crate::error::{BoxError, Error};
use crate::ip::ServerAddr;
use crate::readiness::{release_readied, take_readied};
use crate::scope::Scopes;

/// Fetches each origin's robots.txt before its first request, reports its
/// Crawl-delay to the registry, and optionally obeys its rules. See the
/// [module docs](crate::robots).
///
/// The robots.txt fetch is a request the layer builds itself, with an empty
/// body: `ReqBody::default()` (hence the `ReqBody: Default` bound; `()`,
/// `String`, `http_body_util::Full` and `Empty` qualify). It needs the
/// response body to implement [`http_body::Body`] to read the file.
///
/// # Errors
///
/// [`Error::is_robots_disallowed`] when rules are obeyed and robots.txt
/// disallows the request (or is unreachable); [`Error::is_inner`] when the
/// inner service fails, with its error as the source.
///
/// # Panics
///
/// `call` panics outside a Tokio runtime when it has to start a robots.txt
/// fetch (the fetch runs on a task of its own).
///
/// # Clone
///
/// A clone shares the registry and the robots cache.
pub struct RobotsDelay<S> {
    inner: S,
    shared: Arc<RobotsShared>,
}

impl<S: Clone> Clone for RobotsDelay<S> {
    fn clone(&self) -> Self {
        RobotsDelay {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for RobotsDelay<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RobotsDelay")
            .field("inner", &self.inner)
            .field("shared", &self.shared)
            .finish()
    }
}

impl<S> RobotsDelay<S> {
    pub(crate) fn from_shared(inner: S, shared: Arc<RobotsShared>) -> Self {
        RobotsDelay { inner, shared }
    }
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for RobotsDelay<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ReqBody: Default + Send + 'static,
    ResBody: Body + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Error::inner)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        let Some(origin) = Origin::of(request.uri()) else {
            // No robots.txt to ask (origin-form URI, another scheme).
            return ResponseFuture::calling(take_readied(&mut self.inner).call(request));
        };
        let shared = &self.shared;
        let scopes = shared.registry.scopes_of(&request);
        let now = Instant::now();
        let entry = shared.cache.entry(&origin, now);
        match entry.arrive(&scopes, &shared.registry, now) {
            Arrival::Known(known, turn) => {
                if let Err(err) = known.check(&shared.config, &origin, &request) {
                    // The readied handle stays ready for the next call (a
                    // turn taken ends at once).
                    drop(turn.map(|turn| Turn::new(entry.clone(), turn)));
                    return ResponseFuture::failed(err);
                }
                request.extensions_mut().insert(scopes);
                match turn {
                    None => ResponseFuture::calling(take_readied(&mut self.inner).call(request)),
                    Some(turn) => {
                        // Earlier requests still wait to go on: go after
                        // them, without holding readiness meanwhile.
                        let service = release_readied(&mut self.inner);
                        ResponseFuture::waiting_turn(Turn::new(entry, turn), service, request)
                    }
                }
            }
            Arrival::Wait {
                round,
                start_fetch,
                turn,
            } => {
                // A waiting request must hold no readiness of the inner
                // service: with Throttle inside, that is a queue place, or
                // with `fixed_scope` an admitted send, which the fetch itself
                // may need. Give up what `poll_ready` reserved; the request
                // readies its own handle once the rules are known.
                let service = release_readied(&mut self.inner);
                if start_fetch {
                    let template = FetchTemplate {
                        user_agent: request
                            .headers()
                            .get(USER_AGENT)
                            .cloned()
                            .or_else(|| configured_user_agent(&shared.config)),
                        scopes: request.extensions().get::<Scopes>().cloned(),
                        server: request.extensions().get::<ServerAddr>().copied(),
                    };
                    spawn_fetch(self.inner.clone(), shared.clone(), entry.clone(), template);
                }
                tracing::debug!(
                    target: "tower_throttle",
                    %origin,
                    path = request.uri().path(),
                    "request waits for robots.txt"
                );
                request.extensions_mut().insert(scopes.clone());
                ResponseFuture::waiting(shared.clone(), entry, round, turn, scopes, service, request)
            }
        }
    }
}

fn configured_user_agent(config: &Config) -> Option<HeaderValue> {
    if config.user_agent.is_empty() {
        return None;
    }
    HeaderValue::from_str(&config.user_agent).ok()
}
