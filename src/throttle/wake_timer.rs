//! The timer that wakes a waiting request when its scope's time limits
//! (or the store's answer) may let it go.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// The timer of the first waiter of a scope, which wakes it when the
/// scope's time limits let it go.
///
/// Tokio's timer counts whole milliseconds and rounds a deadline *up*, and
/// the wake-up itself comes a little later still, so a plain `sleep_until`
/// makes every timed gap about a millisecond longer than asked (a 50 ms
/// delay gave 51.3 ms gaps on average). So the timer first aims at the
/// start of the millisecond that holds the deadline; the scheduler then
/// checks the exact instant, and if it has not come yet the timer aims at
/// the deadline itself. Nothing is ever sent early: the timer only wakes,
/// the scheduler decides. At most two wake-ups per deadline, never a loop.
pub(crate) struct WakeTimer {
    sleep: Pin<Box<Sleep>>,
    /// The instant the scheduler asked to be woken at.
    deadline: Instant,
    /// Whether the early wake-up for `deadline` has happened.
    woke_early: bool,
}

/// Less than one timer tick: aiming this much earlier lands in the tick
/// that holds the deadline, once tokio rounds it up.
const EARLY_WAKE: Duration = Duration::from_micros(999);

impl WakeTimer {
    /// A timer for `deadline`, aimed early first (see above).
    pub(crate) fn new(deadline: Instant) -> Box<Self> {
        Box::new(WakeTimer {
            sleep: Box::pin(tokio::time::sleep_until(early(deadline))),
            deadline,
            woke_early: false,
        })
    }

    /// Aims at `deadline` instead (the early wake-up first again).
    pub(crate) fn aim_at(&mut self, deadline: Instant) {
        if self.deadline != deadline {
            self.deadline = deadline;
            self.woke_early = false;
            self.sleep.as_mut().reset(early(deadline));
        }
    }

    /// The instant the timer wakes for.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Ready at the early wake-up, then at the deadline.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        if !self.woke_early {
            self.woke_early = true;
            self.sleep.as_mut().reset(self.deadline);
        }
        Poll::Ready(())
    }
}

fn early(deadline: Instant) -> Instant {
    deadline.checked_sub(EARLY_WAKE).unwrap_or(deadline)
}
