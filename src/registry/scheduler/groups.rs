//! Where a waiter stands in its scopes' queues: groups of waiters with the
//! same scopes, and the leaders another scope holds back (parked).
//!
//! A crawler behind an IP scope sends every page with two scopes, its
//! host's and its server's, and often queues a whole site's pages at once.
//! Two structures keep a shared scope (the server) from waiting behind
//! pages that their own host holds back, at a cost per event that does
//! not grow with the queue:
//!
//! - **Groups.** Waiters of several scopes with the same scopes form a
//!   group, first come first served (by [`OrderKey`](super::OrderKey)).
//!   Only its first, the *leader*, stands in the scopes' queues: the
//!   others could not go before it in any of their scopes anyway. When
//!   the leader goes (or leaves), the next one leads. A site's hundred pages are one entry in
//!   its server's queue, as BUbiNG keeps one entry per host in an IP's
//!   queue. One-scope waiters need no group: their scope's queue is their
//!   only one.
//! - **Parking.** A leader that another of its scopes holds back (its
//!   delay, lanes, hold, quota, or a waiter ahead of it there) is parked
//!   in its other scopes: their dispatch does not look at it, and their
//!   later waiters go past it while it could not go anyway. It stays a
//!   candidate of the scope that holds it (`held_by`), whose dispatch looks
//!   at it again when that scope allows; if another of its scopes refuses
//!   it then, it moves there. So a leader is a candidate of exactly one
//!   scope once a scope has held it, and of all of them before.
//!
//! **No starvation.** A candidate is never passed in its scope: that
//! scope's dispatch takes its candidates in order, and a waiter of another
//! scope that finds it ahead waits. A leader that every scope but one
//! admits is a candidate of that one, so it goes at that scope's next turn.
//! What parking alone allows is a leader of two busy shared scopes that is
//! refused by one each time the other lets it go (a *near miss*). After
//! [`MAX_NEAR_MISSES`] of them it stands in every one of its scopes as a
//! candidate and is parked no more: each keeps its next turn for it, so it
//! goes once both allow it at once, which nobody behind it can prevent.

use std::collections::HashMap;

use smallvec::SmallVec;
use tokio::time::Instant;

use super::ordered::Ordered;
use super::{HeldBy, Scheduler, ScopeId, TicketId};

/// How many times a leader may be refused by another of its scopes just
/// when the scope that held it let it go, before every scope of it keeps
/// its turn for it (see the module docs).
pub(super) const MAX_NEAR_MISSES: u8 = 16;

/// A ticket in no group (one scope, or not waiting).
pub(crate) const NO_GROUP: u32 = u32::MAX;

/// The scope a leader is looked at from when it is served from the global
/// queue, for [`Scheduler::hold_back`]: none (no near miss is counted).
pub(super) const NO_SCOPE: ScopeId = ScopeId::MAX;

/// The scopes of a group, sorted.
type GroupKey = SmallVec<[ScopeId; 2]>;

/// Waiters with the same scopes.
#[derive(Debug)]
pub(super) struct Group {
    key: GroupKey,
    /// Every waiter of the group, in order: the first leads.
    members: Ordered,
}

/// The groups of a scheduler.
#[derive(Debug, Default)]
pub(super) struct Groups {
    groups: slab::Slab<Group>,
    /// Keys are the scheduler's own scope ids: a fast hash, not SipHash.
    index: HashMap<GroupKey, usize, foldhash::fast::RandomState>,
}

impl Groups {
    /// The waiters of group `group`, in order.
    pub(super) fn members(&self, group: u32) -> impl Iterator<Item = TicketId> + '_ {
        self.groups[group as usize].members.ids()
    }
}

impl Scheduler {
    /// Ticket `id`, queued, starts waiting in its scopes: counted in each,
    /// a candidate of its one scope, or in its group (see the module docs).
    pub(super) fn start_waiting(&mut self, id: TicketId) {
        let ticket = &self.tickets[id];
        let order = ticket.order;
        for seat in &ticket.seats {
            self.scopes[seat.scope].count_waiter();
        }
        if let [seat] = ticket.seats.as_slice() {
            let scope = seat.scope;
            let entry = &mut self.scopes[scope];
            entry.add_candidate(order, id);
            // Behind another candidate of a scope whose head waits for an
            // event (a lane, a departure, another scope: no timer), it
            // changes nothing the scope's last look decided. A new head,
            // or a time limit that may be due, needs a look.
            let is_head = entry.queue().first().is_some_and(|(first, _)| first == order);
            if is_head || entry.timer_owner().is_some() {
                self.dirty.push(scope);
            }
            return;
        }
        let mut key: GroupKey = ticket.seats.iter().map(|seat| seat.scope).collect();
        key.sort_unstable();
        let groups = &mut self.groups;
        let group = match groups.index.get(&key) {
            Some(&group) => group,
            None => {
                let group = groups.groups.insert(Group {
                    key: key.clone(),
                    members: Ordered::default(),
                });
                groups.index.insert(key, group);
                group
            }
        };
        let members = &mut groups.groups[group].members;
        let leader = members.first();
        members.insert(order, id);
        self.tickets[id].group = group as u32;
        match leader {
            Some((first, _)) if first < order => {}
            Some((_, leader)) => {
                // A higher priority leads from now on.
                self.withdraw(leader);
                self.lead(id);
            }
            None => self.lead(id),
        }
    }

