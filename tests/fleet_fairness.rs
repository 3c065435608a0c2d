//! Fairness between the workers of a fleet (issue 24, part 4): a scope's
//! free lanes go round the workers waiting for it, in the order they
//! asked, however many requests each has. Paused time, `MemoryStore`:
//! every count is exact. (`tests/redis_store.rs` runs the first case
//! against Redis.)

mod support;

use std::time::Duration;

use tower_throttle::store::MemoryStore;
use tower_throttle::{Registry, ScopeConfig};

use support::fleet_share::{sends_per_window, Loops};

const LATENCY: Duration = Duration::from_millis(100);
const WINDOW: Duration = Duration::from_secs(1);

/// Two lanes, no delay: 20 requests a second for the fleet at 100 ms each.
fn api() -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(2)
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
}

fn worker(store: &MemoryStore, loops: usize, pause: Duration) -> Loops {
    Loops {
        registry: Registry::builder()
            .scope("api", api())
            .store(store.clone())
            .build()
            .unwrap(),
        loops,
        scopes: vec!["api"],
        pause,
    }
}

#[tokio::test(start_paused = true)]
async fn a_worker_sending_ten_times_as_many_requests_gets_a_quarter_of_the_lanes_as_the_others_do() {
    let store = MemoryStore::new();
    // Worker 0 runs ten request loops, the others one each.
    let workers = [10, 1, 1, 1].map(|loops| worker(&store, loops, Duration::ZERO));
    let counts = sends_per_window(workers.into(), LATENCY, WINDOW, 10).await;
    // Every window after the first: the fleet's 20 sends, five each.
    for (window, counts) in counts.iter().enumerate().skip(1) {
        assert_eq!(counts, &[5, 5, 5, 5], "window {window}: {counts:?}");
    }
    assert_eq!(counts[0].iter().sum::<usize>(), 20, "{:?}", counts[0]);
}

#[tokio::test(start_paused = true)]
async fn workers_asking_less_than_their_quarter_get_all_they_ask_and_the_busy_one_the_rest() {
    let store = MemoryStore::new();
    // The light workers pause 400 ms after each answer: at most 2 sends a
    // second each, less than a quarter of 20.
    let workers = vec![
        worker(&store, 10, Duration::ZERO),
        worker(&store, 1, Duration::from_millis(400)),
        worker(&store, 1, Duration::from_millis(400)),
        worker(&store, 1, Duration::from_millis(400)),
    ];
    let counts = sends_per_window(workers, LATENCY, WINDOW, 10).await;
    for (window, counts) in counts.iter().enumerate().skip(1) {
        assert_eq!(counts, &[14, 2, 2, 2], "window {window}: {counts:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn requests_over_two_scopes_wait_their_turn_in_both_lines_and_nobody_stalls() {
    let store = MemoryStore::new();
    let one_lane = api().concurrency(1);
    let registry = || {
        Registry::builder()
            .scope("x", one_lane.clone())
            .scope("y", one_lane.clone())
            .store(store.clone())
            .build()
            .unwrap()
    };
    // Worker 1 needs both scopes at once, workers 0 and 2 one each: in
    // lines kept per scope, a waiter ahead in one line and behind in the
    // other could hold both; one ticket per waiter for all its lines
    // orders them the same way everywhere.
    let with = |loops, scopes| Loops {
        registry: registry(),
        loops,
        scopes,
        pause: Duration::ZERO,
    };
    let workers = vec![with(4, vec!["x"]), with(4, vec!["x", "y"]), with(4, vec!["y"])];
    let counts = sends_per_window(workers, LATENCY, WINDOW, 10).await;
    // x's 10 sends a second go half to worker 0 and half to worker 1, y's
    // half to worker 1 and half to worker 2.
    for (window, counts) in counts.iter().enumerate().skip(1) {
        assert_eq!(counts, &[5, 5, 5], "window {window}: {counts:?}");
    }
}
