//! Idle-scope eviction: memory follows the active scopes, not every scope
//! ever seen.
//!
//! A scope is *idle* when nothing of it is in flight or queued. Idle scopes
//! join a queue of eviction candidates, oldest first. Each request that
//! arrives looks at a few candidates at the front (never more than
//! [`MAX_LOOKS`]), so the cost is amortised over requests and nothing ever
//! scans every scope. A candidate is dropped when it has been idle for
//! `idle_ttl`, or when the registry holds `max_scopes` scopes, unless its
//! state still limits it (see [`ScopeState::may_be_forgotten`](crate::registry::scope_state::ScopeState::may_be_forgotten)); then it
//! goes back to the end of the queue. A candidate used again since it
//! joined also goes back to the end (a second chance, as in the CLOCK page
//! replacement algorithm), so under pressure the least recently used idle
//! scopes go first.
//!
//! A candidate costs 8 bytes: the scope's slab id and the whole second at
//! which it joined (seconds are enough to know when the front of the queue
//! may have expired; the exact check uses the scope's own idle instant).
//!
//! A plain scope's lock-free word (see
//! [`fast_path`](crate::registry::fast_path)) goes sooner than its scope:
//! each word joins a second queue when it is made, and one idle for
//! [`WORD_IDLE`] is retired, the scope kept. A word costs about 1.2 KB, so
//! only scopes busy now keep one; a scope that gets busy again gets a new
//! one (see `fast_admission`).

use std::time::Duration;

use tokio::time::Instant;

use super::{Scheduler, ScopeId};
use crate::registry::fast_path::FastScope;
use crate::time::{saturating_add, Stamp};

/// Default time an idle scope is kept.
pub const DEFAULT_IDLE_TTL: Duration = Duration::from_secs(3600);
/// Default number of scopes past which idle ones are evicted first.
pub const DEFAULT_MAX_SCOPES: usize = 100_000;

/// How many candidates one arriving request looks at, at most.
const MAX_LOOKS: usize = 8;

/// How long a word may stay idle (nothing in flight on it, nothing ended
/// or admitted) before it is retired: 1 to 2 s in effect, as candidates
/// count in whole seconds.
pub(super) const WORD_IDLE: Duration = Duration::from_secs(1);

/// The eviction settings and candidates of a scheduler.
#[derive(Debug)]
pub(crate) struct Eviction {
    pub(crate) idle_ttl: Duration,
    pub(crate) max_scopes: usize,
    /// Idle scopes, each with the second it joined (so in that order); a
    /// scope is here at most once.
    candidates: Queue,
    /// Scopes with a word, each with the second it was made or last found
    /// busy (so in that order), looked at after [`WORD_IDLE`].
    words: Queue,
    /// Scopes evicted since the registry was built.
    pub(crate) evicted: u64,
    /// The due instant last told to the open words.
    published_due: Option<Instant>,
    /// The front candidates (of scopes, of words) when the due instant was
    /// last told (see [`Scheduler::publish_eviction_due`]).
    published_fronts: (Option<Candidate>, Option<Candidate>),
}

/// A queue of candidates, oldest first.
#[derive(Debug, Default)]
struct Queue {
    candidates: std::collections::VecDeque<Candidate>,
    /// When the front candidate's time may have passed, once computed:
    /// every request asks, and the front rarely changes.
    front_expires: Option<Instant>,
}

/// An idle scope waiting for eviction: its id and the whole second (of a
/// [`Stamp`]) at which it joined the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Candidate {
    id: u32,
    joined_secs: u32,
}

impl Candidate {
    /// `None` for an id beyond `u32` (four billion scopes in memory at once
    /// is beyond any machine); such a scope is simply never evicted.
    fn new(id: ScopeId, now: Stamp) -> Option<Self> {
        Some(Candidate {
            id: u32::try_from(id).ok()?,
            joined_secs: now.coarse_secs(),
        })
    }

