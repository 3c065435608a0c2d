//! The two lock-free protocols of the words, apart from everything else
//! so that `loom/` can check them under every interleaving its model
//! allows (`cargo test --release --manifest-path loom/Cargo.toml`): the
//! atomics come from the parent module, std's here and loom's there.
//!
//! - [`Word`]: a scope's open bit, its lanes and its count of requests in
//!   flight, in one atomic word. An end and a close both read-modify-write
//!   the one word, so every request admitted on it is either ended on the
//!   open word or adopted by the close, never both, never neither. An
//!   admission compares the count with the lanes of the same word it
//!   swaps: a word closed and opened again with fewer lanes (a
//!   `set_scope` lowering the scope's concurrency) never admits against
//!   the lanes it had before. (With the lanes in an atomic of their own,
//!   read before the compare-and-swap, loom found an admission on the
//!   reopened word against the old count: `loom/tests/word.rs`.)
//! - [`ScopeWord`]: the [`Word`] with what the requests on it leave for
//!   the scheduler: their sends, the latest departure and end, the
//!   latency average. An end writes them before it ends on the word, and
//!   the close reads them after it closed the word, so what a request
//!   that ended on the open word left is in what the close takes in (and
//!   one that ends after the close is adopted, and finishes under the
//!   lock). The latency average moves by compare-and-swap: concurrent
//!   ends lose no sample.
//! - [`Permits`]: the global counts (one per shard) and the flag that
//!   requests wait for a permit. A release writes its count, then reads
//!   the flag; the scheduler writes the flag, then reads every count,
//!   each with a sequentially consistent fence between its write and its
//!   read, so a waiter queued as the last permit comes back is let go by
//!   one of the two. (Without the fences, with sequentially consistent accesses
//!   alone, loom found the interleaving where both read the old value: its
//!   model treats such accesses as acquire/release, and the fences are
//!   what the C++ model requires of a protocol of this shape on any
//!   hardware.)

use std::time::Duration;

use super::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use super::shard::{share_of_u32, SHARDS};

/// The open bit of a word.
const OPEN: u64 = 1 << 63;
/// The retired bit: evicted, never opened again.
const RETIRED: u64 = 1 << 62;
/// Where the lanes the open word may fill start: the 30 bits below the
/// retired bit.
const LANES_SHIFT: u32 = 32;
/// The most lanes a word holds; a scope of more fills this many on its
/// word (a billion requests in flight on one scope is not a case).
const MAX_LANES: u32 = (1 << 30) - 1;
/// The count of requests admitted on the word and not yet ended.
const COUNT: u64 = u32::MAX as u64;

