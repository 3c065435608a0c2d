//! Bounded waits (`ScopeConfig::max_wait`, `MaxWait`) and scope queue
//! bounds (`ScopeConfig::max_waiting`), in paused virtual time with an
//! in-process inner service, so every instant asserted is exact.

mod support;

use std::time::Duration;

use support::bounds::{bounded, ms, one_lane_one_second, settle};
use support::{at_head, get, Recorder};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::waited::WaitCause;
use tower_throttle::{Error, Registry, ScopeConfig, ThrottleLayer};

#[tokio::test(start_paused = true)]
async fn a_held_scope_fails_a_bounded_request_at_once_with_the_hold_as_retry_after() {
    let registry = Registry::builder()
        .default_scope(one_lane_one_second())
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let service = ThrottleLayer::new(registry.clone())
        .crate_errors()
        .layer(recorder.service(Duration::ZERO));
    registry.hold("api.example", Duration::from_secs(3600));
    let start = Instant::now();
    let error = service
        .oneshot(bounded("http://api.example/users", ms(2000)))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(error.is_would_wait());
    assert_eq!(error.retry_after(), Some(Duration::from_secs(3600)));
    assert_eq!(error.wait_cause().map(|(cause, _)| cause), Some(WaitCause::Hold));
    assert!(error.waited().is_none());
    // Nothing reached the inner service, nothing waits, every place is back.
    assert!(recorder.sent().is_empty());
    let stats = registry.scope_stats("api.example").unwrap();
    assert_eq!((stats.queued, stats.in_flight, stats.sent), (0, 0, 0));
    assert_eq!(registry.stats().waiting, 0);
}

/// Four requests at 0 ms to one lane with a 1 s delay: the fourth would go
/// at 3 s.
async fn fourth_of_four(bound: Duration) -> (Result<Duration, Error>, Vec<u128>) {
    let registry = Registry::builder()
        .default_scope(one_lane_one_second())
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone())
        .crate_errors()
        .layer(recorder.service(Duration::ZERO));
    let start = Instant::now();
    let mut handles = Vec::new();
    for i in 0..4 {
        service.ready().await.unwrap();
        let response = service.call(bounded(&format!("http://a.example/{i}"), bound));
        handles.push(tokio::spawn(async move {
            match at_head(response).await {
                Ok(_) => Ok(start.elapsed()),
                Err(error) => {
                    assert_eq!(start.elapsed(), Duration::ZERO, "refused at once");
                    Err(error)
                }
            }
        }));
    }
    let mut results = Vec::new();
    for handle in handles {
        results.push(handle.await.unwrap());
    }
    for result in &results[..3] {
        assert!(result.is_ok());
    }
    (results.pop().unwrap(), recorder.millis())
}

#[tokio::test(start_paused = true)]
async fn the_fourth_of_four_requests_fails_at_once_when_its_turn_is_past_its_bound() {
    let (fourth, sent) = fourth_of_four(ms(2500)).await;
    let error = fourth.unwrap_err();
    assert!(error.is_would_wait());
    assert_eq!(error.retry_after(), Some(ms(3000)));
    assert_eq!(error.wait_cause().map(|(cause, _)| cause), Some(WaitCause::Delay));
    assert_eq!(sent, [0, 1000, 2000]);
}

#[tokio::test(start_paused = true)]
async fn the_fourth_of_four_requests_goes_at_its_turn_when_that_is_within_its_bound() {
    let (fourth, sent) = fourth_of_four(ms(3500)).await;
    assert_eq!(fourth.unwrap(), ms(3000));
    assert_eq!(sent, [0, 1000, 2000, 3000]);
}