    /// When its `ttl` may have passed: the second it joined is rounded
    /// up, so an expired candidate is never passed over.
    fn expires(&self, ttl: Duration) -> Instant {
        let joined = Stamp::from_coarse_secs(self.joined_secs.saturating_add(1)).instant();
        saturating_add(joined, ttl)
    }
}

impl Queue {
    fn push(&mut self, candidate: Candidate) {
        if self.candidates.is_empty() {
            self.front_expires = None;
        }
        self.candidates.push_back(candidate);
    }

    fn pop(&mut self) -> Option<Candidate> {
        self.front_expires = None;
        self.candidates.pop_front()
    }

    fn len(&self) -> usize {
        self.candidates.len()
    }

    fn front(&self) -> Option<Candidate> {
        self.candidates.front().copied()
    }

    /// When the front candidate's `ttl` may have passed (`None` without
    /// candidates).
    fn front_due(&mut self, ttl: Duration) -> Option<Instant> {
        let front = self.candidates.front()?;
        Some(*self.front_expires.get_or_insert_with(|| front.expires(ttl)))
    }

    /// Whether the front candidate (if any) surely joined less than `ttl`
    /// before `now`.
    #[inline]
    fn front_is_fresh(&mut self, now: Instant, ttl: Duration) -> bool {
        let Some(front) = self.candidates.front() else {
            return true;
        };
        *self.front_expires.get_or_insert_with(|| front.expires(ttl)) > now
    }
}

impl Eviction {
    fn push(&mut self, candidate: Candidate) {
        self.candidates.push(candidate);
    }

    fn pop(&mut self) -> Option<Candidate> {
        self.candidates.pop()
    }

    /// Whether the front candidate (if any) surely joined less than
    /// `idle_ttl` before `now`.
    #[inline]
    fn front_is_fresh(&mut self, now: Instant) -> bool {
        self.candidates.front_is_fresh(now, self.idle_ttl)
    }

    /// When eviction work is next due: the earlier of the fronts' (`None`
    /// without candidates).
    fn due(&mut self) -> Option<Instant> {
        let scopes = self.candidates.front_due(self.idle_ttl);
        let words = self.words.front_due(WORD_IDLE);
        scopes.into_iter().chain(words).min()
    }
}

impl Eviction {
    pub(crate) fn new(idle_ttl: Duration, max_scopes: usize) -> Self {
        Eviction {
            idle_ttl,
            max_scopes,
            candidates: Queue::default(),
            words: Queue::default(),
            evicted: 0,
            published_due: None,
            published_fronts: (None, None),
        }
    }
}

impl Scheduler {
    /// Notes that scope `id` may have become idle at `now`.
    #[inline]
    pub(super) fn note_if_idle(&mut self, id: ScopeId, now: Stamp) {
        self.latest_idle = self.latest_idle.max(now);
        let Some(scope) = self.scopes.get_mut(id) else {
            return;
        };
        if scope.state.in_flight > 0 || scope.has_waiters() {
            return;
        }
        // Nobody waits, so no timer is needed either: an idle scope keeps
        // no waiter storage.
        // (Checked first: the drop of the waiters' storage is out of line.)
        if scope.waiters.is_some() {
            scope.waiters = None;
        }
        if scope.idle_since.is_none() {
            scope.idle_since = Some(now);
        }
        if !scope.state.evictable {
            if let Some(candidate) = Candidate::new(id, now) {
                scope.state.evictable = true;
                scope.state.referenced = false;
                self.eviction.push(candidate);
            }
        }
    }

    /// Notes that scope `id` is in use again.
    #[inline]
    pub(super) fn note_busy(&mut self, id: ScopeId) {
        let scope = &mut self.scopes[id];
        scope.idle_since = None;
        scope.state.referenced = scope.state.evictable;
    }

