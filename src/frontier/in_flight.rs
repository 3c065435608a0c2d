//! The requests a frontier has in its service: their response futures in
//! slots the frontier polls itself, each slot with a waker of its own, so
//! a wakeup polls the one future it is for.
//!
//! A slot is made once (its future's box, its waker) and used again by the
//! next request: a request in flight costs no allocation and no task of
//! its own, as it would in a `FuturesUnordered`. A slot's waker may outlive
//! the future it was given to (a timer keeps it, say) and wake the slot's
//! next future once for nothing: a spurious poll, which futures allow.

use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

/// The in-flight futures (`F`), each with what the frontier keeps beside it
/// (`M`: its tag, its scope's queue).
pub(super) struct InFlight<F, M> {
    slots: Vec<Slot<F, M>>,
    /// Slots with no future, to use again.
    free: Vec<usize>,
    /// Slots to poll in this pass: the futures just pushed (never polled
    /// yet) and those woken since the last pass.
    to_poll: Vec<usize>,
    /// Futures in the slots.
    len: usize,
    woken: Arc<Woken>,
}

// Nothing of it is pinned in place (each future is pinned in its own
// box), so a frontier stays `Unpin` whatever its tags and futures are, as
// it was with a `FuturesUnordered`.
impl<F, M> Unpin for InFlight<F, M> {}

/// One slot: a future in a box that stays where it is (the future is
/// pinned there; the next future is written into the same box), what the
/// frontier keeps with it, and the slot's waker.
struct Slot<F, M> {
    future: Pin<Box<Option<F>>>,
    kept: Option<M>,
    waker: Waker,
}

/// What every slot's waker reaches: the slots woken since the frontier
/// last took them, and the frontier's task to wake.
#[derive(Default)]
struct Woken {
    list: Mutex<WokenList>,
}

/// The slots woken since the frontier last took them (each listed once
/// until then: `listed`, by slot), and the frontier's task to wake. All
/// under one mutex: the wakers and the frontier share nothing else.
#[derive(Default)]
struct WokenList {
    slots: Vec<usize>,
    listed: Vec<bool>,
    frontier: Option<Waker>,
}

/// A slot's waker: it lists its slot as woken (once until the frontier
/// takes the list) and wakes the frontier.
struct SlotWake {
    index: usize,
    woken: Arc<Woken>,
}

impl Wake for SlotWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut list = self.woken.lock();
        if std::mem::replace(&mut list.listed[self.index], true) {
            return;
        }
        list.slots.push(self.index);
        let frontier = list.frontier.take();
        drop(list);
        if let Some(frontier) = frontier {
            frontier.wake();
        }
    }
}

impl Woken {
    fn lock(&self) -> MutexGuard<'_, WokenList> {
        self.list.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<F, M> Default for InFlight<F, M> {
    fn default() -> Self {
        InFlight {
            slots: Vec::new(),
            free: Vec::new(),
            to_poll: Vec::new(),
            len: 0,
            woken: Arc::default(),
        }
    }
}

impl<F: Future, M> InFlight<F, M> {
    /// Futures in flight.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Whether no future is in flight.
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Takes `future` in, with `kept` beside it; it is polled in the next
    /// pass.
    pub(super) fn push(&mut self, future: F, kept: M) {
        let index = match self.free.pop() {
            Some(index) => index,
            None => self.new_slot(),
        };
        let slot = &mut self.slots[index];
        slot.future.as_mut().set(Some(future));
        slot.kept = Some(kept);
        self.to_poll.push(index);
        self.len += 1;
    }

    /// A slot made for a future to come (the slots grow to the most
    /// futures ever in flight at once, then are used again).
    fn new_slot(&mut self) -> usize {
        let index = self.slots.len();
        self.woken.lock().listed.push(false);
        let wake = Arc::new(SlotWake {
            index,
            woken: self.woken.clone(),
        });
        self.slots.push(Slot {
            future: Box::pin(None),
            kept: None,
            waker: Waker::from(wake),
        });
        index
    }

    /// Adds the slots woken since the last call to this pass. Called once
    /// per poll of the frontier: a future that wakes itself as it is
    /// polled is polled again in the next poll, not in a loop within this
    /// one.
    #[inline]
    pub(super) fn take_woken(&mut self) {
        if self.len == 0 {
            return;
        }
        self.take_listed();
    }

    /// The slots listed as woken, added to this pass (a slot woken again
    /// from now on is listed again: it is polled once more, for nothing
    /// if this pass's poll saw what woke it).
    fn take_listed(&mut self) {
        let mut guard = self.woken.lock();
        let list = &mut *guard;
        if list.slots.is_empty() {
            return;
        }
        for &index in &list.slots {
            list.listed[index] = false;
        }
        if self.to_poll.is_empty() {
            mem::swap(&mut self.to_poll, &mut list.slots);
        } else {
            self.to_poll.append(&mut list.slots);
        }
    }

