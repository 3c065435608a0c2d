//! Warnings that help: each fires once, with the scope and the numbers,
//! never once per request. Events are captured by one global subscriber
//! for this test binary (`support::captured_events`); each test looks only
//! at events of its own scopes.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{get, Recorder};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};

fn events() -> Arc<Mutex<Vec<String>>> {
    support::captured_events(tracing::Level::WARN)
}

/// The captured warning lines that contain every one of `needles`.
fn warnings_with(needles: &[&str]) -> Vec<String> {
    let events = events();
    let text = events.lock().unwrap().join("");
    text.lines()
        .filter(|line| needles.iter().all(|needle| line.contains(needle)))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn passing_delayed_warn_threshold_warns_once_not_per_request() {
    events();
    let registry = Registry::builder()
        .max_queued(1_000)
        .delayed_warn_threshold(10)
        .default_scope(
            ScopeConfig::default()
                .delay(Duration::from_secs(3600))
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
    let mut waiting = Vec::new();
    for i in 0..100 {
        service.ready().await.unwrap();
        let mut future = Box::pin(service.call(get(&format!("https://queued.example/{i}"))));
        // Polled once: it joins the queue.
        assert_eq!(i == 0, futures::FutureExt::now_or_never(&mut future).is_some());
        waiting.push(future);
    }
    assert_eq!(registry.stats().waiting, 99);
    let warned = warnings_with(&["delayed_warn_threshold", "threshold=10"]);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(warned[0].contains("waiting=11"), "{}", warned[0]);
}

#[test]
fn a_scope_concurrency_above_max_concurrency_warns_once() {
    events();
    let _registry = Registry::builder()
        .max_concurrency(4)
        .scope("capped.example", ScopeConfig::default().concurrency(32))
        .build()
        .unwrap();
    let warned = warnings_with(&["scope=\"capped.example\"", "max_concurrency caps it"]);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(warned[0].contains("concurrency=32") && warned[0].contains("max_concurrency=4"));
}

#[tokio::test(start_paused = true)]
async fn a_delay_per_slot_that_can_never_bind_warns_once_when_set() {
    events();
    let registry = Registry::builder()
        .scope(
            "per-slot.example",
            ScopeConfig::default()
                .delay(Duration::from_secs(2))
                .delay_per_slot(Duration::from_millis(500))
                .jitter(0.0),
        )
        // Jittered, a per-slot delay as long as the delay may bind: no warning.
        .scope(
            "jittered.example",
            ScopeConfig::default().delay_per_slot(Duration::from_secs(1)),
        )
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
    for i in 0..3 {
        service
            .ready()
            .await
            .unwrap()
            .call(get(&format!("https://per-slot.example/{i}")))
            .await
            .unwrap();
    }
    let warned = warnings_with(&[
        "scope=\"per-slot.example\"",
        "delay_per_slot can never take effect",
    ]);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(warned[0].contains("delay_per_slot_ms=500") && warned[0].contains("delay_ms=2000"));
    assert!(warnings_with(&["jittered.example", "delay_per_slot"]).is_empty());
    // The same check for a config set at runtime.
    registry
        .set_scope(
            "later.example",
            ScopeConfig::default()
                .delay(Duration::from_secs(5))
                .delay_per_slot(Duration::from_secs(1))
                .jitter(0.0),
        )
        .unwrap();
    assert_eq!(
        warnings_with(&["scope=\"later.example\"", "delay_per_slot"]).len(),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn a_robots_crawl_delay_overridden_by_an_explicit_config_warns_once_per_scope() {
    events();
    let registry = Registry::builder()
        .scope(
            "explicit.example",
            ScopeConfig::default().delay(Duration::from_millis(100)),
        )
        .build()
        .unwrap();
    // The robots.txt layer reports the Crawl-delay again at every refresh.
    for _ in 0..3 {
        registry.set_robots_delay("explicit.example", Some(Duration::from_secs(10)));
    }
    let warned = warnings_with(&[
        "explicit.example",
        "Crawl-delay that the scope's explicit config overrides",
    ]);
    assert_eq!(warned.len(), 1, "{warned:?}");
}

#[test]
fn a_short_delay_on_one_lane_warns_that_delay_per_slot_paces_the_scope() {
    events();
    let _registry = Registry::builder()
        // The trap: delay_per_slot keeps its 1 s default.
        .scope(
            "one-lane.example",
            ScopeConfig::default().delay(Duration::from_millis(200)),
        )
        // Both set: five requests a second, no warning.
        .scope(
            "both-set.example",
            ScopeConfig::default()
                .delay(Duration::from_millis(200))
                .delay_per_slot(Duration::from_millis(200)),
        )
        // Several lanes and the default per-lane delay: 1 s / 4 > 100 ms.
        .scope(
            "four-lanes.example",
            ScopeConfig::default()
                .concurrency(4)
                .delay(Duration::from_millis(100)),
        )
        // Several lanes with a per-lane delay set on purpose (the seeds'
        // staggered example): no warning.
        .scope(
            "staggered.example",
            ScopeConfig::default()
                .concurrency(2)
                .delay(Duration::from_millis(300))
                .delay_per_slot(Duration::from_secs(1)),
        )
        .build()
        .unwrap();
    let warned = warnings_with(&["scope=\"one-lane.example\"", "delay_per_slot paces it"]);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].contains("delay_ms=200") && warned[0].contains("delay_per_slot_ms=1000"),
        "{}",
        warned[0]
    );
    let warned = warnings_with(&["scope=\"four-lanes.example\"", "delay_per_slot paces it"]);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(warned[0].contains("lanes=4"), "{}", warned[0]);
    assert!(warnings_with(&["both-set.example", "delay_per_slot paces it"]).is_empty());
    assert!(warnings_with(&["staggered.example", "delay_per_slot paces it"]).is_empty());
}

#[test]
fn the_default_scope_and_the_ip_scopes_are_checked_for_the_same_trap() {
    events();
    let short = ScopeConfig::default().delay(Duration::from_millis(250));
    let _registry = Registry::builder()
        .default_scope(short.clone())
        .ip_scopes(short)
        .scope("checked-defaults.example", ScopeConfig::default())
        .build()
        .unwrap();
    // Other tests of this binary build default scopes too: look for this
    // test's delay.
    let warned = warnings_with(&[
        "scope=\"default scope\"",
        "delay_ms=250",
        "delay_per_slot paces it",
    ]);
    assert!(!warned.is_empty(), "{warned:?}");
    let warned = warnings_with(&["scope=\"ip scopes\"", "delay_ms=250", "delay_per_slot paces it"]);
    assert!(!warned.is_empty(), "{warned:?}");
}

#[cfg(feature = "serde")]
#[test]
fn a_config_file_scope_with_a_short_delay_on_one_lane_warns_too() {
    events();
    let config = tower_throttle::config_file::RegistryConfig::from_toml_str(
        r#"
[scopes."file-one-lane.example"]
delay = "300ms"

[scopes."file-both-set.example"]
delay = "300ms"
delay_per_slot = "300ms"
"#,
    )
    .unwrap();
    let _registry = config.build().unwrap();
    let warned = warnings_with(&["scope=\"file-one-lane.example\"", "delay_per_slot paces it"]);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].contains("delay_ms=300") && warned[0].contains("delay_per_slot_ms=1000"),
        "{}",
        warned[0]
    );
    assert!(warnings_with(&["file-both-set.example", "delay_per_slot paces it"]).is_empty());
}
