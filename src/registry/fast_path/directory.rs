//! A registry's words by scope name, read without the scheduler's lock:
//! see the parent module's "Finding the scope without the lock".
//!
//! The words are spread over [`PARTS`] tables by their name's hash, each
//! behind a read-write lock of its own on lines of its own. A lookup holds
//! its table's read lock for one probe and one admission on the word;
//! only the scheduler writes, under its own lock, when a word is made or
//! its scope evicted. So two threads meet on a table's lock only when
//! their scopes share the table, and never wait for the scheduler.

use std::sync::{Arc, PoisonError, RwLock};

use hashbrown::HashTable;

use super::hot::{admitted, found_in_directory, Lookup};
use super::FastScope;
use crate::scope::names::{same_name, NameHash};

/// Tables per directory: enough that two threads on different scopes
/// seldom share one (64 × 128 bytes a registry).
const PARTS: usize = 64;

/// The words of a registry's plain scopes, by name.
#[derive(Debug)]
pub(crate) struct Directory {
    parts: Box<[Part]>,
    hasher: NameHash,
}

/// One table of a [`Directory`], on lines of its own (128 bytes: cores
/// fetch adjacent lines in pairs).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Part {
    words: RwLock<HashTable<Arc<FastScope>>>,
}

impl Default for Directory {
    fn default() -> Self {
        Directory {
            parts: (0..PARTS).map(|_| Part::default()).collect(),
            hasher: NameHash::default(),
        }
    }
}

impl Directory {
    /// The table of names hashed to `hash`: picked by a product of the
    /// whole hash, since the table itself uses its low bits (buckets) and
    /// its top seven (tags).
    #[inline(always)]
    fn part(&self, hash: u64) -> &Part {
        &self.parts[Self::part_index(hash)]
    }

    /// The index of [`part`](Self::part).
    #[inline(always)]
    fn part_index(hash: u64) -> usize {
        let mixed = hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - PARTS.trailing_zeros());
        mixed as usize % PARTS
    }

    /// Admits a request for the scope named `name` on its word, if the
    /// directory has one (see [`Lookup`]); `registry` the number of the
    /// registry it belongs to, for the thread's cache (see
    /// [`found_in_directory`]).
    #[inline]
    pub(crate) fn admit(&self, registry: u64, name: &str) -> Lookup {
        self.with_word(name, |word| match word {
            Some(word) => {
                found_in_directory(registry, word);
                admitted(word, &word.key)
            }
            None => Lookup::Missed,
        })
    }

    /// Calls `f` with the words of the scopes named `a` and `b`, those
    /// listed, under their tables' read locks: one lock when both are in
    /// one table, else both, the lower table's first. (Only the scheduler
    /// writes, one table at a time, so readers that take two in one order
    /// never wait on each other in a circle.)
    pub(crate) fn with_two<T>(
        &self,
        (a, b): (&str, &str),
        f: impl FnOnce(Option<&Arc<FastScope>>, Option<&Arc<FastScope>>) -> T,
    ) -> T {
        let hashes = (self.hasher.of(a), self.hasher.of(b));
        let parts = (Self::part_index(hashes.0), Self::part_index(hashes.1));
        let read = |part: usize| {
            self.parts[part]
                .words
                .read()
                .unwrap_or_else(PoisonError::into_inner)
        };
        if parts.0 == parts.1 {
            let words = read(parts.0);
            return f(listed(&words, hashes.0, a), listed(&words, hashes.1, b));
        }
        let (low, high) = (read(parts.0.min(parts.1)), read(parts.0.max(parts.1)));
        let (words_a, words_b) = if parts.0 < parts.1 {
            (&low, &high)
        } else {
            (&high, &low)
        };
        f(listed(words_a, hashes.0, a), listed(words_b, hashes.1, b))
    }

    /// Whether a request for the scope named `name` would be admitted on
    /// its word now (see [`FastScope::would_admit`]).
    pub(crate) fn would_admit(&self, name: &str) -> bool {
        self.with_word(name, |word| word.is_some_and(|word| word.would_admit()))
    }

    /// Calls `f` with the word of the scope named `name`, if any, under
    /// its table's read lock.
    #[inline(always)]
    fn with_word<T>(&self, name: &str, f: impl FnOnce(Option<&Arc<FastScope>>) -> T) -> T {
        let hash = self.hasher.of(name);
        // Nothing panics under these locks; a poisoned one is as good.
        let words = self
            .part(hash)
            .words
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        f(listed(&words, hash, name))
    }

    /// Lists `word` under its scope's name (under the scheduler's lock,
    /// when the word is made: a scope has one word while it lives).
    pub(crate) fn insert(&self, word: &Arc<FastScope>) {
        let hasher = &self.hasher;
        let hash = hasher.of(word.key.as_str());
        let mut words = self
            .part(hash)
            .words
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        words.insert_unique(hash, word.clone(), |other| hasher.of(other.key.as_str()));
    }

    /// Forgets `word` (under the scheduler's lock, when its scope is
    /// evicted: the word is retired, so a request that still finds it
    /// meanwhile is refused and goes to the lock).
    pub(crate) fn remove(&self, word: &FastScope) {
        let hash = self.hasher.of(word.key.as_str());
        let mut words = self
            .part(hash)
            .words
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Ok(entry) = words.find_entry(hash, |other| std::ptr::eq(&**other, word)) {
            entry.remove();
        }
    }

    /// Words listed (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.parts
            .iter()
            .map(|part| part.words.read().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }
}

