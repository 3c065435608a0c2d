//! The registry's `max_queued` queue places: what `Throttle::poll_ready`
//! reserves, so that backpressure reaches the caller before a request is
//! built.
//!
//! Almost every place is taken and given back within one request (a
//! request admitted at once gives its place back at admission), so the
//! common path is one atomic word: a compare-and-swap to take a place, an
//! add to give it back. Only when no place is free does a caller join a
//! wait list behind a mutex; giving a place back then wakes the first in
//! line. (tokio's semaphore, used before, takes its wait list's mutex on
//! every release: about 190 instructions per request where this takes 30.)
//!
//! The word holds the count of free places and a bit that says someone
//! may wait. A caller about to line up sets the bit (under the list's
//! lock) and learns from the same read-modify-write how many places were
//! free; a release adds its place and learns from the same add whether the
//! bit was set. Both change the one word, so one of them comes second and
//! sees the other: either the caller sees the place and takes it, or the
//! release sees the bit and wakes the first in line. No place is given
//! back unseen by a caller that lines up (`loom/tests/places.rs` checks
//! it under every interleaving).
//!
//! The count is split over the threads' home shards (see the parent
//! module's "Shards"): a thread takes from its own count and gives back to
//! it, and looks at the others only when its own is empty. Each count has
//! its waiters bit: a caller about to line up sets it on every count, so a
//! place given back on any of them is seen (the argument above, count by
//! count). Each count sits on a 128-byte line of its own, apart from the
//! places' `Arc` counts (a `Throttle` clone clones the `Arc`) and the wait
//! list.
//! A handle (one per `Throttle` clone) keeps the place it reserved
//! itself, and gives it back without touching the places' `Arc`; only a
//! request that waits takes a [`QueuePlace`] holding the `Arc`.
//!
//! A woken caller that goes away before it takes the place it was woken
//! for passes the wake-up on, so a place never sits free while others
//! wait. Order among waiters is first-come first-served, except that a
//! woken waiter whose place was taken meanwhile (by a caller on the fast
//! path) lines up again at the back.

use std::collections::VecDeque;
use std::sync::PoisonError;
use std::task::{Context, Poll, Waker};

use super::atomic::{AtomicUsize, Ordering};
use super::shard::{home, share_of, SHARDS};
use super::sync::{Arc, Mutex, MutexGuard};

/// The places, shared by every `Throttle` of a registry.
#[derive(Debug)]
pub(crate) struct QueuePlaces {
    /// The free places, and the bit that says the wait list may not be
    /// empty, in [`SHARDS`] counts: a thread takes from its home count
    /// ([`home`]) and gives back to it, and looks at the others only when
    /// its own is empty, so two threads write no line of each other's.
    /// Places move between counts (a place taken on one thread may come
    /// back on another): only the sum is the limit.
    free: [FreePlaces; SHARDS],
    waiters: Mutex<WaitList>,
}

/// The callers waiting for a place, in the order they came. Tickets grow
/// and are only ever pushed at the back, so the queue is sorted by ticket
/// and a caller finds its spot by binary search: a woken caller (no longer
/// in line) or one polled again costs O(log n), not a scan of everyone
/// behind it, however long the line.
#[derive(Debug, Default)]
pub(super) struct WaitList {
    next_ticket: u64,
    pub(super) queue: VecDeque<(u64, Waker)>,
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

/// The count of free places and the [`WAITERS`] bit, on a line of its
/// own (128 bytes: cores fetch adjacent lines in pairs).
#[derive(Debug)]
#[repr(align(128))]
struct FreePlaces(AtomicUsize);

impl FreePlaces {
    /// Takes a place of this count, if one is free.
    #[inline]
    fn take(&self) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                (word & !WAITERS > 0).then(|| word - 1)
            })
            .is_ok()
    }
}

/// The bit of every [`FreePlaces`] set while the wait list may not be
/// empty (set and cleared under the list's lock, on every shard).
const WAITERS: usize = 1 << (usize::BITS - 1);

impl QueuePlaces {
    /// `max` free places (at most `usize::MAX / 2`).
    pub(crate) fn new(max: usize) -> Arc<Self> {
        let max = max & !WAITERS;
        Arc::new(QueuePlaces {
            free: std::array::from_fn(|shard| FreePlaces(AtomicUsize::new(share_of(max, shard)))),
            waiters: Mutex::new(WaitList::default()),
        })
    }

    /// How many places are free now, over every shard.
    pub(crate) fn free(&self) -> usize {
        self.free
            .iter()
            .map(|shard| shard.0.load(Ordering::SeqCst) & !WAITERS)
            .sum()
    }

    /// Whether the bit that says someone may wait is set.
    #[cfg(test)]
    pub(super) fn has_waiters(&self) -> bool {
        self.free
            .iter()
            .any(|shard| shard.0.load(Ordering::SeqCst) & WAITERS != 0)
    }

