//! What a request holds from `poll_ready` to its end: a queue place, then
//! a ticket in the scheduler, and the timer that wakes the first waiter of
//! a scope.

use std::fmt;
use std::task::{Context, Poll};

use tokio::time::Instant;

use std::sync::Arc;

use super::handles::Handle;
use super::lease::HeldLease;
use super::wake_timer::WakeTimer;
use crate::departure::stamp::WriteStamp;
use crate::registry::{
    Admission, Asked, Collected, EndOwner, EndTiming, Finishing, Held, Outcome, QueuePlace, Refusal,
    Registry, RequestBound, RequestEnd, Reserved, TicketId, TicketPoll, WordShard,
};
use crate::scope::{Priority, Scopes};
use crate::store::{
    backend::{LeaseId, Reservation, SharedFacts, WaiterId},
    StoreHandle,
};
use crate::time::Stamp;

/// A request's place in the scheduler, from queued to finished. Dropping it
/// at any point releases whatever it holds (queue place, lanes, global
/// permit) and lets the next waiter go.
pub(crate) struct Ticket {
    owner: Owner,
    /// The scheduler's ticket (nothing, for a request on a word).
    id: TicketId,
    /// Where the request stands: the handle's one record of its admission
    /// and departure.
    stage: Stage,
    /// What only a ticket that waits keeps: its timer (only the first
    /// waiter of a scope has one), and the record of its wait (boxed: a
    /// request sent at once allocates neither).
    waiting: Option<Box<Waiting>>,
    /// The lanes the registry's store granted, released when the request
    /// ends (boxed: only requests through a store have one).
    lease: Option<Box<HeldLease>>,
}

/// Who a request answers to.
enum Owner {
    /// A ticket of the registry's scheduler (its throttle's handle: see
    /// `handles.rs`).
    Scheduler(Arc<Handle>),
    /// Admitted at once on this lane of a plain scope (`id` is the
    /// scope's), without a ticket: its end frees the lane.
    Plain(Arc<Handle>, u32),
    /// Admitted on its scope's lock-free word, where it ends too (see the
    /// registry's `fast_path`): the word reaches the registry when the
    /// lock is needed, so the request holds no `Registry`, whose count
    /// every core would write.
    Word(Arc<WordShard>),
    /// Admitted on its two scopes' lock-free words, one shard of each.
    Words(Box<[Arc<WordShard>; 2]>),
}

/// Where a request stands, as its own future knows it. (The queue place
/// and the departure share the space: a waiting request stays within its
/// memory budget.)
#[derive(Debug)]
enum Stage {
    /// Waiting for its scopes, holding its queue place.
    Queued {
        _place: QueuePlace,
    },
    /// Admitted, not yet handed to the inner service. `report`: its
    /// departure must reach the scheduler as soon as it happens (see
    /// [`TicketPoll::Sent`]). `called`: the inner service has been called
    /// (the request may have left, whatever its future did since), or is
    /// called in the step that admitted it (a request admitted at once:
    /// one that parks instead says so, see [`Ticket::note_parked`]).
    Admitted {
        report: bool,
        called: bool,
    },
    /// Handed at `at` to a client that stamps its write: departs at the
    /// later of `at` and the stamp (see [`crate::departure`]); `report` as
    /// in `Admitted`.
    Handed {
        at: Stamp,
        report: bool,
    },
    /// Handed to the inner service at `at`; `reported`: the scheduler has
    /// it already (otherwise [`Ticket::finish`] brings it).
    Departed {
        at: Stamp,
        reported: bool,
    },
    Finished,
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("id", &self.id)
            .field("stage", &self.stage)
            .finish()
    }
}

