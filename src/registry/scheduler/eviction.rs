//! Idle-scope eviction: memory follows the active scopes, not every scope
//! ever seen.
//!
//! A scope is *idle* when nothing of it is in flight or queued. Idle scopes
//! join a queue of eviction candidates, oldest first. Each request that
//! arrives looks at a few candidates at the front (never more than
//! [`MAX_LOOKS`]), so the cost is amortised over requests and nothing ever
//! scans every scope. A candidate is dropped when it has been idle for
//! `idle_ttl`, or when the registry holds `max_scopes` scopes, unless its
//! state still limits it (see [`ScopeState::may_be_forgotten`]); then it
//! goes back to the end of the queue. A candidate used again since it
//! joined also goes back to the end (a second chance), so under pressure
//! the least recently used idle scopes go first.

use std::time::Duration;

use tokio::time::Instant;

use super::{Scheduler, ScopeId};
use crate::registry::time::saturating_add;

/// Default time an idle scope is kept.
pub const DEFAULT_IDLE_TTL: Duration = Duration::from_secs(3600);
/// Default number of scopes past which idle ones are evicted first.
pub const DEFAULT_MAX_SCOPES: usize = 100_000;

/// How many candidates one arriving request looks at, at most.
const MAX_LOOKS: usize = 8;

/// The eviction settings and candidates of a scheduler.
#[derive(Debug)]
pub(crate) struct Eviction {
    pub(crate) idle_ttl: Duration,
    pub(crate) max_scopes: usize,
    /// Idle scopes, each with the instant it joined (so in that order); a
    /// scope is here at most once.
    candidates: std::collections::VecDeque<(ScopeId, Instant)>,
    /// Scopes evicted since the registry was built.
    pub(crate) evicted: u64,
}

impl Eviction {
    pub(crate) fn new(idle_ttl: Duration, max_scopes: usize) -> Self {
        Eviction {
            idle_ttl,
            max_scopes,
            candidates: std::collections::VecDeque::new(),
            evicted: 0,
        }
    }
}

impl Scheduler {
    /// Notes that scope `id` may have become idle at `now`.
    pub(super) fn note_if_idle(&mut self, id: ScopeId, now: Instant) {
        let Some(scope) = self.scopes.get_mut(id) else {
            return;
        };
        if scope.state.in_flight > 0 || !scope.queue.is_empty() {
            return;
        }
        if scope.idle_since.is_none() {
            scope.idle_since = Some(now);
        }
        if !scope.evictable {
            scope.evictable = true;
            self.eviction.candidates.push_back((id, now));
        }
    }

    /// Notes that scope `id` is in use again.
    pub(super) fn note_busy(&mut self, id: ScopeId) {
        self.scopes[id].idle_since = None;
    }

    /// Evicts idle scopes that have had their time, looking at a few
    /// candidates at most. Called before a request is queued, when no scope
    /// is dirty.
    pub(super) fn evict_expired(&mut self, now: Instant) {
        debug_assert!(self.dirty.is_empty(), "eviction runs between operations");
        for _ in 0..MAX_LOOKS {
            let Some(&(id, joined)) = self.eviction.candidates.front() else {
                return;
            };
            if saturating_add(joined, self.eviction.idle_ttl) > now {
                return;
            }
            self.eviction.candidates.pop_front();
            self.look_at_candidate(id, joined, false, now);
        }
    }

    /// Makes room for a new scope when the registry holds `max_scopes`:
    /// evicts the least recently used idle scopes, looking at a few
    /// candidates at most. Called only when a scope is about to be created,
    /// before anything is dirty; every scope the current operation uses is
    /// already marked busy, so none of them can go.
    pub(super) fn make_room(&mut self, now: Instant) {
        debug_assert!(self.dirty.is_empty(), "eviction runs between operations");
        for _ in 0..MAX_LOOKS {
            if self.scopes.len() < self.eviction.max_scopes {
                return;
            }
            let Some((id, joined)) = self.eviction.candidates.pop_front() else {
                return;
            };
            self.look_at_candidate(id, joined, true, now);
        }
    }

    fn look_at_candidate(&mut self, id: ScopeId, joined: Instant, full: bool, now: Instant) {
        let ttl = self.eviction.idle_ttl;
        let Some(scope) = self.scopes.get_mut(id) else {
            return;
        };
        let Some(idle_since) = scope.idle_since else {
            // Busy again: it comes back when it is idle.
            scope.evictable = false;
            return;
        };
        let expired = saturating_add(idle_since, ttl) <= now;
        let used_since_it_joined = idle_since > joined;
        let may_go = (expired || (full && !used_since_it_joined)) && scope.state.may_be_forgotten(now, full);
        if !may_go {
            // Looked at again one `idle_ttl` from now at the earliest (or
            // under pressure), so a scope kept for its state costs one look
            // per `idle_ttl`, not one per request.
            self.eviction.candidates.push_back((id, now));
            return;
        }
        let scope = self.scopes.remove(id);
        self.index.remove(scope.state.key.as_str());
        self.eviction.evicted += 1;
        self.metrics.evicted(&scope.state.key);
        tracing::trace!(
            target: "tower_throttle",
            scope = %scope.state.key,
            idle_ms = now.saturating_duration_since(idle_since).as_millis() as u64,
            "idle scope evicted"
        );
    }

    /// Scopes evicted since the registry was built.
    pub(crate) fn evictions(&self) -> u64 {
        self.eviction.evicted
    }

    /// Scopes the registry holds now.
    pub(crate) fn scopes_tracked(&self) -> usize {
        self.scopes.len()
    }
}
