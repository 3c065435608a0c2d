//! A registry split into shards: each scope's state behind one of several
//! locks, chosen by the hash of its name, so that threads working on
//! different scopes do not wait for each other (issue 26).
//!
//! # Homes and the joint shard
//!
//! Each shard is a whole scheduler for
//! the scopes it holds: their state, waiters, tickets, timers and eviction.
//! A scope's **home** is the shard its name hashes to. A request of one
//! scope takes its home's lock alone, and so does every update of one
//! scope (feedback, a hold, a config change, stats).
//!
//! A request of several scopes is admitted all-or-nothing, in one order of
//! waiters, by one scheduler: shard 0, the **joint** shard. Every scope a
//! multi-scope request names lives there from then on. A scope that lives
//! in another home when a multi-scope request first names it moves:
//!
//! - at once, when nothing of it is in flight or waiting at home (its
//!   state, with every limit in force, goes over under both locks, taken
//!   in shard order: the joint shard first);
//! - otherwise it **leaves**: its home keeps it (and its waiters and
//!   requests in flight) until they are done, and takes no new request of
//!   it; new requests go to the joint shard, where the scope **arrives**
//!   as a placeholder that admits nothing. When the last of its requests
//!   at home is done, its state moves over, under both locks, and the
//!   requests waiting in the joint shard go in their order. A scope's
//!   limits are never applied by two shards at once, and no request
//!   passes one that came before it.
//!
//! A home that gave a scope away remembers where it went (its name, in
//! `elsewhere`): a one-scope request of it takes the home's lock, sees
//! it, and goes on to the joint shard's lock. When the joint shard evicts
//! the scope (idle, see eviction), it tells the home, which holds the
//! scope again from its next request.
//!
//! # The global limit across shards
//!
//! `max_concurrency` is one atomic count for all shards, taken by
//! compare-and-swap. Requests that wait for a permit wait in their
//! shard's global queue, and in one order across shards (`Across`): a
//! permit given back goes to the oldest of them, whatever its shard (the
//! shard that gave it back lets the shard of that waiter know after
//! releasing its own lock), and no request of another shard takes it
//! first. A shard queuing a waiter as another gives the last permit back
//! always leaves one of the two to let it go: `loom/` checks that
//! exchange (the shared count of waiters against the global count).
//!
//! # Eviction across shards
//!
//! Each shard keeps its own idle scopes as eviction candidates, oldest
//! first, and publishes when its oldest is due (a stamp per shard, in the
//! registry's global count). The registry keeps a **hint**, the earliest
//! of those instants (lowered with `fetch_min` whenever a shard publishes
//! its own): each sharded lock's epilogue reads it (one relaxed load and
//! a compare), and once it is due, the request, after releasing its lock,
//! sweeps the shards: one lock at a time, each due shard evicts the
//! scopes idle past `idle_ttl` (a few candidates at most, as under its own
//! requests), and every shard's instant goes back into the hint. So a
//! shard nobody sends to loses its idle scopes to any shard's traffic, a
//! request ending on a lock-free word included (with shards a word reads
//! the hint).
//!
//! `max_scopes` counts the scopes of every shard. The shard that makes a
//! new scope past it evicts its own least recently used idle scopes while
//! its oldest candidate is the oldest of all shards'; otherwise (or with
//! none) it makes the scope past the limit and, once its lock is
//! released, the shards whose oldest candidates are the oldest evict, one
//! lock at a time, until the registry holds `max_scopes` again or no
//! shard has a candidate it may evict (a few looks per lock, each shard
//! asked twice at most per new scope; a shard that evicted nothing is
//! not asked again in that pass, and one whose oldest must stay, held or
//! backing off, does not keep the others' from going). The order is least
//! recently used: within a shard exactly, and across shards by when each
//! shard's oldest candidate joined (its second, then the instant its
//! scope became idle; scopes idle since the same instant in two shards go
//! in shard order). Each shard tells the others when its front candidate
//! changes. A scope used again since it became a candidate gets a second
//! chance, as with one shard (counted from the start of its second, so it
//! is looked at first).
//!
//! # What is per shard
//!
//! The order of waiters within a scope is exact, as with one lock. Across
//! scopes of different homes it is the shards' own (scopes are
//! independent). [`Registry::scope_stats`](crate::Registry::scope_stats)
//! of a scope leaving its home counts it whole: its home's state and
//! requests, and the requests waiting for it in the joint shard.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use super::ticket::OrderKey;

