//! Each thread's home shard of the words, the permits and the queue
//! places: see [`FastScope`](super::FastScope).

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Shards per word, per global count, per queue places: enough that
/// the threads of a small machine each have one (on a big one, a
/// shard's threads share its lines, as all of them did before).
pub(crate) const SHARDS: usize = 4;

/// Shard `shard`'s part of `total` split over [`SHARDS`] (the first
/// ones take what does not divide).
pub(crate) fn share_of(total: usize, shard: usize) -> usize {
    total / SHARDS + usize::from(shard < total % SHARDS)
}

/// [`share_of`] for a count of `u32`s (lanes, permits).
pub(crate) fn share_of_u32(total: u32, shard: usize) -> u32 {
    let share = share_of(usize::try_from(total).unwrap_or(usize::MAX), shard);
    u32::try_from(share).unwrap_or(total)
}

/// The home the next thread gets. Not a protocol: a home is a hint of
/// where to look first, and any value is correct.
static NEXT_HOME: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's home (`usize::MAX`: none given yet).
    static HOME: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// This thread's home shard: threads get them in turn, as they first
/// ask.
#[inline]
pub(crate) fn home() -> usize {
    HOME.try_with(|home| match home.get() {
        usize::MAX => {
            let given = NEXT_HOME.fetch_add(1, Ordering::Relaxed) % SHARDS;
            home.set(given);
            given
        }
        given => given,
    })
    .unwrap_or(0)
}

/// Makes `home` this thread's home shard (tests that take from a
/// given shard).
#[cfg(test)]
pub(crate) fn set_home(home: usize) {
    HOME.with(|cell| cell.set(home % SHARDS));
}
