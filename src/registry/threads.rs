//! Threads told apart: a number per thread, and how many of a thing to
//! make so that threads running at once seldom share one (queue-place
//! stripes, permit pools).

use std::sync::atomic::{AtomicUsize, Ordering};

thread_local! {
    /// This thread's number (see [`thread_number`]); `usize::MAX` until
    /// asked.
    static THREAD_NUMBER: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

/// The number the next thread to ask for one gets.
static NEXT_THREAD_NUMBER: AtomicUsize = AtomicUsize::new(0);

/// The calling thread's number: threads are given numbers in turn, the
/// first time they ask, so threads started together (a runtime's workers,
/// a bench's threads) have numbers next to each other and pick different
/// stripes or pools with them (below `usize::MAX / 2`, so a caller may add
/// to it).
#[inline(always)]
pub(crate) fn thread_number() -> usize {
    THREAD_NUMBER.with(|number| match number.get() {
        usize::MAX => {
            let given = NEXT_THREAD_NUMBER.fetch_add(1, Ordering::Relaxed) % (usize::MAX / 2);
            number.set(given);
            given
        }
        given => given,
    })
}

/// Four per core the machine has, as a power of two, at most `at_most` (a
/// power of two): the default number of queue-place stripes and of permit
/// pools, so that threads running at once seldom share one.
pub(crate) fn four_per_core(at_most: usize) -> usize {
    debug_assert!(at_most.is_power_of_two());
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    cores
        .saturating_mul(4)
        .checked_next_power_of_two()
        .map_or(at_most, |count| count.min(at_most))
}
