//! Finding a scope by its key: a hash table of slab ids, hashed by the key
//! each scope already holds, so the key is stored once and an entry takes
//! the 8 bytes of its id (a map from key to id would take 24, and every
//! byte counts with a million scopes).

use hashbrown::HashTable;
use slab::Slab;

use super::{ScopeEntry, ScopeId};
use crate::scope::names::{same_name, NameHash};

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
            .find(self.hasher.of(key), |&id| {
                same_name(scopes[id].state.key.as_str(), key)
            })
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
