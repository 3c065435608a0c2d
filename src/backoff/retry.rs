use std::fmt;

use bytes::Bytes;
use tower::retry::Policy;

use std::sync::Arc;

use super::classify::ErrorView;
use super::judged::Judged;
use super::shared::ErrorHook;
use crate::registry::Registry;
use crate::scope::Scopes;
use crate::waited::Waited;
use std::time::Duration;
use tokio::time::Instant;

/// A request's attempts through [`BackoffRetry`].
#[derive(Debug, Clone, Copy, Default)]
struct Attempts {
    /// Retries so far (0: the first attempt).
    retries: u32,
    first_started: Option<Instant>,
    latest_started: Option<Instant>,
}

impl Attempts {
    /// A new request's first attempt starts at `now` (nothing, on a
    /// retry's copy of the request).
    fn first_may_start(&mut self, now: Instant) {
        if self.retries == 0 {
            self.first_started = Some(now);
        }
    }

    /// A retry starts at `now`.
    fn next_starts(&mut self, now: Instant) {
        self.retries += 1;
        self.latest_started = Some(now);
    }

    /// Tells the final `response`'s [`Waited`] how many attempts there
    /// were and how long the earlier ones took, when there was a retry.
    fn leave_on<B>(&self, response: &mut http::Response<B>) {
        if self.retries == 0 {
            return;
        }
        let earlier = match (self.first_started, self.latest_started) {
            (Some(first), Some(latest)) => latest.saturating_duration_since(first),
            _ => Duration::ZERO,
        };
        let mut waited = Waited::default();
        waited.set_attempts(self.retries + 1, earlier);
        waited.merge_into(response.extensions_mut());
    }
}

/// Request bodies that can (sometimes) be copied for a retry.
///
/// Implemented for in-memory bodies; a streaming body returns `None`, and
/// its request is then not retried. Implement it for your own body type to
/// make its requests retryable; for a body type of another crate, give
/// [`BackoffRetry::clone_body_with`] a closure instead.
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

/// How [`BackoffRetry`] copies a request body for a retry.
///
/// [`CloneByTrait`] (the default) uses [`TryCloneBody`]; any
/// `Fn(&B) -> Option<B>` closure is a `CloneBody<B>` too, for body types
/// of other crates, which the orphan rule keeps you from implementing
/// `TryCloneBody` for (see [`BackoffRetry::clone_body_with`]).
pub trait CloneBody<B> {
    /// A copy of `body`, or `None` when it cannot be replayed (the request
    /// is then not retried).
    fn clone_body(&self, body: &B) -> Option<B>;
}

/// Copies bodies through [`TryCloneBody`]: the default [`CloneBody`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CloneByTrait;

impl<B: TryCloneBody> CloneBody<B> for CloneByTrait {
    fn clone_body(&self, body: &B) -> Option<B> {
        body.try_clone_body()
    }
}

impl<B, F> CloneBody<B> for F
where
    F: Fn(&B) -> Option<B>,
{
    fn clone_body(&self, body: &B) -> Option<B> {
        self(body)
    }
}

/// A [`tower::retry::Policy`] that re-sends requests whose response was
/// backoff feedback or whose error was (a timeout, a connection failure),
/// at most `max_retries` times per request (so at most `max_retries + 1`
/// attempts). Made by
/// [`BackoffLayer::retry_policy`](crate::BackoffLayer::retry_policy).
///
/// A response is judged once, by [`BackoffLayer`](crate::BackoffLayer)
/// with whatever hooks it was given: the policy reads the [`Judged`]
/// extension that layer attaches, so a response your `on_response` hook
/// calls backoff is retried and one it exempts is not. Without a
/// `BackoffLayer` inside, the policy falls back to the status rule of the
/// request's scopes (their backoff `http_codes`). Errors carry no
/// extensions: the policy judges them with the `on_error` hook of the
/// layer that made it ([`default_error_feedback`](super::default_error_feedback)
/// unless one was given).
///
/// Put the `Retry` layer *outside* [`Throttle`](crate::Throttle): each
/// retry then goes through the throttle again and waits its turn in the
/// scope, which the backoff feedback of the failed attempt has just slowed
/// down. The policy adds no sleep of its own. Requests whose body cannot be
/// copied are not retried: see [`TryCloneBody`] and
/// [`clone_body_with`](Self::clone_body_with).
///
/// ```
/// use std::time::Duration;
/// use tower::retry::RetryLayer;
/// use tower::ServiceBuilder;
/// use tower_throttle::backoff::BackoffRetry;
/// use tower_throttle::{BackoffLayer, Registry, ThrottleLayer};
///
/// let registry = Registry::default();
/// let backoff = BackoffLayer::new(registry.clone());
/// let client = ServiceBuilder::new()
///     .layer(RetryLayer::new(backoff.retry_policy(3)))
///     .layer(ThrottleLayer::new(registry.clone()))
///     .layer(backoff)
///     .service(tower::service_fn(|_request: http::Request<String>| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(()))
///     }));
/// # drop(client);
/// ```
#[derive(Clone)]
pub struct BackoffRetry<C = CloneByTrait> {
    registry: Registry,
    retries_left: u32,
    /// The attempts of the request so far, and when the first and the
    /// latest started: the final response's [`Waited`] tells them.
    attempts: Attempts,
    on_error: Arc<ErrorHook>,
    clone_body: C,
}

