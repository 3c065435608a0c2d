//! The two lock-free protocols of the words, apart from everything else
//! so that `loom/` can check them under every interleaving its model
//! allows (`cargo test --release --manifest-path loom/Cargo.toml`): the
//! atomics come from the parent module, std's here and loom's there.
//!
//! - [`Word`]: a scope's open bit and count of requests in flight. An end
//!   and a close both read-modify-write the one word, so every request
//!   admitted on it is either ended on the open word or adopted by the
//!   close, never both, never neither.
//! - [`Permits`]: the global count, its pools' spare permits, and the flag
//!   that requests wait for a permit. A release writes the count (or a
//!   pool's spare), then reads the flag; the scheduler writes the flag,
//!   then reads the count and the spares, each with a sequentially
//!   consistent fence between its write and its read, so a waiter queued as
//!   the last permit comes back is let go by one of the two. (Without the
//!   fences, with sequentially consistent accesses alone, loom found the
//!   interleaving where both read the old value: its model treats such
//!   accesses as acquire/release, and the fences are what the C++ model
//!   requires of a protocol of this shape on any hardware.)

use super::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

/// The open bit of a word.
const OPEN: u64 = 1 << 63;
/// The retired bit: evicted, never opened again.
const RETIRED: u64 = 1 << 62;
/// The count of requests admitted on the word and not yet ended.
const COUNT: u64 = u32::MAX as u64;

/// A scope's open bit and count of requests in flight on it.
#[derive(Debug)]
pub(crate) struct Word(AtomicU64);

/// How a request admitted on a word ended.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// On the open word: nothing more to do for the scope.
    Open,
    /// The word was closed meanwhile: the scheduler adopted the request,
    /// which must finish under the lock.
    Adopted,
}

impl Word {
    /// A closed word.
    pub(crate) fn new() -> Self {
        Word(AtomicU64::new(0))
    }

    /// Whether requests may be admitted on the word now.
    pub(crate) fn is_open(&self) -> bool {
        self.0.load(Ordering::Acquire) & OPEN != 0
    }

    /// Requests in flight on the word.
    pub(crate) fn in_flight(&self) -> u32 {
        (self.0.load(Ordering::Acquire) & COUNT) as u32
    }

    /// Opens a closed word with nothing in flight; false when it was
    /// retired (or not closed and empty).
    pub(crate) fn open(&self) -> bool {
        self.0
            .compare_exchange(0, OPEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Admits a request on the open word when fewer than `lanes` are in
    /// flight on it.
    pub(crate) fn try_admit(&self, lanes: u64) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                (state & OPEN != 0 && state & COUNT < lanes).then_some(state + 1)
            })
            .is_ok()
    }

    /// Ends a request admitted on the word.
    pub(crate) fn end(&self) -> Ended {
        let before = self.0.fetch_sub(1, Ordering::AcqRel);
        if before & OPEN != 0 {
            Ended::Open
        } else {
            Ended::Adopted
        }
    }

    /// Closes the word: the requests in flight on it, which the caller
    /// adopts, and whether it was open (else there is nothing to adopt:
    /// it was closed before, and those were adopted then).
    pub(crate) fn close(&self) -> (u32, bool) {
        let before = self.0.fetch_and(!OPEN, Ordering::AcqRel);
        ((before & COUNT) as u32, before & OPEN != 0)
    }

    /// Retires a word with nothing in flight: never opened again. False
    /// when requests are in flight on it.
    pub(crate) fn retire(&self) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                (state & COUNT == 0).then_some(RETIRED)
            })
            .is_ok()
    }
}

/// The global count of requests in flight and whether requests wait for a
/// permit.
///
/// With a limit large enough to share out (see [`Permits::new`]), the
/// count is split in two: `taken`, on one line, counts the permits out of
/// the global pool, and each of the pools (a line each, one per thread
/// group on words, see `pool_here` in the parent module) keeps permits
/// taken out in a batch and not in use, its *spare*. A request takes from its own
/// pool's spare and gives back to it, so threads on different pools share
/// no line on most requests; a pool refills a batch at a time from
/// `taken`, and gives a batch back when it holds two. A spare is free to
/// anyone: a caller that finds its pool and the global count empty takes
/// from another pool's, and [`has_room`](Permits::has_room) counts them.
///
/// The waiters' protocol is the one of an unshared count: a release writes
/// (its pool's spare, or `taken`), then, after a sequentially consistent
/// fence, reads the flag; the scheduler writes the flag, then, after its
/// fence, reads `taken` and every spare. A permit given back anywhere as a
/// waiter queues is seen by one of the two.
#[derive(Debug)]
pub(crate) struct Permits {
    /// Permits out of the global pool: in use, or spare in a pool.
    taken: AtomicU32,
    /// Whether requests wait for a permit (the scheduler's global queue is
    /// not empty).
    queued: AtomicBool,
    max: u32,
    /// How many permits a pool takes at once (0: no pools, every request
    /// takes from `taken`).
    batch: u32,
    /// The spare at which a pool gives a batch back: two batches.
    give_back_at: u32,
    /// The pools (none: one count), a power of two of them.
    pools: Box<[Pool]>,
    /// The pools' count less one (0 without pools): a caller's pool number
    /// masked with it is its pool.
    mask: usize,
}

