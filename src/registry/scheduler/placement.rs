//! The scheduler's side of a sharded registry (see
//! [`shards`](crate::registry::shards)): what a home shard gives the joint
//! shard when a request of several scopes names one of its scopes, and
//! what it remembers of the scopes it gave away.

use tokio::time::Instant;

use super::{Scheduler, ScopeEntry, ScopeId, WakeList};
use crate::registry::scope_state::ScopeState;
use crate::registry::shards::{home_of, Placement, JOINT};
use crate::scope::Scope;

/// What a home shard gives the joint shard of a scope.
#[derive(Debug)]
pub(crate) enum GiveAway {
    /// It held nothing of the scope: the joint shard makes it.
    Nothing,
    /// The scope's state, nothing of it in flight or waiting.
    State(ScopeState),
    /// Later: its requests at home are not done (the scope is leaving).
    Later,
}

impl Scheduler {
    /// Where scope `name` is, if this home shard gave it away.
    #[inline(always)]
    pub(crate) fn placement(&self, name: &str) -> Option<Placement> {
        if self.elsewhere.is_empty() {
            return None;
        }
        self.elsewhere.get(name).copied()
    }

    /// Whether updates of scope `name` (feedback, a hold, a config
    /// change) are this shard's: it holds the scope, and not as a
    /// placeholder for a scope still leaving its home.
    pub(crate) fn updates(&self, name: &str) -> bool {
        self.index
            .get(name, &self.scopes)
            .is_some_and(|id| !self.scopes[id].state.arriving)
    }

    /// Whether this shard holds scope `name`.
    pub(crate) fn holds(&self, name: &str) -> bool {
        self.index.get(name, &self.scopes).is_some()
    }

    /// (A home.) Gives scope `name` to the joint shard, which a request
    /// of several scopes needs it in: its state now if nothing of it is in
    /// flight or waiting here, else later (it leaves once they are done,
    /// and takes no new request meanwhile).
    pub(crate) fn give_away(&mut self, name: &Scope) -> GiveAway {
        debug_assert_ne!(self.shard, JOINT, "the joint shard keeps its scopes");
        let Some(id) = self.index.get(name.as_str(), &self.scopes) else {
            self.elsewhere.insert(name.clone(), Placement::Joint);
            return GiveAway::Nothing;
        };
        if self.done_here(id) && self.scopes[id].fast.as_ref().is_none_or(|fast| fast.retire()) {
            self.elsewhere.insert(name.clone(), Placement::Joint);
            return GiveAway::State(self.remove_scope(id));
        }
        // Its word's requests in flight count as the scheduler's from now.
        self.close_fast(id);
        self.scopes[id].state.leaving = true;
        self.leaving.push(id);
        self.moving = true;
        self.elsewhere.insert(name.clone(), Placement::Leaving);
        GiveAway::Later
    }

    /// Whether nothing of scope `id` is in flight or waiting here (a word
    /// may still hold requests: see `give_away`).
    fn done_here(&self, id: ScopeId) -> bool {
        let entry = &self.scopes[id];
        !entry.has_waiters() && entry.state.in_flight == 0
    }

    /// Takes scope `id` out of this shard, and returns its state.
    fn remove_scope(&mut self, id: ScopeId) -> ScopeState {
        self.index.remove(id, &self.scopes);
        let entry = self.scopes.remove(id);
        if self.last_one_scope == id {
            self.last_one_scope = ScopeId::MAX;
        }
        if let Some(across) = &self.across {
            across.scopes_changed(-1);
        }
        let mut state = entry.state;
        // The eviction marks are the shard's, not the scope's.
        state.evictable = false;
        state.referenced = false;
        state.leaving = false;
        state
    }

    /// (A home.) Whether some scope of this shard is leaving.
    #[inline(always)]
    pub(crate) fn has_leaving(&self) -> bool {
        !self.leaving.is_empty()
    }

    /// (A home.) The leaving scopes whose requests here are done: the
    /// joint shard takes their state next (see
    /// [`hand_over_drained`](Self::hand_over_drained)).
    pub(crate) fn drained(&self) -> Vec<Scope> {
        self.leaving
            .iter()
            .filter(|&&id| self.done_here(id))
            .map(|&id| self.scopes[id].state.key.clone())
            .collect()
    }

