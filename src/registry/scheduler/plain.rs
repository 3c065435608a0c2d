//! The scheduler's side of plain scopes (lanes their only limit): a
//! one-scope request admitted on the scope's lock-free word (see
//! [`fast_path`](crate::registry::fast_path)), which the scheduler opens,
//! closes and adopts the requests of, or on a plain lane without a ticket.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Admission, FastMode, Outcome, Scheduler, ScopeId, WakeList};
use crate::registry::fast_path::{
    admit_two, hot, log_sent, logs_sends, Directory, FastScope, TwoAdmission, WordOwner, WordPair, WordShard,
};
use crate::registry::ticket::{Seat, SendsBefore};
use crate::scope::DEFAULT_COST;
use crate::time::Stamp;

/// The longest a plain scope may go without a request (from the last
/// one's end) and still count as busy: asked for again within it, it gets
/// a lock-free word (see [`Scheduler::fast_admission`]).
pub(crate) const WORD_GAP: Duration = Duration::from_millis(250);

/// Words a registry keeps at most: about 20 MB (a word is about 1.2 KB),
/// reached only when that many plain scopes are each asked for again
/// within [`WORD_GAP`]. Past it, busy scopes go through the lock.
pub(crate) const MAX_WORDS: usize = 16_384;

/// Whether a scope idle since `idle_since` (`None`: something in flight)
/// has been so longer than [`WORD_GAP`] at `latest`, the latest instant a
/// scope went idle.
#[inline]
fn is_quiet(idle_since: Option<Stamp>, latest: Stamp) -> bool {
    // On the stamps' values, which spares a conversion to durations.
    const GAP_NANOS: u64 = WORD_GAP.as_nanos() as u64;
    idle_since.is_some_and(|since| since.value().saturating_add(GAP_NANOS) < latest.value())
}

impl Scheduler {
    /// Admits a one-scope request of scope `id` on its lock-free word
    /// when `mode` allows: an open word with a lane free, or a busy plain
    /// scope the scheduler holds nothing of, opened now. Otherwise the
    /// word is closed (the scheduler adopts what is in flight on it): the
    /// request goes through the scheduler.
    ///
    /// A scope is busy, and worth a word, when it is asked for again while
    /// a request of it is in flight or before [`WORD_GAP`] passed since
    /// the last one's end. A scope that never sent a request gets no word,
    /// nor one asked for now and then: a crawl that goes round its hosts
    /// slower than that pays for none. (Time here is the latest instant a scope
    /// went idle, so the request path reads no clock for it: a lone
    /// client's scope, which nothing else moves past, stays busy.) Past
    /// [`MAX_WORDS`] words, no scope gets one.
    #[inline(always)]
    pub(super) fn fast_admission(
        &mut self,
        id: ScopeId,
        mode: FastMode,
        now: Instant,
    ) -> Option<Arc<WordShard>> {
        // The common cases, checked inline, a crawl's first: a scope
        // without a word that is quiet, that never sent a request (this
        // one made it, most likely), or that may not have one.
        let entry = &self.scopes[id];
        let no_word = || {
            is_quiet(entry.idle_since, self.latest_idle)
                || entry.state.sent == 0
                || !self.fast_allowed
                || !entry.state.is_plain_now()
        };
        if entry.fast.is_none() && no_word() {
            return None;
        }
        self.word_admission_or_close(id, mode, now)
    }

    /// Admits a one-scope request on a free lane of a plain scope nobody
    /// waits for, without a ticket (not for `FastMode::Never`, which tests
    /// of tickets use, nor with a store, whose reservation needs the
    /// ticket).
    #[inline(always)]
    pub(super) fn plain_admission(
        &mut self,
        scope: ScopeId,
        mode: FastMode,
        now: Instant,
    ) -> Option<Admission> {
        if mode == FastMode::Never || !self.fast_allowed {
            return None;
        }
        let lane = self.take_plain_lane(scope, now)?;
        match u32::try_from(lane) {
            Ok(lane) => Some(Admission::Plain(scope, lane)),
            // Lanes never outnumber a `u32` concurrency.
            Err(_) => unreachable!("lane {lane} beyond the concurrency"),
        }
    }

