//! loom models of the words' two lock-free protocols (see
//! `src/registry/fast_path/word.rs`, included here with loom's atomics):
//! loom runs each model under every interleaving of its threads that the
//! C++ memory model allows, and fails on the first that breaks an
//! assertion.
//!
//! ```text
//! cargo test --release --manifest-path loom/Cargo.toml
//! ```

use loom::sync::Arc;
use loom::thread;

/// What `word.rs` takes from its parent module.
mod atomic {
    pub use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
}

/// What `word.rs` takes from its parent module's `shard`.
#[path = "support/shard.rs"]
#[allow(dead_code)]
mod shard;

#[path = "../../src/registry/fast_path/word.rs"]
#[allow(dead_code)]
mod word;

use std::time::Duration;

use word::{moving_average, take_two_lanes, Closed, Ended, Permits, ScopeWord, TwoLanes, Word};

/// A close while requests end and are admitted on the word: every request
/// admitted is ended on the open word or adopted by the close, exactly
/// once, and nothing is admitted once the word is closed.
#[test]
fn each_request_on_a_word_is_ended_open_or_adopted_exactly_once() {
    loom::model(|| {
        let word = Arc::new(Word::new());
        assert!(word.open(2));
        // A request in flight before the threads start.
        assert!(word.try_admit());
        let requests = {
            let word = word.clone();
            thread::spawn(move || {
                // A second request, if the word is still open; then both end.
                let second = word.try_admit().then(|| word.end());
                let first = word.end();
                [Some(first), second]
            })
        };
        let (adopted, was_open) = word.close();
        let ends = requests.join().unwrap();
        assert!(was_open);
        let adopted_ends = ends.iter().flatten().filter(|end| **end == Ended::Adopted).count();
        assert_eq!(adopted as usize, adopted_ends, "adopted by the close = ended as adopted");
        assert_eq!(word.in_flight(), 0);
        assert!(!word.is_open());
        assert!(!word.try_admit(), "nothing admitted on a closed word");
    });
}

/// Eviction retires a word while a request may be admitted on it: a
/// retired word had nothing in flight and admits nothing after.
#[test]
fn a_word_is_retired_only_with_nothing_in_flight_and_never_admits_after() {
    loom::model(|| {
        let word = Arc::new(Word::new());
        assert!(word.open(1));
        let request = {
            let word = word.clone();
            thread::spawn(move || {
                let admitted = word.try_admit();
                let end = admitted.then(|| word.end());
                (admitted, end)
            })
        };
        let retired = word.retire();
        let (admitted, end) = request.join().unwrap();
        if retired && admitted {
            // Only if it was admitted and ended before the retirement.
            assert_eq!(end, Some(Ended::Open));
        }
        if retired {
            assert_eq!(word.in_flight(), 0);
            assert!(!word.is_open());
            assert!(!word.open(1), "a retired word never opens again");
        } else {
            assert!(admitted, "retiring an idle word fails only with a request on it");
        }
    });
}

/// The scheduler closes the word, adopts what is in flight, and opens it
/// again with fewer lanes (a `set_scope` lowering the scope's concurrency)
/// while another thread admits a request on it: once the word is open
/// with one lane, never more than one request is in flight on it.
#[test]
fn a_word_reopened_with_fewer_lanes_never_admits_beyond_them() {
    loom::model(|| {
        let word = Arc::new(Word::new());
        assert!(word.open(2));
        let request = {
            let word = word.clone();
            thread::spawn(move || word.try_admit())
        };
        // The scheduler, under its lock: the close adopts what is in
        // flight; with nothing in flight, the word opens again with one
        // lane, and the scheduler admits a request on it.
        let (adopted, was_open) = word.close();
        assert!(was_open);
        let reopened = adopted == 0 && word.open(1);
        let scheduler_admitted = reopened && word.try_admit();
        let admitted = request.join().unwrap();
        if reopened {
            assert!(
                word.in_flight() <= 1,
                "{} requests in flight on a word of one lane",
                word.in_flight()
            );
            assert_eq!(word.in_flight(), u32::from(scheduler_admitted) + u32::from(admitted));
        } else {
            assert!(admitted, "a reopen fails only with the request adopted");
        }
    });
}

