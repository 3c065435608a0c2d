//! Warnings that help: each fires once, with the scope and the numbers,
//! never once per request. The config checks' warnings are also listed by
//! `Registry::config_warnings`, in words; each check is tested there and in
//! the log. Events are captured by one global subscriber for this test
//! binary (`support::captured_events`); each test looks only at events of
//! its own scopes.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{get, Recorder};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::registry::ConfigWarning;
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

/// The registry's config warnings as `config: message` lines.
fn listed(registry: &Registry) -> Vec<String> {
    registry
        .config_warnings()
        .iter()
        .map(ConfigWarning::to_string)
        .collect()
}

#[test]
fn a_scope_concurrency_above_max_concurrency_is_listed_and_logged_once() {
    events();
    let registry = Registry::builder()
        .max_concurrency(4)
        .scope("capped.example", ScopeConfig::default().concurrency(32))
        // Inherited from the default scope, a concurrency is the default
        // scope's warning, not every scope's.
        .default_scope(ScopeConfig::default().concurrency(8))
        .scope("inherits.example", ScopeConfig::default())
        .build()
        .unwrap();
    assert_eq!(
        listed(&registry),
        [
            "default scope: concurrency 8 can never take effect: max_concurrency (4) caps it",
            r#"scope "capped.example": concurrency 32 can never take effect: max_concurrency (4) caps it"#,
        ]
    );
    let warned = warnings_with(&[
        r#"config="scope \"capped.example\"""#,
        "max_concurrency (4) caps it",
    ]);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(warned[0].contains("concurrency 32"), "{}", warned[0]);
    assert!(warnings_with(&["inherits.example"]).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_delay_per_slot_that_can_never_bind_is_listed_once_and_leaves_with_its_config() {
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
    let per_slot = r#"scope "per-slot.example": delay_per_slot (500 ms) can never take effect: the scope's delay between any two sends (2 s) is always longer"#;
    assert_eq!(listed(&registry), [per_slot]);
    let warned = warnings_with(&[
        "per-slot.example",
        "delay_per_slot (500 ms) can never take effect",
    ]);
    assert_eq!(warned.len(), 1, "once, not per request: {warned:?}");
    assert!(warnings_with(&["jittered.example"]).is_empty());

    // The same check for a config set at runtime; a config replaced takes
    // its warning with it.
    let later = ScopeConfig::default()
        .delay(Duration::from_secs(5))
        .delay_per_slot(Duration::from_secs(1))
        .jitter(0.0);
    registry.set_scope("later.example", later).unwrap();
    let later_warning = r#"scope "later.example": delay_per_slot (1 s) can never take effect: the scope's delay between any two sends (5 s) is always longer"#;
    assert_eq!(listed(&registry), [per_slot, later_warning]);
    registry
        .set_scope("per-slot.example", ScopeConfig::default().jitter(0.0))
        .unwrap();
    assert_eq!(listed(&registry), [later_warning]);
}

#[test]
fn a_delay_that_one_lane_never_lets_take_effect_is_listed() {
    events();
    let registry = Registry::builder()
        .default_scope(ScopeConfig::default().delay_per_slot(Duration::from_secs(1)))
        // The per-lane delay it inherits outlasts its own delay.
        .scope(
            "inherited-lane.example",
            ScopeConfig::default().delay(Duration::from_millis(200)),
        )
        // Both set on the scope: the per-lane delay paces it.
        .scope(
            "own-lane.example",
            ScopeConfig::default()
                .delay(Duration::from_millis(200))
                .delay_per_slot(Duration::from_millis(400)),
        )
        // Several lanes with a per-lane delay (the seeds' staggered
        // example): the delay shapes the sends, no warning.
        .scope(
            "staggered.example",
            ScopeConfig::default()
                .concurrency(2)
                .delay(Duration::from_millis(300)),
        )
        // Its per-lane delay is its own delay: nothing to warn about.
        .ip_scopes(
            ScopeConfig::default()
                .delay_per_slot(Duration::from_millis(250))
                .delay(Duration::from_millis(250)),
        )
        .build()
        .unwrap();
    assert_eq!(
        listed(&registry),
        [
            r#"scope "inherited-lane.example": delay (200 ms) has no effect on one lane: the lane waits delay_per_slot (1 s, set on the default scope) after its own last send; set delay_per_slot on this scope too for the delay to take effect"#,
            r#"scope "own-lane.example": delay (200 ms) has no effect on one lane: the lane waits delay_per_slot (400 ms) after its own last send; set delay_per_slot on this scope too for the delay to take effect"#,
        ]
    );
    assert_eq!(
        warnings_with(&["inherited-lane.example", "has no effect on one lane"]).len(),
        1
    );
}

#[test]
fn a_short_delay_alone_is_no_trap_and_warns_nothing() {
    events();
    let registry = Registry::builder()
        .default_scope(ScopeConfig::default().delay(Duration::from_millis(250)))
        .ip_scopes(ScopeConfig::default().delay(Duration::from_millis(100)))
        .scope(
            "short-delay.example",
            ScopeConfig::default().delay(Duration::from_millis(200)),
        )
        .scope(
            "four-lanes.example",
            ScopeConfig::default()
                .concurrency(4)
                .delay(Duration::from_millis(100)),
        )
        .build()
        .unwrap();
    assert_eq!(registry.config_warnings(), []);
    assert_eq!(
        registry.scope_config("short-delay.example").get_delay_per_slot(),
        Duration::from_millis(200)
    );
    assert!(warnings_with(&["short-delay.example"]).is_empty());
}

#[test]
fn the_ip_scopes_config_is_checked_as_completed_from_the_default_scope() {
    events();
    let registry = Registry::builder()
        .max_concurrency(2)
        .default_scope(ScopeConfig::default().delay_per_slot(Duration::from_secs(3)))
        .ip_scopes(
            ScopeConfig::default()
                .concurrency(3)
                .delay(Duration::from_millis(500)),
        )
        .build()
        .unwrap();
    // Capped at max_concurrency's 2 lanes: not one lane, no delay warning.
    assert_eq!(
        listed(&registry),
        ["ip scopes: concurrency 3 can never take effect: max_concurrency (2) caps it"]
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

#[cfg(feature = "serde")]
#[test]
fn a_config_file_scope_is_checked_as_completed_from_the_default_scope() {
    events();
    let config = tower_throttle::config_file::RegistryConfig::from_toml_str(
        r#"
max_concurrency = 4

[default_scope]
delay_per_slot = "1s"

[scopes."file-one-lane.example"]
delay = "300ms"

[scopes."file-both-set.example"]
delay = "300ms"
delay_per_slot = "300ms"

[scopes."file-capped.example"]
concurrency = 5
"#,
    )
    .unwrap();
    let registry = config.build().unwrap();
    assert_eq!(
        listed(&registry),
        [
            r#"scope "file-capped.example": concurrency 5 can never take effect: max_concurrency (4) caps it"#,
            r#"scope "file-one-lane.example": delay (300 ms) has no effect on one lane: the lane waits delay_per_slot (1 s, set on the default scope) after its own last send; set delay_per_slot on this scope too for the delay to take effect"#,
        ]
    );
}

/// A scope bounds its waits, but the throttle cannot fail requests (no
/// `crate_errors()`): the bound cannot apply, and the registry says so
/// once, naming the scope, however many requests wait.
#[tokio::test(start_paused = true)]
async fn a_bound_a_throttle_cannot_apply_is_warned_of_once_per_registry() {
    events();
    let registry = Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .delay(Duration::from_secs(3600))
                .jitter(0.0)
                .max_wait(Duration::from_secs(1)),
        )
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
    let mut waiting = Vec::new();
    for i in 0..5 {
        service.ready().await.unwrap();
        let mut future = Box::pin(service.call(get(&format!("https://unenforced.example/{i}"))));
        assert_eq!(i == 0, futures::FutureExt::now_or_never(&mut future).is_some());
        waiting.push(future);
    }
    assert_eq!(
        registry.stats().waiting,
        4,
        "they wait past the bound: it does not apply"
    );
    let warned = warnings_with(&["crate_errors()", "unenforced.example"]);
    assert_eq!(warned.len(), 1, "{warned:?}");
}
