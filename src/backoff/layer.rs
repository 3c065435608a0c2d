use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use tower_layer::Layer;

use super::classify::{default_error_feedback, default_response_feedback, ErrorView, ResponseHead};
use super::shared::BackoffShared;
use super::{Backoff, BackoffRetry};
use crate::registry::{BackoffConfig, Feedback, Registry};

/// Applies [`Backoff`] to a service; see the [module docs](crate::backoff).
///
/// # Clone
///
/// Cloning this layer shares the registry and the hooks.
///
/// ```
/// use tower::ServiceBuilder;
/// use tower_throttle::{BackoffLayer, Registry, ThrottleLayer};
///
/// let registry = Registry::default();
/// let client = ServiceBuilder::new()
///     .layer(ThrottleLayer::new(registry.clone()))
///     .layer(BackoffLayer::new(registry))
///     .service(tower::service_fn(|_request: http::Request<()>| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(()))
///     }));
/// # drop(client);
/// ```
#[derive(Clone)]
pub struct BackoffLayer {
    shared: Arc<BackoffShared>,
}

impl fmt::Debug for BackoffLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackoffLayer")
            .field("registry", &self.shared.registry)
            .finish_non_exhaustive()
    }
}

impl BackoffLayer {
    /// A layer reporting to `registry` with the default rules
    /// ([`default_response_feedback`],
    /// [`default_error_feedback`]).
    pub fn new(registry: Registry) -> Self {
        BackoffLayer {
            shared: Arc::new(BackoffShared {
                registry,
                cost_header: None,
                on_response: Arc::new(default_response_feedback),
                on_error: Arc::new(default_error_feedback),
                custom_on_response: false,
            }),
        }
    }

    /// Classifies responses with `hook`, which receives the response head
    /// and the backoff settings of the scope being judged (a request with
    /// several scopes is judged once per scope).
    #[must_use]
    pub fn on_response<F>(self, hook: F) -> Self
    where
        F: Fn(&ResponseHead<'_>, &BackoffConfig) -> Feedback + Send + Sync + 'static,
    {
        self.rebuild(|shared| {
            shared.on_response = Arc::new(hook);
            shared.custom_on_response = true;
        })
    }

    /// Reads each response's actual cost from header `name` (for example
    /// `X-Actual-Cost`) and reports it with the feedback, unless the
    /// `on_response` hook already did: in scopes with a
    /// [quota](crate::ScopeConfig::quota), the difference from the
    /// request's expected cost is applied to the current window. A value
    /// that is not a finite number ≥ 0 is ignored.
    ///
    /// ```
    /// use tower::ServiceBuilder;
    /// use tower_throttle::{BackoffLayer, Registry, ThrottleLayer};
    ///
    /// let registry = Registry::default();
    /// let client = ServiceBuilder::new()
    ///     .layer(ThrottleLayer::new(registry.clone()))
    ///     .layer(BackoffLayer::new(registry).actual_cost_header(http::HeaderName::from_static("x-actual-cost")))
    ///     .service(tower::service_fn(|_request: http::Request<()>| async {
    ///         Ok::<_, std::convert::Infallible>(http::Response::new(()))
    ///     }));
    /// # drop(client);
    /// ```
    #[must_use]
    pub fn actual_cost_header(self, name: HeaderName) -> Self {
        self.rebuild(|shared| shared.cost_header = Some(name))
    }

    /// Classifies errors of the inner service with `hook`.
    #[must_use]
    pub fn on_error<F>(self, hook: F) -> Self
    where
        F: Fn(&ErrorView<'_>) -> Feedback + Send + Sync + 'static,
    {
        self.rebuild(|shared| shared.on_error = Arc::new(hook))
    }

    /// A [`BackoffRetry`] policy that re-sends, at most `max_retries` times,
    /// what this layer judges backoff feedback: responses through the
    /// [`Judged`](super::Judged) extension the layer attaches, errors
    /// through the layer's own `on_error` hook. Put the `Retry` layer
    /// outside `Throttle` and this layer inside it.
    pub fn retry_policy(&self, max_retries: u32) -> BackoffRetry {
        BackoffRetry::with_error_hook(
            self.shared.registry.clone(),
            max_retries,
            self.shared.on_error.clone(),
        )
    }

    fn rebuild(self, change: impl FnOnce(&mut BackoffShared)) -> Self {
        let mut shared = BackoffShared {
            registry: self.shared.registry.clone(),
            cost_header: self.shared.cost_header.clone(),
            on_response: self.shared.on_response.clone(),
            on_error: self.shared.on_error.clone(),
            custom_on_response: self.shared.custom_on_response,
        };
        change(&mut shared);
        BackoffLayer {
            shared: Arc::new(shared),
        }
    }
}

impl<S> Layer<S> for BackoffLayer {
    type Service = Backoff<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Backoff::from_shared(inner, self.shared.clone())
    }
}