/// A request is admitted and ends on a scope's word as the scheduler
/// closes it: if it ended on the open word, its departure, end and latency are in what the
/// close takes in; if not, the close adopted it. Its send is counted
/// once, by the close or on the word after it.
#[test]
fn what_a_request_left_on_the_open_word_is_in_what_the_close_takes_in() {
    loom::model(|| {
        let word = Arc::new(ScopeWord::new());
        assert!(word.open(2, 0));
        let request = {
            let word = word.clone();
            thread::spawn(move || {
                let admitted = word.try_admit();
                admitted.then(|| word.end(Some(10), 20, Some(Duration::from_nanos(99))))
            })
        };
        let closed = word.close();
        let ended = request.join().unwrap();
        assert!(closed.was_open);
        match ended {
            None => {
                assert_eq!(closed.in_flight, 0);
                assert_eq!(closed.sent + word.sent(), 0, "nothing sent");
                return;
            }
            Some(Ended::Open) => {
                let left = Closed {
                    in_flight: 0,
                    was_open: true,
                    sent: 1,
                    last_departure: 10,
                    latency: moving_average(0, Duration::from_nanos(99)),
                    moved: true,
                    warm: true,
                };
                assert_eq!(closed, left, "what the request left, taken in by the close");
            }
            Some(Ended::Adopted) => assert_eq!(closed.in_flight, 1, "adopted by the close"),
        }
        assert_eq!(closed.sent + word.sent(), 1, "one send, counted once");
    });
}

/// Two responses end on a word at once: the latency average takes both
/// samples, in one order or the other; neither is lost.
#[test]
fn concurrent_ends_lose_no_latency_sample() {
    loom::model(|| {
        let word = Arc::new(ScopeWord::new());
        let start = moving_average(0, Duration::from_nanos(1_000));
        assert!(word.open(2, start));
        assert!(word.try_admit());
        assert!(word.try_admit());
        let (a, b) = (Duration::from_nanos(5_000), Duration::from_nanos(50_000));
        let other = {
            let word = word.clone();
            thread::spawn(move || word.end(Some(1), 2, Some(b)))
        };
        assert_eq!(word.end(Some(1), 2, Some(a)), Ended::Open);
        assert_eq!(other.join().unwrap(), Ended::Open);
        let a_first = moving_average(moving_average(start, a), b);
        let b_first = moving_average(moving_average(start, b), a);
        let (average, moved) = word.latency();
        assert!(moved);
        assert!(
            average == a_first || average == b_first,
            "average {average}: a sample was lost (both give {a_first} or {b_first})"
        );
    });
}

/// The last permit comes back without the lock as the scheduler queues a
/// waiter for one under it: the release sees the waiter (and takes the
/// lock to let it go), or the scheduler sees the permit free (and lets it
/// go itself). Never neither: no waiter is left with a permit free.
#[test]
fn a_waiter_queued_as_the_last_permit_comes_back_is_always_let_go() {
    loom::model(|| {
        let permits = Arc::new(Permits::new(1));
        // A request on a word holds the only permit.
        assert!(permits.take_at(shard::home()));
        // The permit comes back on the other thread's shard.
        let release = {
            let permits = permits.clone();
            thread::spawn(move || {
                shard::set_home(1);
                permits.release_to(shard::home())
            })
        };
        // The scheduler, under its lock: a request finds no permit and
        // waits in the global queue.
        let queued = !permits.has_room();
        let served = queued && permits.publish_queued(true);
        let release_saw_waiters = release.join().unwrap();
        if queued {
            assert!(served || release_saw_waiters, "the waiter is let go by someone");
        }
        assert_eq!(permits.in_flight(), 0);
    });
}

/// A request takes a permit without the lock as the scheduler, under its
/// lock, admits one: the two compare-and-swap on one count, so together
/// they never pass the maximum, and the count is exact.
#[test]
fn a_permit_taken_without_the_lock_never_passes_the_maximum() {
    loom::model(|| {
        let permits = Arc::new(Permits::new(1));
        // The taker's home shard is empty: it takes from the other one.
        let taker = {
            let permits = permits.clone();
            thread::spawn(move || {
                shard::set_home(1);
                permits.try_take_at(shard::home())
            })
        };
        let scheduler_took = permits.has_room() && permits.take_at(shard::home());
        let took = taker.join().unwrap();
        assert!(!(took && scheduler_took), "one permit, taken twice");
        assert_eq!(permits.in_flight(), u32::from(took) + u32::from(scheduler_took));
    });
}