    /// Evicts idle scopes that have had their time, looking at a few
    /// candidates at most. Called before a request is queued, when no scope
    /// is dirty, and by a request that ends on a word once the work is due
    /// (see [`publish_eviction_due`](Self::publish_eviction_due)).
    #[inline]
    pub(crate) fn evict_expired(&mut self, now: Instant) {
        debug_assert!(self.dirty.is_empty(), "eviction runs between operations");
        // The common case, checked inline: nothing has had its time.
        if self.eviction.front_is_fresh(now) && self.eviction.words.front_is_fresh(now, WORD_IDLE) {
            return;
        }
        self.evict_expired_candidates(now);
        self.retire_idle_words(now);
    }

    /// Notes that scope `id` has a new word, at `now`: it is looked at
    /// after [`WORD_IDLE`], and retired if idle by then.
    pub(super) fn note_word_made(&mut self, id: ScopeId, now: Stamp) {
        if let Some(candidate) = Candidate::new(id, now) {
            self.eviction.words.push(candidate);
        }
    }

    /// Retires the words idle for [`WORD_IDLE`], looking at a few
    /// candidates at most; a busy one goes back to the end.
    #[inline(never)]
    fn retire_idle_words(&mut self, now: Instant) {
        // Requests on words leave the scheduler's clock behind (see
        // `fast_admission`): this work reads it.
        self.latest_idle = self.latest_idle.max(Stamp::of(now));
        for _ in 0..MAX_LOOKS {
            if self.eviction.words.front_is_fresh(now, WORD_IDLE) {
                return;
            }
            let Some(candidate) = self.eviction.words.pop() else {
                return;
            };
            self.look_at_word(candidate.id as ScopeId, now);
        }
    }

    /// Retires scope `id`'s word if nothing used it for [`WORD_IDLE`]
    /// (the scope stays); else looks at it again later. A scope evicted
    /// meanwhile, or whose word went, is forgotten here.
    fn look_at_word(&mut self, id: ScopeId, now: Instant) {
        let Some(scope) = self.scopes.get(id) else {
            return;
        };
        let Some(word) = &scope.fast else {
            return;
        };
        let last_used = word.last_end().max(word.opened_at());
        let busy = word.in_flight() > 0
            || scope.state.in_flight > 0
            || last_used.is_some_and(|at| saturating_add(at.instant(), WORD_IDLE) > now);
        if busy || !self.retire_word(id) {
            self.note_word_made(id, Stamp::of(now));
            return;
        }
        if let Some(word) = self.scopes[id].fast.take() {
            self.forget_word(&word);
        }
    }

    /// Takes retired `word` out of the directory and the count of words.
    pub(super) fn forget_word(&mut self, word: &FastScope) {
        self.words_live -= 1;
        if let Some(owner) = &self.word_owner {
            owner.directory.remove(word);
        }
    }

    fn evict_expired_candidates(&mut self, now: Instant) {
        for _ in 0..MAX_LOOKS {
            if self.eviction.front_is_fresh(now) {
                return;
            }
            let Some(candidate) = self.eviction.pop() else {
                return;
            };
            self.look_at_candidate(candidate.id as ScopeId, false, now);
        }
    }

    /// When eviction work is next due, for the requests that end on open
    /// words (see
    /// [`GlobalFlight::eviction_due`](crate::registry::fast_path::GlobalFlight::eviction_due)):
    /// it follows the front candidate, checked on every operation, one
    /// compare while it stays.
    #[inline(always)]
    pub(super) fn publish_eviction_due(&mut self) {
        let fronts = (self.eviction.candidates.front(), self.eviction.words.front());
        if fronts != self.eviction.published_fronts {
            self.publish_fronts(fronts);
        }
    }

    /// [`publish_eviction_due`](Self::publish_eviction_due) once a front
    /// candidate changed.
    #[inline(never)]
    fn publish_fronts(&mut self, fronts: (Option<Candidate>, Option<Candidate>)) {
        self.eviction.published_fronts = fronts;
        let due = self.eviction.due();
        // Converted and written only when it moved.
        if due != self.eviction.published_due {
            self.eviction.published_due = due;
            self.global.set_evict_due(due.map(Stamp::of));
        }
    }

