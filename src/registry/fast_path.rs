//! What the registry does without its lock: the lock-free path of a
//! *plain* scope (admission and completion by atomics alone), the global
//! count it shares with the scheduler, and the queue places ([`places`]).
//! Every protocol here is checked by loom (see "Checked by loom").
//!
//! A scope is plain when lanes are its only limit (delay 0, no per-lane
//! delay, no quota, no manager, nothing contributed by feedback: see
//! [`ScopeConfig::is_plain`](super::ScopeConfig)). Such a scope has nothing
//! to time and nothing to order as long as nobody waits for it, so a
//! request only needs a free lane and a global permit: two counters. An
//! API client sending to one host at delay 0 from every core is the common
//! case, and through the lock two threads sent fewer requests per second
//! than one (issue 26).
//!
//! # States
//!
//! Each busy plain scope (see "When a word opens") gets a [`FastScope`],
//! one atomic word of state beside the scheduler's own:
//!
//! - **open**: requests are admitted and finished on the word alone (a
//!   compare-and-swap below the scope's lanes, a subtraction), and the
//!   scheduler counts none of them;
//! - **closed**: the scheduler owns the scope again. Closing (under the
//!   lock) *adopts* the requests still in flight on the word: the scope
//!   counts them in flight and undeparted, on no lane, so every limit the
//!   scheduler applies from then on sees them, and a gap that a new delay
//!   needs runs from their departures. Each of them, when it ends, sees
//!   the closed word and finishes under the lock.
//! - **retired**: evicted; a stale handle never opens it again.
//!
//! One word holds the open bit, the lanes and the count, so a request that
//! ends and a scheduler that closes can never both think the other one will
//! do the work: the subtraction returns the state it changed, the close the
//! count it adopted. And an admission compares the count with the lanes of
//! the word it swaps, so a word opened again with fewer lanes never admits
//! against the old ones.
//!
//! The scheduler closes a scope whenever anything but a plain admission
//! touches it: a waiter (lanes or the global limit full), a request with
//! more than two scopes (or two it could not admit on their words),
//! feedback, a hold, a config change, the robots.txt delay, pacing. It
//! opens it again at a plain admission once nothing of the scheduler's
//! own is in flight there and nobody waits.
//!
//! # Requests of two scopes
//!
//! A request of two plain scopes (a host and its server's IP scope, a host
//! and a scope of its own beside it) is admitted on both words at once
//! ([`admit_two`]): one global permit, then a lane on the first scope's
//! word, then one on the second's; if the second has none, the first lane
//! goes back as a request that never left ends ([`word::take_two_lanes`]).
//! A close of the first word in between adopts that lane, and the caller
//! then finishes it under the lock, never sent. The request holds a shard
//! of each word (a [`WordPair`], boxed so that a request's size does not
//! grow) and ends on both: where a word was closed meanwhile, that word
//! adopted it, and the lock finishes it in that scope only, giving its one
//! global permit back once.
//!
//! # Shards: no line two threads write
//!
//! A word is [`SHARDS`] words, each in an allocation of its own (a
//! [`WordShard`]), and the scope's lanes are split over them. The global
//! permits ([`GlobalFlight`]) and the queue places ([`places`]) are split
//! the same way. Each thread has a home shard ([`shard::home`]: threads
//! get them in turn): it admits on its home word, takes a permit and a
//! place from its home counts, and gives them back there. A request holds
//! the shard it was admitted on, and ends on it. So two threads on one
//! scope write no cache line of each other's on the common path; with one
//! shared word, every request moved the word's lines, the permits' and
//! the places' between the cores, and two threads sent fewer requests per
//! second than one (issue 53).
//!
//! A thread whose home is empty takes from another shard (a lane, a
//! permit, a place): only the sum is the limit. Permits and places move
//! between shards as requests end on other threads; lanes do not (a
//! request ends on its own shard). Decisions that need the sum (is a
//! permit free anywhere? how many are in flight?) read every shard. The
//! scheduler opens, closes and retires every shard of a word at once,
//! under the lock, and adds up what they hand it (see
//! [`word::Closed::of_shards`]); each shard is one word of the protocol
//! below, so what loom checks of one word holds of each.
//!
//! # Finding the scope without the lock
//!
//! Two places, looked at in turn; until the registry opened a word, a
//! request looks at neither.
//!
//! - Each thread keeps the last few words it used ([`hot`]), keyed by the
//!   registry and the scope's name: a hit costs a string comparison, and
//!   writes nothing another thread reads (the thread keeps its own copy of
//!   the key). An API client's few hosts live here.
//! - Each registry lists its words by name in a [`Directory`]: 64 tables,
//!   each behind a read-write lock of its own. A lookup holds its table's
//!   read lock for one probe and the admission; only the scheduler writes,
//!   under its own lock, when it makes a word or its scope goes. A crawl
//!   going round many busy hosts finds its words here, so two threads on
//!   different hosts meet on no lock at all (before the directory, they
//!   took turns on the scheduler's, and two threads sent fewer requests a
//!   second than one: issue 53). A word found here twice in a row by one
//!   thread joins that thread's cache.
//!
//! A request of two scopes looks for both words in the thread's cache,
//! else in the directory, holding both tables' read locks (the lower
//! table's first) while it admits: it takes no reference to either word,
//! so two threads of an API client behind `IpScopeLayer` (one host, one
//! server) write no count of the words' that the other reads. A pair
//! found in the directory with the same first word twice in a row joins
//! the thread's cache.
//!
//! A miss takes the lock, which may make or open the word. A word found
//! closed, retired or full also sends the request to the lock.
//!
//! # When a word opens, and when it goes
//!
//! A word costs memory (about 1.2 KB: four shards, each an allocation of
//! 256 bytes, its `Arc`'s counts and the shard on lines of their own, and
//! its place in the directory) and is worth it only for a scope that is
//! busy: the scheduler makes a plain scope's word when the scope is asked
//! for again while a request of it is in flight, or within 250 ms of the
//! last one's end (`scheduler/plain.rs`, `WORD_GAP`; the scheduler's clock
//! there is the latest instant a scope went idle, so the request path
//! reads none). A scope asked for the first time gets none, nor one asked
//! for now and then: a crawl that goes round its hosts slower than that
//! pays one atomic load per request for the words. A registry keeps at
//! most 16 384 words (`MAX_WORDS`, about 20 MB).
//!
//! A word idle for a second (nothing in flight on it, nothing admitted or
//! ended since) is retired and leaves the directory; its scope stays, with
//! what the word took in. The scheduler looks at each word about once a
//! second, as eviction looks at idle scopes: a few per operation under
//! its lock, and a request ending on a word takes the lock once that work
//! is due (`scheduler/eviction.rs`). An evicted scope's word goes with it.
//!
//! # The global limit
//!
//! `max_concurrency` is one atomic counter ([`GlobalFlight`]) that the
//! scheduler and the open scopes share. When requests wait for it (the
//! scheduler's global queue is not empty), a flag says so: an open scope
//! then admits nothing (so it cannot pass those waiters), and a request
//! ending on an open scope takes the lock to let the first of them go.
//!
//! # Logging
//!
//! A `tracing` subscriber is an observer: the words work the same with any
//! subscriber, at any level. A send admitted on a word is logged at DEBUG
//! ("request sent", `lock_free = true`) with what the word knows: its
//! scope, no wait and no gap to come (a plain scope has none), but no
//! lane, since the word counts requests rather than lanes. Its end is not
//! logged, as the scheduler logs none either.
//!
//! # Checked by loom
//!
//! Every atomic of a scope's word is in [`word`]: the open bit, the lanes
//! and the count, and what the requests on it leave for the scheduler
//! (sends, latest departure and end, latency average); so are the global
//! counts and their flag. The queue places' counts with their waiters bit
//! and wait list are in [`places`]. The models run with two shards and
//! give each thread its home, so that they take on one shard and give
//! back on the other (the permits' and places' models, and
//! `closing_every_shard_adopts_each_request_on_any_of_them_exactly_once`).
//! Both files stand apart from everything else, their atomics (and the
//! places' mutex) taken from this module: `loom/` includes them with
//! loom's and checks them under every interleaving its model allows
//! (`loom/tests/word.rs`, `loom/tests/places.rs`; see the README's
//! Development section).
//!
//! The directory ([`Directory`]) has no atomics of its own: its tables are
//! behind `std`'s read-write locks, and what it holds are words, whose
//! protocol is the one above (a word found there after it was closed or
//! retired refuses, as a cached one does).
//!
//! Four atomics here are not protocols, and loom does not model them.
//! The next home a thread gets ([`shard::home`]) is a hint of where to
//! look first: any value is correct. Two are written under the lock and
//! read without it, and a stale read only sends a request to the lock:
//! whether a word was ever opened ([`GlobalFlight::words_exist`]: until
//! then a request does not look for one), and the instant the scheduler's
//! eviction work is next due ([`GlobalFlight`]), which a request ending on
//! a word reads to decide whether to take the lock (a stale read moves
//! that work to the next request that takes the lock: every admission
//! under the lock evicts as it comes). No interleaving can make either
//! wrong. The fourth, the instant a word last opened
//! ([`FastScope::opened_at`]), is written and read under the lock only
//! (an atomic because the `FastScope` is shared).

