//! The registry's `max_queued` queue places: what `Throttle::poll_ready`
//! reserves, so that backpressure reaches the caller before a request is
//! built.
//!
//! Almost every place is taken and given back within one request (a
//! request admitted at once gives its place back at admission), so the
//! common path is one atomic counter: a compare-and-swap to take a place,
//! an add to give it back. Only when no place is free does a caller join a
//! wait list behind a mutex; giving a place back then wakes the first in
//! line. (tokio's semaphore, used before, takes its wait list's mutex on
//! every release: about 190 instructions per request where this takes 30.)
//!
//! The count is spread over *stripes*, one 128-byte line each (four per
//! core, a power of two). Each handle (one per `Throttle` clone) takes its
//! places from a stripe of its own and gives them back to it, so callers
//! on several threads, each with its clone, write no line in common: the
//! handles made on one thread go round the stripes from a number each
//! thread is given in turn. A handle whose stripe is empty takes from the
//! others; only when every stripe is empty does its caller wait. (One
//! counter for all, as before, moved its line between the cores on every
//! request: 30 to 60 ns per request at two threads in `cargo bench
//! --bench overhead -- scaling`'s `scopes_10k`.) A handle keeps the place it
//! reserved itself, and gives it back without touching the places' `Arc`;
//! only a request that waits takes a [`QueuePlace`] holding the `Arc`.
//!
//! A woken caller that goes away before it takes the place it was woken
//! for passes the wake-up on, so a place never sits free while others
//! wait. Order among waiters is first-come first-served, except that a
//! woken waiter whose place was taken meanwhile (by a caller on the fast
//! path) lines up again at the back.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

/// The places, shared by every `Throttle` of a registry.
#[derive(Debug)]
pub(crate) struct QueuePlaces {
    /// The free places.
    stripes: Stripes,
    /// Whether the wait list may be non-empty (read without its lock on
    /// every release).
    has_waiters: AtomicBool,
    waiters: Mutex<WaitList>,
}

/// The callers waiting for a place, in the order they came. Tickets grow
/// and are only ever pushed at the back, so the queue is sorted by ticket
/// and a caller finds its spot by binary search: a woken caller (no longer
/// in line) or one polled again costs O(log n), not a scan of everyone
/// behind it, however long the line.
#[derive(Debug, Default)]
struct WaitList {
    next_ticket: u64,
    queue: VecDeque<(u64, Waker)>,
}

impl WaitList {
    /// Where ticket `ticket` stands in line, if it still does.
    fn spot_of(&self, ticket: u64) -> Option<usize> {
        self.queue
            .binary_search_by_key(&ticket, |(waiting, _)| *waiting)
            .ok()
    }

    /// Lines up a new caller at the back; its ticket.
    fn line_up(&mut self, waker: Waker) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.queue.push_back((ticket, waker));
        ticket
    }
}

/// The count of free places, spread over stripes (see the module docs).
#[derive(Debug)]
struct Stripes(Box<[Arc<Stripe>]>);

/// One stripe's free places, on a line of its own (its `Arc`'s counts
/// on another: a handle holds its stripe, so that its request reaches the
/// count in one step).
#[derive(Debug)]
#[repr(align(128))]
struct Stripe(AtomicUsize);

/// Four stripes per core: few enough that a caller who finds its own empty looks at the others
/// quickly.
fn default_stripe_count() -> usize {
    super::threads::four_per_core(MAX_STRIPES)
}

/// The most stripes a registry's places are spread over.
const MAX_STRIPES: usize = 64;

thread_local! {
    /// How many handles this thread made.
    static HANDLES_HERE: Cell<usize> = const { Cell::new(0) };
}

/// A stripe number for a handle made on this thread: the thread's first
/// handle gets the thread's number (threads are given them in turn, so
/// threads started together use different lines), and each next handle
/// the number after. A `Throttle` clone is often made on one thread and
/// used on another (a spawned task's is): handles made in a row on one
/// thread spread over the stripes, so tasks running at once on several
/// threads seldom share one.
fn next_stripe_here() -> usize {
    let made = HANDLES_HERE.with(|made| made.replace(made.get().wrapping_add(1)));
    super::threads::thread_number().wrapping_add(made)
}

impl Stripes {
    /// `max` free places over `count` stripes (a power of two), as evenly
    /// as they go.
    fn new(max: usize, count: usize) -> Self {
        debug_assert!(count.is_power_of_two(), "stripes are found by a mask");
        let stripes = (0..count)
            .map(|index| {
                let free = max / count + usize::from(index < max % count);
                Arc::new(Stripe(AtomicUsize::new(free)))
            })
            .collect();
        Stripes(stripes)
    }

    /// A stripe for a handle made on the calling thread (see
    /// [`next_stripe_here`]).
    fn next_here(&self) -> &Arc<Stripe> {
        &self.0[next_stripe_here() & (self.0.len() - 1)]
    }

    fn free(&self) -> usize {
        self.0.iter().map(|stripe| stripe.0.load(Ordering::SeqCst)).sum()
    }

