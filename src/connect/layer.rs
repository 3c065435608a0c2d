//! [`PinServerLayer`].

use tower_layer::Layer;

use super::PinServer;

/// Writes each request's [`ServerAddr`](crate::ip::ServerAddr) into its
/// URI, for [`PinnedConnector`](super::PinnedConnector) to dial: see the
/// [module docs](super). Put it directly around the client.
///
/// ```
/// use tower::ServiceBuilder;
/// use tower_throttle::connect::PinServerLayer;
///
/// let client = ServiceBuilder::new()
///     .layer(PinServerLayer::new())
///     .service(tower::service_fn(|request: http::Request<()>| async move {
///         Ok::<_, std::convert::Infallible>(request.uri().clone())
///     }));
/// # let _ = client;
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct PinServerLayer {
    _private: (),
}

impl PinServerLayer {
    /// The layer (it has no settings).
    pub fn new() -> Self {
        PinServerLayer::default()
    }
}

impl<S> Layer<S> for PinServerLayer {
    type Service = PinServer<S>;

    fn layer(&self, inner: S) -> PinServer<S> {
        PinServer::new(inner)
    }
}
