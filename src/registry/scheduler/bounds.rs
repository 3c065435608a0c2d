//! Bounded waits: a request whose prediction is past its bound (its own
//! [`MaxWait`](crate::scope::MaxWait) or its scopes' `max_wait`, the
//! tighter) is refused before it is queued, and so is one that comes when
//! its scope has `max_waiting` requests waiting already. A bounded
//! request that waits keeps its deadline here, is woken whenever one of
//! its scopes' limits changes from outside (a hold, feedback, a config),
//! looks at its prediction again at each poll, and keeps a timer for its
//! deadline, where it leaves with what it waited.
//!
//! A request that leaves this way took nothing: it was only queued, so its
//! scopes start no gap and spend no quota, and the waiters behind it go as
//! if it had never come.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::{Admission, Outcome, Scheduler, ScopeId, TicketId, WakeList};
use crate::registry::config::ScopeConfig;
use crate::registry::ticket::Refusal;
use crate::registry::RequestBound;
use crate::time::saturating_add;

/// The deadlines of the bounded requests that wait.
#[derive(Debug, Default)]
pub(crate) struct Bounds {
    /// Each bounded waiter's deadline and bound (ticket ids are the
    /// scheduler's own slab indices: a fast hash).
    deadlines: HashMap<TicketId, (Instant, Duration), foldhash::fast::RandomState>,
    /// Whether some scope config sets a bound (`None`: not looked at since
    /// the configs last changed). Without one, a request without a bound
    /// of its own skips every check.
    configured: Option<bool>,
    /// Whether a bound that cannot apply was warned about (once per
    /// registry).
    warned_unenforced: bool,
}

/// What the checks before queuing found: the bound the request waits
/// with, if any.
pub(crate) type BoundCheck = Result<Option<Duration>, Box<Refusal>>;

impl Scheduler {
    /// The checks before a request of `scopes` (resolved by name: a scope
    /// not known yet has nothing in its way) with `priority` and `bound`
    /// is queued: refused when its scope has `max_waiting` requests
    /// waiting, or when its prediction is past its bound; otherwise the
    /// bound it waits with, if any. Nothing to check (`Ok(None)`) without
    /// a bound anywhere, or for a throttle that cannot fail requests.
    #[inline]
    pub(crate) fn check_bounds<'a>(
        &mut self,
        scopes: impl Iterator<Item = (&'a str, f64)> + Clone,
        priority: i32,
        bound: RequestBound,
        now: Instant,
    ) -> BoundCheck {
        if !bound.enforced || (bound.max_wait.is_none() && !self.bounds_configured()) {
            return Ok(None);
        }
        self.check_known_bounds(scopes, priority, bound, now)
    }

    #[cold]
    #[inline(never)]
    fn check_known_bounds<'a>(
        &self,
        scopes: impl Iterator<Item = (&'a str, f64)> + Clone,
        priority: i32,
        bound: RequestBound,
        now: Instant,
    ) -> BoundCheck {
        let known = scopes.filter_map(|(name, cost)| Some((self.index.get(name, &self.scopes)?, cost)));
        let mut max_wait = bound.max_wait;
        let mut full = None;
        for (id, _) in known.clone() {
            let scope = &self.scopes[id];
            let config = &scope.state.config;
            if let (Some(max_waiting), None) = (config.max_waiting, &full) {
                if scope.queued() >= max_waiting {
                    full = Some((scope.state.key.clone(), max_waiting, scope.queued()));
                }
            }
            max_wait = match (max_wait, config.max_wait) {
                (Some(own), Some(scope)) => Some(own.min(scope)),
                (own, scope) => own.or(scope),
            };
        }
        if full.is_none() && max_wait.is_none() {
            return Ok(None);
        }
        let forecast = self.forecast_new_seats(known, priority, now);
        if let Some((scope, max_waiting, queued)) = full {
            // Waiters ahead mean it waits too; with none (`max_waiting` 0)
            // it is full only if it could not go at once.
            if queued > 0 || forecast.at > now {
                return Err(Box::new(Refusal::QueueFull { scope, max_waiting }));
            }
        }
        match max_wait {
            Some(bound) if forecast.at > saturating_add(now, bound) => {
                Err(Box::new(Refusal::would_wait(forecast.view(), now, bound, None)))
            }
            max_wait => Ok(max_wait),
        }
    }