#[tokio::test(start_paused = true)]
async fn a_hold_that_arrives_while_a_bounded_request_waits_fails_it_at_that_instant() {
    let registry = Registry::builder()
        .default_scope(one_lane_one_second().delay(ms(3000)))
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let service = ThrottleLayer::new(registry.clone())
        .crate_errors()
        .layer(recorder.service(Duration::ZERO));
    let start = Instant::now();
    at_head(service.clone().oneshot(get("http://a.example/first")))
        .await
        .unwrap();
    // Its turn comes at 3 s, within its bound of 5 s: it waits.
    let waiting = tokio::spawn(service.oneshot(bounded("http://a.example/second", ms(5000))));
    settle().await;
    tokio::time::sleep(ms(1000)).await;
    registry.hold("a.example", Duration::from_secs(60));
    let error = waiting.await.unwrap().unwrap_err();
    assert_eq!(start.elapsed(), ms(1000));
    assert!(error.is_would_wait());
    assert_eq!(error.retry_after(), Some(Duration::from_secs(60)));
    assert_eq!(error.wait_cause().map(|(cause, _)| cause), Some(WaitCause::Hold));
    assert_eq!(recorder.millis(), [0]);
    assert_eq!(registry.stats().waiting, 0);
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_lane_estimate_was_wrong_fails_at_its_bound_having_waited_it() {
    let registry = Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .concurrency(1)
                .delay(Duration::ZERO)
                .delay_per_slot(ms(1))
                .jitter(0.0),
        )
        .build()
        .unwrap();
    let fast = Recorder::new();
    let service = ThrottleLayer::new(registry.clone())
        .crate_errors()
        .layer(fast.service(ms(100)));
    // The scope learns a latency of 100 ms...
    at_head(service.clone().oneshot(get("http://a.example/quick")))
        .await
        .unwrap();
    // ... then a request takes 10 s.
    let slow = Recorder::new();
    let slow_service = ThrottleLayer::new(registry.clone())
        .crate_errors()
        .layer(slow.service(Duration::from_secs(10)));
    let busy = tokio::spawn(at_head(slow_service.oneshot(get("http://a.example/slow"))));
    settle().await;
    let start = Instant::now();
    let prediction = registry.predict_request(&get("http://a.example/bounded"));
    assert_eq!(prediction.wait, ms(100));
    assert!(!prediction.exact);
    let error = service
        .oneshot(bounded("http://a.example/bounded", ms(1000)))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), ms(1000));
    assert!(error.is_would_wait());
    let waited = error.waited().expect("it waited");
    assert_eq!(waited.total(), ms(1000));
    assert_eq!(
        waited.causes().map(|(_, _, time)| time).sum::<Duration>(),
        ms(1000)
    );
    assert_eq!(fast.millis(), [0]);
    busy.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_tighter_of_the_scope_bound_and_the_request_bound_wins() {
    let registry = Registry::builder()
        .default_scope(one_lane_one_second().max_wait(ms(1500)))
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone())
        .crate_errors()
        .layer(recorder.service(Duration::ZERO));
    let mut handles = Vec::new();
    // 0 s and 1 s go; the third (2 s) is past the scope's 1.5 s; the
    // fourth has its own 5 s bound, but the scope's is tighter.
    for (i, request) in [
        get("http://a.example/0"),
        get("http://a.example/1"),
        get("http://a.example/2"),
        bounded("http://a.example/3", ms(5000)),
    ]
    .into_iter()
    .enumerate()
    {
        service.ready().await.unwrap();
        let response = service.call(request);
        handles.push((i, tokio::spawn(at_head(response))));
    }
    let mut failed = Vec::new();
    for (i, handle) in handles {
        if let Err(error) = handle.await.unwrap() {
            assert!(error.is_would_wait());
            failed.push(i);
        }
    }
    assert_eq!(failed, [2, 3]);
    assert_eq!(recorder.millis(), [0, 1000]);

    // A request bound tighter than the scope's: 0.5 s.
    let error = service
        .oneshot(bounded("http://a.example/4", ms(500)))
        .await
        .unwrap_err();
    assert_eq!(error.retry_after(), Some(ms(1000)));
}

#[tokio::test(start_paused = true)]
async fn a_throttle_that_cannot_fail_requests_lets_bounded_ones_wait() {
    let registry = Registry::builder()
        .default_scope(one_lane_one_second().max_wait(ms(100)))
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
    registry.hold("a.example", ms(2000));
    at_head(service.oneshot(bounded("http://a.example/", ms(100))))
        .await
        .unwrap();
    assert_eq!(recorder.millis(), [2000]);
}

#[tokio::test(start_paused = true)]
async fn a_flooded_scope_with_max_waiting_leaves_other_scopes_at_their_own_pace() {
    let registry = Registry::builder()
        .default_scope(one_lane_one_second().delay(ms(500)))
        .scope("flood.example", one_lane_one_second().max_waiting(100))
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone())
        .crate_errors()
        .layer(recorder.service(Duration::ZERO));
    let start = Instant::now();
    let mut flood = Vec::new();
    for i in 0..10_000 {
        service.ready().await.unwrap();
        let response = service.call(get(&format!("http://flood.example/{i}")));
        flood.push(tokio::spawn(at_head(response)));
    }
    // Every queue place but the flood's hundred waiters is free again.
    let mut others = Vec::new();
    for i in 0..5 {
        service.ready().await.unwrap();
        let response = service.call(get(&format!("http://other.example/{i}")));
        others.push(tokio::spawn(async move {
            at_head(response).await.unwrap();
            start.elapsed()
        }));
    }
    let mut other_sent = Vec::new();
    for other in others {
        other_sent.push(other.await.unwrap().as_millis());
    }
    assert_eq!(other_sent, [0, 500, 1000, 1500, 2000]);
    let stats = registry.scope_stats("flood.example").unwrap();
    assert!(stats.queued <= 100, "{} wait", stats.queued);
    let mut full = 0;
    for response in flood {
        if let Err(error) = response.await.unwrap() {
            assert!(error.is_queue_full(), "{error}");
            full += 1;
        }
    }
    // One sent at once, a hundred waited their turn, the rest failed.
    assert_eq!(full, 10_000 - 101);
    assert_eq!(recorder.millis_of("/").len(), 101 + 5);
}
