//! Bounded waits where the wait is not the scheduler's queue of a request
//! it knows: the fixed-scope mode, whose requests wait in `poll_ready`
//! before they exist (only the scopes' `max_wait` applies there), and the
//! registry's store, whose say comes after the scheduler's admission. In
//! paused virtual time with an in-process inner service: every instant
//! asserted is exact.

mod support;

use std::time::Duration;

use support::bounds::{bounded, ms, one_lane_one_second, settle};
use support::{at_head, get, Recorder};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_throttle::store::MemoryStore;
use tower_throttle::throttle::StoreErrors;
use tower_throttle::waited::WaitCause;
use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};

/// A registry of `config`, and a throttle of it bound to `a.example`.
fn fixed_scope_throttle(config: ScopeConfig) -> (Registry, ThrottleLayer<StoreErrors>) {
    let registry = Registry::builder().default_scope(config).build().unwrap();
    let layer = ThrottleLayer::new(registry.clone())
        .crate_errors()
        .fixed_scope("a.example");
    (registry, layer)
}

/// Four clones of a fixed-scope throttle each ask for a request at 0 ms:
/// each clone's `poll_ready` queues its own ticket. Returns when each
/// ended (or the error) and the send instants.
async fn four_fixed_scope_clones(
    config: ScopeConfig,
    bound: Option<Duration>,
) -> (Vec<Result<Duration, tower_throttle::Error>>, Vec<u128>) {
    let (registry, fixed) = fixed_scope_throttle(config);
    let recorder = Recorder::new();
    let service = fixed.layer(recorder.service(Duration::ZERO));
    let start = Instant::now();
    let mut handles = Vec::new();
    for i in 0..4 {
        let request = match bound {
            Some(bound) => bounded(&format!("http://a.example/{i}"), bound),
            None => get(&format!("http://a.example/{i}")),
        };
        let clone = service.clone();
        handles.push(tokio::spawn(async move {
            at_head(clone.oneshot(request)).await.map(|_| start.elapsed())
        }));
        settle().await;
    }
    let mut results = Vec::new();
    for handle in handles {
        results.push(handle.await.unwrap());
    }
    assert_eq!(registry.stats().waiting, 0);
    (results, recorder.millis())
}

#[tokio::test(start_paused = true)]
async fn a_fixed_scope_request_past_its_scopes_bound_fails_at_once_in_call() {
    let (results, sent) = four_fixed_scope_clones(one_lane_one_second().max_wait(ms(1500)), None).await;
    assert_eq!(results[0].as_ref().unwrap(), &ms(0));
    assert_eq!(results[1].as_ref().unwrap(), &ms(1000));
    // The third and the fourth would go at 2 s: `poll_ready` is ready at
    // once, and `call` fails at once, with the predicted wait.
    for failed in &results[2..] {
        let error = failed.as_ref().unwrap_err();
        assert!(error.is_would_wait());
        assert_eq!(error.retry_after(), Some(ms(2000)));
        assert_eq!(error.wait_cause().map(|(cause, _)| cause), Some(WaitCause::Delay));
        assert!(error.waited().is_none());
    }
    assert_eq!(sent, [0, 1000]);
}

#[tokio::test(start_paused = true)]
async fn a_fixed_scope_request_ignores_its_own_max_wait_which_comes_too_late() {
    // The request is not known while `poll_ready` waits: its own 100 ms
    // bound cannot apply, and it goes at its turn.
    let (results, sent) = four_fixed_scope_clones(one_lane_one_second(), Some(ms(100))).await;
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(sent, [0, 1000, 2000, 3000]);
}