    /// Makes room for a new scope when the registry holds `max_scopes`:
    /// evicts the least recently used idle scopes, looking at a few
    /// candidates at most. Called only when a scope is about to be created,
    /// before anything is dirty; every scope the current operation uses is
    /// already marked busy, so none of them can go.
    pub(super) fn make_room(&mut self, now: Instant) {
        self.evict_least_recently_used(self.eviction.max_scopes - 1, now);
    }

    /// Evicts least recently used idle scopes until the registry holds
    /// `limit` scopes, looking at [`MAX_LOOKS`] candidates at most, and at
    /// each one once: a candidate that stays (used since it joined, busy
    /// on its word, or still limited) goes back to the end, with a due
    /// instant from now, so it is looked at again after the others.
    fn evict_least_recently_used(&mut self, limit: usize, now: Instant) {
        debug_assert!(self.dirty.is_empty(), "eviction runs between operations");
        if self.scopes.len() <= limit {
            return;
        }
        for _ in 0..MAX_LOOKS.min(self.eviction.candidates.len()) {
            if self.scopes.len() <= limit {
                return;
            }
            let Some(candidate) = self.eviction.pop() else {
                return;
            };
            self.look_at_candidate(candidate.id as ScopeId, true, now);
        }
    }

    fn look_at_candidate(&mut self, id: ScopeId, full: bool, now: Instant) {
        let ttl = self.eviction.idle_ttl;
        let Some(scope) = self.scopes.get_mut(id) else {
            return;
        };
        let mut used_since_it_joined = std::mem::take(&mut scope.state.referenced);
        let Some(mut idle_since) = scope.idle_since() else {
            // Busy again: it comes back when it is idle.
            scope.state.evictable = false;
            return;
        };
        if let Some(fast) = scope.open_fast() {
            // An open word keeps no idle instant of the scheduler's: it is
            // idle with nothing in flight, since its last end.
            if fast.in_flight() > 0 {
                return self.look_again(id, now);
            }
            if let Some(end) = fast.last_end().filter(|end| end.instant() > idle_since) {
                idle_since = end.instant();
                scope.idle_since = Some(end);
                used_since_it_joined = true;
            }
        }
        let expired = saturating_add(idle_since, ttl) <= now;
        let may_go = (expired || (full && !used_since_it_joined)) && scope.state.may_be_forgotten(now, full);
        if !may_go || !self.retire_word(id) {
            return self.look_again(id, now);
        }
        self.index.remove(id, &self.scopes);
        let scope = self.scopes.remove(id);
        if let Some(word) = &scope.fast {
            self.forget_word(word);
        }
        self.eviction.evicted += 1;
        self.metrics.evicted(&scope.state.key);
        tracing::trace!(
            target: "tower_throttle",
            scope = %scope.state.key,
            idle_ms = now.saturating_duration_since(idle_since).as_millis() as u64,
            "idle scope evicted"
        );
    }

    /// Retires scope `id`'s word, if it has one, before the scope is
    /// evicted: false when a request is in flight on it (admitted since the
    /// eviction looked), and the scope stays. The word is closed first, on
    /// every shard at once, so a request admitted meanwhile on any shard is
    /// adopted (the scope is busy again) rather than left on a shard that
    /// a partial retirement kept open; a closed word's counts only fall,
    /// so with nothing adopted every shard retires.
    fn retire_word(&mut self, id: ScopeId) -> bool {
        if self.scopes[id].fast.is_none() {
            return true;
        }
        self.close_fast(id);
        let scope = &self.scopes[id];
        scope.state.in_flight == 0 && scope.fast.as_ref().is_none_or(|fast| fast.retire())
    }

    /// Puts scope `id` back at the end of the candidates: looked at again
    /// one `idle_ttl` from now at the earliest (or under pressure), so a
    /// scope kept for its state costs one look per `idle_ttl`, not one per
    /// request.
    fn look_again(&mut self, id: ScopeId, now: Instant) {
        if let Some(candidate) = Candidate::new(id, Stamp::of(now)) {
            self.eviction.push(candidate);
        }
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
