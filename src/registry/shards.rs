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
//! asked twice at most per new scope). The order is least recently used
//! across shards to the second of each shard's oldest candidate, and
//! exact within a shard; a scope used again since it became a candidate
//! gets a second chance, as with one shard.
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

/// The most shards a registry may have (the shard rides in the low bits of
/// the ids a throttled request keeps).
pub const MAX_SHARDS: usize = 1 << SHARD_BITS;
const SHARD_BITS: u32 = 8;

/// The joint shard: where requests of several scopes, and their scopes,
/// live.
pub(crate) const JOINT: usize = 0;

/// A scheduler's id (a ticket's or a scope's) with its shard, as a
/// throttled request keeps it.
#[inline(always)]
pub(crate) fn encode(shard: usize, local: usize) -> usize {
    (local << SHARD_BITS) | shard
}

/// The shard and the scheduler's own id of an [`encode`]d id.
#[inline(always)]
pub(crate) fn decode(id: usize) -> (usize, usize) {
    (id & (MAX_SHARDS - 1), id >> SHARD_BITS)
}

/// The home shard of scope `name` among `shards` (a power of two).
#[inline]
pub(crate) fn home_of(name: &str, shards: usize) -> usize {
    if shards == 1 {
        return JOINT;
    }
    // Eight bytes at a time, each mixed in by a multiplication (as
    // rustc's FxHash does).
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let bytes = name.as_bytes();
    let word_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("eight bytes"));
    let mut hash = bytes.len() as u64;
    if bytes.len() >= 8 {
        let mut at = 0;
        while at + 8 < bytes.len() {
            hash = (hash.rotate_left(5) ^ word_at(at)).wrapping_mul(K);
            at += 8;
        }
        // The last eight bytes (overlapping the word before when the
        // length is not a multiple of eight).
        hash = (hash.rotate_left(5) ^ word_at(bytes.len() - 8)).wrapping_mul(K);
    } else {
        for &byte in bytes {
            hash = (hash.rotate_left(5) ^ u64::from(byte)).wrapping_mul(K);
        }
    }
    // A final mix (as murmur3's), so the low bits depend on every byte.
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash as usize & (shards - 1)
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
            for local in [0, 1, 12_345, usize::MAX >> SHARD_BITS] {
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
        for name in kinds {
            let mut counts = [0u32; 8];
            for i in 0..8_000 {
                counts[home_of(&name(i), 8)] += 1;
            }
            assert!(
                counts.iter().all(|&count| (900..1_100).contains(&count)),
                "{counts:?}"
            );
        }
        assert_eq!(home_of("anything", 1), JOINT);
    }
}
