//! The two moves a layer makes with the inner service `poll_ready` readied
//! (a leaf, for every layer): hand it to `call`, or give it up for a
//! request that must wait first. Either way a fresh clone takes its place
//! for the next `poll_ready` (tower's clone-and-replace).

/// The readied service in `slot`, to call; a fresh clone stays in its
/// place.
pub(crate) fn take_readied<S: Clone>(slot: &mut S) -> S {
    let fresh = slot.clone();
    std::mem::replace(slot, fresh)
}

/// Gives up what `poll_ready` reserved in `slot` (with `Throttle` inside, a
/// queue place) for a request that waits for something else first; returns
/// an unreadied clone for that request to ready once it may go.
pub(crate) fn release_readied<S: Clone>(slot: &mut S) -> S {
    drop(take_readied(slot));
    slot.clone()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    /// A handle that counts live handles, and whether it is the readied one.
    struct Handle {
        live: Arc<AtomicUsize>,
        readied: bool,
    }

    impl Clone for Handle {
        fn clone(&self) -> Self {
            self.live.fetch_add(1, Ordering::SeqCst);
            Handle {
                live: self.live.clone(),
                readied: false,
            }
        }
    }

    impl Drop for Handle {
        fn drop(&mut self) {
            self.live.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_readied_handle_is_taken_or_dropped_and_a_fresh_one_stays() {
        let live = Arc::new(AtomicUsize::new(1));
        let mut slot = Handle {
            live: live.clone(),
            readied: true,
        };
        let taken = take_readied(&mut slot);
        assert!(taken.readied && !slot.readied);
        assert_eq!(live.load(Ordering::SeqCst), 2);
        drop(taken);
        slot.readied = true;
        let waiting = release_readied(&mut slot);
        assert!(!waiting.readied && !slot.readied, "the readied one is gone");
        assert_eq!(live.load(Ordering::SeqCst), 2, "the slot's and the waiter's");
    }
}
