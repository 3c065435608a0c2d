use tower_layer::Layer;

use super::DepartureStamp;

/// Applies [`DepartureStamp`] to a client: the throttle outside times each
/// request's departure by the instant the client takes it to be written.
/// See the [module docs](crate::departure).
///
/// # Clone
///
/// The layer holds nothing: cloning it is free.
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::Empty;
/// use hyper_util::client::legacy::Client;
/// use hyper_util::rt::TokioExecutor;
/// use tower::ServiceBuilder;
/// use tower_throttle::departure::{DepartureStampLayer, StampedBody};
/// use tower_throttle::{Registry, ThrottleLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let registry = Registry::default();
/// // The client sends the stamped body (the request's own inside).
/// let client = Client::builder(TokioExecutor::new()).build_http::<StampedBody<Empty<Bytes>>>();
/// let service = ServiceBuilder::new()
///     .layer(ThrottleLayer::new(registry))
///     .layer(DepartureStampLayer::new())
///     .service(client);
/// # drop(service);
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct DepartureStampLayer {
    on_socket_write: bool,
}

impl DepartureStampLayer {
    /// The layer: a departure is the instant the client asks the body.
    pub fn new() -> Self {
        DepartureStampLayer::default()
    }

    /// A departure is the instant the connection's socket write returns
    /// (the bytes are with the kernel), not the instant the client asks
    /// the body. It needs the client's connector wrapped in
    /// [`StampingConnector`](super::StampingConnector), which makes the
    /// stamp; see the [module docs](crate::departure).
    #[must_use]
    pub fn at_socket_write(mut self) -> Self {
        self.on_socket_write = true;
        self
    }
}

impl<S> Layer<S> for DepartureStampLayer {
    type Service = DepartureStamp<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DepartureStamp::at_socket_write(inner, self.on_socket_write)
    }
}
