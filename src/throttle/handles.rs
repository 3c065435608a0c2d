//! The registry handles requests keep while they are in flight.
//!
//! A request admitted under a shard's lock (a ticket of the scheduler, or a
//! plain lane) keeps a handle on the registry until it ends, and takes the
//! lock again through it. A clone of the [`Registry`] per request would
//! write the registry's one reference count twice per request, from every
//! core: a line that every thread's requests pass between the cores. So a
//! throttle (and the services a [`ThrottleLayer`](super::ThrottleLayer)
//! makes, and their clones) shares a few handles, each on lines of its own,
//! and a request clones the handle of the thread it is admitted on: its
//! count is written by that thread's requests, and by another thread only
//! when a request ends there.
//!
//! The handles hold the registry; the registry does not hold them (that
//! would be a cycle of counts, never freed). They are made once per
//! [`ThrottleLayer`](super::ThrottleLayer),
//! not per clone.

use std::fmt;
use std::sync::Arc;

use crate::registry::shards::{four_per_core, thread_number};
use crate::registry::Registry;

/// The most handles a throttle shares out (four per core, as the shards).
const MAX_HANDLES: usize = 64;

/// A registry and the handles its requests keep, one per thread group.
pub(crate) struct Handles {
    registry: Registry,
    /// A power of two of them.
    stripes: Box<[Arc<Handle>]>,
}

/// A request's handle on its registry, on lines of its own (128 bytes:
/// cores fetch adjacent lines in pairs), so that its count shares a line
/// with no other handle's.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct Handle(Registry);

impl Handles {
    /// The handles of `registry`: four per core, a power of two, at most
    /// [`MAX_HANDLES`] (one when the registry's builder turned them off, a
    /// bench hook).
    pub(crate) fn new(registry: Registry) -> Arc<Self> {
        let count = if registry.thread_handles() {
            four_per_core(MAX_HANDLES)
        } else {
            1
        };
        let stripes = (0..count).map(|_| Arc::new(Handle(registry.clone()))).collect();
        Arc::new(Handles { registry, stripes })
    }

    /// The registry.
    #[inline(always)]
    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// A handle for a request admitted on the calling thread: the
    /// thread's own (round the handles).
    #[inline(always)]
    pub(crate) fn here(&self) -> Arc<Handle> {
        let index = thread_number() & (self.stripes.len() - 1);
        self.stripes[index].clone()
    }
}

impl fmt::Debug for Handles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The registry once, not once more per handle.
        f.debug_struct("Handles")
            .field("registry", &self.registry)
            .field("handles", &self.stripes.len())
            .finish()
    }
}

impl Handle {
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
    fn handles_are_a_power_of_two_and_a_thread_keeps_its_own() {
        let handles = Handles::new(Registry::default());
        assert!(handles.stripes.len().is_power_of_two());
        assert!(handles.stripes.len() <= MAX_HANDLES);
        let first = handles.here();
        assert!(Arc::ptr_eq(&first, &handles.here()), "one thread, one handle");
        assert_eq!(first.registry().id(), handles.registry().id());
        let other = std::thread::scope(|scope| scope.spawn(|| handles.here()).join().unwrap());
        assert_eq!(
            other.registry().id(),
            handles.registry().id(),
            "every handle keeps the registry"
        );
    }

    #[test]
    fn without_thread_handles_a_throttle_has_one() {
        let registry = Registry::builder().thread_handles(false).build().unwrap();
        let handles = Handles::new(registry);
        assert_eq!(handles.stripes.len(), 1);
        let other = std::thread::scope(|scope| scope.spawn(|| handles.here()).join().unwrap());
        assert!(
            Arc::ptr_eq(&other, &handles.here()),
            "every thread, the one handle"
        );
    }

    #[test]
    fn a_request_keeps_the_registry_after_the_throttle_is_gone() {
        let registry = Registry::default();
        let id = registry.id();
        let handles = Handles::new(registry);
        let kept = handles.here();
        drop(handles);
        assert_eq!(kept.registry().id(), id);
    }
}