use std::sync::{Arc, Weak};
use std::time::Duration;

use self::atomic::{AtomicBool, AtomicU64, Ordering};
pub(crate) use directory::Directory;
pub(crate) use held::{admit_two, Held, TwoAdmission, WordPair};
use shard::SHARDS;
pub(crate) use statuses::StatusSet;
pub(crate) use word::Ended;
use word::{Permits, ScopeWord};

use super::metrics::Metrics;
use super::ticket::ScopeId;
use super::{Registry, RegistryShared};
use crate::scope::Scope;
use crate::time::Stamp;

mod directory;
mod held;
pub(crate) mod hot;
pub(crate) mod places;
#[cfg(test)]
mod places_tests;
pub(crate) mod shard;
#[cfg(test)]
mod shards_tests;
mod statuses;
mod word;

/// The atomics of [`word`]'s and [`places`]' protocols: std's here; `loom/`
/// gives them loom's to check the protocols.
mod atomic {
    pub(super) use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
}

/// The locks and shared pointers of [`places`]' protocol: std's here,
/// loom's in `loom/`.
mod sync {
    pub(super) use std::sync::{Arc, Mutex, MutexGuard};
}

/// A due instant that never comes.
const NEVER: u64 = u64::MAX;

/// The permits' shard the scheduler takes from and gives back to, under
/// its lock, first: its line travels with the lock's, and the lock's
/// holder needs no lookup of its thread's home. The last one, since homes
/// are given from the first (any shard is right: only the sum is the
/// limit).
const LOCK_SHARD: usize = SHARDS - 1;