    /// Takes a place from stripe `first`, or else from any other; false
    /// when every stripe was empty as it looked.
    #[inline]
    fn try_take(&self, first: &Stripe) -> bool {
        take_one(first) || self.try_take_any()
    }

    /// Takes a place from any stripe, looking at each once.
    #[inline(never)]
    fn try_take_any(&self) -> bool {
        self.0.iter().any(|stripe| take_one(stripe))
    }
}

/// Takes one place from `stripe`, if it has one.
#[inline]
fn take_one(stripe: &Stripe) -> bool {
    stripe
        .0
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |free| free.checked_sub(1))
        .is_ok()
}

impl QueuePlaces {
    /// `max` free places, over stripes when `striped` (else one count).
    pub(crate) fn new(max: usize, striped: bool) -> Arc<Self> {
        let stripes = if striped { default_stripe_count() } else { 1 };
        Arc::new(QueuePlaces {
            stripes: Stripes::new(max, stripes),
            has_waiters: AtomicBool::new(false),
            waiters: Mutex::new(WaitList::default()),
        })
    }

    /// How many places are free now.
    pub(crate) fn free(&self) -> usize {
        self.stripes.free()
    }

    /// The stripe of a handle made on the calling thread now.
    fn stripe_here(&self) -> Arc<Stripe> {
        self.stripes.next_here().clone()
    }

    #[inline]
    fn try_take(&self, stripe: &Stripe) -> bool {
        self.stripes.try_take(stripe)
    }

    #[inline]
    fn give_back(&self, stripe: &Stripe) {
        // Seen by a caller that lines up from now on, or it sees that
        // someone waits (both sequentially consistent): see `poll_reserve`.
        stripe.0.fetch_add(1, Ordering::SeqCst);
        if self.has_waiters.load(Ordering::SeqCst) {
            self.wake_first();
        }
    }

    /// Wakes the first waiter in line (which leaves the line).
    fn wake_first(&self) {
        let first = {
            let mut list = self.list();
            let first = list.queue.pop_front();
            if list.queue.is_empty() {
                self.has_waiters.store(false, Ordering::SeqCst);
            }
            first
        };
        if let Some((_, waker)) = first {
            waker.wake();
        }
    }

    fn list(&self) -> std::sync::MutexGuard<'_, WaitList> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One place held by a request that waits, given back when dropped.
#[derive(Debug)]
pub(crate) struct QueuePlace {
    places: Arc<QueuePlaces>,
}

impl Drop for QueuePlace {
    fn drop(&mut self) {
        // A stripe of the thread it ends on: its request may have moved.
        self.places.give_back(self.places.stripes.next_here());
    }
}

/// The place a handle reserved, taken out of it for a request: given back
/// at once ([`give_back`](Self::give_back): the request was admitted at
/// once), or kept while the request waits ([`keep`](Self::keep)).
/// Dropped otherwise, it is given back.
#[derive(Debug)]
pub(crate) struct Reserved<'a> {
    /// The handle it was reserved by (one word: it is passed along the
    /// admission).
    handle: &'a PlaceHandle,
}

impl Reserved<'_> {
    /// Gives the place back, without touching the places' `Arc`.
    #[inline]
    pub(crate) fn give_back(self) {
        // `Drop` gives it back.
    }

    /// Keeps the place while the request waits.
    pub(crate) fn keep(self) -> QueuePlace {
        let place = QueuePlace {
            places: self.handle.places.clone(),
        };
        std::mem::forget(self);
        place
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.handle.give_back();
    }
}

/// A caller's handle on the places (one per `Throttle` clone): it keeps
/// its spot in the wait list between polls, and the place it reserved
/// until its request takes it (or the handle goes: then it gives it back).
#[derive(Debug)]
pub(crate) struct PlaceHandle {
    places: Arc<QueuePlaces>,
    /// Its ticket in the wait list, from its last `Pending` until it takes
    /// a place.
    waiting: Option<u64>,
    /// Whether it holds a place its request has not taken yet.
    reserved: bool,
    /// The stripe it takes places from and gives them back to first,
    /// found once when it is made rather than per request (see
    /// [`next_stripe_here`]).
    stripe: Arc<Stripe>,
}

impl PlaceHandle {
    pub(crate) fn new(places: Arc<QueuePlaces>) -> Self {
        let stripe = places.stripe_here();
        PlaceHandle {
            places,
            waiting: None,
            reserved: false,
            stripe,
        }
    }

    /// Reserves a place (at once if the handle holds one already), or
    /// registers `cx`'s waker to be woken when one may be free.
    pub(crate) fn poll_reserve(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.reserved {
            return Poll::Ready(());
        }
        if self.try_take() {
            self.took();
            return Poll::Ready(());
        }
        let mut list = self.places.list();
        // Announce the wait before looking again, so that a place given
        // back in between is either seen here or wakes someone.
        self.places.has_waiters.store(true, Ordering::SeqCst);
        if self.places.stripes.try_take_any() {
            self.leave_line(&mut list);
            if list.queue.is_empty() {
                self.places.has_waiters.store(false, Ordering::SeqCst);
            }
            drop(list);
            self.waiting = None;
            self.reserved = true;
            return Poll::Ready(());
        }
        match self.waiting.and_then(|ticket| list.spot_of(ticket)) {
            Some(index) => list.queue[index].1.clone_from(cx.waker()),
            None => self.waiting = Some(list.line_up(cx.waker().clone())),
        }
        Poll::Pending
    }