    /// [`fast_admission`](Self::fast_admission) past its inline check.
    #[inline(never)]
    pub(super) fn word_admission_or_close(
        &mut self,
        id: ScopeId,
        mode: FastMode,
        now: Instant,
    ) -> Option<Arc<WordShard>> {
        let fast = self.word_admission(id, mode, now);
        if fast.is_none() {
            self.close_fast(id);
        }
        fast
    }

    /// Admits on scope `id`'s word, opening it if `mode` and the scope
    /// allow; the shard the request holds. The calling thread caches the
    /// word (see [`hot`]).
    pub(super) fn word_admission(
        &mut self,
        id: ScopeId,
        mode: FastMode,
        now: Instant,
    ) -> Option<Arc<WordShard>> {
        if mode == FastMode::Never || !self.open_word(id, now) {
            return None;
        }
        let owner = self.word_owner.as_ref()?;
        let fast = self.scopes[id].fast.as_ref()?;
        let shard = fast.admit()?.clone();
        hot::remember(owner.uid, fast);
        self.metrics.sent(&fast.key);
        if logs_sends() {
            log_sent(&fast.key);
        }
        self.note_open(id, now);
        Some(shard)
    }

    /// Whether scope `id` has an open word now: open already, or opened
    /// now (made first if it has none) when the scope is plain and the
    /// scheduler holds nothing of it.
    fn open_word(&mut self, id: ScopeId, now: Instant) -> bool {
        let Some(owner) = self.word_owner.as_ref() else {
            return false;
        };
        let entry = &mut self.scopes[id];
        if entry.open_fast().is_some() {
            return true;
        }
        let made = entry.fast.is_none();
        let openable = self.fast_allowed
            && !(made && self.words_live >= MAX_WORDS)
            && !entry.has_waiters()
            && entry.state.in_flight == 0
            && entry.state.is_plain_now();
        if !openable {
            return false;
        }
        let lanes = entry.state.config.concurrency.min(self.max_concurrency);
        let latency = entry.state.latency_value();
        let fast = entry.fast.get_or_insert_with(|| {
            let word = FastScope::new(id, entry.state.key.clone(), owner);
            owner.directory.insert(&word);
            word
        });
        let stamp = Stamp::of(now);
        let opened = fast.open(lanes, latency, stamp);
        if made {
            self.words_live += 1;
            self.note_word_made(id, stamp);
        }
        if opened {
            self.global.note_word_opened();
        }
        opened
    }

    /// Whether scope `id`, just looked up for a request of several scopes,
    /// is worth a word: it has one, or it is plain and busy (asked for
    /// before, and not quiet: see [`fast_admission`](Self::fast_admission)).
    pub(super) fn worth_a_word(&self, id: ScopeId) -> bool {
        let entry = &self.scopes[id];
        entry.fast.is_some()
            || (self.fast_allowed
                && entry.state.sent > 0
                && entry.state.is_plain_now()
                && !is_quiet(entry.idle_since, self.latest_idle))
    }

    /// Admits a request of the two scopes `ids` on their words, opened if
    /// need be, when both may have one (see
    /// [`worth_a_word`](Self::worth_a_word)); `None` otherwise: the caller
    /// closes them and the request goes through the scheduler.
    pub(super) fn two_word_admission(
        &mut self,
        ids: [ScopeId; 2],
        now: Instant,
        wake: &mut WakeList,
    ) -> Option<WordPair> {
        if ids[0] == ids[1] || !ids.iter().all(|&id| self.open_word(id, now)) {
            return None;
        }
        let words = ids.map(|id| self.scopes[id].fast.clone());
        let [Some(a), Some(b)] = &words else {
            return None;
        };
        match admit_two(a, b) {
            TwoAdmission::Admitted(held) => {
                for (word, id) in [(a, ids[0]), (b, ids[1])] {
                    self.metrics.sent(&word.key);
                    if logs_sends() {
                        log_sent(&word.key);
                    }
                    self.note_open(id, now);
                }
                Some(held)
            }
            TwoAdmission::Refused => None,
            // Not under the lock, which closes words; but if it were, the
            // request never left.
            TwoAdmission::FirstAdopted(shard) => {
                self.finish_adopted([Some(&shard), None], Outcome::NoResponse, None, (now, None), wake);
                None
            }
        }
    }