    /// (A home, under the joint shard's lock.) The state of leaving scope
    /// `key`, if its requests here are done; it is the joint shard's from
    /// now.
    pub(crate) fn hand_over_drained(&mut self, key: &Scope) -> Option<ScopeState> {
        let id = self.index.get(key.as_str(), &self.scopes)?;
        if !self.scopes[id].state.leaving || !self.done_here(id) {
            return None;
        }
        if let Some(fast) = &self.scopes[id].fast {
            // Closed when the scope began leaving, and empty now.
            fast.retire();
        }
        self.leaving.retain(|&leaving| leaving != id);
        self.elsewhere.insert(key.clone(), Placement::Joint);
        Some(self.remove_scope(id))
    }

    /// (The joint shard.) Takes scope `key` as its home gave it.
    pub(crate) fn receive(&mut self, key: &Scope, given: GiveAway, now: Instant) {
        match given {
            GiveAway::Nothing => {}
            GiveAway::State(state) => {
                self.insert_moved(state, now);
            }
            GiveAway::Later => {
                let id = self.scope_id_named(key.as_str(), || key.clone(), now);
                self.scopes[id].state.arriving = true;
                // Counted by its home until it arrives.
                self.arriving += 1;
                if let Some(across) = &self.across {
                    across.scopes_changed(-1);
                }
            }
        }
    }

    /// (The joint shard.) Arriving scope `state.key`'s state came: its
    /// waiters here go as it allows.
    pub(crate) fn install(&mut self, mut state: ScopeState, now: Instant, wake: &mut WakeList) {
        state.arriving = false;
        let Some(id) = self.index.get(state.key.as_str(), &self.scopes) else {
            // An arriving scope is never evicted; kept for safety.
            self.insert_moved(state, now);
            return;
        };
        let entry = &mut self.scopes[id];
        if entry.state.arriving {
            self.arriving -= 1;
            if let Some(across) = &self.across {
                across.scopes_changed(1);
            }
        }
        state.evictable = entry.state.evictable;
        state.referenced = entry.state.referenced;
        entry.state = state;
        if entry.has_waiters() {
            self.dirty.push(id);
        }
        self.run_dispatch(now, wake);
        self.note_if_idle(id, crate::time::Stamp::of(now));
    }

    /// A scope that came from another shard, with its state.
    fn insert_moved(&mut self, state: ScopeState, now: Instant) -> ScopeId {
        self.make_room(now);
        let id = self.scopes.insert(ScopeEntry::new(state));
        self.index.insert(id, &self.scopes);
        if let Some(across) = &self.across {
            across.scopes_changed(1);
            self.note_scope_made();
        }
        id
    }

    /// Notes that this shard evicted scope `key`: counted, and, in the
    /// joint shard, its home must hold it again (see
    /// [`take_unplaced`](Self::take_unplaced)).
    pub(super) fn forget_placement(&mut self, key: &Scope) {
        let Some(across) = &self.across else {
            return;
        };
        across.scopes_changed(-1);
        if self.shard == JOINT && home_of(key.as_str(), across.shards()) != JOINT {
            self.unplaced.push(key.clone());
            self.moving = true;
        }
    }

    /// (The joint shard.) The scopes it evicted whose homes gave them
    /// away, and that it did not make again since.
    pub(crate) fn take_unplaced(&mut self) -> Vec<Scope> {
        let mut unplaced = std::mem::take(&mut self.unplaced);
        unplaced.retain(|key| !self.holds(key.as_str()));
        unplaced
    }

    /// Whether this lock's epilogue has work (several shards only): scopes
    /// move to or from this shard (some leave it, or the joint shard
    /// evicted scopes of other homes), this operation made a scope (which
    /// `max_scopes` may want room for), or eviction work is due in some
    /// shard.
    #[inline(always)]
    pub(crate) fn needs_epilogue(&mut self, now: Instant) -> bool {
        if self.across.is_none() {
            return false;
        }
        self.moving || self.made_scope() || self.sweep_due(now)
    }

    /// (In the lock's epilogue.) Notes whether scopes still move (see
    /// [`needs_epilogue`](Self::needs_epilogue)).
    pub(crate) fn note_moving(&mut self) {
        self.moving = !(self.leaving.is_empty() && self.unplaced.is_empty());
    }

    /// (The joint shard.) Whether it evicted scopes of other homes.
    #[inline(always)]
    pub(crate) fn has_unplaced(&self) -> bool {
        !self.unplaced.is_empty()
    }

    /// (A home.) Scope `key` was evicted from the joint shard: this home
    /// holds it again from its next request.
    pub(crate) fn take_back(&mut self, key: &Scope) {
        if self.elsewhere.get(key.as_str()) == Some(&Placement::Joint) {
            self.elsewhere.remove(key.as_str());
        }
    }
}
