use std::marker::PhantomData;
use std::sync::Arc;

use tower_layer::Layer;

use super::errors::{InnerErrors, StoreErrors};
use super::handles::Handle;
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
///
/// The service passes the inner service's error type through; with a
/// [scope store](crate::store) that fails closed, use
/// [`store_errors`](Self::store_errors) so a request can fail with the
/// store's error.
#[derive(Debug, Clone)]
pub struct ThrottleLayer<M = InnerErrors> {
    /// The registry, and the handle the requests of every service the
    /// layer makes keep (see `handles.rs`): made once, shared by them all.
    handle: Arc<Handle>,
    fixed: Option<Scopes>,
    record_scopes: bool,
    mode: PhantomData<fn() -> M>,
}

impl ThrottleLayer {
    /// A layer that throttles through `registry`.
    pub fn new(registry: Registry) -> Self {
        ThrottleLayer {
            handle: Handle::new(registry),
            fixed: None,
            record_scopes: false,
            mode: PhantomData,
        }
    }

    /// Makes the service return the crate's [`Error`](crate::Error): the
    /// inner service's errors wrapped ([`is_inner`](crate::Error::is_inner)),
    /// and the failures of the registry's scope store
    /// ([`is_store`](crate::Error::is_store)) when it fails closed. The
    /// inner service's error must convert into `tower::BoxError`.
    pub fn store_errors(self) -> ThrottleLayer<StoreErrors> {
        self.crate_errors()
    }

    /// Makes the service return the crate's [`Error`](crate::Error), as
    /// [`store_errors`](Self::store_errors) does (the same mode, named for
    /// all it reports): the inner service's errors wrapped, the store's
    /// failures, and the requests failed for their bounds
    /// ([`is_would_wait`](crate::Error::is_would_wait),
    /// [`is_queue_full`](crate::Error::is_queue_full)), which only a
    /// throttle in this mode applies.
    pub fn crate_errors(self) -> ThrottleLayer<StoreErrors> {
        ThrottleLayer {
            handle: self.handle,
            fixed: self.fixed,
            record_scopes: self.record_scopes,
            mode: PhantomData,
        }
    }
}

impl<M> ThrottleLayer<M> {
    /// Binds every request of the service to `scopes` (ignoring the resolver
    /// and any `Scopes` extension). Then `poll_ready` is `Pending` until
    /// those scopes admit a send, and `call` sends at once.
    ///
    /// Bounds: the wait happens in `poll_ready`, before the request is
    /// known, so a request's own [`MaxWait`](crate::scope::MaxWait) does
    /// not apply; the scopes' [`max_wait`](crate::ScopeConfig::max_wait)
    /// and [`max_waiting`](crate::ScopeConfig::max_waiting) do, counted
    /// from `poll_ready`'s first call, in
    /// [`crate_errors`](ThrottleLayer::crate_errors) mode. Then
    /// `poll_ready` is ready at once (or when the bound passes, or a hold
    /// moves the prediction past it), and `call` fails at once without
    /// calling the inner service.
    #[must_use]
    pub fn fixed_scope(mut self, scopes: impl Into<Scopes>) -> Self {
        self.fixed = Some(scopes.into());
        self
    }

    /// Whether to insert the request's resolved [`Scopes`] into its
    /// extensions too (default: no). Inner layers learn the throttle's
    /// scopes without it: [`Registry::scopes_of`](crate::Registry::scopes_of)
    /// called in their `call` returns the scopes this throttle is handing
    /// over (see [`scope::handover`](crate::scope)), which is what the
    /// crate's backoff and rate-limit layers do. Turn it on when an inner
    /// layer reads the extension itself, or calls its inner service later
    /// from another task (behind a `tower::buffer::Buffer`) and must still
    /// report to scopes the resolver cannot reproduce (a
    /// [`fixed_scope`](Self::fixed_scope)). It costs about a fifth of
    /// Throttle's per-request work: http's extension map allocates three
    /// times on first insert.
    #[must_use]
    pub fn record_scopes(mut self, record: bool) -> Self {
        self.record_scopes = record;
        self
    }
}

impl<S, M> Layer<S> for ThrottleLayer<M> {
    type Service = Throttle<S, M>;

    fn layer(&self, inner: S) -> Self::Service {
        let mut throttle = Throttle::with_mode(inner, self.handle.clone(), self.fixed.clone());
        throttle.record_scopes = self.record_scopes;
        throttle
    }
}