    /// Ends a request admitted on words after some of them were closed
    /// (the scheduler adopted it there): `adopted`, the shards it held on
    /// those words. As [`finish`](Self::finish) ends a ticket on no lane,
    /// in each of their scopes; its global permit goes back once.
    pub(crate) fn finish_adopted(
        &mut self,
        adopted: [Option<&WordShard>; 2],
        outcome: Outcome,
        departed_at: Option<Stamp>,
        now: (Instant, Option<Stamp>),
        wake: &mut WakeList,
    ) {
        let ours = |shard: &&&WordShard| {
            self.scopes
                .get(shard.scope_id())
                .and_then(|entry| entry.fast.as_deref())
                .is_some_and(|word| word.owns(shard))
        };
        let seat = |shard: &&WordShard| Seat {
            scope: shard.scope_id(),
            lane: usize::MAX,
            cost: DEFAULT_COST,
            before: SendsBefore::KEEP,
        };
        // A request holds two words at most: no allocation.
        let mut ours = adopted.iter().flatten().filter(ours).map(seat);
        match [ours.next(), ours.next()] {
            [Some(one), None] => self.finish_unticketed(one, outcome, departed_at, now, wake),
            [Some(one), Some(two)] => {
                self.finish_unticketed_pair([one, two], outcome, departed_at, now, wake)
            }
            // Never: an adopted request keeps its scope from eviction. Its
            // permit still goes back.
            [None, _] => {
                self.global.release();
            }
        }
    }

    /// [`finish_unticketed`](Self::finish_unticketed) for a request of two
    /// scopes adopted from both their words.
    fn finish_unticketed_pair(
        &mut self,
        seats: [Seat; 2],
        outcome: Outcome,
        departed_at: Option<Stamp>,
        (now, now_stamp): (Instant, Option<Stamp>),
        wake: &mut WakeList,
    ) {
        let now_stamp = now_stamp.unwrap_or_else(|| Stamp::of(now));
        self.release_seats(
            &seats,
            (outcome, false),
            (departed_at, departed_at),
            (now, now_stamp),
            wake,
        );
        for seat in seats {
            self.note_if_idle(seat.scope, now_stamp);
        }
    }

    /// An open scope is an eviction candidate from its first admission on
    /// (its word says whether it is idle: see `look_at_candidate`).
    pub(super) fn note_open(&mut self, id: ScopeId, now: Instant) {
        let entry = &self.scopes[id];
        if entry.idle_since.is_none() || !entry.state.evictable {
            self.note_if_idle(id, Stamp::of(now));
        }
    }

    /// Closes scope `id`'s word, if open: the scheduler adopts its
    /// requests in flight (see [`ScopeState::adopt`](crate::registry::scope_state::ScopeState::adopt)).
    pub(super) fn close_fast(&mut self, id: ScopeId) {
        let entry = &mut self.scopes[id];
        let Some(fast) = entry.open_fast() else {
            return;
        };
        let adopted = fast.close();
        if adopted.was_open {
            entry.state.adopt(adopted, &mut self.rng);
        }
    }

    /// Lets plain scopes open words that reach `registry` (the registry
    /// that holds this scheduler) when they need its lock.
    /// Lists them in `directory`, where requests find them without the
    /// lock.
    pub(in crate::registry) fn with_word_owner(
        mut self,
        registry: std::sync::Weak<crate::registry::RegistryShared>,
        uid: u64,
        directory: Arc<Directory>,
    ) -> Self {
        self.word_owner = Some(WordOwner {
            global: self.global.clone(),
            registry,
            uid,
            directory,
            metrics: self.metrics,
        });
        self
    }

    /// Keeps every scope's word closed (a fleet: every send reserves
    /// through the store).
    pub(crate) fn without_fast_path(mut self) -> Self {
        self.fast_allowed = false;
        self
    }
}
