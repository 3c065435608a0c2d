//! Responses of whole-transfer scopes held unread, and the warning when
//! they keep every lane of a scope while its requests wait.
//!
//! A scope that [counts whole transfers](crate::ScopeConfig::count_whole_transfers)
//! keeps a lane until the response body ends, so a caller that collects
//! responses before reading them can wait for good. Nothing is wrong in
//! the registry then, and nothing else would tell the user: this module
//! counts, per scope, the responses whose bodies have not been polled
//! since their heads, and a watch (one task per scope at a time, only
//! while such responses exist) warns once per scope when every lane in
//! force is held by one of them, the newest for 10 s or more, while
//! requests of the scope wait.
//!
//! Only requests of whole-transfer scopes come here, under a mutex of its
//! own: the default path (lanes back at the head) never does.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::{Registry, RegistryShared};
use crate::scope::{Scope, Scopes};

/// How long every lane of a scope must have been held by unread responses
/// (counted from the newest of their heads) before the registry warns.
pub(crate) const STUCK_AFTER: Duration = Duration::from_secs(10);

/// Per scope: its responses held unread, and its watch.
#[derive(Debug, Default)]
pub(crate) struct UnreadTransfers {
    scopes: Mutex<HashMap<Scope, Unread>>,
}

#[derive(Debug, Default)]
struct Unread {
    /// Responses whose heads came and whose bodies were not polled since.
    count: u32,
    /// The latest of their heads.
    newest_head: Option<Instant>,
    /// Whether a watch task runs for the scope.
    watching: bool,
    /// Whether the scope was warned about (once per scope).
    warned: bool,
}

/// Notes that no watch runs for `scope`.
fn unwatch(map: &mut HashMap<Scope, Unread>, scope: &Scope) {
    if let Some(unread) = map.get_mut(scope) {
        unread.watching = false;
    }
}

/// What the watch does next.
enum Next {
    Stop,
    CheckAt(Instant),
    Check,
}

impl UnreadTransfers {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<Scope, Unread>) -> T) -> T {
        f(&mut self.scopes.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Registry {
    /// Notes a response of `scopes` whose head came at `head` and whose
    /// body streams on, unread yet; starts a scope's watch when none runs.
    pub(crate) fn note_unread_head(&self, scopes: &Scopes, head: Instant) {
        let to_watch: Vec<Scope> = self.shared.unread.with(|map| {
            scopes
                .iter()
                .filter_map(|(scope, _)| {
                    let unread = map.entry(scope.clone()).or_default();
                    unread.count += 1;
                    unread.newest_head = Some(unread.newest_head.map_or(head, |newest| newest.max(head)));
                    let start = !unread.watching && !unread.warned;
                    unread.watching |= start;
                    start.then(|| scope.clone())
                })
                .collect()
        });
        // Outside a tokio runtime (a future polled by another executor),
        // nothing watches: the warning is a help, not a limit.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.shared
                .unread
                .with(|map| to_watch.iter().for_each(|scope| unwatch(map, scope)));
            return;
        };
        for scope in to_watch {
            runtime.spawn(watch(std::sync::Arc::downgrade(&self.shared), scope));
        }
    }

    /// Notes that a response of `scopes` noted by
    /// [`note_unread_head`](Self::note_unread_head) was polled, or dropped.
    pub(crate) fn note_read(&self, scopes: &Scopes) {
        self.shared.unread.with(|map| {
            for (scope, _) in scopes.iter() {
                if let Some(unread) = map.get_mut(scope) {
                    unread.count = unread.count.saturating_sub(1);
                    if unread.count == 0 && !unread.watching && !unread.warned {
                        map.remove(scope);
                    }
                }
            }
        });
    }

    /// What the watch of `scope` does next, at `now`.
    fn next_watch_step(&self, scope: &Scope, now: Instant) -> Next {
        self.shared.unread.with(|map| {
            let Some(unread) = map.get_mut(scope) else {
                return Next::Stop;
            };
            match unread.newest_head {
                _ if unread.count == 0 || unread.warned => {
                    unread.watching = false;
                    if !unread.warned {
                        map.remove(scope);
                    }
                    Next::Stop
                }
                Some(newest) if now < newest + STUCK_AFTER => Next::CheckAt(newest + STUCK_AFTER),
                _ => Next::Check,
            }
        })
    }

    /// Warns, once, when every lane of `scope` is held by a response held
    /// unread while requests of the scope wait; true when it did (or had).
    fn warn_if_stuck(&self, scope: &Scope) -> bool {
        let Some(stats) = self.scope_stats(scope.as_str()) else {
            return false;
        };
        self.shared.unread.with(|map| {
            let Some(unread) = map.get_mut(scope) else {
                return false;
            };
            let stuck = stats.queued > 0
                && stats.in_flight > 0
                && stats.in_flight >= stats.concurrency
                && unread.count >= stats.in_flight;
            if stuck && !unread.warned {
                unread.warned = true;
                unread.watching = false;
                tracing::warn!(
                    target: "tower_throttle",
                    scope = scope.as_str(),
                    lanes = stats.in_flight,
                    waiting = stats.queued,
                    "scope {:?} is stuck: all {} of its lanes are held by responses whose bodies have not \
                     been read for {} s, and {} requests wait. It counts whole transfers, so a response held \
                     unread keeps its lane: read or drop each response before awaiting more requests of \
                     the scope (or turn count_whole_transfers off)",
                    scope.as_str(),
                    stats.in_flight,
                    STUCK_AFTER.as_secs(),
                    stats.queued,
                );
            }
            unread.warned
        })
    }
}

/// The watch of `scope`: checks when the newest unread head is
/// [`STUCK_AFTER`] old, and again every [`STUCK_AFTER`] while responses are
/// held unread and the scope was not found stuck; ends with the registry.
async fn watch(weak: Weak<RegistryShared>, scope: Scope) {
    let mut at = Instant::now() + STUCK_AFTER;
    loop {
        tokio::time::sleep_until(at).await;
        // Held only for this step: a watch never keeps a registry alive.
        let Some(shared) = weak.upgrade() else {
            return;
        };
        let registry = Registry { shared };
        let now = Instant::now();
        match registry.next_watch_step(&scope, now) {
            Next::Stop => return,
            Next::CheckAt(later) => at = later,
            Next::Check => {
                if registry.warn_if_stuck(&scope) {
                    return;
                }
                at = now + STUCK_AFTER;
            }
        }
    }
}
