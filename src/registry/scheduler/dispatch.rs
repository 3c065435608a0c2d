//! The waiters: their count, a ticket's poll and departure, and what lets
//! waiters go (the global queue served, each dirty scope's dispatch), their
//! sends and the record of why each waited.

use std::task::Waker;

use tokio::time::Instant;

use super::groups::NO_SCOPE;
use super::{
    choice, wait_log, Effective, Finishing, Scheduler, ScopeCheck, ScopeEntry, ScopeId, TicketId, TicketPoll,
    Verdict, WakeList,
};
use crate::registry::scope_state::Sending;
use crate::registry::ticket::{Seats, Status, WaitParts, WaitedInScheduler};
use crate::time::Stamp;
use crate::waited::WaitCause;

impl Scheduler {
    /// One more request waits; warns once when the count passes the
    /// threshold, and again only after it fell back below half of it.
    pub(super) fn count_waiter(&mut self) {
        self.waiting += 1;
        let waiting = self.waiting;
        if waiting <= self.delayed_warn_threshold / 2 {
            self.delayed_warned = false;
        }
        if waiting > self.delayed_warn_threshold && !self.delayed_warned {
            self.delayed_warned = true;
            tracing::warn!(
                target: "tower_throttle",
                waiting,
                threshold = self.delayed_warn_threshold,
                in_flight = self.global.in_flight(),
                "more requests wait for their scopes than delayed_warn_threshold: \
                 the crawl produces requests faster than its scopes allow"
            );
        }
    }

    /// One request fewer waits.
    pub(super) fn uncount_waiter(&mut self) {
        self.waiting -= 1;
    }

    /// Polls a waiting ticket: runs the timers it keeps, and says whether it
    /// was sent or how long to sleep.
    pub(crate) fn poll_ticket(
        &mut self,
        id: TicketId,
        now: Instant,
        waker: &Waker,
        wake: &mut WakeList,
    ) -> TicketPoll {
        if let Some(report_departure) = self.report_departure(id) {
            return TicketPoll::Sent { report_departure };
        }
        self.fire_due_timers(id, now);
        self.run_dispatch(now, wake);
        if let Some(report_departure) = self.report_departure(id) {
            return TicketPoll::Sent { report_departure };
        }
        if let Some(refusal) = self.bound_passed(id, now, wake) {
            return TicketPoll::Refused(refusal);
        }
        let ticket = &mut self.tickets[id];
        match &ticket.waker {
            Some(known) if known.will_wake(waker) => {}
            _ => ticket.waker = Some(waker.clone()),
        }
        TicketPoll::Waiting {
            timer: self.bounded_timer(id, self.timer_of(id)),
        }
    }

    /// Records that admitted ticket `id` was handed to the inner service
    /// at `at` (a clock reading taken after the hand-over, before this
    /// lock): its scopes' next gaps run from then, and the scopes it held
    /// back look at their waiters again, at `now`.
    pub(crate) fn depart(&mut self, id: TicketId, at: Stamp, now: Instant, wake: &mut WakeList) {
        let ticket = &mut self.tickets[id];
        if !matches!(ticket.status, Status::Admitted { .. }) {
            return;
        }
        ticket.status = Status::Departed(at);
        for seat in &ticket.seats {
            let scope = &mut self.scopes[seat.scope];
            scope.state.depart(seat.lane, at);
            if scope.has_waiters() {
                self.dirty.push(seat.scope);
            }
        }
        self.run_dispatch(now, wake);
    }

    /// Takes waiting ticket `id` out of its scopes' queues and the global
    /// queue (it is gone), and lets the next waiters go.
    pub(super) fn leave_queues(&mut self, id: TicketId, now: Instant, wake: &mut WakeList) {
        self.forget_bound(id);
        self.stop_waiting(id);
        let ticket = &self.tickets[id];
        if ticket.in_global_queue {
            self.global_queue.remove(&ticket.order);
        }
        if ticket.waiting {
            self.uncount_waiter();
        }
        self.run_dispatch(now, wake);
    }