#[tokio::test(start_paused = true)]
async fn a_hold_that_arrives_while_a_fixed_scope_request_waits_fails_it_at_that_instant() {
    let (registry, fixed) = fixed_scope_throttle(one_lane_one_second().max_wait(ms(5000)));
    let recorder = Recorder::new();
    let service = fixed.layer(recorder.service(Duration::ZERO));
    let start = Instant::now();
    at_head(service.clone().oneshot(get("http://a.example/first")))
        .await
        .unwrap();
    // Its turn comes at 1 s, within the scope's 5 s: it waits in
    // `poll_ready`.
    let waiting = tokio::spawn(service.oneshot(get("http://a.example/second")));
    settle().await;
    tokio::time::sleep(ms(500)).await;
    registry.hold("a.example", Duration::from_secs(60));
    let error = waiting.await.unwrap().unwrap_err();
    assert_eq!(start.elapsed(), ms(500));
    assert!(error.is_would_wait());
    assert_eq!(error.retry_after(), Some(Duration::from_secs(60)));
    assert_eq!(error.wait_cause().map(|(cause, _)| cause), Some(WaitCause::Hold));
    assert_eq!(recorder.millis(), [0]);
    assert_eq!(registry.stats().waiting, 0);
}

/// A worker of a fleet of two sharing one store (one lane, a 1 s delay):
/// its registry and its throttle.
fn worker(store: &MemoryStore) -> (Registry, ThrottleLayer<StoreErrors>) {
    let registry = Registry::builder()
        .default_scope(one_lane_one_second())
        .store(store.clone())
        .build()
        .unwrap();
    (registry.clone(), ThrottleLayer::new(registry).crate_errors())
}

#[tokio::test(start_paused = true)]
async fn a_request_the_store_would_send_past_its_bound_fails_at_once() {
    let store = MemoryStore::new();
    let (one_sent, two_sent) = (Recorder::new(), Recorder::new());
    let one = worker(&store).1.layer(one_sent.service(Duration::ZERO));
    let (two_registry, two) = worker(&store);
    let two = two.layer(two_sent.service(Duration::ZERO));
    one.oneshot(get("http://site.test/1")).await.unwrap();
    // Worker two's scope admits it at once; the store's turn is 1 s away.
    let start = Instant::now();
    let error = two
        .clone()
        .oneshot(bounded("http://site.test/2", ms(500)))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(error.is_would_wait());
    assert_eq!(error.retry_after(), Some(ms(1000)));
    assert_eq!(error.wait_cause().map(|(cause, _)| cause), Some(WaitCause::Store));
    assert!(error.waited().is_none());
    // Its scope admitted it, then forgot the send: no lane held, no gap.
    let stats = two_registry.scope_stats("site.test").unwrap();
    assert_eq!((stats.queued, stats.in_flight), (0, 0));
    let prediction = two_registry.predict_request(&get("http://site.test/3"));
    assert_eq!(prediction.wait, Duration::ZERO);
    // The store had granted it 1 s, and a store cannot take a grant back:
    // that instant stays spent, so the next turn is 2 s. Within its bound,
    // the next request goes then.
    two.oneshot(bounded("http://site.test/3", ms(2500)))
        .await
        .unwrap();
    assert_eq!(one_sent.millis(), [0]);
    assert_eq!(two_sent.millis(), [2000]);
}

#[tokio::test(start_paused = true)]
async fn the_store_counts_a_bound_from_the_requests_arrival_not_from_its_local_admission() {
    let store = MemoryStore::new();
    let (one_sent, two_sent) = (Recorder::new(), Recorder::new());
    let one = worker(&store).1.layer(one_sent.service(Duration::ZERO));
    let two = worker(&store).1.layer(two_sent.service(Duration::ZERO));
    let start = Instant::now();
    two.clone().oneshot(get("http://site.test/first")).await.unwrap();
    // Queued at 0 ms with a 1.5 s bound: its own scope lets it go at 1 s.
    let bounded_request = tokio::spawn(two.oneshot(bounded("http://site.test/bounded", ms(1500))));
    settle().await;
    // Meanwhile worker one takes the fleet's turn at 1 s, so the store's
    // next is at 2 s: past 0 ms + 1.5 s.
    tokio::time::sleep(ms(500)).await;
    one.oneshot(get("http://site.test/other")).await.unwrap();
    let error = bounded_request.await.unwrap().unwrap_err();
    assert_eq!(start.elapsed(), ms(1000));
    assert!(error.is_would_wait());
    assert_eq!(error.retry_after(), Some(ms(1000)));
    assert_eq!(error.wait_cause().map(|(cause, _)| cause), Some(WaitCause::Store));
    assert_eq!(one_sent.millis(), [1000]);
    assert_eq!(two_sent.millis(), [0]);
}