/// The most shards a registry may have (the shard rides in the top bits of
/// the ids a throttled request keeps).
pub(crate) const MAX_SHARDS: usize = 1 << SHARD_BITS;

/// Four per core the machine has, as a power of two, at most `at_most` (a
/// power of two): the default number of shards, so that threads running
/// at once seldom share one.
pub(crate) fn four_per_core(at_most: usize) -> usize {
    debug_assert!(at_most.is_power_of_two());
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    cores
        .saturating_mul(4)
        .checked_next_power_of_two()
        .map_or(at_most, |count| count.min(at_most))
}
const SHARD_BITS: u32 = 8;
/// Where an id's shard starts: its top [`SHARD_BITS`] (a scheduler's own
/// ids are slab keys, far below; the joint shard's ids are its own).
const SHARD_AT: u32 = usize::BITS - SHARD_BITS;

/// The joint shard: where requests of several scopes, and their scopes,
/// live.
pub(crate) const JOINT: usize = 0;

/// A scheduler's id (a ticket's or a scope's) with its shard, as a
/// throttled request keeps it: the id itself in the joint shard (and so in
/// a registry of one shard).
#[inline(always)]
pub(crate) fn encode(shard: usize, local: usize) -> usize {
    debug_assert!(local < 1 << SHARD_AT, "a scheduler's ids are slab keys");
    local | shard << SHARD_AT
}

/// The shard and the scheduler's own id of an [`encode`]d id.
#[inline(always)]
pub(crate) fn decode(id: usize) -> (usize, usize) {
    (id >> SHARD_AT, id & ((1 << SHARD_AT) - 1))
}

/// The hash of scope names: one function for the whole process (seeded at
/// random once, as foldhash's `RandomState` is), shared by every shard's
/// index of scopes and the choice of a scope's home, so that one hash per
/// request serves both (and names that collide on purpose in one process
/// do not in the next).
#[derive(Debug, Clone)]
pub(crate) struct NameHash(foldhash::fast::RandomState);

impl Default for NameHash {
    fn default() -> Self {
        static PROCESS: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
        NameHash(PROCESS.get_or_init(Default::default).clone())
    }
}

impl NameHash {
    /// The hash of scope name `name`.
    #[inline(always)]
    pub(crate) fn of(&self, name: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.0, name)
    }
}

/// Where in a name's hash its home is read: above the bits a shard's hash
/// table uses for a bucket (its low bits, up to four billion buckets) and
/// below the seven it keeps as a tag (its top bits), so that the scopes of
/// one shard still spread over its table.
const HOME_AT: u32 = 32;

/// The home shard, among `shards` (a power of two), of the scope whose
/// name has hash `hash` (see [`NameHash`]).
#[inline(always)]
pub(crate) fn home_of_hash(hash: u64, shards: usize) -> usize {
    (hash >> HOME_AT) as usize & (shards - 1)
}

/// The home shard of scope `name` among `shards` (a power of two).
pub(crate) fn home_of(name: &str, shards: usize) -> usize {
    home_of_hash(NameHash::default().of(name), shards)
}

/// Where a scope a home shard gave away is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Still held at home until its requests there are done; new requests
    /// go to the joint shard.
    Leaving,
    /// In the joint shard.
    Joint,
}

/// What the shards of a registry with more than one share: the order of
/// waiters, the requests that wait for a global permit in every shard, and
/// the registry-wide counts the gauges and the warning read.
#[derive(Debug, Default)]
pub(crate) struct Across {
    /// How many shards.
    shards: usize,
    /// The next waiter's place in the one order of all shards.
    seq: AtomicU64,
    /// Requests waiting for a global permit, oldest first, with their
    /// shard: a permit given back goes to the first.
    global_waiters: Mutex<BTreeMap<OrderKey, usize>>,
    /// `global_waiters`' length, read without its lock.
    global_waiter_count: AtomicUsize,
    /// Requests waiting in every shard.
    waiting: AtomicUsize,
    /// Scopes held by every shard.
    scopes: AtomicUsize,
}

