//! Tests of the queue places (see [`places`](super::places)), apart from
//! the protocol's file so that `loom/` can include that file alone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use super::places::*;

/// A waker that counts its wake-ups.
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counter() -> (Arc<Count>, Waker) {
    let count = Arc::new(Count(AtomicUsize::new(0)));
    (count.clone(), Waker::from(count))
}

fn woken(count: &Count) -> usize {
    count.0.load(Ordering::SeqCst)
}

#[test]
fn places_are_taken_until_none_is_left_and_come_back_when_given_back() {
    let places = QueuePlaces::new(2);
    let (_, waker) = counter();
    let mut cx = Context::from_waker(&waker);
    let mut first = PlaceHandle::new(places.clone());
    let mut second = PlaceHandle::new(places.clone());
    let mut third = PlaceHandle::new(places.clone());
    assert!(first.poll_reserve(&mut cx).is_ready() && second.poll_reserve(&mut cx).is_ready());
    assert!(first.poll_reserve(&mut cx).is_ready(), "a handle keeps its place");
    assert_eq!(places.free(), 0);
    assert!(third.poll_reserve(&mut cx).is_pending());
    first.take_reserved().expect("reserved").give_back();
    assert_eq!(places.free(), 1);
    assert!(first.take_reserved().is_none(), "its place was taken");
    assert!(third.poll_reserve(&mut cx).is_ready());
    assert!(!places.has_waiters(), "it left the line");
}

#[test]
fn a_kept_place_is_given_back_when_its_request_ends_and_a_dropped_one_at_once() {
    let places = QueuePlaces::new(1);
    let (_, waker) = counter();
    let mut cx = Context::from_waker(&waker);
    let mut handle = PlaceHandle::new(places.clone());
    assert!(handle.poll_reserve(&mut cx).is_ready());
    let kept = handle.take_reserved().expect("reserved").keep();
    assert_eq!(places.free(), 0, "a waiting request holds it");
    drop(kept);
    assert_eq!(places.free(), 1);
    assert!(handle.poll_reserve(&mut cx).is_ready());
    drop(handle.take_reserved());
    assert_eq!(places.free(), 1, "dropped without a word: given back");
    assert!(handle.poll_reserve(&mut cx).is_ready());
    drop(handle);
    assert_eq!(places.free(), 1, "a handle that goes gives its place back");
}

/// A handle and the waker it polls with, counting its wake-ups.
struct Waiter {
    handle: PlaceHandle,
    count: Arc<Count>,
    waker: Waker,
}

impl Waiter {
    fn poll(&mut self) -> Poll<()> {
        self.handle.poll_reserve(&mut Context::from_waker(&self.waker))
    }

    fn woken(&self) -> usize {
        woken(&self.count)
    }
}

/// The places of a registry with one place, a handle holding it, and
/// `count` handles waiting for it, in line in this order.
fn one_place_held_and_waiting(count: usize) -> (Arc<QueuePlaces>, PlaceHandle, Vec<Waiter>) {
    let places = QueuePlaces::new(1);
    let (_, waker) = counter();
    let mut held = PlaceHandle::new(places.clone());
    assert!(held.poll_reserve(&mut Context::from_waker(&waker)).is_ready());
    let waiters = (0..count)
        .map(|_| {
            let (count, waker) = counter();
            let mut waiter = Waiter {
                handle: PlaceHandle::new(places.clone()),
                count,
                waker,
            };
            assert!(waiter.poll().is_pending());
            waiter
        })
        .collect();
    (places, held, waiters)
}

/// A handle holding the one place of a registry, and two handles
/// waiting for it, in line in this order.
fn one_place_held_and_two_waiting() -> (PlaceHandle, Waiter, Waiter) {
    let (_, held, mut waiters) = one_place_held_and_waiting(2);
    let second = waiters.pop().expect("two waiters");
    let first = waiters.pop().expect("two waiters");
    (held, first, second)
}