    /// Hands freed global permits to the oldest waiters that only lacked one.
    pub(super) fn serve_global_queue(&mut self, now: Instant, wake: &mut WakeList) {
        while self.global.has_room() {
            if !self.serve_first_global_waiter(now, wake) {
                return;
            }
        }
    }

    /// Lets the first global waiter go if its scopes allow (or has its
    /// scopes look at it again); false when there is none.
    pub(super) fn serve_first_global_waiter(&mut self, now: Instant, wake: &mut WakeList) -> bool {
        let Some((_, id)) = self.global_queue.pop_first() else {
            return false;
        };
        self.tickets[id].in_global_queue = false;
        match self.evaluate(id, None, now) {
            Verdict::Admit => self.send(id, now, wake),
            verdict => self.look_again_at(id, verdict),
        }
        true
    }

    /// A waiter served from the global queue that did not go: its scopes
    /// look at it again (and note their own causes). Held by one of them,
    /// it is first moved as a scope's dispatch moves it: a candidate where
    /// it is held, so no later waiter passes it there (it may be parked
    /// there, held by a scope that let it go since); not a waiter whose
    /// group another leads now, which stands in no queue.
    #[cold]
    fn look_again_at(&mut self, id: TicketId, verdict: Verdict) {
        if let Verdict::HeldBy(holder) = verdict {
            if self.stands_in_queues(id) {
                self.hold_back(id, holder, NO_SCOPE);
            }
        }
        for seat in &self.tickets[id].seats {
            self.dirty.push(seat.scope);
        }
    }

    /// Dispatches every dirty scope. A scope named again before or while
    /// it was dispatched is not dispatched twice: its dispatch looks at it
    /// until something holds it, after every change it made itself (a
    /// waiter sent names its scopes again), so a second look would only
    /// find it held again.
    #[inline]
    pub(super) fn run_dispatch(&mut self, now: Instant, wake: &mut WakeList) {
        while let Some(scope) = self.dirty.pop() {
            self.dispatch(scope, now, wake);
            if self.dirty.contains(&scope) {
                self.dirty.retain(|&dirty| dirty != scope);
            }
        }
    }

    /// Whether ending request `which` may let a waiter go: a waiter of
    /// one of its scopes, or of a global permit. (A request still queued
    /// leaves its queues, at the current instant too.) When none, the end
    /// needs no clock reading.
    #[inline]
    pub(crate) fn end_lets_someone_go(&self, which: Finishing) -> bool {
        if !self.global_queue.is_empty() {
            return true;
        }
        match which {
            Finishing::Ticket(id) => match self.tickets.get(id) {
                Some(ticket) => {
                    ticket.status == Status::Queued
                        || ticket
                            .seats
                            .iter()
                            .any(|seat| self.scopes[seat.scope].has_waiters())
                }
                None => false,
            },
            Finishing::Plain(scope, _) => self.scopes.get(scope).is_some_and(ScopeEntry::has_waiters),
        }
    }

