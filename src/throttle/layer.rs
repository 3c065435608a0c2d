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
}

impl ThrottleLayer {
    /// A layer that throttles through `registry`.
    pub fn new(registry: Registry) -> Self {
        ThrottleLayer {
            registry,
            fixed: None,
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

impl<S> Layer<S> for ThrottleLayer {
    type Service = Throttle<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Throttle::with_fixed_scopes(inner, self.registry.clone(), self.fixed.clone())
    }
}