#[test]
fn a_place_given_back_wakes_the_first_waiter_in_line() {
    let (held, mut first, second) = one_place_held_and_two_waiting();
    drop(held);
    assert_eq!((first.woken(), second.woken()), (1, 0));
    assert!(first.poll().is_ready());
}

#[test]
fn a_woken_waiter_that_goes_away_passes_the_wake_up_on() {
    let (held, first, mut second) = one_place_held_and_two_waiting();
    drop(held);
    assert_eq!(first.woken(), 1);
    drop(first);
    assert_eq!(second.woken(), 1, "the place went to nobody: the next is woken");
    assert!(second.poll().is_ready());
}

#[test]
fn a_waiter_that_goes_away_unwoken_just_leaves_the_line() {
    let (held, first, second) = one_place_held_and_two_waiting();
    let first_count = first.count.clone();
    drop(first);
    drop(held);
    assert_eq!((woken(&first_count), second.woken()), (0, 1));
}

#[test]
fn polling_again_while_waiting_keeps_the_spot_and_the_latest_waker() {
    let places = QueuePlaces::new(1);
    let (_, waker) = counter();
    let mut held = PlaceHandle::new(places.clone());
    assert!(held.poll_reserve(&mut Context::from_waker(&waker)).is_ready());
    let (old_count, old_waker) = counter();
    let (new_count, new_waker) = counter();
    let mut handle = PlaceHandle::new(places.clone());
    assert!(handle
        .poll_reserve(&mut Context::from_waker(&old_waker))
        .is_pending());
    assert!(handle
        .poll_reserve(&mut Context::from_waker(&new_waker))
        .is_pending());
    assert_eq!(places.list().queue.len(), 1);
    drop(held);
    assert_eq!((woken(&old_count), woken(&new_count)), (0, 1));
}

#[test]
fn a_long_line_with_gaps_is_served_in_order_and_keeps_each_spot() {
    let (places, mut held, waiters) = one_place_held_and_waiting(300);
    let mut line: Vec<Option<Waiter>> = waiters.into_iter().map(Some).collect();
    // Every third leaves unwoken; every fifth polls again with a new
    // waker (and must keep its spot, not line up at the back).
    for (index, spot) in line.iter_mut().enumerate() {
        if index % 3 == 0 {
            *spot = None;
        } else if index % 5 == 0 {
            let waiter = spot.as_mut().expect("still in line");
            let (count, waker) = counter();
            (waiter.count, waiter.waker) = (count, waker);
            assert!(waiter.poll().is_pending());
        }
    }
    assert_eq!(places.list().queue.len(), 200);
    let mut turn = held.take_reserved().expect("reserved");
    for (index, spot) in line.iter_mut().enumerate() {
        let Some(waiter) = spot.as_mut() else { continue };
        assert_eq!(waiter.woken(), 0, "waiter {index} woken early");
        turn.give_back();
        assert_eq!(waiter.woken(), 1, "waiter {index} is next in line");
        assert!(waiter.poll().is_ready());
        turn = waiter.handle.take_reserved().expect("reserved");
    }
    drop(turn);
    assert!(places.list().queue.is_empty());
    assert_eq!(places.free(), 1);
}

#[test]
fn many_threads_never_hold_more_places_than_there_are_and_give_all_back() {
    let places = QueuePlaces::new(3);
    let held = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let places = places.clone();
            let held = held.clone();
            std::thread::spawn(move || {
                let (_, waker) = counter();
                let mut cx = Context::from_waker(&waker);
                let mut handle = PlaceHandle::new(places);
                let mut taken = 0;
                while taken < 2_000 {
                    if handle.poll_reserve(&mut cx).is_ready() {
                        assert!(held.fetch_add(1, Ordering::SeqCst) < 3);
                        held.fetch_sub(1, Ordering::SeqCst);
                        handle.take_reserved().expect("reserved").give_back();
                        taken += 1;
                    } else {
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(places.free(), 3);
}
