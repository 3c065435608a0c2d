//! The write stamp a [`DepartureStamp`](super::DepartureStamp) gives the
//! request a throttle is handing over, and the thread-local offer through
//! which the throttle learns of it.
//!
//! While [`Throttle`](crate::Throttle) calls its inner service it *offers*
//! to take a write stamp (one plain `Cell` on this thread, as the scopes'
//! hand-over is a slot). A `DepartureStamp` inside, called within that
//! call, *claims* the offer: it makes the stamp, leaves it for the throttle
//! and wraps the request's body with it. The throttle takes it when its
//! call returns, and times the request's departure by it.

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Waker};

use tokio::time::Instant;

/// When the request's head was taken to be written: the first time the
/// client asks its body anything (hyper asks whether it is empty right
/// before it writes the head on the connection).
///
/// The stamp is set once; the waiter is kept under a lock, which the
/// stamp takes after it is set and the waiter before it looks again, so a
/// waiter that missed the stamp is woken by it. Only std's primitives: no
/// protocol of atomics to check.
#[derive(Debug, Default)]
pub(crate) struct WriteStamp {
    at: OnceLock<Instant>,
    /// The throttle's task, when it waits for the stamp to report it.
    waiter: Mutex<Option<Waker>>,
    /// Set once armed for the connection's next socket write (see
    /// [`arm`]).
    armed: OnceLock<()>,
}

impl WriteStamp {
    /// Stamps now, the first time; wakes whoever waits for it.
    pub(crate) fn stamp(&self) {
        if self.at.get().is_none() && self.at.set(Instant::now()).is_ok() {
            if let Some(waiter) = self.waiter().take() {
                waiter.wake();
            }
        }
    }

    /// Arms the stamp for the next socket write on this thread, the first
    /// time: a `StampedIo` stamps it when that write returns.
    pub(crate) fn arm_once(self: &Arc<Self>) {
        if self.armed.set(()).is_ok() {
            arm(self.clone());
        }
    }

    /// The stamp, if the write began.
    pub(crate) fn get(&self) -> Option<Instant> {
        self.at.get().copied()
    }

    /// The stamp; or `None`, and `cx` is woken when it comes.
    pub(crate) fn poll_get(&self, cx: &Context<'_>) -> Option<Instant> {
        if let Some(at) = self.get() {
            return Some(at);
        }
        match &mut *self.waiter() {
            Some(waiter) if waiter.will_wake(cx.waker()) => {}
            waiter => *waiter = Some(cx.waker().clone()),
        }
        self.get()
    }

    fn waiter(&self) -> std::sync::MutexGuard<'_, Option<Waker>> {
        self.waiter.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// No throttle is calling its inner service on this thread.
const CLOSED: u8 = 0;
/// A throttle is calling its inner service and takes a write stamp.
const OPEN: u8 = 1;
/// A `DepartureStamp` claimed the offer: the stamp is in [`CLAIMED`].
const TAKEN: u8 = 2;

thread_local! {
    static OFFER: Cell<u8> = const { Cell::new(CLOSED) };
    static CLAIMED: RefCell<Option<Arc<WriteStamp>>> = const { RefCell::new(None) };
}

thread_local! {
    /// The stamp of the request whose head the connection task on this
    /// thread is about to write (armed when hyper asks the body, right
    /// before it flushes the head to the connection in the same poll).
    static ARMED: RefCell<Option<Arc<WriteStamp>>> = const { RefCell::new(None) };
}

/// Arms `stamp` for the next socket write on this thread. A stamp still
/// armed from before (its connection's writes are not stamped) is stamped
/// now, late rather than never.
fn arm(stamp: Arc<WriteStamp>) {
    let previous = ARMED
        .try_with(|armed| armed.borrow_mut().replace(stamp))
        .ok()
        .flatten();
    if let Some(previous) = previous {
        previous.stamp();
    }
}

/// The stamp armed on this thread, for the socket write about to be made.
#[cfg(feature = "hyper-util")]
pub(crate) fn take_armed() -> Option<Arc<WriteStamp>> {
    ARMED.try_with(|armed| armed.borrow_mut().take()).ok().flatten()
}

/// Offers, until [`Offer::take`], a write stamp for the request a throttle
/// is calling its inner service with.
#[inline]
pub(crate) fn offer() -> Offer {
    Offer {
        previous: OFFER.replace(OPEN),
    }
}

/// The throttle's side of the offer; restores the previous one when taken
/// or dropped (nested throttles each have their own).
#[derive(Debug)]
#[must_use = "the offer stays open until taken"]
pub(crate) struct Offer {
    previous: u8,
}

impl Offer {
    /// The stamp a `DepartureStamp` claimed during the call, if any.
    #[inline]
    pub(crate) fn take(self) -> Option<Arc<WriteStamp>> {
        let state = OFFER.replace(self.previous);
        std::mem::forget(self);
        if state != TAKEN {
            return None;
        }
        CLAIMED
            .try_with(|claimed| claimed.borrow_mut().take())
            .ok()
            .flatten()
    }
}

impl Drop for Offer {
    fn drop(&mut self) {
        // Unwinding out of the call: nobody will time by the stamp.
        if OFFER.replace(self.previous) == TAKEN {
            let _ = CLAIMED.try_with(|claimed| claimed.borrow_mut().take());
        }
    }
}

/// Claims the throttle's open offer on this thread: the stamp to wrap the
/// request's body with, `None` when no throttle is calling (or another
/// `DepartureStamp` claimed it already).
pub(crate) fn claim() -> Option<Arc<WriteStamp>> {
    if OFFER.get() != OPEN {
        return None;
    }
    let stamp = Arc::new(WriteStamp::default());
    let left = CLAIMED
        .try_with(|claimed| *claimed.borrow_mut() = Some(stamp.clone()))
        .is_ok();
    if !left {
        return None;
    }
    OFFER.set(TAKEN);
    Some(stamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_is_claimed_only_while_offered_and_once() {
        assert!(claim().is_none(), "nothing offered");
        let offer = offer();
        let claimed = claim().expect("offered");
        assert!(claim().is_none(), "claimed already");
        let taken = offer.take().expect("the claimed stamp");
        assert!(Arc::ptr_eq(&claimed, &taken));
        assert!(claim().is_none(), "the offer is over");
    }

    #[test]
    fn nested_offers_each_get_their_own() {
        let outer = offer();
        let inner = offer();
        let claimed = claim().unwrap();
        assert!(Arc::ptr_eq(&inner.take().unwrap(), &claimed));
        assert!(claim().is_some(), "the outer offer is open again");
        assert!(outer.take().is_some());
    }

    #[test]
    fn an_offer_nobody_claims_gives_nothing() {
        assert!(offer().take().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_stamp_stays_and_wakes_the_waiter() {
        let stamp = WriteStamp::default();
        let waker = futures::task::noop_waker();
        assert_eq!(stamp.poll_get(&Context::from_waker(&waker)), None);
        let first = Instant::now();
        stamp.stamp();
        tokio::time::advance(std::time::Duration::from_millis(5)).await;
        stamp.stamp();
        assert_eq!(stamp.get(), Some(first));
    }
}