    /// Ticket `id`, waiting, stops waiting (sent, or gone): uncounted, out
    /// of its scopes' queues; the next of its group leads.
    pub(super) fn stop_waiting(&mut self, id: TicketId) {
        let ticket = &self.tickets[id];
        let order = ticket.order;
        for seat in &ticket.seats {
            let scope = &mut self.scopes[seat.scope];
            scope.uncount_waiter();
            self.dirty.push(seat.scope);
        }
        let group = ticket.group;
        if group == NO_GROUP {
            let scope = ticket.seats.as_slice()[0].scope;
            self.scopes[scope].remove_waiter(&order);
            self.clear_timer_of(scope, id);
            return;
        }
        self.tickets[id].group = NO_GROUP;
        let members = &mut self.groups.groups[group as usize].members;
        let led = members.first().is_some_and(|(_, leader)| leader == id);
        members.remove(order);
        let next = members.first().map(|(_, next)| next);
        if !led {
            return;
        }
        self.withdraw(id);
        match next {
            Some(next) => self.lead(next),
            None => {
                let gone = self.groups.groups.remove(group as usize);
                self.groups.index.remove(&gone.key);
            }
        }
    }

    /// Ticket `id` leads its group: a candidate of every one of its scopes,
    /// which look at it.
    fn lead(&mut self, id: TicketId) {
        let ticket = &mut self.tickets[id];
        ticket.held_by = HeldBy::NONE;
        ticket.near_misses = 0;
        let order = ticket.order;
        for seat in &ticket.seats {
            self.scopes[seat.scope].add_candidate(order, id);
            self.dirty.push(seat.scope);
        }
    }

    /// Whether waiting ticket `id` stands in its scopes' queues: it has one
    /// scope, or it leads its group (a later waiter of higher priority may
    /// have taken the lead, see [`start_waiting`](Self::start_waiting)).
    pub(super) fn stands_in_queues(&self, id: TicketId) -> bool {
        match self.tickets[id].group {
            NO_GROUP => true,
            group => self.groups.members(group).next() == Some(id),
        }
    }

    /// Ticket `id` leads no more: out of its scopes' queues and timers.
    fn withdraw(&mut self, id: TicketId) {
        let order = self.tickets[id].order;
        let scopes: SmallVec<[ScopeId; 2]> = self.tickets[id].seats.iter().map(|seat| seat.scope).collect();
        for scope in scopes {
            self.scopes[scope].remove_waiter(&order);
            self.clear_timer_of(scope, id);
        }
    }

    /// Leader `id`, found held back by scope `holder` in the dispatch of
    /// scope `looking`, moves: a candidate of `holder`, parked in its other
    /// scopes. Counts a near miss when `looking` was what held it; past
    /// [`MAX_NEAR_MISSES`] it stays a candidate everywhere instead. Whether
    /// it was parked in `looking` (false: `looking` keeps its turn for it).
    pub(super) fn hold_back(&mut self, id: TicketId, holder: ScopeId, looking: ScopeId) -> bool {
        let ticket = &mut self.tickets[id];
        if ticket.held_by.get() == Some(looking) {
            ticket.near_misses = ticket.near_misses.saturating_add(1);
        }
        let Some(held_by) = HeldBy::scope(holder).filter(|_| ticket.near_misses < MAX_NEAR_MISSES) else {
            self.stand_everywhere(id);
            return false;
        };
        let before = std::mem::replace(&mut ticket.held_by, held_by).get();
        let order = ticket.order;
        let scopes: SmallVec<[ScopeId; 2]> = ticket.seats.iter().map(|seat| seat.scope).collect();
        for scope in scopes {
            let was_candidate = before.is_none_or(|held| held == scope);
            let is_candidate = scope == holder;
            if was_candidate && !is_candidate {
                self.scopes[scope].park(order, id);
                self.clear_timer_of(scope, id);
            } else if is_candidate && !was_candidate {
                self.scopes[scope].add_candidate(order, id);
                self.dirty.push(scope);
            }
        }
        true
    }

    /// Leader `id` is a candidate of every one of its scopes from now on
    /// (each keeps its turn for it).
    fn stand_everywhere(&mut self, id: TicketId) {
        let ticket = &mut self.tickets[id];
        let Some(held) = std::mem::replace(&mut ticket.held_by, HeldBy::NONE).get() else {
            return;
        };
        let order = ticket.order;
        for seat in &ticket.seats {
            if seat.scope != held {
                self.scopes[seat.scope].add_candidate(order, id);
                self.dirty.push(seat.scope);
            }
        }
    }

    /// Forgets scope `scope`'s timer if ticket `id` kept it: the scope
    /// looks at its waiters again, and its next candidate keeps it.
    fn clear_timer_of(&mut self, scope: ScopeId, id: TicketId) {
        let entry = &mut self.scopes[scope];
        if matches!(entry.timer_owner(), Some((owner, _)) if owner == id) {
            entry.set_timer_owner(None);
            self.dirty.push(scope);
        }
    }

    /// When the oldest request waiting for scope `scope` other than
    /// `leaving` came (candidates, parked leaders and their groups).
    pub(super) fn oldest_waiter_since(&self, scope: ScopeId, leaving: TicketId) -> Option<Instant> {
        let entry = &self.scopes[scope];
        let mut oldest: Option<Instant> = None;
        let mut note = |waiter: TicketId| {
            if waiter != leaving {
                let came = self.tickets[waiter].enqueued_at;
                oldest = Some(oldest.map_or(came, |oldest| oldest.min(came)));
            }
        };
        for waiter in entry.queue().ids().chain(entry.parked().values().copied()) {
            match self.tickets[waiter].group {
                NO_GROUP => note(waiter),
                group => self.groups.members(group).for_each(&mut note),
            }
        }
        oldest
    }
}
