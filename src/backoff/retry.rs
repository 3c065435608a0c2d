use std::fmt;

use bytes::Bytes;
use tower::retry::Policy;

use super::classify::{default_error_feedback, ErrorView};
use crate::registry::Registry;

/// Request bodies that can (sometimes) be copied for a retry.
///
/// Implemented for in-memory bodies; a streaming body returns `None`, and
/// its request is then not retried. Implement it for your own body type to
/// make its requests retryable.
pub trait TryCloneBody: Sized {
    /// A copy of the body, or `None` when it cannot be replayed.
    fn try_clone_body(&self) -> Option<Self>;
}

macro_rules! cloneable_bodies {
    ($($ty:ty),* $(,)?) => {
        $(impl TryCloneBody for $ty {
            fn try_clone_body(&self) -> Option<Self> {
                Some(self.clone())
            }
        })*
    };
}

cloneable_bodies!(
    (),
    String,
    Vec<u8>,
    Bytes,
    &'static str,
    &'static [u8],
    http_body_util::Full<Bytes>,
    http_body_util::Empty<Bytes>,
);

impl TryCloneBody for hyper::body::Incoming {
    /// A streamed body is consumed as it is sent: never replayable.
    fn try_clone_body(&self) -> Option<Self> {
        None
    }
}

/// A [`tower::retry::Policy`] that re-sends requests whose response was
/// backoff feedback (a status in the scope's backoff `http_codes`) or whose
/// error was (a timeout, a connection failure), at most `max_retries` times
/// per request.
///
/// Put the `Retry` layer *outside* [`Throttle`](crate::Throttle): each
/// retry then goes through the throttle again and waits its turn in the
/// scope, which the backoff feedback of the failed attempt has just slowed
/// down. The policy adds no sleep of its own. Requests whose body cannot be
/// copied ([`TryCloneBody`] returns `None`) are not retried.
///
/// ```
/// use std::time::Duration;
/// use tower::retry::RetryLayer;
/// use tower::ServiceBuilder;
/// use tower_throttle::backoff::BackoffRetry;
/// use tower_throttle::{BackoffLayer, Registry, ThrottleLayer};
///
/// let registry = Registry::default();
/// let client = ServiceBuilder::new()
///     .layer(RetryLayer::new(BackoffRetry::new(registry.clone(), 3)))
///     .layer(ThrottleLayer::new(registry.clone()))
///     .layer(BackoffLayer::new(registry))
///     .service(tower::service_fn(|_request: http::Request<String>| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(()))
///     }));
/// # drop(client);
/// ```
#[derive(Clone)]
pub struct BackoffRetry {
    registry: Registry,
    retries_left: u32,
}

impl fmt::Debug for BackoffRetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackoffRetry")
            .field("retries_left", &self.retries_left)
            .finish_non_exhaustive()
    }
}

impl BackoffRetry {
    /// Retries each request at most `max_retries` times (so at most
    /// `max_retries + 1` attempts), judging responses by the backoff
    /// settings of the request's scopes in `registry`.
    pub fn new(registry: Registry, max_retries: u32) -> Self {
        BackoffRetry {
            registry,
            retries_left: max_retries,
        }
    }

    fn is_backoff_response<ReqBody, ResBody>(
        &self,
        request: &http::Request<ReqBody>,
        response: &http::Response<ResBody>,
    ) -> bool {
        let status = response.status().as_u16();
        let scopes = self.registry.scopes_of(request);
        scopes.iter().any(|(scope, _)| {
            self.registry
                .scope_config(scope.as_str())
                .get_backoff()
                .is_backoff_status(status)
        })
    }
}

impl<ReqBody, ResBody, E> Policy<http::Request<ReqBody>, http::Response<ResBody>, E> for BackoffRetry
where
    ReqBody: TryCloneBody,
    E: 'static,
{
    type Future = std::future::Ready<()>;

    fn retry(
        &mut self,
        request: &mut http::Request<ReqBody>,
        result: &mut Result<http::Response<ResBody>, E>,
    ) -> Option<Self::Future> {
        if self.retries_left == 0 {
            return None;
        }
        let retry = match result {
            Ok(response) => self.is_backoff_response(request, response),
            Err(error) => default_error_feedback(&ErrorView::of(error)).is_backoff(),
        };
        if !retry {
            return None;
        }
        self.retries_left -= 1;
        tracing::debug!(
            target: "tower_throttle",
            uri = %request.uri(),
            retries_left = self.retries_left,
            "retrying after backoff feedback"
        );
        Some(std::future::ready(()))
    }

    fn clone_request(&mut self, request: &http::Request<ReqBody>) -> Option<http::Request<ReqBody>> {
        let body = request.body().try_clone_body()?;
        let mut copy = http::Request::new(body);
        *copy.method_mut() = request.method().clone();
        *copy.uri_mut() = request.uri().clone();
        *copy.version_mut() = request.version();
        *copy.headers_mut() = request.headers().clone();
        *copy.extensions_mut() = request.extensions().clone();
        Some(copy)
    }
}
