//! Bounded waits: a queued request whose prediction is past its bound
//! (its own [`MaxWait`](crate::scope::MaxWait) or its scopes'
//! `max_wait`, the tighter) leaves at once, and so does one that comes
//! when its scope has `max_waiting` requests waiting already. A bounded
//! request that waits keeps its deadline here, is woken whenever one of
//! its scopes' limits changes from outside (a hold, feedback, a config),
//! looks at its prediction again at each poll, and keeps a timer for its
//! deadline, where it leaves with what it waited.
//!
//! A request that leaves this way took nothing: it was only queued, so its
//! scopes start no gap and spend no quota, and the waiters behind it go as
//! if it had never come.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::{Admission, Outcome, Scheduler, ScopeId, TicketId, WakeList};
use crate::registry::ticket::Refusal;
use crate::registry::RequestBound;
use crate::time::saturating_add;

/// The deadlines of the bounded requests that wait.
#[derive(Debug, Default)]
pub(crate) struct Bounds {
    /// Each bounded waiter's deadline and bound (ticket ids are the
    /// scheduler's own slab indices: a fast hash).
    deadlines: HashMap<TicketId, (Instant, Duration), foldhash::fast::RandomState>,
}

/// Whether a bound that cannot apply was warned about.
static WARNED_UNENFORCED: AtomicBool = AtomicBool::new(false);

impl Scheduler {
    /// Applies the bounds of a request just queued as `admission` (only a
    /// ticket that waits has any to apply): its own `bound` and its scopes'.
    #[inline]
    pub(crate) fn within_bounds(
        &mut self,
        admission: Admission,
        bound: RequestBound,
        now: Instant,
        wake: &mut WakeList,
    ) -> Admission {
        match admission {
            Admission::Ticket(id, None) => self.check_bounds(id, bound, now, wake),
            admitted => admitted,
        }
    }

    #[cold]
    fn check_bounds(
        &mut self,
        id: TicketId,
        bound: RequestBound,
        now: Instant,
        wake: &mut WakeList,
    ) -> Admission {
        let mut max_wait = bound.max_wait;
        let mut full = None;
        for seat in &self.tickets[id].seats {
            let scope = &self.scopes[seat.scope];
            let config = &scope.state.config;
            if let Some(max_waiting) = config.max_waiting {
                // Counted among them already.
                if scope.queued() > max_waiting && full.is_none() {
                    full = Some(Refusal::QueueFull {
                        scope: scope.state.key.clone(),
                        max_waiting,
                    });
                }
            }
            max_wait = match (max_wait, config.max_wait) {
                (Some(own), Some(scope)) => Some(own.min(scope)),
                (own, scope) => own.or(scope),
            };
        }
        if !bound.enforced {
            if (full.is_some() || max_wait.is_some()) && !WARNED_UNENFORCED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    target: "tower_throttle",
                    "a request with a bound on its wait (max_wait, max_waiting or MaxWait) goes through a \
                     throttle that cannot fail it: bounds need ThrottleLayer::crate_errors(); it waits unbounded"
                );
            }
            return Admission::Ticket(id, None);
        }
        if let Some(refusal) = full {
            return self.refuse(id, refusal, now, wake);
        }
        let Some(bound) = max_wait else {
            return Admission::Ticket(id, None);
        };
        let forecast = self.forecast_ticket(id, now);
        let deadline = saturating_add(now, bound);
        if forecast.at > deadline {
            let refusal = Refusal::would_wait(forecast.view(), now, bound, None);
            return self.refuse(id, refusal, now, wake);
        }
        self.bounds.deadlines.insert(id, (deadline, bound));
        Admission::Ticket(id, None)
    }

    /// Takes queued ticket `id` out of the scheduler, as if it had never
    /// come, for `refusal`.
    fn refuse(&mut self, id: TicketId, refusal: Refusal, now: Instant, wake: &mut WakeList) -> Admission {
        self.finish(id, Outcome::NoResponse, None, (now, None), wake);
        Admission::Refused(refusal)
    }

    /// For waiting ticket `id`, polled at `now`: a bounded waiter whose
    /// deadline came, or whose prediction moved past it, leaves.
    #[inline]
    pub(super) fn bound_passed(
        &mut self,
        id: TicketId,
        now: Instant,
        wake: &mut WakeList,
    ) -> Option<Refusal> {
        if self.bounds.deadlines.is_empty() {
            return None;
        }
        let &(deadline, bound) = self.bounds.deadlines.get(&id)?;
        let forecast = self.forecast_ticket(id, now);
        let waited = match now >= deadline {
            true => Some(self.wait_parts(id, now)),
            false if forecast.at > deadline => None,
            false => return None,
        };
        let refusal = Refusal::would_wait(forecast.view(), now, bound, waited);
        self.finish(id, Outcome::NoResponse, None, (now, None), wake);
        Some(refusal)
    }

    /// The instant waiting ticket `id` must be polled at: its scopes'
    /// `timer`, or its deadline when it has one and that comes first.
    #[inline]
    pub(super) fn bounded_timer(&self, id: TicketId, timer: Option<Instant>) -> Option<Instant> {
        if self.bounds.deadlines.is_empty() {
            return timer;
        }
        match (timer, self.bounds.deadlines.get(&id)) {
            (Some(at), Some(&(deadline, _))) => Some(at.min(deadline)),
            (None, Some(&(deadline, _))) => Some(deadline),
            (timer, None) => timer,
        }
    }

    /// Forgets the deadline of ticket `id`, which leaves its queues
    /// (admitted, or gone).
    #[inline]
    pub(super) fn forget_bound(&mut self, id: TicketId) {
        if !self.bounds.deadlines.is_empty() {
            self.bounds.deadlines.remove(&id);
        }
    }

    /// Wakes the bounded waiters of `scope`, whose limits just changed
    /// from outside: each looks at its prediction again.
    pub(super) fn wake_bounded(&self, scope: ScopeId, wake: &mut WakeList) {
        if self.bounds.deadlines.is_empty() {
            return;
        }
        for &id in self.bounds.deadlines.keys() {
            let ticket = &self.tickets[id];
            if ticket.seats.iter().any(|seat| seat.scope == scope) {
                if let Some(waker) = &ticket.waker {
                    wake.push(waker.clone());
                }
            }
        }
    }
}
