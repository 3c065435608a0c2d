//! A set of HTTP status codes that only grows, read without a lock: the
//! statuses that are a backoff status in some scope's config (see
//! `registry/report.rs`'s `BackoffStatuses`). Its atomics come from the
//! parent module, std's here and loom's in `loom/`, which checks that
//! codes added at once, by config changes that take no lock for it, are
//! all kept.

use super::atomic::{AtomicU64, Ordering};

/// Codes 0–639, one bit each (HTTP statuses are 100–599).
const WORDS: usize = 10;

/// A set of status codes that only grows.
#[derive(Debug, Default)]
pub(crate) struct StatusSet {
    bits: [AtomicU64; WORDS],
}

impl StatusSet {
    /// Adds `code` (one read-modify-write: codes added at once are all
    /// kept); a code beyond the set's range is left out, and
    /// [`may_contain`](Self::may_contain) says yes to it anyway.
    pub(crate) fn add(&self, code: u16) {
        if let Some(word) = self.bits.get(usize::from(code / 64)) {
            word.fetch_or(1 << (code % 64), Ordering::Relaxed);
        }
    }

    /// Whether `status` may be in the set: it was added, or is beyond the
    /// set's range.
    pub(crate) fn may_contain(&self, status: u16) -> bool {
        self.bits
            .get(usize::from(status / 64))
            .is_none_or(|word| word.load(Ordering::Relaxed) & (1 << (status % 64)) != 0)
    }
}