/// A scope's word in two shards, one request on each, closed (both
/// shards, as the scheduler does) while both requests end: what the close
/// adopts is exactly the requests that end adopted, over both shards, and
/// a request that ended open left its send in what the close takes in.
#[test]
fn closing_every_shard_adopts_each_request_on_any_of_them_exactly_once() {
    loom::model(|| {
        let shards = Arc::new([ScopeWord::new(), ScopeWord::new()]);
        for shard in shards.iter() {
            assert!(shard.open(1, 0));
            assert!(shard.try_admit());
        }
        let ender = {
            let shards = shards.clone();
            thread::spawn(move || shards[1].end(Some(5), 6, Some(Duration::from_nanos(40))))
        };
        let first = shards[0].end(Some(7), 8, None);
        let closed = Closed::of_shards(shards.iter().map(ScopeWord::close));
        let second = ender.join().unwrap();
        assert!(closed.was_open);
        let adopted = [first, second].iter().filter(|end| **end == Ended::Adopted).count();
        assert_eq!(closed.in_flight as usize, adopted, "adopted by the close = ended as adopted");
        assert_eq!(first, Ended::Open, "the closer's own end came first");
        assert_eq!(closed.sent, 2, "both sends taken in, once");
        if second == Ended::Open {
            assert_eq!(closed.last_departure, 7);
            assert!(closed.moved, "the second shard's sample moved its average");
            assert_eq!(closed.latency, moving_average(0, Duration::from_nanos(40)));
        }
    });
}

/// A request of two scopes takes a lane on the first scope's word, then
/// on the second's, whose one lane is taken by a request that may end
/// meanwhile; the scheduler closes the first word meanwhile. Every lane
/// taken on the first word is given back once: on the open word, or by
/// the scheduler, which adopted it (then the caller hears it as
/// `FirstAdopted`, or, admitted, ends it as adopted), and a send counts
/// on each word only for a request admitted on both.
#[test]
fn a_lane_taken_for_a_request_of_two_scopes_goes_back_once_open_or_adopted() {
    loom::model(|| {
        let words = Arc::new([ScopeWord::new(), ScopeWord::new()]);
        assert!(words[0].open(2, 0));
        assert!(words[1].open(1, 0));
        // The second word's one lane, taken by a request in flight.
        assert!(words[1].try_admit());
        let ender = {
            let words = words.clone();
            thread::spawn(move || words[1].end(None, 1, None))
        };
        let request = {
            let words = words.clone();
            thread::spawn(move || {
                let taken = take_two_lanes(&[&words[0]], &[&words[1]]);
                // Admitted: the request ends on both words at once.
                let ends = matches!(taken, TwoLanes::Taken(..))
                    .then(|| (words[0].end(None, 2, None), words[1].end(None, 2, None)));
                (taken, ends)
            })
        };
        let closed = words[0].close();
        let (taken, ends) = request.join().unwrap();
        assert_eq!(ender.join().unwrap(), Ended::Open, "nobody closes the second word");
        let ended_adopted = match (taken, ends) {
            (TwoLanes::Taken(0, 0), Some((first, second))) => {
                assert_eq!(second, Ended::Open);
                first == Ended::Adopted
            }
            (TwoLanes::FirstAdopted(0), None) => true,
            (TwoLanes::Refused, None) => false,
            other => panic!("not a result of two one-word lists: {other:?}"),
        };
        assert_eq!(closed.in_flight == 1, ended_adopted, "adopted by the close = given back as adopted");
        assert_eq!(words[0].in_flight(), 0);
        assert_eq!(words[1].in_flight(), 0);
        let admitted = u64::from(matches!(taken, TwoLanes::Taken(..)));
        assert_eq!(closed.sent + words[0].sent(), admitted, "the first word's send: once, if admitted");
        assert_eq!(words[1].sent(), 1 + admitted, "the second word's: the request in flight's, and this one's");
    });
}
