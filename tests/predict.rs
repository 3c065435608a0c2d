//! Predictions (`Registry::predict`, `Registry::predict_request`,
//! `ScopeStats::next_send`), in paused virtual time with an in-process
//! inner service, so every instant asserted is exact.

mod support;

use std::time::Duration;

use support::{at_head, get, Recorder};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::waited::WaitCause;
use tower_throttle::{Registry, ScopeConfig, Scopes, ThrottleLayer};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// Lets every spawned task run until it waits on time.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_prediction_takes_nothing() {
    let registry = Registry::builder()
        .default_scope(ScopeConfig::default().delay(ms(1000)).jitter(0.0))
        .build()
        .unwrap();
    let scopes = Scopes::from(["a.example"]);
    for _ in 0..3 {
        let prediction = registry.predict(&scopes);
        assert_eq!(prediction.wait, Duration::ZERO);
        assert_eq!(prediction.cause, None);
        assert!(prediction.exact);
    }
    // Nothing was sent, queued or even created.
    assert!(registry.scope_stats("a.example").is_none());
}

#[tokio::test(start_paused = true)]
async fn a_prediction_counts_the_waiters_ahead_and_names_the_delay() {
    let registry = Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .concurrency(4)
                .delay(ms(1000))
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
    let mut handles = Vec::new();
    for i in 0..3 {
        service.ready().await.unwrap();
        handles.push(tokio::spawn(at_head(
            service.call(get(&format!("http://a.example/{i}"))),
        )));
        settle().await;
    }
    // One sent at 0 ms and answered; two wait, for 1 s and 2 s.
    let prediction = registry.predict_request(&get("http://a.example/next"));
    assert_eq!(prediction.wait, ms(3000));
    assert_eq!(prediction.cause, Some(WaitCause::Delay));
    assert!(prediction.exact);
    let stats = registry.scope_stats("a.example").unwrap();
    assert_eq!(stats.next_send, Instant::now() + ms(1000));
    for handle in handles {
        handle.await.unwrap().unwrap();
    }
    assert_eq!(recorder.millis(), [0, 1000, 2000]);
}

#[tokio::test(start_paused = true)]
async fn a_busy_lane_is_an_estimate_from_the_latency_average() {
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
    let recorder = Recorder::new();
    let service = ThrottleLayer::new(registry.clone()).layer(recorder.service(ms(400)));
    // One answer teaches the scope a latency of 400 ms; the next request
    // leaves at 400 ms and is predicted to free its lane at 800 ms.
    at_head(service.clone().oneshot(get("http://a.example/0")))
        .await
        .unwrap();
    let busy = tokio::spawn(at_head(service.clone().oneshot(get("http://a.example/1"))));
    settle().await;
    tokio::time::sleep(ms(100)).await;
    let prediction = registry.predict(&Scopes::from(["a.example"]));
    assert_eq!(prediction.wait, ms(300));
    assert_eq!(prediction.cause, Some(WaitCause::Lanes));
    assert!(!prediction.exact);
    busy.await.unwrap().unwrap();
}

/// A new scope's first request opens its connection, so the next gap runs
/// from its answer. Before the answer, the prediction is the gap from the
/// send plus the latency average (none yet here), and once that instant
/// is past, the gap from now: an answer not come yet comes now at the
/// earliest. It never says *now* while the scope admits nothing.
#[tokio::test(start_paused = true)]
async fn before_a_late_first_answer_the_prediction_is_at_least_the_gap_from_now() {
    let registry = Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .concurrency(2)
                .delay(ms(100))
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let service = ThrottleLayer::new(registry.clone()).layer(recorder.service(ms(300)));
    let first = tokio::spawn(at_head(service.clone().oneshot(get("http://a.example/0"))));
    settle().await;
    let scopes = Scopes::from(["a.example"]);
    // What the wait is for: the answer (as the waiter's `Waited` says).
    let prediction = registry.predict(&scopes);
    assert_eq!((prediction.wait, prediction.exact), (ms(100), false));
    assert_eq!(prediction.cause, Some(WaitCause::Departure));
    tokio::time::sleep(ms(150)).await;
    let prediction = registry.predict(&scopes);
    assert_eq!((prediction.wait, prediction.exact), (ms(100), false));
    assert_eq!(prediction.cause, Some(WaitCause::Departure));
    // The answer comes at 300 ms: the next send at 400 ms, as predicted
    // from then on.
    let second = tokio::spawn(at_head(service.clone().oneshot(get("http://a.example/1"))));
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    assert_eq!(recorder.millis(), [0, 400]);
}