impl Ticket {
    /// The handle of ticket `id`, just enqueued; `admitted`: whether it
    /// was admitted at once, and then whether its departure must be
    /// reported as soon as it happens.
    #[inline]
    fn new(
        handle: &Arc<Handle>,
        admission: Admission,
        (place, place_wait): (Reserved<'_>, Option<Instant>),
        scopes: &Scopes,
    ) -> Self {
        let registry = handle.registry();
        let fleet = registry.fleet().is_some();
        if let Admission::Fast(fast) = &admission {
            // The inner layers find the scopes being handed over by it.
            debug_assert_eq!(fast.registry_id(), registry.id(), "a word names its registry");
        }
        let (id, admitted, owner) = match admission {
            // No ticket of the scheduler's: an id it never gives.
            Admission::Fast(fast) => (TicketId::MAX, Some(false), Owner::Word(fast)),
            Admission::FastTwo(pair) => (TicketId::MAX, Some(false), Owner::Words(pair)),
            Admission::Ticket(id, admitted) => (id, admitted, Owner::Scheduler(handle.clone())),
            // Nothing to report early: a plain scope has no gap.
            Admission::Plain(scope, lane) => (scope, Some(false), Owner::Plain(handle.clone(), lane)),
            Admission::Refused(refusal) => return Ticket::refused(handle, place, refusal),
        };
        let stage = match admitted {
            // A request admitted at once gives its place back now.
            Some(report) => {
                place.give_back();
                Stage::Admitted { report, called: true }
            }
            None => Stage::Queued { _place: place.keep() },
        };
        Ticket {
            owner,
            id,
            stage,
            waiting: Waiting::for_request(place_wait, scopes, fleet),
            lease: None,
        }
    }

    /// A ticket failed for its bounds as it came: it gives its place back
    /// and holds nothing.
    #[cold]
    #[inline(never)]
    fn refused(handle: &Arc<Handle>, place: Reserved<'_>, refusal: Box<Refusal>) -> Self {
        place.give_back();
        let mut ticket = Ticket {
            owner: Owner::Scheduler(handle.clone()),
            id: TicketId::MAX,
            stage: Stage::Finished,
            waiting: None,
            lease: None,
        };
        ticket.note_refusal(refusal);
        ticket
    }

    /// Queues a request for `scopes` in `registry`, which consumes its queue
    /// place, and admits it at once if nothing is ahead of it and every
    /// limit allows; one that would wait past its `bound` comes back
    /// failed (see [`is_refused`](Self::is_refused)). Whoever hands it to the inner service then reports that
    /// with [`depart`](Self::depart).
    pub(crate) fn enqueue(
        handle: &Arc<Handle>,
        place: (Reserved<'_>, Option<Instant>),
        scopes: Scopes,
        (priority, bound): (Priority, RequestBound),
    ) -> Self {
        let (admission, scopes) = handle
            .registry()
            .enqueue::<()>(Asked::Scopes(scopes), priority, bound);
        let mut ticket = Ticket::new(handle, admission, place, &scopes);
        // Its `call` comes later, if ever.
        ticket.note_parked();
        ticket
    }

    /// [`enqueue`](Self::enqueue) for `request`, its scopes resolved as the
    /// throttle does; also returns them. A request that would wait past
    /// its `bound` (or its scopes') comes back failed (see
    /// [`is_refused`](Self::is_refused)).
    #[inline]
    pub(crate) fn enqueue_resolved<B>(
        handle: &Arc<Handle>,
        place: (Reserved<'_>, Option<Instant>),
        request: &http::Request<B>,
        (priority, bound): (Priority, RequestBound),
    ) -> (Self, Scopes) {
        let (admission, scopes) = handle
            .registry()
            .enqueue(Asked::Request(request), priority, bound);
        let ticket = Ticket::new(handle, admission, place, &scopes);
        (ticket, scopes)
    }

    /// The identity of the registry the ticket is in.
    pub(crate) fn registry_id(&self) -> usize {
        match &self.owner {
            Owner::Scheduler(handle) | Owner::Plain(handle, _) => handle.registry().id(),
            Owner::Word(fast) => fast.registry_id(),
            Owner::Words(fast) => fast[0].registry_id(),
        }
    }

    /// A handle of the registry the request is in (`None` only for a
    /// request on a word whose registry is gone).
    pub(crate) fn registry_handle(&self) -> Option<Registry> {
        match &self.owner {
            Owner::Scheduler(handle) | Owner::Plain(handle, _) => Some(handle.registry().clone()),
            Owner::Word(fast) => fast.registry(),
            Owner::Words(fast) => fast[0].registry(),
        }
    }

    /// The registry, for a ticket of its scheduler (a request on a word
    /// or a plain lane never has a store, nor waits).
    fn registry(&self) -> Option<&Registry> {
        match &self.owner {
            Owner::Scheduler(handle) => Some(handle.registry()),
            Owner::Plain(..) | Owner::Word(_) | Owner::Words(_) => None,
        }
    }

    /// Whether the registry shares its scopes through a store.
    pub(crate) fn has_fleet(&self) -> bool {
        self.registry().is_some_and(|registry| registry.fleet().is_some())
    }

    /// The registry's store, if it has one.
    pub(crate) fn fleet(&self) -> Option<Arc<StoreHandle>> {
        self.registry()?.fleet().cloned()
    }

    /// The store reservation for this admitted request: its scopes with
    /// their effective limits now, and this send's jitter drawn.
    /// The store reservation of this request: lease `lease` in each of
    /// its scopes, asked by the waiter of this worker for them.
    pub(crate) fn fleet_reservation(&self, lease: LeaseId, fleet: &StoreHandle) -> Reservation {
        let scopes = self
            .registry()
            .map_or_else(Vec::new, |registry| registry.fleet_terms(self.id));
        let waiter = WaiterId::of(fleet.worker, scopes.iter().map(|terms| &terms.scope));
        Reservation {
            lease,
            scopes,
            waiter,
        }
    }

    /// Applies what the store said about this request's scopes (in the
    /// reservation's order) to the local scopes.
    pub(crate) fn apply_shared_facts(&self, facts: &[SharedFacts]) {
        if let Some(registry) = self.registry() {
            registry.apply_shared_facts(self.id, facts);
        }
    }

    /// Keeps the store's lease until the request ends.
    pub(crate) fn hold_lease(&mut self, lease: HeldLease) {
        self.lease = Some(Box::new(lease));
    }

    /// Whether the request was admitted (it may be handed to the inner
    /// service): not while it waits, nor once it was failed for its
    /// bounds.
    pub(crate) fn is_sent(&self) -> bool {
        !matches!(self.stage, Stage::Queued { .. }) && !self.is_refused()
    }

    /// Resolves when the request may be sent, or was failed for its bounds
    /// (see [`take_refusal`](Self::take_refusal)).
    pub(crate) fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.is_sent() || self.is_refused() {
            return Poll::Ready(());
        }
        let Owner::Scheduler(handle) = &self.owner else {
            // On a word or a plain lane: admitted from the start.
            return Poll::Ready(());
        };
        let handle = handle.clone();
        let registry = handle.registry();
        loop {
            let (polled, waited) = registry.poll_ticket(self.id, cx.waker());
            if let Some(waited) = waited {
                self.note_scheduler_wait(waited);
            }
            let timer = match polled {
                TicketPoll::Sent { report_departure } => {
                    self.stage = Stage::Admitted {
                        report: report_departure,
                        called: false,
                    };
                    return Poll::Ready(());
                }
                TicketPoll::Refused(refusal) => {
                    // Out of the scheduler already: its place goes back.
                    self.stage = Stage::Finished;
                    self.note_refusal(refusal);
                    return Poll::Ready(());
                }
                TicketPoll::Waiting { timer: None } => return Poll::Pending,
                TicketPoll::Waiting { timer: Some(at) } => at,
            };
            let waiting = self.waiting.get_or_insert_with(Box::default);
            let wake_timer = waiting.timer.get_or_insert_with(|| WakeTimer::new(timer));
            wake_timer.aim_at(timer);
            if wake_timer.poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }

    /// Notes that the inner service has been called with the request: from
    /// now on it may have left, even if its future is never polled.
    #[inline(always)]
    pub(crate) fn note_called(&mut self) {
        self.set_called(true);
    }

    /// Notes that a request admitted at once is not handed over in the
    /// same step (it waits for the registry's store, or for its `call`).
    pub(crate) fn note_parked(&mut self) {
        self.set_called(false);
    }

    #[inline(always)]
    fn set_called(&mut self, to: bool) {
        if let Stage::Admitted { called, .. } = &mut self.stage {
            *called = to;
        }
    }

    /// Records that the inner service has the request now (the caller
    /// calls this once the hand-over is done): reads the clock, and its
    /// scopes' next gaps run from that reading. It reaches the scheduler
    /// under a lock at once only when another request of its scopes may be
    /// admitted before this one ends; otherwise [`finish`](Self::finish)
    /// brings it, under the lock it takes anyway. A no-op after the first
    /// call, and before admission. Returns the clock reading it took, if
    /// it took one.
    pub(crate) fn depart(&mut self) -> Option<Instant> {
        let Stage::Admitted { report, .. } = self.stage else {
            return None;
        };
        let instant = self.hand_over_now();
        self.depart_at(Stamp::of(instant), report);
        Some(instant)
    }

    /// The stamp of the request's departure, once it departed.
    pub(crate) fn departure_stamp(&self) -> Option<Stamp> {
        match self.stage {
            Stage::Departed { at, .. } => Some(at),
            _ => None,
        }
    }

    /// [`depart`](Self::depart) for a request whose client stamps its write
    /// ([`crate::departure`]): takes the hand-over reading the first time,
    /// and departs at the later of it and the stamp once the stamp came
    /// (`cx` is woken for it when the departure must be reported at once).
    /// Returns the clock reading it took, if it took one.
    pub(crate) fn depart_on_write(&mut self, stamp: &WriteStamp, cx: &Context<'_>) -> Option<Instant> {
        let mut reading = None;
        if let Stage::Admitted { report, .. } = self.stage {
            let instant = self.hand_over_now();
            self.stage = Stage::Handed {
                at: Stamp::of(instant),
                report,
            };
            reading = Some(instant);
        }
        let Stage::Handed { at, report } = self.stage else {
            return reading;
        };
        let written = if report { stamp.poll_get(cx) } else { stamp.get() };
        if let Some(written) = written {
            self.lease_departs(written);
            self.depart_at(at.max(Stamp::of(written)), report);
        }
        reading
    }

    /// When the request ends: a departure still waiting for its write stamp
    /// is the later of the hand-over and the stamp if it came (the
    /// completion brings it), else the hand-over.
    pub(crate) fn settle_write(&mut self, stamp: &WriteStamp) {
        if let Stage::Handed { at, .. } = self.stage {
            let written = stamp.get();
            if let Some(written) = written {
                self.lease_departs(written);
            }
            let at = written.map_or(at, |written| at.max(Stamp::of(written)));
            self.stage = Stage::Departed { at, reported: false };
        }
    }

    /// Reads the clock at the hand-over; the store's lease departs then.
    fn hand_over_now(&mut self) -> Instant {
        let instant = Instant::now();
        self.lease_departs(instant);
        instant
    }

    /// Tells the store's lease, if any, that the request left at `at` (the
    /// lease keeps the latest reading: see [`HeldLease::depart`]).
    fn lease_departs(&mut self, at: Instant) {
        if let Some(lease) = &mut self.lease {
            lease.depart(at);
        }
    }

    /// Departs at `at`: under a lock at once when `report`, else with the
    /// completion.
    fn depart_at(&mut self, at: Stamp, report: bool) {
        self.stage = Stage::Departed { at, reported: report };
        if let (true, Some(registry)) = (report, self.registry()) {
            registry.depart(self.id, at);
        }
    }

    /// Marks the request answered (or failed, or abandoned): frees what it
    /// holds and feeds latency to the registry.
    pub(crate) fn finish(&mut self, outcome: Outcome) {
        self.finish_at(outcome, None);
    }

    /// [`finish`](Self::finish), at `ended` when the caller read the clock
    /// after the request ended (the inner future answered in the very poll
    /// that handed the request over, and [`depart`](Self::depart)'s reading
    /// came after the answer: it serves for both).
    pub(crate) fn finish_at(&mut self, outcome: Outcome, ended: Option<Instant>) {
        self.end_in_registry(outcome, (ended, None), &[]);
    }

    /// [`finish`](Self::finish) at the end of the transfer of a response
    /// whose head came at `head`: the end counts from the head and reads
    /// the clock only when a waiter may go (see [`EndTiming::FromHead`]).
    #[inline]
    pub(crate) fn finish_transfer(&mut self, outcome: Outcome, head: Instant) {
        self.end_in_registry(outcome, (None, Some(head)), &[]);
    }

    /// [`finish_at`](Self::finish_at), applying first, under the same
    /// lock, the reports the feedback layers left for this request (see
    /// [`collect`](crate::registry::collect)).
    pub(crate) fn finish_reported(
        &mut self,
        outcome: Outcome,
        ended: Option<Instant>,
        collected: &[Collected],
    ) {
        if !self.end_in_registry(outcome, (ended, None), collected) {
            self.apply_reports(collected);
        }
    }

    /// Ends the request in the registry ([`Registry::end`]): on its scope's
    /// word, or as a ticket or a plain lane of the scheduler, at `ended`
    /// (a reading the caller took after the end) or counting from a
    /// transfer's `head`. False when it was finished already.
    #[inline(always)]
    fn end_in_registry(
        &mut self,
        outcome: Outcome,
        (ended, head): (Option<Instant>, Option<Instant>),
        collected: &[Collected],
    ) -> bool {
        let Some(end) = self.end(ended) else {
            return false;
        };
        let timing = match (ended, head, outcome) {
            (Some(ended), _, _) => EndTiming::Read(ended, end.stamp),
            (
                None,
                Some(head),
                Outcome::Response {
                    answered_at: Some(stamp),
                    ..
                },
            ) => EndTiming::FromHead(head, stamp),
            _ => EndTiming::Unread,
        };
        let owner = match &self.owner {
            Owner::Word(fast) => EndOwner::Word(Held::One(fast)),
            Owner::Words(fast) => EndOwner::Word(Held::Two(fast)),
            Owner::Scheduler(handle) => EndOwner::Scheduler(handle.registry(), Finishing::Ticket(self.id)),
            Owner::Plain(handle, lane) => {
                EndOwner::Scheduler(handle.registry(), Finishing::Plain(self.id, *lane))
            }
        };
        Registry::end(RequestEnd {
            owner,
            outcome,
            departed_at: end.departed_at,
            timing,
            collected,
        });
        // A queued ticket's place goes back now, once it left its queues.
        drop(end);
        true
    }

    /// Marks the handle finished and gives its store lease back; `None`
    /// when it was finished already. (Inlined: the completion path pays
    /// for no `End` moved between frames.)
    #[inline(always)]
    fn end(&mut self, ended: Option<Instant>) -> Option<End> {
        let stage = std::mem::replace(&mut self.stage, Stage::Finished);
        let (departed_at, stamp) = match stage {
            Stage::Finished => {
                self.release_lease();
                return None;
            }
            // `ended` is the departure's reading: its stamp too.
            Stage::Departed { at, reported } => ((!reported).then_some(at), ended.and(Some(at))),
            // Ended (or dropped) before its write stamp came: it may have
            // left, so it departs at its hand-over.
            Stage::Handed { at, .. } => (Some(at), ended.and(Some(at))),
            Stage::Admitted { called: true, .. } => (Some(self.depart_unpolled()), None),
            // Ended before the inner service had it: it never left, and the
            // scheduler forgets its send.
            _ => (None, None),
        };
        self.release_lease();
        Some(End {
            departed_at,
            stamp,
            _stage: stage,
        })
    }

    /// The departure of a request whose inner service was called but whose
    /// future was never polled: the service may have sent it already (not
    /// every service waits for a poll), so it departs now, the latest it
    /// can have left.
    #[cold]
    fn depart_unpolled(&mut self) -> Stamp {
        Stamp::of(self.hand_over_now())
    }

    /// Gives the store's lease back, if the request holds one (only a
    /// request through a store does).
    #[inline(always)]
    fn release_lease(&mut self) {
        if let Some(lease) = self.lease.take() {
            if let Some(fleet) = self.registry().and_then(Registry::fleet) {
                fleet.untrack(lease.id());
                fleet.in_background(fleet.store.release(lease.release(Instant::now())));
            }
        }
    }

    /// Applies the reports the feedback layers left for this request when
    /// its response head came and its body streams on: under one lock, as
    /// its end would have applied them.
    pub(crate) fn apply_head_reports(&self, collected: &[Collected]) {
        match &self.owner {
            Owner::Scheduler(handle) | Owner::Plain(handle, _) => {
                handle.registry().apply_head_reports(collected)
            }
            Owner::Word(_) | Owner::Words(_) => match self.registry_handle() {
                Some(registry) => registry.apply_head_reports(collected),
                None => self.apply_reports(collected),
            },
        }
    }

    /// Applies, under a lock of their own, reports the feedback layers left
    /// for this request's completion while it is not done (a layer inside
    /// the throttle retried).
    pub(crate) fn apply_reports(&self, collected: &[Collected]) {
        match &self.owner {
            Owner::Scheduler(handle) | Owner::Plain(handle, _) => {
                handle.registry().apply_collected_now(collected)
            }
            Owner::Word(_) | Owner::Words(_) => {
                if let Some(registry) = self.registry_handle() {
                    registry.apply_collected_now(collected);
                }
            }
        }
    }
}

/// What the scheduler needs to finish a ticket, from its handle.
struct End {
    /// The departure, when the scheduler has yet to learn it.
    departed_at: Option<Stamp>,
    /// The stamp of the caller's `ended` reading, when it has one.
    stamp: Option<Stamp>,
    /// The stage the handle left, kept until the scheduler's lock is
    /// released: a queued ticket's place goes back once it left its queues.
    _stage: Stage,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // Finished with nothing left to give back: the common case, checked
        // inline.
        if matches!(self.stage, Stage::Finished) && self.lease.is_none() {
            return;
        }
        self.finish(Outcome::NoResponse);
    }
}

mod record;

use record::Waiting;
