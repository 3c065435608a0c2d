//! Tests of a word's shards (see the parent module's "Shards"): lanes
//! split over the shards and taken from another when a thread's own is
//! full, requests ending on the shard they were admitted on, and what the
//! scheduler takes in from all of them at once.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::word::{moving_average, Closed};
use super::{shard, Ended, FastScope, GlobalFlight, WordOwner};
use crate::registry::metrics::Metrics;
use crate::scope::Scope;
use crate::time::Stamp;

/// A closed word of scope `name`, in a registry of `max` permits that is
/// gone (nothing here needs its lock).
fn word(max: u32) -> (Arc<FastScope>, Arc<GlobalFlight>) {
    let global = Arc::new(GlobalFlight::new(max));
    let owner = WordOwner {
        global: global.clone(),
        registry: Weak::new(),
        uid: 0,
        directory: Default::default(),
        metrics: Metrics::default(),
    };
    (FastScope::new(0, Scope::new("example.com"), &owner), global)
}

fn stamp(nanos: u64) -> Stamp {
    Stamp::from_value(nanos).expect("a stamp above 0")
}

#[test]
fn a_thread_whose_shard_has_no_lane_takes_the_others_and_never_more_than_the_lanes() {
    let (word, global) = word(100);
    // Three lanes over four shards: 1, 1, 1 and none for shard 3.
    assert!(word.open(3, 0, stamp(1)));
    shard::set_home(3);
    let admitted: Vec<_> = (0..3)
        .map(|_| word.admit().expect("a lane is free").clone())
        .collect();
    assert!(word.admit().is_none(), "three lanes, three requests");
    assert_eq!(word.in_flight(), 3);
    assert_eq!(global.in_flight(), 3, "the refused request gave its permit back");
    let shards: Vec<_> = admitted.iter().map(Arc::as_ptr).collect();
    assert!(
        shards
            .iter()
            .enumerate()
            .all(|(i, a)| shards[i + 1..].iter().all(|b| a != b)),
        "each request on a shard of its own"
    );
    // One ends, on its own shard: its lane is free again, for anyone.
    assert_eq!(admitted[1].end(Some(stamp(2)), stamp(3), None), Ended::Open);
    let _ = global.release();
    shard::set_home(0);
    let again = word.admit().expect("the lane that came back");
    assert!(Arc::ptr_eq(again, &admitted[1]), "taken where it came back");
    assert_eq!(word.in_flight(), 3);
}

#[test]
fn closing_adopts_what_is_in_flight_on_every_shard_and_sums_the_sends() {
    let (word, _global) = word(100);
    assert!(word.open(8, 0, stamp(1)));
    let mut held = Vec::new();
    for home in 0..4 {
        shard::set_home(home);
        held.push(word.admit().expect("a lane").clone());
        held.push(word.admit().expect("a lane").clone());
    }
    assert_eq!(word.sent(), 8);
    // One request of each of two shards ends on the open word.
    assert_eq!(held[0].end(Some(stamp(5)), stamp(6), None), Ended::Open);
    assert_eq!(held[7].end(Some(stamp(9)), stamp(10), None), Ended::Open);
    assert_eq!(word.last_end(), Some(stamp(10)));
    let adopted = word.close();
    assert!(adopted.was_open);
    assert_eq!(adopted.in_flight, 6, "every shard's requests, adopted");
    assert_eq!(adopted.sent, 8);
    assert_eq!(
        adopted.last_departure,
        Some(stamp(9)),
        "the latest over the shards"
    );
    assert!(!word.is_open());
    assert!(
        word.admit().is_none(),
        "a closed word admits nothing, on any shard"
    );
    // The adopted ones end adopted, whatever their shard.
    assert!(held[1..7]
        .iter()
        .all(|shard| shard.end(None, stamp(11), None) == Ended::Adopted));
    assert_eq!(word.in_flight(), 0);
    assert!(word.retire(), "idle on every shard: retired");
    assert!(!word.open(8, 0, stamp(12)), "a retired word never opens again");
}

#[test]
fn retiring_fails_on_every_shard_while_one_has_a_request() {
    let (word, _global) = word(100);
    assert!(word.open(4, 0, stamp(1)));
    shard::set_home(2);
    let shard = word.admit().expect("a lane").clone();
    let _ = word.close();
    assert!(!word.retire(), "a request is in flight on shard 2");
    assert_eq!(shard.end(None, stamp(2), None), Ended::Adopted);
    assert!(word.retire());
}

/// The word's latency average is its shards' mean, counting only the
/// shards that a response moved; with none moved, the opening one.
#[test]
fn the_latency_taken_in_is_the_mean_of_the_shards_that_responses_moved() {
    let opening = moving_average(0, Duration::from_micros(500));
    let closed = |latency: u64, moved: bool| Closed {
        in_flight: 0,
        was_open: true,
        sent: 0,
        last_departure: 0,
        latency,
        moved,
        warm: moved,
    };
    let one = moving_average(0, Duration::from_micros(100));
    let three = moving_average(0, Duration::from_micros(300));
    let all = Closed::of_shards([
        closed(one, true),
        closed(opening, false),
        closed(three, true),
        closed(opening, false),
    ]);
    assert_eq!(all.latency, moving_average(0, Duration::from_micros(200)));
    assert!(all.moved && all.warm);
    let none = Closed::of_shards((0..4).map(|_| closed(opening, false)));
    assert_eq!((none.latency, none.moved), (opening, false));
    // One thread, one shard moved: its average, exactly as on one word.
    let single = Closed::of_shards([closed(three, true), closed(opening, false)]);
    assert_eq!(single.latency, three);
}

#[test]
fn permits_taken_on_one_shard_come_back_on_another() {
    let (_word, global) = word(2);
    shard::set_home(0);
    assert!(global.take_locked());
    shard::set_home(3);
    // Shard 3 has none of the 2 permits (1, 1, 0, 0): it takes shard 0's
    // or 1's.
    assert!(global.take_locked());
    assert!(!global.take_locked(), "two permits, two taken");
    assert!(!global.has_room());
    // Both come back on shard 3, and are taken from there.
    let _ = global.release();
    let _ = global.release();
    assert_eq!(global.in_flight(), 0);
    shard::set_home(1);
    assert!(global.take_locked() && global.take_locked());
    assert_eq!(global.in_flight(), 2);
    assert!(!global.take_locked());
}

/// What the module docs say a word costs: each shard is 128 bytes,
/// aligned to 128, so its `Arc` allocation (counts, then the shard) is
/// 256 bytes on lines no other shard shares.
#[test]
fn a_shard_fills_one_pair_of_lines() {
    assert_eq!(std::mem::size_of::<super::WordShard>(), 128);
    assert_eq!(std::mem::align_of::<super::WordShard>(), 128);
}

/// A registry without a real limit (`max_concurrency(u32::MAX)`): the
/// shards' counts add up to the maximum, and counting what is in flight
/// neither overflows nor says anything but the truth.
#[test]
fn the_largest_maximum_splits_and_counts_without_overflow() {
    let (_word, global) = word(u32::MAX);
    assert_eq!(global.in_flight(), 0);
    shard::set_home(2);
    assert!(global.take_locked());
    assert_eq!(global.in_flight(), 1);
    let _ = global.release();
    assert_eq!(global.in_flight(), 0);
    assert!(global.has_room());
}