/// The requests in flight over all scopes, shared by the scheduler and the
/// open scopes; see the [module docs](self).
///
/// Each part sits on cache lines of its own, by who writes it: what every
/// request reads and rarely anyone writes (the flag) first; then when
/// eviction work is next due, which the lock's holder writes (as often as
/// every request, when requests go round the scopes oldest first, as a
/// crawl does); then the count every request writes. The lock's write
/// thus never sends another core the lines it reads on every request.
#[derive(Debug)]
pub(crate) struct GlobalFlight {
    read_mostly: ReadMostly,
    evict: EvictDue,
    counts: Counts,
}

/// [`GlobalFlight`]'s count every request writes, on lines of its own.
#[derive(Debug)]
#[repr(align(128))]
struct Counts {
    permits: Permits,
}

/// [`GlobalFlight`]'s fields read on every request.
#[derive(Debug)]
#[repr(align(128))]
struct ReadMostly {
    /// Whether a word was ever opened: until then a request does not look
    /// for one.
    words_exist: AtomicBool,
}

/// When the scheduler's eviction work is next due, on lines of its own
/// (128 bytes: a core's adjacent-line prefetch fetches lines in pairs).
#[derive(Debug)]
#[repr(align(128))]
struct EvictDue {
    /// A stamp's value; `u64::MAX`: never. A request that ends on an open
    /// word reads it and takes the lock to do the work once it is due, as
    /// arriving requests do under the lock.
    due: AtomicU64,
}