/// A pool's spare permits, on a line of its own (128 bytes: cores fetch
/// adjacent lines in pairs).
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct Pool {
    spare: AtomicU32,
}

/// The fewest permits a pool takes at once: below it, pools are not worth
/// what they strand.
const MIN_BATCH: u32 = 4;
/// The most permits a pool takes at once.
const MAX_BATCH: u32 = 32;

impl Permits {
    /// `max` permits, none taken, shared out over `pools` pools when `max`
    /// allows a batch of at least [`MIN_BATCH`] per pool with a quarter of
    /// the permits at most spare in all of them; else one count (the
    /// default limit of 16 always is).
    pub(crate) fn new(max: u32, pools: usize) -> Self {
        let pools_u32 = u32::try_from(pools).unwrap_or(u32::MAX).max(1);
        let batch = (max / pools_u32.saturating_mul(8)).min(MAX_BATCH);
        if pools < 2 || batch < MIN_BATCH {
            return Self::with_pools(max, 0, 0);
        }
        Self::with_pools(max, pools.next_power_of_two(), batch)
    }

    /// `max` permits over `pools` pools that take `batch` at once (0 and 0:
    /// one count).
    pub(crate) fn with_pools(max: u32, pools: usize, batch: u32) -> Self {
        debug_assert_eq!(pools == 0, batch == 0, "pools take batches");
        debug_assert!(pools == 0 || pools.is_power_of_two(), "pools are found by a mask");
        Permits {
            taken: AtomicU32::new(0),
            queued: AtomicBool::new(false),
            max,
            batch,
            give_back_at: batch.saturating_mul(2),
            pools: (0..pools)
                .map(|_| Pool {
                    spare: AtomicU32::new(0),
                })
                .collect(),
            mask: pools.saturating_sub(1),
        }
    }

    /// Pool `pool`, round the pools; `None` without pools.
    #[inline(always)]
    fn pool(&self, pool: usize) -> Option<&Pool> {
        self.pools.get(pool & self.mask)
    }

    /// How many pools the permits are shared out over (0: one count).
    #[cfg(test)]
    pub(crate) fn pool_count(&self) -> usize {
        self.pools.len()
    }

    /// Requests in flight now: the permits taken but not spare. Exact when
    /// nothing moves; a snapshot otherwise.
    pub(crate) fn in_flight(&self) -> u32 {
        let taken = self.taken.load(Ordering::SeqCst);
        taken.saturating_sub(self.spares())
    }

    /// The permits spare in the pools.
    fn spares(&self) -> u32 {
        self.pools
            .iter()
            .map(|pool| pool.spare.load(Ordering::SeqCst))
            .fold(0, u32::saturating_add)
    }

    /// Whether a permit is free now: one left in the global pool, or one
    /// spare in some pool.
    #[inline]
    pub(crate) fn has_room(&self) -> bool {
        self.taken.load(Ordering::SeqCst) < self.max
            || self
                .pools
                .iter()
                .any(|pool| pool.spare.load(Ordering::SeqCst) > 0)
    }

    /// Takes a permit under the lock of a scheduler whose requests use
    /// pool `pool`, if one is free: from the pool's spare, else a batch
    /// from the global count, else another pool's spare; with no pool of
    /// its own (or none at all), from the global count, else any pool's
    /// spare. A compare-and-swap, as on a word, since a request on a word
    /// may take the last permit between the scheduler's check and its
    /// take. The queued flag does not stop it: the scheduler orders its own
    /// waiters.
    #[inline]
    pub(crate) fn take_locked(&self, pool: Option<usize>) -> bool {
        match pool.and_then(|pool| self.pool(pool)) {
            Some(own) => take_own_spare(own) || self.take_batch(own),
            None => self.take_from_global(1) == 1 || self.pools.iter().any(take_spare),
        }
    }