    /// Polls this pass's slots until one's future is done and `done`,
    /// given what was kept beside it and the output (which it may
    /// change), gives a tag for it: `Ready` with the tag and the output,
    /// which is moved once, from the future's poll to where the caller
    /// returns it. An output given no tag is dropped. `Pending` once every
    /// slot of the pass was polled.
    #[inline]
    pub(super) fn poll_pass<T>(
        &mut self,
        mut done: impl FnMut(M, &mut F::Output) -> Option<T>,
    ) -> Poll<Option<(T, F::Output)>> {
        while let Some(index) = self.to_poll.pop() {
            let slot = &mut self.slots[index];
            let Some(future) = slot.future.as_mut().as_pin_mut() else {
                // Woken after its future ended: nothing to poll.
                continue;
            };
            let Poll::Ready(mut output) = future.poll(&mut Context::from_waker(&slot.waker)) else {
                continue;
            };
            slot.future.as_mut().set(None);
            let kept = slot.kept.take().expect("a slot with a future keeps its part");
            self.free.push(index);
            self.len -= 1;
            if let Some(tag) = done(kept, &mut output) {
                return Poll::Ready(Some((tag, output)));
            }
        }
        Poll::Pending
    }

    /// Before the frontier sleeps with futures in flight: has a slot been
    /// woken meanwhile (then poll again, the caller having yielded)? If
    /// not, a slot's next wake wakes `cx`'s task.
    pub(super) fn woken_before_sleep(&mut self, cx: &Context<'_>) -> bool {
        if self.len == 0 {
            return false;
        }
        let mut list = self.woken.lock();
        if !list.slots.is_empty() {
            return true;
        }
        match &list.frontier {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            _ => list.frontier = Some(cx.waker().clone()),
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    impl<F: Future, M> InFlight<F, M> {
        /// The next future of the pass that is done, with its part.
        fn poll_done(&mut self) -> Option<(M, F::Output)> {
            match self.poll_pass(|kept, _| Some(kept)) {
                Poll::Ready(done) => done,
                Poll::Pending => None,
            }
        }
    }

    /// A waker counting its wakes.
    struct Counting(AtomicUsize);

    impl Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Counting {
        /// The frontier's task as a counting waker.
        fn frontier() -> (Arc<Counting>, Waker) {
            let counting = Arc::new(Counting(AtomicUsize::new(0)));
            (counting.clone(), Waker::from(counting))
        }

        fn wakes(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// An in-flight set with one future pushed and polled once: it waits
    /// for `sender`.
    fn one_waiting<M>(
        kept: M,
    ) -> (
        InFlight<futures::channel::oneshot::Receiver<u32>, M>,
        futures::channel::oneshot::Sender<u32>,
    ) {
        let (sender, receiver) = futures::channel::oneshot::channel::<u32>();
        let mut in_flight = InFlight::default();
        in_flight.push(receiver, kept);
        in_flight.take_woken();
        assert!(in_flight.poll_done().is_none(), "nothing sent yet");
        (in_flight, sender)
    }

    #[test]
    fn a_woken_future_is_polled_and_wakes_the_frontier_once() {
        let (frontier, waker) = Counting::frontier();
        let cx = Context::from_waker(&waker);
        let (mut in_flight, sender) = one_waiting("a");
        assert!(!in_flight.woken_before_sleep(&cx));
        sender.send(7).unwrap();
        assert_eq!(frontier.wakes(), 1);
        assert!(in_flight.woken_before_sleep(&cx), "woken since");
        in_flight.take_woken();
        let (kept, output) = in_flight.poll_done().unwrap();
        assert_eq!((kept, output), ("a", Ok(7)));
        assert!(in_flight.is_empty());
    }

    #[test]
    fn a_wake_before_the_frontier_sleeps_is_not_lost() {
        let (frontier, waker) = Counting::frontier();
        let cx = Context::from_waker(&waker);
        let (mut in_flight, sender) = one_waiting(());
        // Woken while the frontier has registered no waker yet: the slot
        // is listed, and the frontier sees it before it sleeps.
        sender.send(1).unwrap();
        assert_eq!(frontier.wakes(), 0);
        assert!(in_flight.woken_before_sleep(&cx));
        in_flight.take_woken();
        assert!(in_flight.poll_done().is_some());
    }

    #[test]
    fn slots_are_used_again_and_a_stale_wake_polls_nothing_twice() {
        let (frontier, waker) = Counting::frontier();
        let cx = Context::from_waker(&waker);
        let mut in_flight = InFlight::default();
        for round in 0..3 {
            let (sender, receiver) = futures::channel::oneshot::channel::<u32>();
            sender.send(round).unwrap();
            in_flight.push(receiver, round);
            in_flight.take_woken();
            assert_eq!(in_flight.poll_done(), Some((round, Ok(round))));
        }
        assert_eq!(in_flight.slots.len(), 1, "one slot, used three times");
        // A wake for a slot whose future ended lists it once, and polling
        // it again only polls its next future (spuriously).
        let stale = in_flight.slots[0].waker.clone();
        let (_sender, receiver) = futures::channel::oneshot::channel::<u32>();
        in_flight.push(receiver, 9);
        in_flight.take_woken();
        assert!(in_flight.poll_done().is_none());
        assert!(!in_flight.woken_before_sleep(&cx));
        stale.wake_by_ref();
        stale.wake_by_ref();
        assert_eq!(frontier.wakes(), 1, "listed once");
        in_flight.take_woken();
        assert_eq!(in_flight.to_poll, [0]);
        assert!(in_flight.poll_done().is_none());
        assert_eq!(in_flight.len(), 1);
    }
}
