//! A request's place in the scheduler, from queued to finished: its order
//! among waiters and its seat (scope and lane) in each of its scopes.

use std::cmp::Reverse;
use std::task::Waker;

use tokio::time::Instant;

use crate::scope::Scope;
use crate::time::Stamp;
use crate::waited::{CauseKey, WaitPart};

/// Index of a scope in the scheduler.
pub(crate) type ScopeId = usize;
/// Index of a ticket in the scheduler.
pub(crate) type TicketId = usize;

/// Position of a waiter: higher priority first, then arrival order. The
/// order is global (one sequence for all scopes), so two waiters are in the
/// same relative order in every scope they share, which is what makes
/// all-or-nothing admission deadlock-free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct OrderKey {
    pub(crate) priority: Reverse<i32>,
    pub(crate) seq: u64,
}

/// A ticket's place in one of its scopes: the scope, and the lane it took
/// there once sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seat {
    pub(crate) scope: ScopeId,
    pub(crate) lane: usize,
    /// The request's expected quota cost in this scope.
    pub(crate) cost: f64,
    /// What to put back if the request never leaves, once the scheduler's
    /// send took its lane ([`SendsBefore::KEEP`] until then, and for a
    /// plain lane).
    pub(crate) before: SendsBefore,
}

/// What a request's admission replaced in its scope: the instants of the
/// scope's and the lane's last sends before it. They are put back if the
/// request never leaves (it is dropped, or its inner service fails to get
/// ready, before the inner service is called): the site saw nothing, so no
/// gap may run from it. (The jitter draws stay: a fresh draw for the gap
/// after a send is as good as the first. Two instants keep a waiting
/// request's seat within its memory budget.)
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendsBefore {
    pub(crate) scope: Option<Stamp>,
    pub(crate) lane: Stamp,
}

impl SendsBefore {
    /// For a seat whose lane was not taken by
    /// the scheduler's send (a plain lane, or none
    /// yet): nothing to put back.
    pub(crate) const KEEP: SendsBefore = SendsBefore {
        scope: None,
        lane: Stamp::LATEST,
    };
}

/// The seats of a ticket, inline for the common one-scope request.
#[derive(Debug)]
pub(crate) enum Seats {
    One([Seat; 1]),
    Many(Vec<Seat>),
}

impl Seats {
    pub(crate) fn from_iter(mut seats: impl ExactSizeIterator<Item = Seat>) -> Self {
        match (seats.len(), seats.next()) {
            (1, Some(seat)) => Seats::One([seat]),
            (_, first) => Seats::Many(first.into_iter().chain(seats).collect()),
        }
    }

    pub(crate) fn as_slice(&self) -> &[Seat] {
        match self {
            Seats::One(one) => one,
            Seats::Many(many) => many,
        }
    }

    pub(crate) fn iter(&self) -> std::slice::Iter<'_, Seat> {
        match self {
            Seats::One(one) => one.iter(),
            Seats::Many(many) => many.iter(),
        }
    }

    pub(crate) fn iter_mut(&mut self) -> std::slice::IterMut<'_, Seat> {
        match self {
            Seats::One(one) => one.iter_mut(),
            Seats::Many(many) => many.iter_mut(),
        }
    }
}

impl<'a> IntoIterator for &'a Seats {
    type Item = &'a Seat;
    type IntoIter = std::slice::Iter<'a, Seat>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// Where a ticket stands in the scheduler: the one record of whether its
/// request was admitted and whether it has left.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(crate) enum Status {
    /// Waiting for its scopes.
    Queued,
    /// Admitted (a lane taken in each scope, counted in flight), not yet
    /// known to have left: its scopes count it as *undeparted*.
    /// `report_departure`: whether its own future must report the
    /// departure as soon as it happens (see [`TicketPoll::Sent`]).
    Admitted { report_departure: bool },
    /// Handed to the inner service at this instant.
    Departed(Stamp),
}

impl Status {}

