//! A scope as the scheduler keeps it: its state, its waiters and its
//! timer, sized for a million idle scopes.

use std::collections::BTreeMap;

use std::sync::Arc;

use tokio::time::Instant;

use super::ordered::Ordered;
use super::wait_log::WaitLog;
use super::{OrderKey, ScopeState, TicketId};
use crate::registry::fast_path::{latency_of, FastScope};
use crate::registry::scope_state::OnWord;
use crate::time::Stamp;
use crate::waited::CauseKey;

/// A scope as the scheduler keeps it: its state, and its waiters.
///
/// Sized for a million idle scopes: the waiters live behind a pointer that
/// is null while the scope has none, and instants are 8-byte stamps.
#[derive(Debug)]
pub(crate) struct ScopeEntry {
    pub(crate) state: ScopeState,
    /// Allocated when a first request waits, dropped when the scope goes
    /// idle.
    pub(super) waiters: Option<Box<Waiters>>,
    /// Since when nothing of the scope has been in flight or queued.
    pub(super) idle_since: Option<Stamp>,
    // (Whether the scope is an eviction candidate, and was used since it
    // joined, are in `state`, where two bytes of padding hold them.)
    /// The scope's lock-free word, once it was opened (see
    /// [`fast_path`](crate::registry::fast_path)).
    pub(crate) fast: Option<Arc<FastScope>>,
}

/// The requests waiting for a scope, and its timer.
///
/// A waiter of several scopes stands here only while it leads its group
/// (the waiters with the same scopes, see `scheduler/groups.rs`). While
/// another of its scopes holds it back it is *parked* here: this scope's
/// dispatch does not look at it, and later waiters go past it, because it
/// could not go anyway. The scope that holds it has it among its
/// candidates, and puts it back here when it lets it go and this scope
/// does not.
#[derive(Debug, Default)]
pub(super) struct Waiters {
    /// The candidates, in order: the waiters this scope's dispatch looks
    /// at (its one-scope waiters, and the groups' leaders no other scope
    /// is known to hold back).
    pub(super) queue: Ordered,
    /// Groups' leaders that another of their scopes holds back.
    pub(super) parked: BTreeMap<OrderKey, TicketId>,
    /// Every request waiting for this scope: candidates, parked leaders,
    /// and the members of its groups behind their leaders.
    pub(super) count: usize,
    /// The waiter told to keep the scope's timer, and the instant the
    /// scope's own time limits next let its head go.
    pub(super) timer_owner: Option<(TicketId, Instant)>,
    /// What held the queue, since its oldest waiter came.
    pub(super) log: WaitLog,
}

/// The candidates and the parked leaders of a scope nobody waits for.
static NO_CANDIDATES: Ordered = Ordered::NONE;
static NO_WAITERS: BTreeMap<OrderKey, TicketId> = BTreeMap::new();

impl ScopeEntry {
    pub(super) fn new(state: ScopeState) -> Self {
        ScopeEntry {
            state,
            waiters: None,
            idle_since: None,
            fast: None,
        }
    }

    /// What a forecast of the scope knows of the requests its lock-free
    /// word admitted (see `scope_state/forecast.rs`).
    pub(crate) fn on_word(&self) -> OnWord {
        let Some(fast) = &self.fast else {
            return OnWord::NONE;
        };
        let open = fast.is_open();
        OnWord {
            in_flight: if open { fast.in_flight() } else { 0 },
            latency: open.then(|| latency_of(fast.latency())).flatten(),
            opened_at: fast.opened_at().map(Stamp::instant),
        }
    }

    /// The scope's word, while it is open.
    pub(crate) fn open_fast(&self) -> Option<&FastScope> {
        self.fast.as_deref().filter(|fast| fast.is_open())
    }

    /// Requests waiting for this scope.
    #[inline]
    pub(crate) fn queued(&self) -> usize {
        self.waiters.as_ref().map_or(0, |waiters| waiters.count)
    }