/// A scope's open bit, its lanes and its count of requests in flight on
/// it, in one atomic word.
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

    /// Opens a closed word with nothing in flight, with `lanes` lanes (at
    /// most [`MAX_LANES`]); false when it was retired (or not closed and
    /// empty).
    pub(crate) fn open(&self, lanes: u32) -> bool {
        let lanes = u64::from(lanes.min(MAX_LANES)) << LANES_SHIFT;
        self.0
            .compare_exchange(0, OPEN | lanes, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Whether [`try_admit`](Self::try_admit) would admit a request now
    /// (a load: it takes nothing, and may be stale by the time it returns).
    pub(crate) fn has_free_lane(&self) -> bool {
        let state = self.0.load(Ordering::Acquire);
        let lanes = (state >> LANES_SHIFT) & u64::from(MAX_LANES);
        state & OPEN != 0 && state & COUNT < lanes
    }

    /// Admits a request on the open word when a lane is free: fewer in
    /// flight than the lanes the same word holds.
    pub(crate) fn try_admit(&self) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                let lanes = (state >> LANES_SHIFT) & u64::from(MAX_LANES);
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
    /// it was closed before, and those were adopted then). Its lanes go
    /// with the open bit: it opens again with the lanes then in force.
    pub(crate) fn close(&self) -> (u32, bool) {
        let before = self.0.fetch_and(RETIRED | COUNT, Ordering::AcqRel);
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

/// A scope's [`Word`] and what the requests admitted on it leave for the
/// scheduler; see the [module docs](self). Instants are stamps' values
/// (0: none).
///
/// What every request writes comes first (`repr(C)`): with the owner's
/// `Arc` counts, one cache line or two.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct ScopeWord {
    /// The open bit, the lanes and the count.
    word: Word,
    /// Sends admitted on the word since the scheduler last took them in.
    sent: AtomicU64,
    /// The latest departure of a request that ended on the word: where a
    /// gap starts if the scope gets a delay.
    last_departure: AtomicU64,
    /// The latest end of a request on the word: since when the scope is
    /// idle, for eviction.
    last_end: AtomicU64,
    /// The latency average as the scope keeps it (nanoseconds + 1; 0: no
    /// response yet), moved by the responses that end on the word; its
    /// [`MOVED`] bit set once one did since the word opened.
    latency: AtomicU64,
}

/// The bit of [`ScopeWord`]'s latency set once a response moved it since
/// the word opened (averages stay below `u64::MAX / 8`).
const MOVED: u64 = 1 << 63;

/// What closing a [`ScopeWord`] hands the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Closed {
    /// Requests admitted on the word and not yet ended.
    pub(crate) in_flight: u32,
    /// Whether it was open (else there is nothing to adopt).
    pub(crate) was_open: bool,
    /// Sends on the word since the scheduler last took them in.
    pub(crate) sent: u64,
    /// The latest departure of a request that ended on the word (0: none).
    pub(crate) last_departure: u64,
    /// The latency average (nanoseconds + 1; 0: none).
    pub(crate) latency: u64,
    /// Whether a response moved the latency average since the word opened.
    pub(crate) moved: bool,
    /// Whether a request ended on the word.
    pub(crate) warm: bool,
}

impl Closed {
    /// What closing a scope's shards hands the scheduler: their counts
    /// summed, their latest departure, and the mean of the latency averages
    /// that responses moved (each shard's own; the opening average when
    /// none moved). With one thread, one shard moves: its average is the
    /// scope's, exactly as on one word. With several, every sample counts
    /// in its shard's average, and the shards count alike.
    pub(crate) fn of_shards(shards: impl IntoIterator<Item = Closed>) -> Closed {
        let mut all = Closed {
            in_flight: 0,
            was_open: false,
            sent: 0,
            last_departure: 0,
            latency: 0,
            moved: false,
            warm: false,
        };
        let mut latencies = LatencyMean::default();
        for shard in shards {
            all.in_flight += shard.in_flight;
            all.was_open |= shard.was_open;
            all.sent += shard.sent;
            all.last_departure = all.last_departure.max(shard.last_departure);
            all.warm |= shard.warm;
            latencies.add(shard.latency, shard.moved);
        }
        (all.latency, all.moved) = latencies.mean();
        all
    }
}

/// The mean of shards' latency averages (see [`Closed::of_shards`]).
#[derive(Debug, Default)]
pub(crate) struct LatencyMean {
    /// The sum of the moved averages' nanoseconds, and how many moved.
    moved: (u64, u64),
    /// The average of a shard that did not move (the opening one).
    unmoved: u64,
}

impl LatencyMean {
    /// Adds one shard's average (nanoseconds + 1; 0: none).
    pub(crate) fn add(&mut self, biased: u64, moved: bool) {
        match (moved, biased.checked_sub(1)) {
            // Each at most `u64::MAX / 8`: a few shards' sum fits.
            (true, Some(nanos)) => self.moved = (self.moved.0.saturating_add(nanos), self.moved.1 + 1),
            _ => self.unmoved = self.unmoved.max(biased),
        }
    }

    /// The mean (biased), and whether any shard moved.
    pub(crate) fn mean(&self) -> (u64, bool) {
        match self.moved {
            (_, 0) => (self.unmoved, false),
            (sum, count) => (sum / count + 1, true),
        }
    }
}

impl ScopeWord {
    /// A closed word with nothing left on it.
    pub(crate) fn new() -> Self {
        ScopeWord {
            word: Word::new(),
            sent: AtomicU64::new(0),
            last_departure: AtomicU64::new(0),
            last_end: AtomicU64::new(0),
            latency: AtomicU64::new(0),
        }
    }

    /// Whether requests may be admitted on the word now.
    pub(crate) fn is_open(&self) -> bool {
        self.word.is_open()
    }

    /// Whether the word is open with a lane free now (see
    /// [`Word::has_free_lane`]).
    pub(crate) fn has_free_lane(&self) -> bool {
        self.word.has_free_lane()
    }

    /// Requests in flight on the word.
    pub(crate) fn in_flight(&self) -> u32 {
        self.word.in_flight()
    }

    /// Opens a closed word with nothing in flight, with `lanes` lanes and
    /// the scheduler's latency average (`latency`, as the scope keeps
    /// it); under the lock. False when it was retired.
    pub(crate) fn open(&self, lanes: u32, latency: u64) -> bool {
        self.latency.store(latency, Ordering::Relaxed);
        self.word.open(lanes)
    }

    /// Admits a request on the open word when a lane is free, and counts
    /// its send.
    #[inline]
    pub(crate) fn try_admit(&self) -> bool {
        let admitted = self.word.try_admit();
        if admitted {
            self.count_sent();
        }
        admitted
    }

    /// Counts a send admitted on the word (see [`take_two_lanes`]).
    #[inline]
    pub(crate) fn count_sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Ends a request admitted on the word: its departure (if it left),
    /// its end, and the response's latency go to the word first, then the
    /// count. Says whether it ended open or was adopted.
    pub(crate) fn end(&self, departed_at: Option<u64>, ended: u64, latency: Option<Duration>) -> Ended {
        if let Some(at) = departed_at {
            self.last_departure.fetch_max(at, Ordering::Relaxed);
        }
        self.last_end.fetch_max(ended, Ordering::Relaxed);
        if let Some(latency) = latency {
            let _ = self
                .latency
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |biased| {
                    Some(moving_average(biased & !MOVED, latency) | MOVED)
                });
        }
        self.word.end()
    }

    /// Closes the word (under the lock), then takes in what the requests
    /// that ended on it left.
    pub(crate) fn close(&self) -> Closed {
        let (in_flight, was_open) = self.word.close();
        let latency = self.latency.load(Ordering::Relaxed);
        Closed {
            in_flight,
            was_open,
            sent: self.sent.swap(0, Ordering::Relaxed),
            last_departure: self.last_departure.load(Ordering::Relaxed),
            latency: latency & !MOVED,
            moved: latency & MOVED != 0,
            warm: self.last_end.load(Ordering::Relaxed) != 0,
        }
    }

    /// Retires a word with nothing in flight (under the lock, for
    /// eviction): false when requests are in flight on it.
    pub(crate) fn retire(&self) -> bool {
        self.word.retire()
    }

    /// Sends on the word the scheduler has not taken in yet.
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// The latency average as the scope keeps it (0: none), and whether a
    /// response moved it since the word opened.
    pub(crate) fn latency(&self) -> (u64, bool) {
        let latency = self.latency.load(Ordering::Relaxed);
        (latency & !MOVED, latency & MOVED != 0)
    }

    /// The latest end of a request on the word (0: none).
    pub(crate) fn last_end(&self) -> u64 {
        self.last_end.load(Ordering::Relaxed)
    }
}

