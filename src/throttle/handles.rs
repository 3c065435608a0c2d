//! The registry handle requests keep while they are in flight.
//!
//! A request admitted under the registry's lock (a ticket of the scheduler, or a
//! plain lane) keeps a handle on the registry until it ends, and takes the
//! lock again through it. A throttle (and the services a
//! [`ThrottleLayer`](super::ThrottleLayer) makes, and their clones) shares
//! one handle, made once per layer, not per clone; every request clones it.

use std::sync::Arc;

use crate::registry::Registry;

/// A request's handle on its registry, on lines of its own (128 bytes:
/// cores fetch adjacent lines in pairs).
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct Handle(Registry);

impl Handle {
    /// The handle a throttle's requests keep on `registry`.
    pub(crate) fn new(registry: Registry) -> Arc<Self> {
        Arc::new(Handle(registry))
    }

    /// The registry this handle keeps.
    #[inline(always)]
    pub(crate) fn registry(&self) -> &Registry {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_keeps_the_registry_after_the_throttle_is_gone() {
        let registry = Registry::default();
        let id = registry.id();
        let handle = Handle::new(registry);
        let kept = handle.clone();
        drop(handle);
        assert_eq!(kept.registry().id(), id);
    }
}