impl GlobalFlight {
    /// `max` permits.
    pub(crate) fn new(max: u32) -> Self {
        GlobalFlight {
            read_mostly: ReadMostly {
                words_exist: AtomicBool::new(false),
            },
            evict: EvictDue {
                due: AtomicU64::new(NEVER),
            },
            counts: Counts {
                permits: Permits::new(max),
            },
        }
    }

    /// Whether a word was ever opened in the registry.
    #[inline]
    pub(crate) fn words_exist(&self) -> bool {
        self.read_mostly.words_exist.load(Ordering::Relaxed)
    }

    /// Notes that a word was opened (under the lock).
    pub(crate) fn note_word_opened(&self) {
        if !self.words_exist() {
            self.read_mostly.words_exist.store(true, Ordering::Relaxed);
        }
    }

    /// Sets when eviction work is next due (under the lock).
    pub(crate) fn set_evict_due(&self, due: Option<Stamp>) {
        let due = due.map_or(NEVER, Stamp::value);
        if self.evict.due.load(Ordering::Relaxed) != due {
            self.evict.due.store(due, Ordering::Relaxed);
        }
    }

    /// Whether eviction work is due at `now`.
    #[inline(always)]
    pub(crate) fn eviction_due(&self, now: Stamp) -> bool {
        now.value() >= self.evict.due.load(Ordering::Relaxed)
    }

    /// Requests in flight now.
    pub(crate) fn in_flight(&self) -> u32 {
        self.counts.permits.in_flight()
    }

    /// Whether a permit is free now.
    #[inline]
    pub(crate) fn has_room(&self) -> bool {
        self.counts.permits.has_room()
    }

    /// Takes a permit under the lock, if one is free (see
    /// [`Permits::take_at`]), from the lock's own shard first
    /// ([`LOCK_SHARD`]).
    #[must_use]
    #[inline]
    pub(crate) fn take_locked(&self) -> bool {
        self.counts.permits.take_at(LOCK_SHARD)
    }

    /// Gives back a permit taken under the lock (to the lock's shard);
    /// whether requests wait for one (then the caller must let the first
    /// go, under the lock).
    pub(crate) fn release(&self) -> bool {
        self.counts.permits.release_to(LOCK_SHARD)
    }

    /// Says, under the lock, whether requests wait for a permit; true when
    /// a permit is free although they do: see [`Permits::publish_queued`].
    #[inline(always)]
    pub(crate) fn publish_queued(&self, queued: bool) -> bool {
        self.counts.permits.publish_queued(queued)
    }
}

/// A plain scope's lock-free state; see the [module docs](self): its
/// word, in [`SHARDS`] shards.
///
/// Each shard is a word of its own (open bit, lanes, count, and what the
/// requests on it leave), in an allocation of its own: a thread admits on
/// its home shard ([`shard::home`]) and its request holds that shard, so
/// two threads on one scope write no line of each other's. The scope's
/// lanes are split over the shards; a thread whose shard is full takes a
/// lane of another. The scheduler opens, closes and retires every shard
/// at once, under the lock, and sums what they hand it.
#[derive(Debug)]
pub(crate) struct FastScope {
    shards: [Arc<WordShard>; SHARDS],
    /// The scope's key (the cache compares names).
    pub(crate) key: Scope,
    /// The stamp of the instant the word last opened (0: never): every
    /// request in flight on it left no earlier. Written and read under the
    /// lock only, for predictions (see [`opened_at`](Self::opened_at)).
    opened_at: AtomicU64,
}