    /// Sends as many waiters of `scope_id` as its limits allow, in order,
    /// and sets its timer when time is what holds the head back. Notes in
    /// the scope's wait log what holds its queue (see [`crate::waited`]).
    pub(super) fn dispatch(&mut self, scope_id: ScopeId, now: Instant, wake: &mut WakeList) {
        loop {
            let scope = &self.scopes[scope_id];
            if !scope.has_candidates() {
                // Its waiters, if any, are parked: other scopes hold them.
                let cause = scope.has_waiters().then_some(choice::OTHER_SCOPE);
                self.scopes[scope_id].note_wait(now, cause);
                self.set_timer(scope_id, None, wake);
                return;
            }
            let effective = scope.state.effective(now, self.max_concurrency);
            // A head of several scopes may be held back by another of them
            // and parked, letting the ones behind it go: its own quota cost
            // must not close the scope before `pick_waiter` looks (each
            // candidate's cost is checked there).
            let head_cost = match self.head_has_several_scopes(scope_id) {
                true => 0.0,
                false => self.head_cost(scope_id),
            };
            let (held, lane) = match scope.state.check(now, &effective, head_cost) {
                ScopeCheck::Full => (
                    Some(((WaitCause::Lanes, Some(effective.concurrency_source)), None)),
                    0,
                ),
                ScopeCheck::AwaitingEarlier => (Some(((WaitCause::Departure, None), None)), 0),
                ScopeCheck::Until(at) => (
                    Some((scope.state.wait_cause(now, &effective, head_cost), Some(at))),
                    0,
                ),
                ScopeCheck::Ready { lane } => (None, lane),
            };
            if let Some((cause, timer)) = held {
                self.scopes[scope_id].note_wait(now, Some(cause));
                self.set_timer(scope_id, timer, wake);
                return;
            }
            self.set_timer(scope_id, None, wake);
            match self.pick_waiter(scope_id, now, wake) {
                // The lane just found is the one to take (nothing changed
                // the scope's lanes since) when this scope is the
                // waiter's only one.
                Ok(id) if self.tickets[id].seats.as_slice().len() == 1 => {
                    self.send_on_lanes(id, now, wake, Some((lane, effective)));
                    // A send changes the scope's lanes, not its limits: with
                    // every lane now busy, the next look would find it full.
                    let scope = &mut self.scopes[scope_id];
                    if scope.has_candidates() && scope.state.in_flight >= effective.concurrency {
                        let full = (WaitCause::Lanes, Some(effective.concurrency_source));
                        scope.note_wait(now, Some(full));
                        return;
                    }
                }
                Ok(id) => self.send(id, now, wake),
                Err(cause) => {
                    self.scopes[scope_id].note_wait(now, Some(cause));
                    if self.scopes[scope_id].timer_owner().is_none() {
                        let relief = self.when_another_scope_may_let_the_head_go(scope_id, now);
                        self.set_timer(scope_id, relief, wake);
                    }
                    return;
                }
            }
        }
    }

    /// The scope allows a send but its head waits for another of its
    /// scopes: when that scope's own time limits next let it go, if time is
    /// what holds it. Without a timer here, nothing would look at this
    /// scope again should the other scope's next event not reach the head.
    pub(super) fn when_another_scope_may_let_the_head_go(
        &self,
        scope_id: ScopeId,
        now: Instant,
    ) -> Option<Instant> {
        let (_, head) = self.scopes[scope_id].queue().first()?;
        self.tickets[head]
            .seats
            .iter()
            .filter(|seat| seat.scope != scope_id)
            .filter_map(|seat| {
                let scope = &self.scopes[seat.scope].state;
                match scope.check(now, &scope.effective(now, self.max_concurrency), seat.cost) {
                    ScopeCheck::Until(at) => Some(at),
                    _ => None,
                }
            })
            .min()
    }

    /// Keeps, for ticket `id` admitted at `now` after waiting, why it
    /// waited: the part of its scopes' wait logs since it came (see
    /// [`crate::waited`]).
    #[cold]
    pub(super) fn record_wait(&mut self, id: TicketId, now: Instant) {
        let parts = self.wait_parts(id, now);
        // Copied out (the trims below need the scheduler mutably); on the
        // stack for the usual one or two scopes.
        let seats: smallvec::SmallVec<[ScopeId; 2]> =
            self.tickets[id].seats.iter().map(|seat| seat.scope).collect();
        self.waited.insert(
            id,
            WaitedInScheduler {
                parts,
                admitted_at: now,
            },
        );
        for scope in seats {
            self.trim_wait_log(scope, id);
        }
    }

    /// Why waiting ticket `id` waited from its arrival until `now`: the
    /// part of its scopes' wait logs since it came.
    pub(super) fn wait_parts(&self, id: TicketId, now: Instant) -> WaitParts {
        let ticket = &self.tickets[id];
        let from = ticket.enqueued_at;
        match &ticket.seats {
            Seats::One([seat]) => self.scopes[seat.scope]
                .wait_log()
                .map(|log| log.parts(from, now))
                .unwrap_or_default(),
            seats => {
                let logs: Vec<&wait_log::WaitLog> = seats
                    .iter()
                    .filter_map(|seat| self.scopes[seat.scope].wait_log())
                    .collect();
                wait_log::merged_parts(&logs, from, now)
            }
        }
    }