    /// Takes a batch from the global count into `own` and one of it for
    /// the caller, or else a permit spare in another pool.
    #[inline(never)]
    fn take_batch(&self, own: &Pool) -> bool {
        match self.take_from_global(self.batch) {
            0 => self.pools.iter().any(take_spare),
            1 => true,
            taken => {
                own.spare.fetch_add(taken - 1, Ordering::SeqCst);
                true
            }
        }
    }

    /// Takes a permit without the lock, for a caller of pool `pool`: from
    /// the pool's spare, else a batch from the global count, else from
    /// another pool's spare; none while requests wait for one.
    #[inline]
    pub(crate) fn try_take(&self, pool: usize) -> bool {
        if self.queued.load(Ordering::SeqCst) {
            return false;
        }
        match self.pool(pool) {
            Some(own) => take_own_spare(own) || self.take_batch(own),
            None => self.take_from_global(1) == 1,
        }
    }

    /// Takes up to `wanted` permits from the global pool (fewer when fewer
    /// are left): how many it took.
    fn take_from_global(&self, wanted: u32) -> u32 {
        match self.taken.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < self.max).then(|| n + wanted.min(self.max - n))
        }) {
            Ok(before) => wanted.min(self.max - before),
            Err(_) => 0,
        }
    }

    /// Gives a permit back to the global count; whether requests wait for
    /// one (then the caller must let the first go, under the lock).
    #[inline]
    pub(crate) fn release(&self) -> bool {
        self.taken.fetch_sub(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        self.queued.load(Ordering::SeqCst)
    }

    /// Gives a permit [`try_take`](Self::try_take) took back, to pool
    /// `pool`'s spare (to the global count without pools); whether requests
    /// wait for one, as [`release`](Self::release) says (the scheduler then
    /// finds the permit in that pool).
    #[inline]
    pub(crate) fn release_to(&self, pool: usize) -> bool {
        match self.pool(pool) {
            Some(pool) => self.give_to_pool(pool),
            None => {
                self.taken.fetch_sub(1, Ordering::SeqCst);
            }
        }
        fence(Ordering::SeqCst);
        self.queued.load(Ordering::SeqCst)
    }

    /// Gives a permit to `pool`'s spare, and a batch back to the global
    /// pool when the spare reaches two. The spare goes down before the
    /// global count does: a reader in between sees a permit fewer free,
    /// never one more, and the release's fence and read of the flag come
    /// after both.
    #[inline]
    fn give_to_pool(&self, pool: &Pool) {
        let spare = pool.spare.fetch_add(1, Ordering::SeqCst) + 1;
        if spare >= self.give_back_at {
            self.give_batch_back(pool);
        }
    }

    /// Gives a batch of `pool`'s spare back to the global count.
    #[inline(never)]
    fn give_batch_back(&self, pool: &Pool) {
        let batch = self.batch;
        let given = pool
            .spare
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |spare| {
                (spare >= batch).then(|| spare - batch)
            });
        if given.is_ok() {
            self.taken.fetch_sub(batch, Ordering::SeqCst);
        }
    }

    /// Says, under the lock, whether requests wait for a permit; true when
    /// a permit is free although they do (one was given back without the
    /// lock as they queued, or is spare in a pool): the caller lets them
    /// go then.
    #[inline(always)]
    pub(crate) fn publish_queued(&self, queued: bool) -> bool {
        if self.queued.load(Ordering::Relaxed) != queued {
            self.queued.store(queued, Ordering::SeqCst);
        }
        if !queued {
            return false;
        }
        fence(Ordering::SeqCst);
        self.has_room()
    }
}

/// Takes one of the caller's own pool's spare permits, if it has one and
/// nobody changed it meanwhile (else the caller goes on to the global
/// count: its own pool is seldom anyone else's).
#[inline(always)]
fn take_own_spare(pool: &Pool) -> bool {
    let spare = pool.spare.load(Ordering::SeqCst);
    spare > 0
        && pool
            .spare
            .compare_exchange(spare, spare - 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
}

/// Takes one of `pool`'s spare permits, if it has one.
fn take_spare(pool: &Pool) -> bool {
    pool.spare.load(Ordering::SeqCst) > 0
        && pool
            .spare
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |spare| spare.checked_sub(1))
            .is_ok()
}