/// One shard of a [`FastScope`]'s word: what a request admitted on the
/// word holds, and ends on.
///
/// Aligned to 128 bytes (cores fetch adjacent lines in pairs), so that
/// the `Arc`'s counts, which each request writes, and the word share
/// lines with nothing another shard's thread writes.
#[derive(Debug)]
#[repr(C, align(128))]
pub(crate) struct WordShard {
    /// The open bit, this shard's lanes (its part of the scope's
    /// concurrency, capped by the global limit), the count of requests
    /// admitted on it and not yet ended, and what they leave for the
    /// scheduler.
    state: ScopeWord,
    /// The scope's id in the scheduler.
    id: ScopeId,
    /// Which shard of the word this is: the home of the threads that admit
    /// on it first, whose permits' shard its requests give their permit
    /// back to.
    index: usize,
    /// The registry's global count.
    global: Arc<GlobalFlight>,
    /// The registry, for what needs its lock: a request admitted on the
    /// word holds no `Registry` (a clone per request is a count that every
    /// core's requests would write).
    registry: Weak<RegistryShared>,
    /// The scheduler's metrics.
    pub(crate) metrics: Metrics,
}

/// What a scope's word is made with, from its registry.
#[derive(Debug, Clone)]
pub(crate) struct WordOwner {
    pub(crate) global: Arc<GlobalFlight>,
    pub(super) registry: Weak<RegistryShared>,
    /// The registry's number, for the threads' caches ([`hot`]).
    pub(crate) uid: u64,
    /// The registry's words by name, which the scheduler lists each word
    /// in as it makes it.
    pub(crate) directory: Arc<Directory>,
    pub(crate) metrics: Metrics,
}

impl FastScope {
    /// A closed scope for scope `id`, `key`, of `owner`'s registry.
    pub(crate) fn new(id: ScopeId, key: Scope, owner: &WordOwner) -> Arc<Self> {
        let shard = |index| {
            Arc::new(WordShard {
                state: ScopeWord::new(),
                id,
                index,
                global: owner.global.clone(),
                registry: owner.registry.clone(),
                metrics: owner.metrics,
            })
        };
        Arc::new(FastScope {
            shards: std::array::from_fn(shard),
            key,
            opened_at: AtomicU64::new(0),
        })
    }

    /// Whether `shard` is one of this scope's.
    pub(crate) fn owns(&self, shard: &WordShard) -> bool {
        self.shards.iter().any(|own| std::ptr::eq(&**own, shard))
    }

    /// Whether requests may be admitted on the word now (its shards open
    /// and close together, under the lock: the first says for all).
    pub(crate) fn is_open(&self) -> bool {
        self.shards[0].state.is_open()
    }

    /// Opens a closed scope with `lanes` lanes (split over the shards) and
    /// the scheduler's latency average (`latency`, as the scope keeps it);
    /// under the lock, with nothing of the scope in flight, at `now`.
    /// False when it was retired.
    pub(crate) fn open(&self, lanes: u32, latency: u64, now: Stamp) -> bool {
        // Every shard is closed and empty, or every one retired: they
        // change together, under the lock.
        let opened = self
            .shards
            .iter()
            .enumerate()
            .all(|(index, shard)| shard.state.open(shard::share_of_u32(lanes, index), latency));
        // The scheduler opens a word only with nothing of the scope in
        // flight (an adopted request leaves its shard before the lock
        // counts it ended): a shard refuses only when all were retired.
        debug_assert!(
            opened || self.shards.iter().all(|shard| !shard.state.is_open()),
            "a word's shards open together"
        );
        if opened {
            self.opened_at.store(now.value(), Ordering::Relaxed);
        }
        opened
    }