    /// The candidates, in order (see [`Waiters`]).
    pub(super) fn queue(&self) -> &Ordered {
        self.waiters
            .as_ref()
            .map_or(&NO_CANDIDATES, |waiters| &waiters.queue)
    }

    /// The parked leaders, in order (see [`Waiters`]).
    pub(super) fn parked(&self) -> &BTreeMap<OrderKey, TicketId> {
        self.waiters
            .as_ref()
            .map_or(&NO_WAITERS, |waiters| &waiters.parked)
    }

    /// Whether any request waits for this scope, parked or not.
    #[inline]
    pub(super) fn has_waiters(&self) -> bool {
        self.queued() > 0
    }

    /// Whether a waiter stands among this scope's candidates.
    pub(super) fn has_candidates(&self) -> bool {
        !self.queue().is_empty()
    }

    /// One more request waits for this scope.
    pub(super) fn count_waiter(&mut self) {
        self.waiters.get_or_insert_with(Box::default).count += 1;
    }

    /// One request fewer waits for this scope.
    pub(super) fn uncount_waiter(&mut self) {
        if let Some(waiters) = self.waiters.as_mut() {
            waiters.count -= 1;
        }
    }

    /// Makes waiter `order` a candidate (out of the parked, if there).
    pub(super) fn add_candidate(&mut self, order: OrderKey, id: TicketId) {
        let waiters = self.waiters.get_or_insert_with(Box::default);
        if !waiters.parked.is_empty() {
            waiters.parked.remove(&order);
        }
        waiters.queue.insert(order, id);
    }

    /// Parks waiter `order` (out of the candidates, if there).
    pub(super) fn park(&mut self, order: OrderKey, id: TicketId) {
        let waiters = self.waiters.get_or_insert_with(Box::default);
        waiters.queue.remove(order);
        waiters.parked.insert(order, id);
    }

    /// Takes waiter `order` out of the candidates and the parked; whether
    /// it was a candidate.
    pub(super) fn remove_waiter(&mut self, order: &OrderKey) -> bool {
        self.waiters.as_mut().is_some_and(|waiters| {
            if !waiters.parked.is_empty() {
                waiters.parked.remove(order);
            }
            // Usually the first: sent, or gone after a wait as long as
            // everyone's ahead of it.
            waiters.queue.remove(*order).is_some()
        })
    }

    /// Notes that `key` holds the queue from `now` on; forgets the log
    /// when nobody waits.
    pub(super) fn note_wait(&mut self, now: Instant, key: Option<CauseKey>) {
        let Some(waiters) = self.waiters.as_mut() else {
            return;
        };
        match key {
            Some(key) if waiters.count > 0 => waiters.log.note(now, key),
            _ => waiters.log.clear(),
        }
    }

    /// What held the queue (empty without waiters).
    pub(super) fn wait_log(&self) -> Option<&WaitLog> {
        self.waiters.as_ref().map(|waiters| &waiters.log)
    }

    /// The log, to trim.
    pub(super) fn wait_log_mut(&mut self) -> Option<&mut WaitLog> {
        self.waiters.as_mut().map(|waiters| &mut waiters.log)
    }

    pub(super) fn timer_owner(&self) -> Option<(TicketId, Instant)> {
        self.waiters.as_ref().and_then(|waiters| waiters.timer_owner)
    }

    pub(super) fn set_timer_owner(&mut self, owner: Option<(TicketId, Instant)>) {
        // Clearing the timer of a scope without waiter storage allocates
        // nothing.
        if owner.is_some() || self.waiters.is_some() {
            self.waiters.get_or_insert_with(Box::default).timer_owner = owner;
        }
    }

    /// Since when nothing of the scope has been in flight or queued.
    pub(crate) fn idle_since(&self) -> Option<Instant> {
        self.idle_since.map(Stamp::instant)
    }
}