impl<C> fmt::Debug for BackoffRetry<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackoffRetry")
            .field("retries_left", &self.retries_left)
            .finish_non_exhaustive()
    }
}

impl BackoffRetry {
    pub(crate) fn with_error_hook(registry: Registry, max_retries: u32, on_error: Arc<ErrorHook>) -> Self {
        BackoffRetry {
            registry,
            retries_left: max_retries,
            attempts: Attempts::default(),
            on_error,
            clone_body: CloneByTrait,
        }
    }
}

impl<C> BackoffRetry<C> {
    /// Copies request bodies with `clone_body` (return `None` for a body
    /// that cannot be replayed) instead of [`TryCloneBody`]: the way to
    /// retry requests whose body type comes from another crate.
    ///
    /// ```
    /// use tower::retry::RetryLayer;
    /// use tower_throttle::{BackoffLayer, Registry};
    ///
    /// // A body type of another crate, cheap to copy.
    /// # #[derive(Clone)] struct ForeignBody;
    /// let policy = BackoffLayer::new(Registry::default())
    ///     .retry_policy(3)
    ///     .clone_body_with(|body: &ForeignBody| Some(body.clone()));
    /// let layer = RetryLayer::new(policy);
    /// # drop(layer);
    /// ```
    pub fn clone_body_with<B, F>(self, clone_body: F) -> BackoffRetry<F>
    where
        F: Fn(&B) -> Option<B> + Clone,
    {
        BackoffRetry {
            registry: self.registry,
            retries_left: self.retries_left,
            attempts: self.attempts,
            on_error: self.on_error,
            clone_body,
        }
    }

    fn is_backoff_response<ReqBody, ResBody>(
        &self,
        request: &http::Request<ReqBody>,
        response: &http::Response<ResBody>,
    ) -> bool {
        if let Some(judged) = response.extensions().get::<Judged>() {
            return judged.feedback().is_backoff();
        }
        let status = response.status().as_u16();
        match request.extensions().get::<Scopes>() {
            Some(scopes) => self.any_scope_backs_off_on(scopes, status),
            None => self.any_scope_backs_off_on(&self.registry.scopes_of(request), status),
        }
    }

    fn any_scope_backs_off_on(&self, scopes: &Scopes, status: u16) -> bool {
        scopes
            .iter()
            .any(|(scope, _)| self.registry.is_backoff_status(scope.as_str(), status))
    }
}

impl<ReqBody, ResBody, E, C> Policy<http::Request<ReqBody>, http::Response<ResBody>, E> for BackoffRetry<C>
where
    C: CloneBody<ReqBody>,
    E: 'static,
{
    type Future = std::future::Ready<()>;

    fn retry(
        &mut self,
        request: &mut http::Request<ReqBody>,
        result: &mut Result<http::Response<ResBody>, E>,
    ) -> Option<Self::Future> {
        let retry = self.retries_left > 0
            && match result {
                Ok(response) => self.is_backoff_response(request, response),
                Err(error) => (self.on_error)(&ErrorView::of(error)).is_backoff(),
            };
        if !retry {
            if let Ok(response) = result {
                self.attempts.leave_on(response);
            }
            return None;
        }
        self.retries_left -= 1;
        self.attempts.next_starts(Instant::now());
        tracing::debug!(
            target: "tower_throttle",
            uri = %request.uri(),
            retries_left = self.retries_left,
            "retrying after backoff feedback"
        );
        Some(std::future::ready(()))
    }

    fn clone_request(&mut self, request: &http::Request<ReqBody>) -> Option<http::Request<ReqBody>> {
        // Called as each request starts, on the policy the request's retry
        // future then copies: the first attempt starts now.
        self.attempts.first_may_start(Instant::now());
        let body = self.clone_body.clone_body(request.body())?;
        let mut copy = http::Request::new(body);
        *copy.method_mut() = request.method().clone();
        *copy.uri_mut() = request.uri().clone();
        *copy.version_mut() = request.version();
        *copy.headers_mut() = request.headers().clone();
        *copy.extensions_mut() = request.extensions().clone();
        Some(copy)
    }
}
