//! What each key of a file reads as, inherited keys included. (The
//! integration tests in `tests/config_file.rs` check what a user sees: the
//! registry built, the files written back, the errors.)

use std::time::Duration;

use super::RegistryConfig;
use crate::registry::Jitter;

const FULL: &str = include_str!("../../tests/support/full_config.toml");

#[test]
fn a_full_file_sets_every_setting_and_scopes_inherit_what_they_leave_out() {
    let config = RegistryConfig::from_toml_str(FULL).unwrap();
    let registry = config.build().unwrap();

    let default = registry.scope_config("unknown.example");
    assert_eq!(default.concurrency, 2);
    assert_eq!(default.delay, Duration::from_millis(500));
    assert_eq!(default.delay_per_slot, Duration::from_millis(750));
    assert_eq!(default.jitter, Jitter::range(0.25, 0.5));
    assert!(default.ignore_robots_txt);
    assert_eq!(default.get_quota(), Some(1000.0));
    assert_eq!(default.get_window(), Duration::from_secs(60));
    assert_eq!(default.get_max_wait(), Some(Duration::from_secs(5)));
    assert_eq!(default.get_max_waiting(), Some(100));
    let autothrottle = default.get_autothrottle().expect("on in the default scope");
    assert_eq!(autothrottle.get_target_concurrency(), 2.0);
    assert_eq!(autothrottle.get_start_delay(), Duration::from_secs(3));
    assert_eq!(autothrottle.get_max_delay(), Duration::from_secs(30));
    let backoff = default.get_backoff();
    assert!(backoff.is_backoff_status(503) && !backoff.is_backoff_status(502));
    assert_eq!(backoff.max_delay, Duration::from_secs(120));
    assert_eq!(backoff.window, Duration::from_secs(45));

    // "api.example" sets its quota, window, one backoff key and rampup;
    // the rest comes from the default scope.
    let api = registry.scope_config("api.example");
    assert_eq!(api.concurrency, 2);
    assert_eq!(api.delay, Duration::from_millis(500));
    assert_eq!(api.jitter, Jitter::range(0.25, 0.5));
    assert_eq!(api.get_quota(), Some(500.0));
    assert_eq!(api.get_max_wait(), Some(Duration::from_secs(5)));
    assert_eq!(api.get_window(), Duration::from_secs(90));
    assert!(api.get_backoff().is_backoff_status(503) && !api.get_backoff().is_backoff_status(502));
    assert_eq!(api.get_backoff().max_delay, Duration::from_secs(120));
    assert!(api.get_autothrottle().is_some());
    let rampup = api.get_rampup().expect("rampup on");
    assert_eq!(rampup.get_backoff_target(), &(1..=3));
    assert_eq!(rampup.get_window(), Duration::from_secs(30));
    assert_eq!(rampup.get_min_delay(), Duration::from_millis(10));
    assert_eq!(rampup.get_max_delay(), Duration::from_secs(60));
    assert_eq!(rampup.get_factor(), 1.5);

    let fast = registry.scope_config("fast");
    assert_eq!(fast.concurrency, 2);
    assert_eq!(fast.delay, Duration::from_millis(100));
    assert_eq!(fast.delay_per_slot, Duration::ZERO);
    assert_eq!(fast.jitter, Jitter::NONE);
    assert!(fast.get_autothrottle().is_none());
    assert_eq!(fast.get_quota(), Some(1000.0));
}

#[test]
fn json_files_read_as_toml_files_do() {
    let config = RegistryConfig::from_json_str(
        r#"{
            "max_concurrency": 4,
            "default_scope": { "delay": "250ms", "jitter": 0 },
            "scopes": { "api.example": { "concurrency": 3, "rampup": true } }
        }"#,
    )
    .unwrap();
    assert_eq!(config.default_scope.delay, Duration::from_millis(250));
    let api = &config.scopes["api.example"];
    assert_eq!(api.concurrency, 3);
    assert_eq!(api.delay, Duration::from_millis(250));
    assert!(api.get_rampup().is_some());
}

#[test]
fn ip_scopes_inherit_from_the_default_scope() {
    let config = RegistryConfig::from_toml_str(
        r#"
        [default_scope]
        delay = "2s"
        jitter = 0.0

        [ip_scopes]
        concurrency = 2

        [scopes."ip:203.0.113.7"]
        concurrency = 1
        "#,
    )
    .unwrap();
    let ip = config.ip_scopes.as_ref().unwrap();
    assert_eq!((ip.concurrency, ip.delay), (2, Duration::from_secs(2)));
    let registry = config.build().unwrap();
    let any_server = registry.scope_config("ip:198.51.100.1");
    assert_eq!(
        (any_server.concurrency, any_server.delay),
        (2, Duration::from_secs(2))
    );
    assert_eq!(registry.scope_config("ip:203.0.113.7").concurrency, 1);
    assert_eq!(registry.scope_config("books.example").concurrency, 1);
}