    /// Takes a place, if one is free: from this thread's shard first. The
    /// shard it came from, the caller's home unless that was empty.
    #[inline]
    fn try_take(&self) -> Option<usize> {
        let home = home();
        if self.free[home].take() {
            return Some(home);
        }
        self.take_elsewhere(home)
    }

    /// [`try_take`](Self::try_take) past an empty home shard: from the
    /// others, in turn.
    #[cold]
    #[inline(never)]
    fn take_elsewhere(&self, home: usize) -> Option<usize> {
        (1..SHARDS)
            .map(|step| (home + step) % SHARDS)
            .find(|&shard| self.free[shard].take())
    }

    /// Gives a place back to this thread's shard, and wakes the first
    /// waiter if any may wait.
    #[inline]
    fn give_back(&self) {
        self.give_back_to(home());
    }

    /// [`give_back`](Self::give_back) to shard `shard` (any shard is
    /// right: only the sum is the limit).
    #[inline]
    fn give_back_to(&self, shard: usize) {
        // The add reads the bit a caller that lines up sets on every
        // shard, in the same word: see `poll_reserve`.
        if self.free[shard % SHARDS].0.fetch_add(1, Ordering::AcqRel) & WAITERS != 0 {
            self.wake_first();
        }
    }

    /// Sets the waiters bit on every shard (under the list's lock);
    /// whether a place was free in one as it was set there.
    fn announce_waiter(&self, _list: &WaitList) -> bool {
        let mut free = false;
        for shard in &self.free {
            free |= shard.0.fetch_or(WAITERS, Ordering::AcqRel) & !WAITERS > 0;
        }
        free
    }

    /// Clears the waiters bit of every shard once the list is empty (under
    /// its lock).
    fn clear_waiters_if_none(&self, list: &WaitList) {
        if list.queue.is_empty() {
            for shard in &self.free {
                shard.0.fetch_and(!WAITERS, Ordering::AcqRel);
            }
        }
    }

    /// Wakes the first waiter in line (which leaves the line).
    fn wake_first(&self) {
        let first = {
            let mut list = self.list();
            let first = list.queue.pop_front();
            self.clear_waiters_if_none(&list);
            first
        };
        if let Some((_, waker)) = first {
            waker.wake();
        }
    }

    pub(super) fn list(&self) -> MutexGuard<'_, WaitList> {
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
        self.places.give_back();
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
    #[inline]
    fn drop(&mut self) {
        // Back where it came from: the home of the thread that took it,
        // most often this one (no lookup of the home).
        self.handle.places.give_back_to(self.handle.shard);
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
    /// The shard of the place it took last.
    shard: usize,
}

impl PlaceHandle {
    pub(crate) fn new(places: Arc<QueuePlaces>) -> Self {
        PlaceHandle {
            places,
            waiting: None,
            reserved: false,
            shard: 0,
        }
    }

    /// Reserves a place (at once if the handle holds one already), or
    /// registers `cx`'s waker to be woken when one may be free.
    pub(crate) fn poll_reserve(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.reserved {
            return Poll::Ready(());
        }
        if let Some(shard) = self.places.try_take() {
            self.took(shard);
            return Poll::Ready(());
        }
        let mut list = self.places.list();
        // Announce the wait and look again in one step, so that a place
        // given back in between is either seen here or wakes someone.
        if let Some(shard) = self
            .places
            .announce_waiter(&list)
            .then(|| self.places.try_take())
            .flatten()
        {
            self.leave_line(&mut list);
            self.places.clear_waiters_if_none(&list);
            drop(list);
            self.waiting = None;
            self.reserved = true;
            self.shard = shard;
            return Poll::Ready(());
        }
        match self.waiting.and_then(|ticket| list.spot_of(ticket)) {
            Some(index) => list.queue[index].1.clone_from(cx.waker()),
            None => self.waiting = Some(list.line_up(cx.waker().clone())),
        }
        Poll::Pending
    }

    /// The place this handle reserved, for its request; `None` when it
    /// holds none.
    pub(crate) fn take_reserved(&mut self) -> Option<Reserved<'_>> {
        if !std::mem::take(&mut self.reserved) {
            return None;
        }
        Some(Reserved { handle: self })
    }

    /// A place just taken (from `shard`) on the fast path: leaves the line
    /// if it was in it.
    fn took(&mut self, shard: usize) {
        if self.waiting.is_some() {
            let mut list = self.places.list();
            self.leave_line(&mut list);
            self.places.clear_waiters_if_none(&list);
            drop(list);
            self.waiting = None;
        }
        self.reserved = true;
        self.shard = shard;
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
            self.places.give_back_to(self.shard);
        }
        if self.waiting.is_none() {
            return;
        }
        let woken = {
            let mut list = self.places.list();
            let woken = !self.leave_line(&mut list);
            self.places.clear_waiters_if_none(&list);
            woken
        };
        // Woken for a place it will not take: the next in line gets it.
        if woken && self.places.free() > 0 {
            self.places.wake_first();
        }
    }
}