/// What [`take_two_lanes`] gave.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TwoLanes {
    /// A lane on each: the indices of the words, in their candidates.
    Taken(usize, usize),
    /// Nothing taken: a word of the first scope, or one of the second's,
    /// had no lane free (the first's lane, taken, went back on its open
    /// word).
    Refused,
    /// The second scope had no lane free, and the first's lane, taken on
    /// its word at this index, was adopted by a close meanwhile: the
    /// scheduler counts it in flight, and the caller finishes it under the
    /// lock, never sent.
    FirstAdopted(usize),
}

/// Takes a lane for a request of two scopes: on the first of `first`'s
/// words with one free, then on the first of `second`'s (each scope's
/// words in the order the caller tries its shards). When the second scope
/// has none, the first's lane goes back, as a request that never left
/// ends. A send is counted on each word only once both lanes are taken.
///
/// A close of either scope may come at any point: a lane taken before it
/// is adopted, and either ends on its word as [`Ended::Adopted`] (the
/// caller's end finishes it under the lock) or comes back here as
/// [`TwoLanes::FirstAdopted`]. So every lane taken is given back once, on
/// the open word or by the scheduler (`loom/tests/word.rs`).
pub(crate) fn take_two_lanes(first: &[&ScopeWord], second: &[&ScopeWord]) -> TwoLanes {
    let Some(one) = first.iter().position(|word| word.word.try_admit()) else {
        return TwoLanes::Refused;
    };
    let Some(two) = second.iter().position(|word| word.word.try_admit()) else {
        return match first[one].word.end() {
            Ended::Open => TwoLanes::Refused,
            Ended::Adopted => TwoLanes::FirstAdopted(one),
        };
    };
    first[one].count_sent();
    second[two].count_sent();
    TwoLanes::Taken(one, two)
}

/// The scope's moving average (weight 1/5 for the newest sample, in
/// nanoseconds + 1; 0: none yet) after `latency`: the rule
/// `ScopeState::observe_latency` applies, on the biased value.
pub(crate) fn moving_average(biased: u64, latency: Duration) -> u64 {
    let latest = u64::try_from(latency.as_nanos())
        .unwrap_or(u64::MAX)
        .min(u64::MAX / 8);
    let average = match biased {
        0 => latest,
        biased => ((biased - 1).min(u64::MAX / 8) * 4 + latest) / 5,
    };
    average + 1
}

