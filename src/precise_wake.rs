//! Wake-ups at the exact instant, beside tokio's timer.
//!
//! Tokio's timer counts whole milliseconds: it rounds a deadline up to the
//! next millisecond, and the runtime's wait for it is rounded up again, so
//! a task sleeping until an instant wakes 0.5 to 1 ms after it on average.
//! For a wait that ends a gap (a scope's next send) that lag is lost on
//! every gap: at 25 ms between sends, 4 % of what a server allows.
//!
//! A [`PreciseWake`] asks one thread of the crate's, shared by the whole
//! process, to wake a task when the real clock passes an instant. The
//! thread sleeps on a condition variable with a timeout, which the system
//! keeps to tens of microseconds. It is only a hint: the caller keeps
//! tokio's timer as well and decides by tokio's clock, so a paused clock
//! (tests under `start_paused`) behaves as before (its timers fire first;
//! the thread's wake, in real time, finds nothing due), and a wake that
//! came early or late changes no decision. If the thread cannot be
//! started, nothing is woken early and tokio's timer alone wakes the task.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::Waker;

use tokio::time::Instant;

/// A task's wake-up at an exact instant; dropping it, or aiming it
/// elsewhere, cancels the wake-up it had.
#[derive(Debug, Default)]
pub(crate) struct PreciseWake {
    /// The wake-up asked for: its key at the thread, its instant and the
    /// waker it wakes.
    armed: Option<(u64, Instant, Waker)>,
}

impl PreciseWake {
    /// Wakes `waker` once the real clock passes `at` (instead of what was
    /// asked before). Nothing to do when the same wake-up is armed.
    pub(crate) fn aim(&mut self, at: Instant, waker: &Waker) {
        if let Some((_, armed_at, armed_waker)) = &self.armed {
            if *armed_at == at && armed_waker.will_wake(waker) {
                return;
            }
        }
        let Some(thread) = WakeThread::get() else {
            return;
        };
        let real_at = std::time::Instant::now() + at.saturating_duration_since(Instant::now());
        let old = self.armed.take().map(|(key, ..)| key);
        let key = thread.replace(old, real_at, waker.clone());
        self.armed = Some((key, at, waker.clone()));
    }

    /// Cancels the wake-up, if one is armed.
    pub(crate) fn cancel(&mut self) {
        if let Some((key, ..)) = self.armed.take() {
            if let Some(thread) = WakeThread::get() {
                thread.remove(key);
            }
        }
    }
}

impl Drop for PreciseWake {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// The thread that wakes the tasks, and the wake-ups it keeps.
struct WakeThread {
    state: Mutex<Wakes>,
    /// Signalled when a wake-up earlier than every other one is asked for.
    earlier: Condvar,
}

/// The wake-ups: by key, and in the order of their instants. A wake-up
/// cancelled or replaced leaves its entry in `order`, which finds no waker
/// when its instant comes (or goes when `order` is rebuilt).
#[derive(Default)]
struct Wakes {
    next_key: u64,
    pending: HashMap<u64, (std::time::Instant, Waker)>,
    order: BinaryHeap<Reverse<(std::time::Instant, u64)>>,
}

/// Entries of cancelled wake-ups `order` may hold beyond the pending ones
/// before it is rebuilt.
const STALE_ENTRIES: usize = 64;

impl WakeThread {
    /// The process's wake thread, started on first use; `None` when it
    /// could not be started.
    fn get() -> Option<&'static WakeThread> {
        static THREAD: OnceLock<Option<&'static WakeThread>> = OnceLock::new();
        *THREAD.get_or_init(|| {
            let thread: &'static WakeThread = Box::leak(Box::new(WakeThread {
                state: Mutex::new(Wakes::default()),
                earlier: Condvar::new(),
            }));
            std::thread::Builder::new()
                .name("tower-throttle-wake".into())
                .spawn(move || thread.run())
                .ok()
                .map(|_| thread)
        })
    }

    fn lock(&self) -> MutexGuard<'_, Wakes> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces wake-up `old` (if any) by one of `waker` at `at`; its key.
    fn replace(&self, old: Option<u64>, at: std::time::Instant, waker: Waker) -> u64 {
        let mut wakes = self.lock();
        if let Some(old) = old {
            wakes.pending.remove(&old);
        }
        let earliest = wakes.order.peek().map(|Reverse((first, _))| *first);
        let key = wakes.next_key;
        wakes.next_key += 1;
        wakes.pending.insert(key, (at, waker));
        wakes.order.push(Reverse((at, key)));
        wakes.drop_stale_entries();
        drop(wakes);
        if earliest.is_none_or(|first| at < first) {
            self.earlier.notify_one();
        }
        key
    }

    /// Cancels wake-up `key`.
    fn remove(&self, key: u64) {
        let mut wakes = self.lock();
        wakes.pending.remove(&key);
        wakes.drop_stale_entries();
    }

    /// Wakes each task whose instant has passed, then sleeps until the
    /// next instant or an earlier wake-up; for ever.
    fn run(&self) {
        let mut wakes = self.lock();
        loop {
            let now = std::time::Instant::now();
            let due = wakes.take_due(now);
            if !due.is_empty() {
                drop(wakes);
                due.into_iter().for_each(Waker::wake);
                wakes = self.lock();
                continue;
            }
            wakes = match wakes.order.peek() {
                Some(Reverse((at, _))) => {
                    let timeout = at.saturating_duration_since(now);
                    self.earlier
                        .wait_timeout(wakes, timeout)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => self.earlier.wait(wakes).unwrap_or_else(PoisonError::into_inner),
            };
        }
    }
}

