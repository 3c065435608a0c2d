//! The scopes of the request a [`Throttle`](crate::Throttle) is handing to
//! its inner service, for the inner layers to report to.
//!
//! Inner layers (backoff, rate-limit headers, your own) must report to the
//! scopes the throttle decided, which may differ from what the resolver
//! says of the request (a [`fixed_scope`](crate::ThrottleLayer::fixed_scope)
//! throttle, a resolver that changed). Writing them into the request's
//! extensions would cost every request three allocations (http's extension
//! map allocates on first insert). Instead, while the throttle makes its
//! synchronous `call` into the inner service, the scopes sit in a
//! thread-local slot tagged with the registry, as `tracing` keeps the
//! current span: every inner layer's `call` runs inside that call, on this
//! thread, and [`Registry::scopes_of`](crate::Registry::scopes_of) looks
//! there after the request's own `Scopes` extension. A layer that calls on
//! later, elsewhere (behind a `tower::buffer::Buffer`, whose worker task
//! calls the inner service), finds nothing there and resolves the request
//! again; turn [`record_scopes`](crate::ThrottleLayer::record_scopes) on
//! for such a stack.
//!
//! The slot is set only for the duration of the call (restored on return
//! or unwind, so nested throttles each see their own), and the scopes move
//! in and out of it: nothing is cloned or allocated on the way.

use std::cell::Cell;

use super::Scopes;

thread_local! {
    static HANDING_OVER: Cell<Option<(usize, Scopes)>> = const { Cell::new(None) };
}

/// Puts `scopes` in the slot, as the scopes being handed over through
/// registry `registry` (its identity, [`Registry::id`](crate::Registry)),
/// until the returned guard is dropped: hold it across the throttle's call
/// into its inner service. (A guard rather than a closure around the call:
/// the request then moves into the call directly, not through a closure.)
#[inline(always)]
pub(crate) fn handing_over(registry: usize, scopes: Scopes) -> HandingOver {
    HandingOver(HANDING_OVER.with(|slot| slot.replace(Some((registry, scopes)))))
}

/// Puts the slot back as it was before [`handing_over`] when dropped, also
/// on unwind.
#[must_use = "the scopes are handed over only while the guard lives"]
pub(crate) struct HandingOver(Option<(usize, Scopes)>);

impl Drop for HandingOver {
    fn drop(&mut self) {
        let previous = self.0.take();
        // During thread teardown the slot may be gone: nothing to restore.
        let _ = HANDING_OVER.try_with(|slot| slot.replace(previous));
    }
}

/// The scopes a throttle of registry `registry` is handing over on this
/// thread right now, if any.
pub(crate) fn being_handed_over(registry: usize) -> Option<Scopes> {
    HANDING_OVER
        .try_with(|slot| {
            let current = slot.take();
            let scopes = match &current {
                Some((id, scopes)) if *id == registry => Some(scopes.clone()),
                _ => None,
            };
            slot.set(current);
            scopes
        })
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slot_holds_the_scopes_only_during_the_call_and_only_for_its_registry() {
        assert_eq!(being_handed_over(1), None);
        let seen = {
            let _outer = handing_over(1, Scopes::from("a"));
            let inner = {
                let _inner = handing_over(2, Scopes::from("b"));
                (being_handed_over(1), being_handed_over(2))
            };
            (inner, being_handed_over(1), being_handed_over(2))
        };
        assert_eq!(
            seen.0,
            (None, Some(Scopes::from("b"))),
            "the nested throttle's own"
        );
        assert_eq!(seen.1, Some(Scopes::from("a")), "restored after the nested call");
        assert_eq!(seen.2, None);
        assert_eq!(being_handed_over(1), None, "cleared after the call");
    }

    #[test]
    fn the_slot_is_restored_when_the_call_panics() {
        let caught = std::panic::catch_unwind(|| {
            let _handing_over = handing_over(1, Scopes::from("a"));
            panic!("inner call")
        });
        assert!(caught.is_err());
        assert_eq!(being_handed_over(1), None);
    }
}