    /// Trims the wait log of `scope` to its oldest waiter other than
    /// `leaving`, once the log has grown enough for that to pay.
    pub(super) fn trim_wait_log(&mut self, scope: ScopeId, leaving: TicketId) {
        let entry = &self.scopes[scope];
        if !entry.wait_log().is_some_and(|log| log.needs_trim()) {
            return;
        }
        let oldest = self.oldest_waiter_since(scope, leaving);
        if let (Some(oldest), Some(log)) = (oldest, self.scopes[scope].wait_log_mut()) {
            log.trim(oldest);
        }
    }

    /// The record of why ticket `id` waited, once it was admitted after
    /// waiting: taken by its future, which finishes it at the hand-over.
    pub(crate) fn take_waited(&mut self, id: TicketId) -> Option<WaitedInScheduler> {
        self.waited.remove(&id)
    }

    /// Sends ticket `id`, whose global permit its caller took (see
    /// [`GlobalFlight::take_locked`](crate::registry::fast_path::GlobalFlight::take_locked)):
    /// takes a lane in each scope, starts each scope's delays (with a fresh
    /// jitter draw) and counts it in flight.
    pub(super) fn send(&mut self, id: TicketId, now: Instant, wake: &mut WakeList) {
        self.send_on_lanes(id, now, wake, None);
    }

    /// After a send of ticket `id`: each leader parked in one of its
    /// scopes may now be held there longer than by the quota scope that
    /// holds it, waiting for its window: that scope looks at it again, and
    /// parks it too if so, letting the cheaper requests behind it go now
    /// rather than when the window ends. (Only a quota can let a request
    /// behind a held head go: a delay or full lanes hold them all alike, so
    /// other holders are left alone, and a server's send does not make
    /// every one of its names look again.)
    fn recheck_holders_of_parked(&mut self, id: TicketId) {
        for seat in self.tickets[id].seats.iter() {
            for &parked in self.scopes[seat.scope].parked().values() {
                let Some(holder) = self.tickets[parked].held_by.get() else {
                    continue;
                };
                let has_quota = self.scopes[holder].state.config.get_quota().is_some();
                if has_quota && !self.dirty.contains(&holder) {
                    self.dirty.push(holder);
                }
            }
        }
    }

    /// [`send`](Self::send), with the lane of a one-scope ticket already
    /// chosen by the caller under this same lock.
    pub(super) fn send_on_lanes(
        &mut self,
        id: TicketId,
        now: Instant,
        wake: &mut WakeList,
        chosen: Option<(usize, Effective)>,
    ) {
        if self.tickets[id].waiting {
            self.record_wait(id, now);
        }
        let ticket = &mut self.tickets[id];
        let mut report_departure = false;
        // A request of several scopes, one of them cold, opens a
        // connection of its own after it leaves: its other scopes' next
        // gaps run from its answer too.
        let opens = matches!(ticket.seats, Seats::Many(_))
            && ticket
                .seats
                .iter()
                .any(|seat| !self.scopes[seat.scope].state.warm);
        ticket.opens_connection = opens;
        for seat in ticket.seats.iter_mut() {
            let scope = &mut self.scopes[seat.scope];
            let taken = scope.state.take_lane(
                now,
                chosen,
                self.max_concurrency,
                &mut self.rng,
                Sending {
                    enqueued_at: ticket.enqueued_at,
                    cost: seat.cost,
                },
            );
            seat.lane = taken.lane;
            seat.before = taken.before;
            if opens {
                // After the send: the send itself was allowed.
                scope.state.start_opening();
            }
            report_departure |= taken.others_may_follow;
            self.metrics.sent(&scope.state.key);
        }
        if ticket.waiting {
            self.forget_bound(id);
            self.stop_waiting(id);
        }
        let ticket = &mut self.tickets[id];
        if ticket.in_global_queue {
            ticket.in_global_queue = false;
            self.global_queue.remove(&ticket.order);
        }
        if ticket.waiting {
            ticket.waiting = false;
            self.waiting -= 1;
        }
        ticket.status = Status::Admitted { report_departure };
        if let Some(waker) = ticket.waker.take() {
            wake.push(waker);
        }
        self.recheck_holders_of_parked(id);
    }
}
