//! Finding a scope by its key: a hash table of slab ids, hashed by the key
//! each scope already holds, so the key is stored once and an entry takes
//! the 8 bytes of its id (a map from key to id would take 24, and every
//! byte counts with a million scopes).

use hashbrown::HashTable;
use slab::Slab;

use super::{ScopeEntry, ScopeId};

/// The hash of scope names: one function for the whole process, seeded at
/// random once (as foldhash's `RandomState` is), so that names that
/// collide on purpose in one process do not in the next.
#[derive(Debug, Clone)]
struct NameHash(foldhash::fast::RandomState);

impl Default for NameHash {
    fn default() -> Self {
        static PROCESS: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
        NameHash(PROCESS.get_or_init(Default::default).clone())
    }
}

impl NameHash {
    /// The hash of scope name `name`.
    #[inline(always)]
    fn of(&self, name: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.0, name)
    }
}

#[derive(Debug, Default)]
pub(super) struct ScopeIndex {
    ids: HashTable<ScopeId>,
    hasher: NameHash,
}

impl ScopeIndex {
    /// The id of the scope named `key`, if indexed.
    #[inline]
    pub(super) fn get(&self, key: &str, scopes: &Slab<ScopeEntry>) -> Option<ScopeId> {
        self.ids
            .find(self.hasher.of(key), |&id| scopes[id].state.key.as_str() == key)
            .copied()
    }

    /// Indexes scope `id`, already in `scopes`, by its key.
    pub(super) fn insert(&mut self, id: ScopeId, scopes: &Slab<ScopeEntry>) {
        let hasher = &self.hasher;
        let hash = hasher.of(scopes[id].state.key.as_str());
        self.ids
            .insert_unique(hash, id, |&other| hasher.of(scopes[other].state.key.as_str()));
    }

    /// Forgets scope `id`, still in `scopes`.
    pub(super) fn remove(&mut self, id: ScopeId, scopes: &Slab<ScopeEntry>) {
        let hash = self.hasher.of(scopes[id].state.key.as_str());
        if let Ok(entry) = self.ids.find_entry(hash, |&other| other == id) {
            entry.remove();
        }
    }
}
