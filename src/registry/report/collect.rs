//! Reports held back for the lock a throttle's completion takes anyway.
//!
//! The backoff and rate-limit layers sit inside [`Throttle`](crate::Throttle),
//! so their response futures end within the throttle's poll of its inner
//! future, on the same thread. While it polls, the throttle marks this
//! thread as collecting for its registry; a layer of that registry leaves
//! its report here instead of taking the registry's lock, and the throttle
//! applies what was left under the one lock its completion takes (before
//! the completion frees the request's lanes, so the next waiter already
//! sees a backoff or a hold). A layer with no throttle of its registry
//! around it (or behind a `Buffer`, on another task) finds no collector and
//! applies its report at once, as before.
//!
//! The mark is one `Cell` of plain data (no destructor, so reading it is a
//! couple of instructions); the reports themselves go into a thread-local
//! list only when there are some.

use std::cell::{Cell, RefCell};

use smallvec::SmallVec;

use super::ScopeReport;
use crate::scope::Scopes;

/// What a response says about each of its request's scopes, in their order.
pub(crate) type ScopeReports = SmallVec<[ScopeReport; 1]>;

/// A report left for the throttle's completion.
#[derive(Debug)]
pub(crate) struct Collected {
    registry: usize,
    pub(crate) scopes: Scopes,
    pub(crate) reports: ScopeReports,
}

/// The registry a throttle collects for on this thread right now (0: none;
/// a registry's identity is its address, never 0), and whether a report
/// was left for it.
#[derive(Debug, Clone, Copy)]
struct Collecting {
    registry: usize,
    left: bool,
}

const NOT_COLLECTING: Collecting = Collecting {
    registry: 0,
    left: false,
};

thread_local! {
    static COLLECTING: Cell<Collecting> = const { Cell::new(NOT_COLLECTING) };
    static COLLECTED: RefCell<Vec<Collected>> = const { RefCell::new(Vec::new()) };
}

/// Runs `poll` (a throttle's poll of its inner future) collecting the
/// reports its layers of registry `registry` make; returns what `poll`
/// returned and whether a report was left, to [`take`] then.
#[inline]
pub(crate) fn collecting<R>(registry: usize, poll: impl FnOnce() -> R) -> (R, bool) {
    let previous = COLLECTING.replace(Collecting {
        registry,
        left: false,
    });
    let on_unwind = Restore { previous, registry };
    let polled = poll();
    // The common path restores the mark without the guard's draining.
    std::mem::forget(on_unwind);
    (polled, COLLECTING.replace(previous).left)
}

/// The reports left for the collector of `registry` that just ended.
pub(crate) fn take(registry: usize) -> Vec<Collected> {
    COLLECTED
        .try_with(|collected| {
            let mut collected = collected.borrow_mut();
            let (mine, others) = std::mem::take(&mut *collected)
                .into_iter()
                .partition(|report| report.registry == registry);
            *collected = others;
            mine
        })
        .unwrap_or_default()
}

/// Leaves `reports` about `scopes` for the throttle of `registry` that is
/// polling on this thread; gives them back when there is none.
pub(crate) fn leave(registry: usize, scopes: &Scopes, reports: ScopeReports) -> Option<ScopeReports> {
    let current = COLLECTING.get();
    if current.registry != registry {
        return Some(reports);
    }
    let mut reports = Some(reports);
    let _ = COLLECTED.try_with(|collected| {
        if let Some(reports) = reports.take() {
            collected.borrow_mut().push(Collected {
                registry,
                scopes: scopes.clone(),
                reports,
            });
        }
    });
    if reports.is_none() {
        COLLECTING.set(Collecting {
            left: true,
            ..current
        });
    }
    // Still here when the list is gone (thread teardown): apply at once.
    reports
}

/// Restores the mark as it was before [`collecting`] when `poll` unwinds.
struct Restore {
    previous: Collecting,
    registry: usize,
}

impl Drop for Restore {
    fn drop(&mut self) {
        // The request failed: its reports go with it rather than linger
        // for another request.
        if COLLECTING.replace(self.previous).left {
            drop(take(self.registry));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> ScopeReports {
        SmallVec::from_elem(ScopeReport::new().hold(std::time::Duration::from_secs(1)), 1)
    }

    #[test]
    fn a_report_is_left_only_for_the_registry_collecting_and_only_during_its_poll() {
        let scopes = Scopes::from("a");
        assert!(leave(1, &scopes, report()).is_some(), "nobody collects");
        let (inner, left) = collecting(1, || {
            let left_for_1 = leave(1, &scopes, report()).is_none();
            let left_for_2 = leave(2, &scopes, report()).is_none();
            // A nested collector for another registry takes its own only.
            let (nested, nested_left) = collecting(2, || leave(2, &scopes, report()).is_none());
            (left_for_1, left_for_2, nested, nested_left, take(2).len())
        });
        assert_eq!(inner, (true, false, true, true, 1));
        assert!(left);
        let collected = take(1);
        assert_eq!(collected.len(), 1);
        assert_eq!(collected[0].scopes, scopes);
        assert!(leave(1, &scopes, report()).is_some(), "the poll is over");
    }

    #[test]
    fn a_poll_that_left_nothing_says_so() {
        let ((), left) = collecting(1, || ());
        assert!(!left);
        assert!(take(1).is_empty());
    }

    #[test]
    fn a_panicking_poll_leaves_no_report_behind() {
        let scopes = Scopes::from("a");
        let panicked = std::panic::catch_unwind(|| {
            collecting(1, || {
                assert!(leave(1, &scopes, report()).is_none());
                panic!("inner poll");
            })
        });
        assert!(panicked.is_err());
        let ((), left) = collecting(1, || ());
        assert!(!left);
        assert!(COLLECTED.with(|collected| collected.borrow().is_empty()));
    }
}