    /// When the word last opened (under the lock, which orders this read
    /// after the write): the requests in flight on it, or adopted from it
    /// and still in flight, all left no earlier. The word does not learn
    /// their departures until they end (its admission reads no clock), so
    /// this is what a prediction knows of when they will end.
    pub(crate) fn opened_at(&self) -> Option<Stamp> {
        Stamp::from_value(self.opened_at.load(Ordering::Relaxed))
    }

    /// Closes the scope (under the lock): what the scheduler adopts, over
    /// every shard.
    pub(crate) fn close(&self) -> Adopted {
        let closed = word::Closed::of_shards(self.shards.iter().map(|shard| shard.state.close()));
        Adopted {
            in_flight: closed.in_flight,
            was_open: closed.was_open,
            sent: closed.sent,
            last_departure: Stamp::from_value(closed.last_departure),
            latency: closed.latency,
            warm: closed.warm,
        }
    }

    /// Retires an idle scope's closed word (under the lock, for
    /// eviction): false when requests are in flight on it. The word must
    /// be closed (see `Scheduler::retire_word`): nothing is admitted on a
    /// closed word, so its counts only fall, and with every shard empty at
    /// the check, every shard retires.
    pub(crate) fn retire(&self) -> bool {
        debug_assert!(!self.is_open(), "a word is closed before it retires");
        if self.in_flight() > 0 {
            return false;
        }
        self.shards.iter().all(|shard| shard.state.retire())
    }

    /// Requests in flight on the word.
    pub(crate) fn in_flight(&self) -> u32 {
        self.shards.iter().map(|shard| shard.state.in_flight()).sum()
    }

    /// Sends on the word the scheduler has not taken in yet.
    pub(crate) fn sent(&self) -> u64 {
        self.shards.iter().map(|shard| shard.state.sent()).sum()
    }

    /// The latency average as the scope keeps it (0: none): the mean of
    /// the shards' averages (see [`word::Closed::of_shards`]).
    pub(crate) fn latency(&self) -> u64 {
        let mut mean = word::LatencyMean::default();
        for shard in &self.shards {
            let (latency, moved) = shard.state.latency();
            mean.add(latency, moved);
        }
        mean.mean().0
    }

    /// The latest end of a request on the word.
    pub(crate) fn last_end(&self) -> Option<Stamp> {
        let latest = self.shards.iter().map(|shard| shard.state.last_end()).max();
        latest.and_then(Stamp::from_value)
    }

    /// Whether [`admit`](Self::admit) would admit a request now: the word
    /// open with a lane free, and a global permit free that nobody waits
    /// for. It takes nothing (a prediction's answer without the lock).
    pub(crate) fn would_admit(&self) -> bool {
        self.shards[0].global.counts.permits.would_take()
            && self.shards.iter().any(|shard| shard.state.has_free_lane())
    }

    /// Admits a request: a global permit and a lane on the open word, on
    /// this thread's home shard if it has one free, else on another; the
    /// shard the request ends on.
    #[inline]
    pub(crate) fn admit(&self) -> Option<&Arc<WordShard>> {
        let global = &self.shards[0].global;
        let home = shard::home();
        if !global.counts.permits.try_take_at(home) {
            return None;
        }
        let shard = match &self.shards[home] {
            shard if shard.state.try_admit() => Some(shard),
            _ => self.admit_elsewhere(home),
        };
        if shard.is_none() {
            // The permit goes back; requests that started waiting for one
            // meanwhile are the caller's lock path's business (it closes
            // the scope or queues, and the scheduler rechecks the count).
            let _ = global.counts.permits.release_to(home);
        }
        shard
    }