impl Wakes {
    /// Takes out the wakers whose instant is at or before `now`.
    fn take_due(&mut self, now: std::time::Instant) -> Vec<Waker> {
        let mut due = Vec::new();
        while let Some(Reverse((at, key))) = self.order.peek().copied() {
            if at > now {
                break;
            }
            self.order.pop();
            if let Some((_, waker)) = self.pending.remove(&key) {
                due.push(waker);
            }
        }
        due
    }

    /// Rebuilds `order` from the pending wake-ups once cancelled ones fill
    /// it, so it never grows beyond the wake-ups asked for.
    fn drop_stale_entries(&mut self) {
        if self.order.len() > self.pending.len() * 2 + STALE_ENTRIES {
            self.order = self
                .pending
                .iter()
                .map(|(key, (at, _))| Reverse((*at, *key)))
                .collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;
    use std::time::Duration;

    use super::*;

    /// A waker that counts its wakes.
    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counter() -> (Arc<Counter>, Waker) {
        let counter = Arc::new(Counter::default());
        (counter.clone(), Waker::from(counter))
    }

    #[tokio::test]
    async fn wakes_once_the_instant_has_passed_and_not_before() {
        let (count, waker) = counter();
        let at = Instant::now() + Duration::from_millis(20);
        let mut wake = PreciseWake::default();
        wake.aim(at, &waker);
        while count.0.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < at + Duration::from_secs(5), "never woken");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(Instant::now() >= at, "woken before its instant");
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_cancelled_or_replaced_wake_up_never_comes() {
        let (cancelled, waker) = counter();
        let mut wake = PreciseWake::default();
        wake.aim(Instant::now() + Duration::from_millis(5), &waker);
        wake.cancel();
        let (replaced, first) = counter();
        let (kept, second) = counter();
        let mut moved = PreciseWake::default();
        moved.aim(Instant::now() + Duration::from_millis(5), &first);
        moved.aim(Instant::now() + Duration::from_millis(10), &second);
        let (dropped, waker) = counter();
        drop({
            let mut wake = PreciseWake::default();
            wake.aim(Instant::now() + Duration::from_millis(5), &waker);
            wake
        });
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert_eq!(cancelled.0.load(Ordering::SeqCst), 0);
        assert_eq!(replaced.0.load(Ordering::SeqCst), 0);
        assert_eq!(dropped.0.load(Ordering::SeqCst), 0);
        assert_eq!(kept.0.load(Ordering::SeqCst), 1, "the replacing wake-up comes");
    }

    #[test]
    fn cancelled_entries_are_dropped_from_the_order() {
        let (_, waker) = counter();
        let mut wakes = Wakes::default();
        let far = std::time::Instant::now() + Duration::from_secs(3600);
        for key in 0..1_000 {
            wakes.pending.insert(key, (far, waker.clone()));
            wakes.order.push(Reverse((far, key)));
            wakes.pending.remove(&key);
            wakes.drop_stale_entries();
        }
        assert!(
            wakes.order.len() <= STALE_ENTRIES + 1,
            "{} entries",
            wakes.order.len()
        );
    }
}
