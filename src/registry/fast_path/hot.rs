//! The open scopes a thread used last, per registry: see the parent
//! module's "Finding the scope without the lock".

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use super::{FastScope, WordShard};
use crate::scope::Scope;

/// Scopes kept per thread (over every registry): an API client's few
/// hosts, not a crawl's many, which take the lock.
const SLOTS: usize = 4;

/// A cached word: its registry, the word, and this thread's own copy
/// of the scope's key. The copy is what a request's `Scopes` gets: a
/// clone of the word's key would write the key's count, which every
/// core's requests share, and the copy's count is this thread's.
type Slot = (u64, Arc<FastScope>, Scope);

#[derive(Default)]
struct Hot {
    slots: [Option<Slot>; SLOTS],
    /// The slot the next scope replaces.
    next: usize,
}

thread_local! {
    static HOT: RefCell<Hot> = RefCell::default();
    /// The address of the word this thread last found in a directory.
    static LAST_FOUND: Cell<usize> = const { Cell::new(0) };
}

/// What the thread's cache, or the registry's directory, said.
pub(crate) enum Lookup {
    /// Admitted on the scope's open word, on this shard; the thread's
    /// copy of its key.
    Admitted(Arc<WordShard>, Scope),
    /// The scope has a word, closed or full: the lock decides, and may
    /// open it again.
    Refused,
    /// No word found.
    Missed,
}

/// Admits a request for the scope named `name` of registry `registry`
/// on its open word, if this thread has it cached.
#[inline]
pub(crate) fn admit(registry: u64, name: &str) -> Lookup {
    with_cached(registry, name, |cached| match cached {
        Some((scope, key)) => admitted(scope, key),
        None => Lookup::Missed,
    })
    .unwrap_or(Lookup::Missed)
}

/// Calls `f` with this thread's cached word of the scope named `name` of
/// registry `registry` and its copy of the key, if cached (`None` while
/// the thread is being torn down).
#[inline(always)]
fn with_cached<T>(
    registry: u64,
    name: &str,
    f: impl FnOnce(Option<(&Arc<FastScope>, &Scope)>) -> T,
) -> Option<T> {
    HOT.try_with(|hot| {
        let hot = hot.borrow();
        let cached = hot
            .slots
            .iter()
            .flatten()
            .find(|(owner, _, key)| *owner == registry && key.as_str() == name);
        f(cached.map(|(_, scope, key)| (scope, key)))
    })
    .ok()
}

/// Admits a request on `scope`'s word, found by the thread's cache or
/// the registry's directory; `key` the copy of its key the request gets.
#[inline(always)]
pub(super) fn admitted(scope: &FastScope, key: &Scope) -> Lookup {
    match scope.admit() {
        Some(shard) => {
            if super::logs_sends() {
                super::log_sent(key);
            }
            Lookup::Admitted(shard.clone(), key.clone())
        }
        None => Lookup::Refused,
    }
}

/// Calls `f` with this thread's cached words of the scopes named `a` and
/// `b` of registry `registry`, if it has both (`None` otherwise).
pub(crate) fn with_two<T>(
    registry: u64,
    (a, b): (&str, &str),
    f: impl FnOnce(&FastScope, &FastScope) -> T,
) -> Option<T> {
    HOT.try_with(|hot| {
        let hot = hot.borrow();
        let find = |name: &str| {
            hot.slots
                .iter()
                .flatten()
                .find(|(owner, _, key)| *owner == registry && key.as_str() == name)
                .map(|(_, scope, _)| scope)
        };
        Some(f(find(a)?, find(b)?))
    })
    .ok()
    .flatten()
}

/// Whether a request for the scope named `name` of registry `registry`
/// would be admitted on its open word now (see
/// [`FastScope::would_admit`]); false when this thread has no word of
/// it cached, or the word is closed or full: then only the lock knows.
#[inline]
pub(crate) fn would_admit(registry: u64, name: &str) -> bool {
    with_cached(registry, name, |cached| {
        cached.is_some_and(|(scope, _)| scope.would_admit())
    })
    .unwrap_or(false)
}

/// Notes that this thread found `scope`, of registry `registry`, in the
/// registry's directory: a word found twice in a row joins the thread's
/// cache, where the next requests find it without touching the
/// directory's lock or the word's shared key. A crawl going round many
/// scopes never finds one twice in a row, and leaves the cache alone.
#[inline(always)]
pub(super) fn found_in_directory(registry: u64, scope: &Arc<FastScope>) {
    if found_again(scope) {
        remember(registry, scope);
    }
}

/// [`found_in_directory`] for the words of a request of two scopes: when
/// the first was also the first found last time (an API client's host
/// and its server, asked for again and again), both join the cache.
pub(crate) fn found_two_in_directory(registry: u64, first: &Arc<FastScope>, second: &Arc<FastScope>) {
    if found_again(first) {
        remember(registry, first);
        remember(registry, second);
    }
}

/// Whether `scope` is the word this thread found in a directory last
/// time; notes it as the last one.
#[inline(always)]
fn found_again(scope: &Arc<FastScope>) -> bool {
    let address = Arc::as_ptr(scope) as usize;
    LAST_FOUND
        .try_with(|last| last.replace(address) == address)
        .unwrap_or(false)
}

/// Caches `scope` of registry `registry` for this thread.
pub(crate) fn remember(registry: u64, scope: &Arc<FastScope>) {
    let _ = HOT.try_with(|hot| {
        let mut hot = hot.borrow_mut();
        // A scope of the same name replaces its stale word (closed
        // for good, or evicted).
        let same_name = hot.slots.iter().position(|slot| {
            slot.as_ref()
                .is_some_and(|(owner, _, key)| *owner == registry && *key == scope.key)
        });
        let slot = match same_name {
            Some(slot) => slot,
            None => {
                let slot = hot.next;
                hot.next = (slot + 1) % SLOTS;
                slot
            }
        };
        if !hot.slots[slot]
            .as_ref()
            .is_some_and(|(_, cached, _)| Arc::ptr_eq(cached, scope))
        {
            let own_key = Scope::new(scope.key.as_str());
            hot.slots[slot] = Some((registry, scope.clone(), own_key));
        }
    });
}
