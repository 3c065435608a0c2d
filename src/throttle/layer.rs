use tower_layer::Layer;

use super::Throttle;
use crate::registry::Registry;
use crate::scope::Scopes;

/// Applies [`Throttle`] to a service.
///
/// # Clone
///
/// Cloning this layer shares the registry.
///
/// ```
/// use tower::ServiceBuilder;
/// use tower_throttle::{Registry, ThrottleLayer};
///
/// let registry = Registry::default();
/// let service = ServiceBuilder::new()
///     .layer(ThrottleLayer::new(registry))
///     .service(tower::service_fn(|_request: http::Request<()>| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(()))
///     }));
/// # drop(service);
/// ```
#[derive(Debug, Clone)]
pub struct ThrottleLayer {
    registry: Registry,
    fixed: Option<Scopes>,
    record_scopes: bool,
}

impl ThrottleLayer {
    /// A layer that throttles through `registry`.
    pub fn new(registry: Registry) -> Self {
        ThrottleLayer {
            registry,
            fixed: None,
            record_scopes: true,
        }
    }

    /// Binds every request of the service to `scopes` (ignoring the resolver
    /// and any `Scopes` extension). Then `poll_ready` is `Pending` until
    /// those scopes admit a send, and `call` sends at once.
    pub fn fixed_scope(mut self, scopes: impl Into<Scopes>) -> Self {
        self.fixed = Some(scopes.into());
        self
    }
}

impl ThrottleLayer {
    /// Whether to insert the request's resolved [`Scopes`] into its
    /// extensions (default: yes). Inner layers (backoff, rate-limit headers)
    /// read them to report feedback to the right scopes. Without them they
    /// resolve the scopes again through the registry, which gives the same
    /// answer unless the scopes came from [`fixed_scope`](Self::fixed_scope).
    /// Turning it off saves about a quarter of Throttle's per-request cost
    /// (http's extension map allocates on first insert) when nothing inside
    /// needs them.
    pub fn record_scopes(mut self, record: bool) -> Self {
        self.record_scopes = record;
        self
    }
}

impl<S> Layer<S> for ThrottleLayer {
    type Service = Throttle<S>;

    fn layer(&self, inner: S) -> Self::Service {
        let mut throttle = Throttle::with_fixed_scopes(inner, self.registry.clone(), self.fixed.clone());
        throttle.record_scopes = self.record_scopes;
        throttle
    }
}