    /// The shards' words, from the `home` shard on, in turn (the order
    /// [`admit`](Self::admit) tries them in).
    fn words_from(&self, home: usize) -> [&ScopeWord; SHARDS] {
        std::array::from_fn(|step| &self.shards[(home + step) % SHARDS].state)
    }

    /// [`admit`](Self::admit)'s lane past a full home shard: from the
    /// others, in turn.
    #[cold]
    #[inline(never)]
    fn admit_elsewhere(&self, home: usize) -> Option<&Arc<WordShard>> {
        (1..SHARDS)
            .map(|step| &self.shards[(home + step) % SHARDS])
            .find(|shard| shard.state.try_admit())
    }
}

impl WordShard {
    /// The scope's id in the scheduler.
    pub(crate) fn scope_id(&self) -> ScopeId {
        self.id
    }

    /// The registry's global count.
    pub(crate) fn global(&self) -> &GlobalFlight {
        &self.global
    }

    /// The registry's [`id`](Registry::id) (the address an upgrade would
    /// give, read without one).
    pub(crate) fn registry_id(&self) -> usize {
        self.registry.as_ptr() as usize
    }

    /// The registry, unless it is gone (then nothing waits in it either).
    pub(crate) fn registry(&self) -> Option<Registry> {
        self.registry.upgrade().map(|shared| Registry { shared })
    }

    /// Gives the request's global permit back, to the permits' shard of
    /// this word shard's number (its thread's home, for a request admitted
    /// on its home shard: no lookup of the home); whether requests wait for
    /// one (then the caller must let the first go, under the lock).
    #[inline]
    pub(crate) fn release_permit(&self) -> bool {
        self.global.counts.permits.release_to(self.index)
    }

    /// Ends a request admitted on this shard: its departure (if it left),
    /// its end, and the response's latency go to the shard first, then
    /// the count. Says whether it ended open or was adopted.
    pub(crate) fn end(&self, departed_at: Option<Stamp>, ended: Stamp, latency: Option<Duration>) -> Ended {
        self.state
            .end(departed_at.map(Stamp::value), ended.value(), latency)
    }
}

/// Whether a subscriber listens for the sends admitted on words (see
/// [`log_sent`]).
#[inline(always)]
pub(crate) fn logs_sends() -> bool {
    // One load while no subscriber was ever set, the common case.
    tracing::dispatcher::has_been_set() && tracing::enabled!(target: "tower_throttle", tracing::Level::DEBUG)
}

/// Logs a send admitted on `scope`'s word at DEBUG, as the scheduler logs
/// the sends it admits ("request sent"), with what the word knows: no
/// lane (the word counts requests, not lanes), no wait, no gap to come
/// (a plain scope has none). A subscriber only listens: the word stays
/// open for it (see the [module docs](self#logging)). Out of the request
/// path's way: the caller asks [`logs_sends`] first.
#[cold]
#[inline(never)]
pub(crate) fn log_sent(scope: &Scope) {
    tracing::debug!(
        target: "tower_throttle",
        scope = %scope,
        lock_free = true,
        waited_ms = 0u64,
        next_send_in_ms = 0u64,
        "request sent"
    );
}

/// What closing a scope hands the scheduler.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Adopted {
    /// Requests admitted on the word and not yet ended.
    pub(crate) in_flight: u32,
    /// Whether it was open (else there is nothing to adopt).
    pub(crate) was_open: bool,
    /// Sends on the word since the scheduler last took them in.
    pub(crate) sent: u64,
    /// The latest departure of a request that ended on the word.
    pub(crate) last_departure: Option<Stamp>,
    /// The latency average (nanoseconds + 1; 0: none).
    pub(crate) latency: u64,
    /// Whether a request ended on the word (the scope is warm).
    pub(crate) warm: bool,
}

/// The latency a biased average stands for (`None` for 0: no response).
pub(crate) fn latency_of(biased: u64) -> Option<Duration> {
    biased.checked_sub(1).map(Duration::from_nanos)
}