impl Across {
    /// What `shards` shards share.
    pub(crate) fn new(shards: usize) -> Self {
        Across {
            shards,
            ..Across::default()
        }
    }

    /// How many shards.
    pub(crate) fn shards(&self) -> usize {
        self.shards
    }

    /// The next place in the order of waiters.
    pub(crate) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    fn waiters(&self) -> std::sync::MutexGuard<'_, BTreeMap<OrderKey, usize>> {
        self.global_waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request of `shard` waits for a global permit.
    pub(crate) fn add_global_waiter(&self, order: OrderKey, shard: usize) {
        let mut waiters = self.waiters();
        waiters.insert(order, shard);
        self.global_waiter_count.store(waiters.len(), Ordering::SeqCst);
    }

    /// A request no longer waits for a global permit.
    pub(crate) fn remove_global_waiter(&self, order: &OrderKey) {
        let mut waiters = self.waiters();
        waiters.remove(order);
        self.global_waiter_count.store(waiters.len(), Ordering::SeqCst);
    }

    /// Whether requests wait for a global permit in some shard.
    #[inline]
    pub(crate) fn global_waiters(&self) -> bool {
        self.global_waiter_count.load(Ordering::SeqCst) > 0
    }

    /// The oldest request waiting for a global permit, and its shard.
    pub(crate) fn first_global_waiter(&self) -> Option<(OrderKey, usize)> {
        if !self.global_waiters() {
            return None;
        }
        self.waiters()
            .first_key_value()
            .map(|(&order, &shard)| (order, shard))
    }

    /// Requests waiting in every shard, after `delta` more in one.
    pub(crate) fn waiting_changed(&self, delta: isize) -> usize {
        let before = if delta >= 0 {
            self.waiting.fetch_add(delta as usize, Ordering::Relaxed) as isize
        } else {
            self.waiting.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed) as isize
        };
        (before + delta).max(0) as usize
    }

    /// Scopes held by every shard, after `delta` more in one.
    pub(crate) fn scopes_changed(&self, delta: isize) {
        if delta >= 0 {
            self.scopes.fetch_add(delta as usize, Ordering::Relaxed);
        } else {
            self.scopes.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
        }
    }

    /// Requests waiting and scopes held, in every shard.
    pub(crate) fn levels(&self) -> (usize, usize) {
        (
            self.waiting.load(Ordering::Relaxed),
            self.scopes.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_keeps_its_shard_and_its_scheduler_id() {
        for shard in [0, 1, 7, MAX_SHARDS - 1] {
            for local in [0, 1, 12_345, (1 << SHARD_AT) - 1] {
                assert_eq!(decode(encode(shard, local)), (shard, local));
            }
        }
    }

    #[test]
    fn names_spread_over_the_shards_and_one_shard_is_the_joint_one() {
        // Short names (under eight bytes), and longer ones that differ in
        // one byte only.
        let kinds: [fn(u32) -> String; 3] = [
            |i| format!("h{i}"),
            |i| format!("host{i}.example"),
            |i| format!("www.a-rather-long-host-name-{i}.example.co.uk"),
        ];
        // The hash is seeded at random per process: 80 000 names, 10 000
        // per shard on average (a standard deviation of about 94), and
        // each shard within 6 %, more than six deviations: a fair hash
        // never fails this.
        for name in kinds {
            let mut counts = [0u32; 8];
            for i in 0..80_000 {
                counts[home_of(&name(i), 8)] += 1;
            }
            assert!(
                counts.iter().all(|&count| (9_400..10_600).contains(&count)),
                "{counts:?}"
            );
        }
        assert_eq!(home_of("anything", 1), JOINT);
    }
}