    /// Takes a place from this handle's stripe, or else from any other.
    #[inline]
    fn try_take(&self) -> bool {
        self.places.try_take(&self.stripe)
    }

    /// Gives a place back to this handle's stripe.
    #[inline]
    fn give_back(&self) {
        self.places.give_back(&self.stripe);
    }

    /// The place this handle reserved, for its request; `None` when it
    /// holds none.
    pub(crate) fn take_reserved(&mut self) -> Option<Reserved<'_>> {
        if !std::mem::take(&mut self.reserved) {
            return None;
        }
        Some(Reserved { handle: self })
    }

    /// A place just taken on the fast path: leaves the line if it was in it.
    fn took(&mut self) {
        if self.waiting.is_some() {
            let mut list = self.places.list();
            self.leave_line(&mut list);
            if list.queue.is_empty() {
                self.places.has_waiters.store(false, Ordering::SeqCst);
            }
            drop(list);
            self.waiting = None;
        }
        self.reserved = true;
    }

    /// Takes this handle out of the line; whether it was still in it (if
    /// not, it was woken).
    fn leave_line(&self, list: &mut WaitList) -> bool {
        let Some(ticket) = self.waiting else {
            return false;
        };
        match list.spot_of(ticket) {
            Some(index) => {
                list.queue.remove(index);
                true
            }
            None => false,
        }
    }
}

impl Drop for PlaceHandle {
    fn drop(&mut self) {
        if self.reserved {
            self.give_back();
        }
        if self.waiting.is_none() {
            return;
        }
        let woken = {
            let mut list = self.places.list();
            let woken = !self.leave_line(&mut list);
            if list.queue.is_empty() {
                self.places.has_waiters.store(false, Ordering::SeqCst);
            }
            woken
        };
        // Woken for a place it will not take: the next in line gets it.
        if woken && self.places.free() > 0 {
            self.places.wake_first();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    use super::*;

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

    /// `max` places.
    fn places(max: usize) -> Arc<QueuePlaces> {
        QueuePlaces::new(max, true)
    }

    #[test]
    fn without_stripes_the_places_are_one_count() {
        let places = QueuePlaces::new(100, false);
        assert_eq!(places.stripes.0.len(), 1);
        assert_eq!(places.free(), 100);
    }

    #[test]
    fn places_are_taken_until_none_is_left_and_come_back_when_given_back() {
        let places = places(2);
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
        assert!(!places.has_waiters.load(Ordering::SeqCst), "it left the line");
    }

    #[test]
    fn a_kept_place_is_given_back_when_its_request_ends_and_a_dropped_one_at_once() {
        let places = places(1);
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
        let places = places(1);
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
        let places = places(1);
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
    fn stripes_share_the_places_out_evenly_and_lend_them_across() {
        let stripes = Stripes::new(10, 4);
        let each: Vec<usize> = stripes
            .0
            .iter()
            .map(|stripe| stripe.0.load(Ordering::SeqCst))
            .collect();
        assert_eq!(each, [3, 3, 2, 2]);
        assert_eq!(stripes.free(), 10);
        // One place in another stripe than this thread's: still taken.
        let one = Stripes::new(1, 4);
        let mine = one.next_here().clone();
        let theirs = one
            .0
            .iter()
            .find(|stripe| !Arc::ptr_eq(stripe, &mine))
            .expect("four stripes");
        one.0[0].0.store(0, Ordering::SeqCst);
        theirs.0.store(1, Ordering::SeqCst);
        assert!(one.try_take(&mine), "taken from another stripe");
        assert!(!one.try_take(&mine), "none left in any stripe");
        mine.0.fetch_add(1, Ordering::SeqCst);
        assert!(one.try_take(&mine));
        assert_eq!(one.free(), 0);
    }

    #[test]
    fn a_place_given_back_to_another_stripe_wakes_the_waiter_and_is_taken_across() {
        let places = places(1);
        let (_, waker) = counter();
        let (count, waiter_waker) = counter();
        let mut waiter = PlaceHandle::new(places.clone());
        // A handle of another thread's stripe holds the only place.
        let mut giver = PlaceHandle::new(places.clone());
        let mine = waiter.stripe.clone();
        giver.stripe = (places.stripes.0.iter())
            .find(|stripe| !Arc::ptr_eq(stripe, &mine))
            .expect("several stripes")
            .clone();
        assert!(giver.poll_reserve(&mut Context::from_waker(&waker)).is_ready());
        assert!(waiter
            .poll_reserve(&mut Context::from_waker(&waiter_waker))
            .is_pending());
        drop(giver);
        assert_eq!(woken(&count), 1);
        assert!(waiter
            .poll_reserve(&mut Context::from_waker(&waiter_waker))
            .is_ready());
        assert_eq!(places.free(), 0);
    }

    #[test]
    fn many_threads_never_hold_more_places_than_there_are_and_give_all_back() {
        let places = places(3);
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
}