/// The word of the scope named `name` (its hash `hash`) in a table.
#[inline(always)]
fn listed<'a>(words: &'a HashTable<Arc<FastScope>>, hash: u64, name: &str) -> Option<&'a Arc<FastScope>> {
    words.find(hash, |word| same_name(word.key.as_str(), name))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Weak};

    use super::Directory;
    use crate::registry::fast_path::{FastScope, GlobalFlight, WordOwner};
    use crate::registry::metrics::Metrics;
    use crate::scope::Scope;

    /// Words of scopes `names`, listed in a new directory.
    fn listed(names: &[&str]) -> Directory {
        let owner = WordOwner {
            global: Arc::new(GlobalFlight::new(8)),
            registry: Weak::new(),
            uid: 0,
            directory: Default::default(),
            metrics: Metrics::default(),
        };
        let directory = Directory::default();
        for (id, name) in names.iter().enumerate() {
            directory.insert(&FastScope::new(id, Scope::new(*name), &owner));
        }
        directory
    }

    /// The first `site<n>.test` after `after` whose table is (or is not)
    /// `part`'s.
    fn name_in(directory: &Directory, part: usize, same: bool, after: usize) -> String {
        (after + 1..)
            .map(|n| format!("site{n}.test"))
            .find(|name| (Directory::part_index(directory.hasher.of(name)) == part) == same)
            .expect("names cover every table")
    }

    /// Two scopes in one table (one read lock) and in two tables (both,
    /// in order), either way round: each name finds its own word, and a
    /// name not listed finds none.
    #[test]
    fn two_words_are_found_in_one_table_or_two() {
        let probe = Directory::default();
        let a = "site0.test".to_string();
        let part = Directory::part_index(probe.hasher.of(&a));
        let same = name_in(&probe, part, true, 0);
        let other = name_in(&probe, part, false, 0);
        let directory = listed(&[&a, &same, &other]);
        for (first, second) in [(&a, &same), (&same, &a), (&a, &other), (&other, &a)] {
            let found = directory.with_two((first, second), |x, y| {
                (
                    x.map(|word| word.key.to_string()),
                    y.map(|word| word.key.to_string()),
                )
            });
            assert_eq!(found, (Some(first.clone()), Some(second.clone())));
        }
        let missing = directory.with_two((&a, "missing.test"), |x, y| (x.is_some(), y.is_some()));
        assert_eq!(missing, (true, false));
    }
}