    /// After a request passed [`check_bounds`](Self::check_bounds) with
    /// `bound` and was queued as `admission`: a ticket that waits keeps
    /// its deadline. For a throttle that cannot fail requests, warns once
    /// of a scope's bounds, which do not apply.
    #[inline]
    pub(crate) fn wait_within(
        &mut self,
        admission: Admission,
        (checked, bound): (Option<Duration>, RequestBound),
        now: Instant,
    ) -> Admission {
        match (&admission, checked) {
            (Admission::Ticket(id, None), Some(max_wait)) => {
                self.bounds
                    .deadlines
                    .insert(*id, (saturating_add(now, max_wait), max_wait));
            }
            (Admission::Ticket(id, None), None) if !bound.enforced => self.warn_unenforced(*id),
            _ => {}
        }
        admission
    }

    /// Warns, once, when a waiter's scope sets a bound that its throttle
    /// cannot apply.
    #[cold]
    fn warn_unenforced(&mut self, id: TicketId) {
        if self.bounds.warned_unenforced || !self.bounds_configured() {
            return;
        }
        let bounded = self.tickets[id].seats.iter().find(|seat| {
            let config = &self.scopes[seat.scope].state.config;
            config.max_wait.is_some() || config.max_waiting.is_some()
        });
        if let Some(seat) = bounded {
            self.bounds.warned_unenforced = true;
            tracing::warn!(
                target: "tower_throttle",
                scope = %self.scopes[seat.scope].state.key,
                "a scope with a bound on its waits (max_wait, max_waiting) is throttled by a throttle \
                 that cannot fail requests: bounds need ThrottleLayer::crate_errors(); its requests wait unbounded"
            );
        }
    }

    /// Whether some scope config sets a bound (looked at again after the
    /// configs change).
    fn bounds_configured(&mut self) -> bool {
        if let Some(configured) = self.bounds.configured {
            return configured;
        }
        let configured = self
            .configs
            .any(|config: &ScopeConfig| config.max_wait.is_some() || config.max_waiting.is_some());
        self.bounds.configured = Some(configured);
        configured
    }

    /// The configs changed: whether one sets a bound is looked at again.
    pub(super) fn configs_changed(&mut self) {
        self.bounds.configured = None;
    }

    /// For waiting ticket `id`, polled at `now`: a bounded waiter whose
    /// deadline came, or whose prediction moved past it, leaves.
    #[inline]
    pub(super) fn bound_passed(
        &mut self,
        id: TicketId,
        now: Instant,
        wake: &mut WakeList,
    ) -> Option<Box<Refusal>> {
        if self.bounds.deadlines.is_empty() {
            return None;
        }
        let &(deadline, bound) = self.bounds.deadlines.get(&id)?;
        let woken_with_others = std::mem::take(&mut self.tickets[id].bounds_woken);
        let forecast = self.forecast_ticket(id, now);
        let waited = match now >= deadline {
            true => Some(self.wait_parts(id, now)),
            false if forecast.at > deadline => None,
            false => return None,
        };
        // Failed by its prediction (not by its deadline, which says
        // nothing of the others') and not woken with the others: see below.
        let wake_others = waited.is_none() && !woken_with_others;
        let refusal = Refusal::would_wait(forecast.view(), now, bound, waited);
        let scopes: Vec<ScopeId> = match wake_others {
            true => self.tickets[id].seats.iter().map(|seat| seat.scope).collect(),
            false => Vec::new(),
        };
        self.finish(id, Outcome::NoResponse, None, (now, None), wake);
        // When its prediction moved past its bound, its scopes' other
        // bounded waiters look at theirs now too: one past its bound leaves
        // at this instant, not at its next poll, as it would have were this
        // one never queued. Not when this one was woken with them (a change
        // of limits woke every one of them already): a hold that fails n
        // waiters wakes each once, not n times.
        for scope in scopes {
            self.wake_bounded(scope, wake);
        }
        Some(Box::new(refusal))
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
    pub(super) fn wake_bounded(&mut self, scope: ScopeId, wake: &mut WakeList) {
        if self.bounds.deadlines.is_empty() {
            return;
        }
        for &id in self.bounds.deadlines.keys() {
            let ticket = &mut self.tickets[id];
            if ticket.seats.iter().any(|seat| seat.scope == scope) {
                if let Some(waker) = &ticket.waker {
                    wake.push(waker.clone());
                    ticket.bounds_woken = true;
                }
            }
        }
    }
}
