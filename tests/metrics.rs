//! With the `metrics` feature, the registry reports counters and gauges
//! through the `metrics` facade; checked with metrics-util's debugging
//! recorder.
#![cfg(feature = "metrics")]

mod support;

use support::at_head;

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::{get, Recorder};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::registry::Feedback;
use tower_throttle::{Registry, ScopeConfig, Scopes, ThrottleLayer};

/// A metric's name, labels and value.
type Metric = (String, Vec<(String, String)>, DebugValue);

fn free() -> ScopeConfig {
    ScopeConfig::default()
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
}

/// Runs a small crawl under a local debugging recorder and returns every
/// metric as (name, labels, value).
fn crawl_and_snapshot(per_scope: bool) -> Vec<Metric> {
    recorded(async move {
        let registry = Registry::builder()
            .default_scope(free())
            .max_scopes(2)
            .metrics_per_scope(per_scope)
            .build()
            .unwrap();
        let recorder = Recorder::new();
        let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
        for host in ["a", "b", "c", "a"] {
            let request = get(&format!("https://{host}.example/"));
            service.ready().await.unwrap().call(request).await.unwrap();
            // Each scope idle from its own instant.
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        registry.feedback(&Scopes::from("a.example"), Feedback::backoff());
        registry.hold("a.example", Duration::from_secs(5));
    })
}

/// Runs `run` on a paused current-thread runtime under a local debugging
/// recorder, and returns every metric as (name, labels, value).
fn recorded(run: impl std::future::Future<Output = ()>) -> Vec<Metric> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(run);
    });
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels = key
                .labels()
                .map(|label| (label.key().to_owned(), label.value().to_owned()))
                .collect();
            (key.name().to_owned(), labels, value)
        })
        .collect()
}

fn counter(metrics: &[Metric], name: &str) -> u64 {
    metrics
        .iter()
        .filter(|(metric, _, _)| metric == name)
        .map(|(_, _, value)| match value {
            DebugValue::Counter(count) => *count,
            other => panic!("{name} is not a counter: {other:?}"),
        })
        .sum()
}

fn gauge(metrics: &[Metric], name: &str) -> f64 {
    match metrics.iter().find(|(metric, _, _)| metric == name) {
        Some((_, _, DebugValue::Gauge(value))) => value.into_inner(),
        other => panic!("{name}: {other:?}"),
    }
}

#[test]
fn aggregate_counters_and_gauges_have_no_scope_label() {
    let metrics = crawl_and_snapshot(false);
    assert_eq!(counter(&metrics, "tower_throttle_requests_sent_total"), 4);
    assert_eq!(counter(&metrics, "tower_throttle_backoffs_total"), 1);
    assert_eq!(counter(&metrics, "tower_throttle_holds_total"), 1);
    // a, b, c with room for two: one eviction to make room for c, another
    // when a came back.
    assert_eq!(counter(&metrics, "tower_throttle_evictions_total"), 2);
    assert_eq!(gauge(&metrics, "tower_throttle_scopes_tracked"), 2.0);
    assert_eq!(gauge(&metrics, "tower_throttle_requests_in_flight"), 0.0);
    assert_eq!(gauge(&metrics, "tower_throttle_requests_waiting"), 0.0);
    assert!(metrics.iter().all(|(_, labels, _)| labels.is_empty()));
}

#[test]
fn per_scope_labels_are_opt_in() {
    let metrics = crawl_and_snapshot(true);
    let sent_to_a: u64 = metrics
        .iter()
        .filter(|(name, labels, _)| {
            name == "tower_throttle_requests_sent_total"
                && labels.contains(&("scope".to_owned(), "a.example".to_owned()))
        })
        .map(|(_, _, value)| match value {
            DebugValue::Counter(count) => *count,
            _ => 0,
        })
        .sum();
    assert_eq!(sent_to_a, 2);
    assert_eq!(counter(&metrics, "tower_throttle_requests_sent_total"), 4);
}

type Labels = Vec<(String, String)>;

/// Issue 25: every request that waited records each part of its wait in
/// `tower_throttle_wait_seconds`, labelled by cause and source only.
#[test]
fn waits_are_recorded_by_cause_and_source() {
    let metrics = recorded(async {
        // One lane, one request a second: three requests, the second
        // waits 1 s and the third 2 s, all of it the config's delay.
        let registry = Registry::builder()
            .default_scope(free().concurrency(1).delay(Duration::from_secs(1)))
            .build()
            .unwrap();
        let service = ThrottleLayer::new(registry).layer(Recorder::new().service(Duration::ZERO));
        let requests =
            (0..3).map(|page| at_head(service.clone().oneshot(get(&format!("https://a.example/{page}")))));
        for response in futures::future::join_all(requests).await {
            response.unwrap();
        }
    });
    let waits: Vec<(Labels, Vec<f64>)> = metrics
        .into_iter()
        .filter(|(name, _, _)| name == "tower_throttle_wait_seconds")
        .map(|(_, labels, value)| {
            let DebugValue::Histogram(values) = value else {
                panic!("not a histogram: {value:?}")
            };
            (
                labels,
                values.into_iter().map(|value| value.into_inner()).collect(),
            )
        })
        .collect();
    assert_eq!(
        waits,
        [(
            vec![
                ("cause".to_owned(), "delay".to_owned()),
                ("source".to_owned(), "config".to_owned())
            ],
            vec![1.0, 2.0]
        )]
    );
}