/// The global count of requests in flight and whether requests wait for a
/// permit.
///
/// The free permits are split over [`SHARDS`] counts, each on lines of
/// its own: a thread takes from its home count (the caller says which)
/// and gives back to it, and looks at the others only when its own is
/// empty. Two threads thus write no line of each other's on the common
/// path; the scheduler, under its lock, has a count of its own. The
/// permits move between counts (a request taken on one thread may end on
/// another): only the sum is the limit, and every decision that needs the
/// sum (is a permit free anywhere?) reads every count.
///
/// The waiters' protocol: a release writes its count, then, after a
/// sequentially consistent fence, reads the flag; the scheduler writes the
/// flag, then, after its fence, reads every count. A permit given back as
/// a waiter queues is seen by one of the two.
#[derive(Debug)]
pub(crate) struct Permits {
    /// Free permits, per shard.
    free: [PermitShard; SHARDS],
    /// Whether requests wait for a permit (the scheduler's global queue is
    /// not empty): read by every request, written rarely.
    queued: Queued,
    max: u32,
}

/// One shard's free permits, on lines of its own (128 bytes: cores fetch
/// adjacent lines in pairs).
#[derive(Debug)]
#[repr(align(128))]
struct PermitShard(AtomicU32);

/// [`Permits`]' flag, on lines of its own.
#[derive(Debug)]
#[repr(align(128))]
struct Queued(AtomicBool);

impl Permits {
    /// `max` permits, none taken.
    pub(crate) fn new(max: u32) -> Self {
        Permits {
            free: std::array::from_fn(|shard| PermitShard(AtomicU32::new(share_of_u32(max, shard)))),
            queued: Queued(AtomicBool::new(false)),
            max,
        }
    }

    /// Free permits now, over every shard, in a `u64`: read one after the
    /// other while permits move, the counts can add up to more than the
    /// maximum, which may be `u32::MAX`.
    fn free(&self) -> u64 {
        self.free
            .iter()
            .map(|shard| u64::from(shard.0.load(Ordering::SeqCst)))
            .sum()
    }

    /// Requests in flight now (a permit moving between shards as they are
    /// read may be missed: exact once traffic stops).
    pub(crate) fn in_flight(&self) -> u32 {
        let in_flight = u64::from(self.max).saturating_sub(self.free());
        u32::try_from(in_flight).unwrap_or(self.max)
    }

    /// Whether a permit is free now, in any shard.
    #[inline]
    pub(crate) fn has_room(&self) -> bool {
        self.free.iter().any(|shard| shard.0.load(Ordering::SeqCst) > 0)
    }

    /// Takes a permit, if one is free, from shard `home` first, then from
    /// the others: under the lock (the lock's shard first), or for
    /// [`try_take_at`](Self::try_take_at). A compare-and-swap, as on a
    /// word, since a request on a word may take the last permit between
    /// the scheduler's check and its take. The queued flag does not stop
    /// it: the scheduler orders its own waiters.
    #[inline]
    pub(crate) fn take_at(&self, home: usize) -> bool {
        take_one(&self.free[home].0) || self.take_elsewhere(home)
    }

    /// [`take_at`](Self::take_at) past an empty home shard: from
    /// the others, in turn.
    #[cold]
    #[inline(never)]
    fn take_elsewhere(&self, home: usize) -> bool {
        (1..SHARDS).any(|step| take_one(&self.free[(home + step) % SHARDS].0))
    }

    /// Whether [`try_take_at`](Self::try_take_at) would take a permit now (loads
    /// only: it takes nothing).
    #[inline]
    pub(crate) fn would_take(&self) -> bool {
        !self.queued.0.load(Ordering::SeqCst) && self.has_room()
    }

    /// Takes a permit without the lock, if one is free, for a thread
    /// whose home shard is `home`; none while requests wait for one.
    #[inline]
    pub(crate) fn try_take_at(&self, home: usize) -> bool {
        !self.queued.0.load(Ordering::SeqCst) && self.take_at(home)
    }

    /// Gives a permit back, to shard `shard` (any shard is right: only the
    /// sum is the limit; the caller's own keeps the line its); whether
    /// requests wait for one (then the caller must let the first go, under
    /// the lock).
    #[inline]
    pub(crate) fn release_to(&self, shard: usize) -> bool {
        self.free[shard % SHARDS].0.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        self.queued.0.load(Ordering::SeqCst)
    }

    /// Says, under the lock, whether requests wait for a permit; true when
    /// a permit is free although they do (one was given back without the
    /// lock as they queued): the caller lets them go then.
    #[inline(always)]
    pub(crate) fn publish_queued(&self, queued: bool) -> bool {
        if self.queued.0.load(Ordering::Relaxed) != queued {
            self.queued.0.store(queued, Ordering::SeqCst);
        }
        if !queued {
            return false;
        }
        fence(Ordering::SeqCst);
        self.has_room()
    }
}

/// Takes one from `count` if it is above 0.
#[inline]
fn take_one(count: &AtomicU32) -> bool {
    count
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |free| free.checked_sub(1))
        .is_ok()
}