#[derive(Debug)]
pub(crate) struct TicketState {
    pub(crate) order: OrderKey,
    pub(crate) seats: Seats,
    pub(crate) status: Status,
    pub(crate) waker: Option<Waker>,
    /// Times another of its scopes refused it just as the scope that held
    /// it let it go (see `scheduler/groups.rs`).
    pub(crate) near_misses: u8,
    /// Its group of waiters with the same scopes, while it waits with
    /// several (`NO_GROUP` otherwise).
    pub(crate) group: u32,
    /// The scope that held this waiter back at its last evaluation.
    pub(crate) held_by: HeldBy,
    pub(crate) in_global_queue: bool,
    /// Whether it was woken to look at its bound again (with every bounded
    /// waiter of a scope whose limits changed) and has not looked yet.
    pub(crate) bounds_woken: bool,
    /// Whether it is in its scopes' queues (counted among the waiting).
    pub(crate) waiting: bool,
    /// Whether it was sent while one of its several scopes was cold: it
    /// then opens a connection, and counts as opening in each of its
    /// scopes until it ends (see `ScopeState::first_answer_pending`).
    pub(crate) opens_connection: bool,
    pub(crate) enqueued_at: Instant,
}

/// The scope that held a waiter back at its last evaluation, if any, in
/// four bytes (a waiting request's memory is budgeted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeldBy(u32);

impl HeldBy {
    /// Held by no scope known (never looked at, or a candidate of all its
    /// scopes).
    pub(crate) const NONE: HeldBy = HeldBy(u32::MAX);

    /// Held by `scope`; `None` for an id beyond four bytes' range (never:
    /// that many scopes would not fit in memory), which the caller treats
    /// as not knowing.
    pub(crate) fn scope(scope: ScopeId) -> Option<HeldBy> {
        u32::try_from(scope).ok().filter(|&id| id != u32::MAX).map(HeldBy)
    }

    /// The scope, if any.
    pub(crate) fn get(self) -> Option<ScopeId> {
        (self != HeldBy::NONE).then_some(self.0 as ScopeId)
    }
}

/// The parts of a wait by cause: inline for the usual one or two.
pub(crate) type WaitParts = smallvec::SmallVec<[WaitPart; 2]>;

/// What a request that waited learnt at its admission: why it waited,
/// from its arrival (`enqueued_at`) to `admitted_at`.
#[derive(Debug)]
pub(crate) struct WaitedInScheduler {
    pub(crate) parts: WaitParts,
    pub(crate) admitted_at: Instant,
}

/// How a sent request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The inner service answered with this status. `answered_at`: when
    /// the response head arrived, when the request ends later (its body
    /// was still streaming): the latency runs to the head, not to the end.
    Response {
        status: u16,
        adjust_autothrottle: bool,
        answered_at: Option<Stamp>,
    },
    /// The inner service failed, or the future was dropped.
    NoResponse,
}

/// Why the registry failed a request for its bounds (see
/// `scheduler/bounds.rs`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Refusal {
    /// Its prediction was past its `bound`: the wait it predicted, what
    /// accounts for most of it and whether it was exact; `waited`: what
    /// it waited before (by cause), when the bound itself passed while it
    /// waited.
    WouldWait {
        wait: std::time::Duration,
        cause: Option<CauseKey>,
        exact: bool,
        bound: std::time::Duration,
        waited: Option<WaitParts>,
    },
    /// Its scope had `max_waiting` requests waiting already.
    QueueFull { scope: Scope, max_waiting: usize },
}

impl Refusal {
    /// A request whose prediction at `now` is `forecast`, past its `bound`.
    pub(crate) fn would_wait(
        forecast: ScopeForecastView,
        now: Instant,
        bound: std::time::Duration,
        waited: Option<WaitParts>,
    ) -> Self {
        Refusal::WouldWait {
            wait: forecast.0.saturating_duration_since(now),
            cause: forecast.1,
            exact: forecast.2,
            bound,
            waited,
        }
    }
}

/// A forecast as a refusal keeps it: the instant, the cause, whether it is
/// exact.
pub(crate) type ScopeForecastView = (Instant, Option<CauseKey>, bool);

/// The result of polling a ticket.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TicketPoll {
    /// The request may be sent now (it is counted in flight). The caller
    /// reads the clock once the inner service has it (the departure) and
    /// gives that instant to the scheduler: at once, under a lock of its
    /// own, when `report_departure` (another request of one of its scopes
    /// could be admitted before this one ends, and must time its gap from
    /// this departure); otherwise with [`finish`](super::Scheduler::finish),
    /// which it takes anyway.
    Sent { report_departure: bool },
    /// Still waiting; keep a timer until this instant, if any.
    Waiting { timer: Option<Instant> },
    /// Failed for its bound: it left the scheduler. (Boxed: polls that
    /// wait move this enum, and a refusal is rare.)
    Refused(Box<Refusal>),
}

/// Wakers to call once the lock is released.
pub(crate) type WakeList = Vec<Waker>;