/// Generated schedules of one scope where lanes never bind (lanes to
/// spare, answers at once, no jitter), with holds set now and then while
/// nothing waits, and requests coming at random instants: each
/// request's prediction, taken just before it is called, is the instant
/// it is sent.
#[tokio::test(start_paused = true)]
async fn where_lanes_do_not_bind_the_predicted_instant_is_the_actual_one() {
    for seed in 0..20u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let delay = ms(rng.u64(1..=20) * 100);
        let registry = Registry::builder()
            .default_scope(
                ScopeConfig::default()
                    .concurrency(16)
                    .delay(delay)
                    .delay_per_slot(Duration::ZERO)
                    .jitter(0.0),
            )
            .build()
            .unwrap();
        let recorder = Recorder::new();
        let start = Instant::now();
        let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
        let mut predicted = Vec::new();
        let mut handles = Vec::new();
        for i in 0..12 {
            // A hold changes the instants of requests already waiting: it
            // comes only when none waits, so every prediction holds.
            let idle = registry
                .scope_stats("a.example")
                .is_none_or(|stats| stats.queued == 0);
            if idle && rng.u8(0..4) == 0 {
                registry.hold("a.example", ms(rng.u64(1..=50) * 100));
            }
            tokio::time::sleep(ms(rng.u64(0..=15) * 100)).await;
            settle().await;
            let request = get(&format!("http://a.example/{i:02}"));
            let prediction = registry.predict_request(&request);
            assert!(prediction.exact, "seed {seed}, request {i}: {prediction:?}");
            predicted.push(prediction.at.duration_since(start).as_millis());
            service.ready().await.unwrap();
            handles.push(tokio::spawn(at_head(service.call(request))));
            settle().await;
        }
        for handle in handles {
            handle.await.unwrap().unwrap();
        }
        assert_eq!(recorder.millis(), predicted, "seed {seed}, delay {delay:?}");
    }
}

/// A scope on its lock-free word (delay 0, asked for twice in a row): the
/// prediction is read off the word without the registry's lock while a
/// lane is free, and says what the lock says once the lanes are full.
#[tokio::test(start_paused = true)]
async fn on_a_lock_free_word_a_prediction_agrees_with_the_lock() {
    let registry = Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .concurrency(2)
                .delay(Duration::ZERO)
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(ms(1000)));
    // Two requests end first: the second opens the scope's word.
    for _ in 0..2 {
        service.ready().await.unwrap();
        at_head(service.call(get("http://word.example/"))).await.unwrap();
    }
    let request = get("http://word.example/next");
    service.ready().await.unwrap();
    let first = tokio::spawn(at_head(service.call(get("http://word.example/a"))));
    settle().await;
    let locks = registry.debug_lock_count();
    let prediction = registry.predict_request(&request);
    assert_eq!(
        (prediction.wait, prediction.cause, prediction.exact),
        (Duration::ZERO, None, true)
    );
    assert_eq!(prediction.at, Instant::now());
    if let Some(locks) = locks {
        assert_eq!(
            registry.debug_lock_count(),
            Some(locks),
            "read off the word, without the lock"
        );
    }
    // The second lane taken: the word is full, and the lock estimates
    // when a lane frees.
    service.ready().await.unwrap();
    let second = tokio::spawn(at_head(service.call(get("http://word.example/b"))));
    settle().await;
    let prediction = registry.predict_request(&request);
    assert_eq!(prediction.cause, Some(WaitCause::Lanes));
    assert!(prediction.wait > Duration::ZERO && !prediction.exact);
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    assert_eq!(registry.predict_request(&request).wait, Duration::ZERO);
}
