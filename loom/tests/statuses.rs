//! loom model of the backoff statuses' bit set (see
//! `src/registry/fast_path/statuses.rs`, included here with loom's
//! atomics): config changes add their codes without the registry's lock,
//! so two may add at once.
//!
//! ```text
//! cargo test --release --manifest-path loom/Cargo.toml
//! ```

use loom::sync::Arc;
use loom::thread;

/// What `statuses.rs` takes from its parent module.
mod atomic {
    pub use loom::sync::atomic::{AtomicU64, Ordering};
}

#[path = "../../src/registry/fast_path/statuses.rs"]
#[allow(dead_code)]
mod statuses;

use statuses::StatusSet;

/// Two config changes add codes of one word of the set at once (429 and
/// 503 share none, 500 and 503 do): every code added is in the set
/// afterwards, and none that was not.
#[test]
fn codes_added_at_once_are_all_kept() {
    loom::model(|| {
        let set = Arc::new(StatusSet::default());
        let other = {
            let set = set.clone();
            thread::spawn(move || {
                set.add(500);
                set.add(429);
            })
        };
        set.add(503);
        // A reader meanwhile sees a code only once it was added: never one
        // that nobody adds.
        assert!(!set.may_contain(502));
        other.join().unwrap();
        for code in [429, 500, 503] {
            assert!(set.may_contain(code), "{code} was added and lost");
        }
        assert!(!set.may_contain(502));
    });
}
