//! loom models of the queue places' protocol (see
//! `src/registry/fast_path/places.rs`, included here with loom's atomics,
//! mutex and `Arc`): a count taken by compare-and-swap, given back by an
//! add, and a wait list behind a mutex that a caller joins only when no
//! place is free, announcing itself with a flag before it looks again.
//!
//! ```text
//! cargo test --release --manifest-path loom/Cargo.toml
//! ```

use std::task::{Context, Poll, Wake, Waker};

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

/// What `places.rs` takes from its parent module.
mod atomic {
    pub use loom::sync::atomic::{AtomicUsize, Ordering};
}

/// What `places.rs` takes from its parent module.
mod sync {
    pub use loom::sync::{Arc, Mutex, MutexGuard};
}

/// What `places.rs` takes from its parent module's `shard`.
#[path = "support/shard.rs"]
#[allow(dead_code)]
mod shard;

#[path = "../../src/registry/fast_path/places.rs"]
#[allow(dead_code)]
mod places;

use places::{PlaceHandle, QueuePlaces};

/// A waker that counts its wake-ups (a loom atomic: each wake-up is a
/// step of the model).
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counter() -> (std::sync::Arc<Count>, Waker) {
    let count = std::sync::Arc::new(Count(AtomicUsize::new(0)));
    (count.clone(), Waker::from(count))
}

fn woken(count: &Count) -> usize {
    count.0.load(Ordering::SeqCst)
}

/// The one place given back while another caller lines up for it: the
/// caller either takes it at once or is woken, in every interleaving (no
/// lost wake-up), and then takes it.
#[test]
fn a_place_given_back_as_a_caller_lines_up_is_taken_or_wakes_it() {
    loom::model(|| {
        let places = QueuePlaces::new(1);
        let mut holder = PlaceHandle::new(places.clone());
        let (_, waker) = counter();
        assert!(holder.poll_reserve(&mut Context::from_waker(&waker)).is_ready());
        // The place comes back on the giver's shard, not the caller's.
        let giver = thread::spawn(move || {
            shard::set_home(1);
            holder.take_reserved().expect("reserved").give_back();
        });
        let (count, waker) = counter();
        let mut caller = PlaceHandle::new(places.clone());
        let first = caller.poll_reserve(&mut Context::from_waker(&waker));
        giver.join().unwrap();
        if first.is_pending() {
            assert_eq!(woken(&count), 1, "the place came back: the caller is woken");
            assert!(caller.poll_reserve(&mut Context::from_waker(&waker)).is_ready());
        }
        assert_eq!(places.free(), 0, "the caller holds the one place");
        drop(caller);
        assert_eq!(places.free(), 1, "a handle gives back the place it holds");
    });
}

/// Two callers race for the one place, each giving it back once it has
/// it: never both hold it, and it is free again at the end.
#[test]
fn two_callers_never_hold_more_places_than_there_are() {
    loom::model(|| {
        let places = QueuePlaces::new(1);
        let holding = loom::sync::Arc::new(AtomicUsize::new(0));
        let race = |places: loom::sync::Arc<QueuePlaces>, holding: loom::sync::Arc<AtomicUsize>| {
            move || {
                let (_, waker) = counter();
                let mut handle = PlaceHandle::new(places);
                if let Poll::Ready(()) = handle.poll_reserve(&mut Context::from_waker(&waker)) {
                    assert_eq!(holding.fetch_add(1, Ordering::SeqCst), 0, "one place, one holder");
                    holding.fetch_sub(1, Ordering::SeqCst);
                    handle.take_reserved().expect("reserved").give_back();
                }
            }
        };
        let other = {
            let race = race(places.clone(), holding.clone());
            thread::spawn(move || {
                shard::set_home(1);
                race()
            })
        };
        race(places.clone(), holding)();
        other.join().unwrap();
        assert_eq!(places.free(), 1);
    });
}

/// The first in line goes away while the place comes back: whether it
/// was woken first or not, the next in line is woken for the place.
#[test]
fn a_woken_caller_that_goes_away_passes_the_wake_up_on() {
    loom::model(|| {
        let places = QueuePlaces::new(1);
        let (_, waker) = counter();
        let mut holder = PlaceHandle::new(places.clone());
        assert!(holder.poll_reserve(&mut Context::from_waker(&waker)).is_ready());
        let mut first = PlaceHandle::new(places.clone());
        assert!(first.poll_reserve(&mut Context::from_waker(&waker)).is_pending());
        let (count, next_waker) = counter();
        let mut next = PlaceHandle::new(places.clone());
        assert!(next.poll_reserve(&mut Context::from_waker(&next_waker)).is_pending());
        let giver = thread::spawn(move || {
            holder.take_reserved().expect("reserved").give_back();
        });
        let leaver = thread::spawn(move || drop(first));
        giver.join().unwrap();
        leaver.join().unwrap();
        assert_eq!(woken(&count), 1, "the next in line is woken for the free place");
        assert!(next.poll_reserve(&mut Context::from_waker(&next_waker)).is_ready());
    });
}
