//! Holds as long as the server says, up to the registry's `max_hold`
//! (issue 24, part 2): capped with a warning naming the scope and what was
//! asked, and a held scope is never evicted while its hold lasts.

mod support;

use std::time::Duration;

use tower::ServiceExt;
use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test(start_paused = true)]
async fn a_hold_past_max_hold_is_capped_with_a_warning_naming_scope_and_ask() {
    let events = support::captured_events(tracing::Level::WARN);
    let registry = Registry::builder().build().unwrap();
    registry.hold("daily-quota.example", 24 * HOUR);
    assert_eq!(
        registry.scope_stats("daily-quota.example").unwrap().held_for,
        Some(HOUR)
    );
    let warnings: Vec<String> = events
        .lock()
        .unwrap()
        .iter()
        .filter(|line| line.contains("daily-quota.example"))
        .cloned()
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let warning = &warnings[0];
    assert!(
        warning.contains("WARN") && warning.contains("max_hold"),
        "{warning}"
    );
    assert!(
        warning.contains("asked_s=86400") && warning.contains("max_hold_s=3600"),
        "{warning}"
    );

    // Within max_hold: held whole, no warning.
    registry.hold("hourly.example", HOUR);
    assert_eq!(
        registry.scope_stats("hourly.example").unwrap().held_for,
        Some(HOUR)
    );
    assert!(!events
        .lock()
        .unwrap()
        .iter()
        .any(|line| line.contains("hourly.example")));
}

#[test]
fn max_hold_is_refused_outside_zero_to_a_day_naming_the_field() {
    for bad in [Duration::ZERO, 24 * HOUR + Duration::from_secs(1)] {
        let error = Registry::builder().max_hold(bad).build().unwrap_err();
        assert!(error.to_string().contains("max_hold"), "{error}");
    }
    assert!(Registry::builder().max_hold(24 * HOUR).build().is_ok());
}

/// A scope held for an hour outlives `idle_ttl` (1 minute here) and a
/// stream of other scopes past `max_scopes`: evicting it would forget the
/// hold, and its next request would be sent at once.
#[tokio::test(start_paused = true)]
async fn a_held_scope_is_not_evicted_while_its_hold_lasts() {
    let registry = Registry::builder()
        .idle_ttl(Duration::from_secs(60))
        .max_scopes(10)
        .default_scope(ScopeConfig::default().delay(Duration::ZERO).jitter(0.0))
        .build()
        .unwrap();
    registry.hold("held.example", HOUR);
    let client = tower::ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .service(tower::service_fn(|_request: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(()))
        }));
    for minute in 1..=30 {
        tokio::time::advance(Duration::from_secs(60)).await;
        // Other scopes come and go, past max_scopes, giving eviction work.
        for site in 0..5 {
            let uri = format!("http://site{minute}-{site}.example/");
            client
                .clone()
                .oneshot(http::Request::get(uri).body(()).unwrap())
                .await
                .unwrap();
        }
    }
    let held = registry.scope_stats("held.example").expect("still known");
    assert_eq!(held.held_for, Some(30 * Duration::from_secs(60)));
}
