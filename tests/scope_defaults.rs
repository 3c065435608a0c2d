//! What a scope's config leaves out, and which keys a config can have:
//! a scope's config takes every setting it does not set from the default
//! scope's, whether it comes from the builder, a config file or
//! `set_scope`; the per-lane delay follows the delay unless set; a key the
//! resolver can never give a request is an error naming the key. Paused
//! virtual time and an in-process inner service: every instant is exact.

mod support;

use std::time::Duration;

use support::{at_head, get, Recorder};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::scope::EndpointResolver;
use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// The issue's default scope: no per-lane delay, no jitter (the delay
/// stays the built-in 1 s).
fn default_scope() -> ScopeConfig {
    ScopeConfig::default().delay_per_slot(Duration::ZERO).jitter(0.0)
}

/// What the user wrote for one site: two lanes, 200 ms, nothing else.
fn site_config() -> ScopeConfig {
    ScopeConfig::default().concurrency(2).delay(ms(200))
}

/// Sends `count` requests to `host` at once through `registry` and returns
/// the instants (ms) the inner service was called at.
async fn send_times(registry: Registry, host: &str, count: usize) -> Vec<u128> {
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry).layer(recorder.service(Duration::ZERO));
    let mut responses = Vec::new();
    for i in 0..count {
        service.ready().await.unwrap();
        // Each response's body is unwrapped as it comes: its lane is free.
        responses.push(tokio::spawn(at_head(
            service.call(get(&format!("https://{host}/{i}"))),
        )));
    }
    for response in futures::future::join_all(responses).await {
        response.unwrap().unwrap();
    }
    recorder.millis()
}

fn from_the_builder() -> Registry {
    Registry::builder()
        .default_scope(default_scope())
        .scope("site.example", site_config())
        .build()
        .unwrap()
}

fn from_set_scope() -> Registry {
    let registry = Registry::builder()
        .default_scope(default_scope())
        .build()
        .unwrap();
    registry.set_scope("site.example", site_config()).unwrap();
    registry
}

const EVERY_200_MS: [u128; 5] = [0, 200, 400, 600, 800];

#[tokio::test(start_paused = true)]
async fn a_builder_scope_that_sets_lanes_and_delay_keeps_the_default_scopes_zero_per_lane_delay() {
    // Before, the builder's scope took the built-in 1 s per lane instead:
    // 0, 200, 1 000, 1 200, 2 000 ms.
    assert_eq!(
        send_times(from_the_builder(), "site.example", 5).await,
        EVERY_200_MS
    );
}

#[tokio::test(start_paused = true)]
async fn a_set_scope_config_that_sets_lanes_and_delay_keeps_the_default_scopes_zero_per_lane_delay() {
    assert_eq!(
        send_times(from_set_scope(), "site.example", 5).await,
        EVERY_200_MS
    );
}

#[cfg(feature = "serde")]
fn from_a_file() -> Registry {
    tower_throttle::config_file::RegistryConfig::from_toml_str(
        r#"
        [default_scope]
        delay_per_slot = 0
        jitter = 0

        [scopes."site.example"]
        concurrency = 2
        delay = "200ms"
        "#,
    )
    .unwrap()
    .build()
    .unwrap()
}

#[cfg(feature = "serde")]
#[tokio::test(start_paused = true)]
async fn the_builder_the_config_file_and_set_scope_give_one_config_one_meaning() {
    let builder = send_times(from_the_builder(), "site.example", 5).await;
    let file = send_times(from_a_file(), "site.example", 5).await;
    let set_scope = send_times(from_set_scope(), "site.example", 5).await;
    assert_eq!(file, EVERY_200_MS);
    assert_eq!(builder, file);
    assert_eq!(set_scope, file);
    // And the configs themselves are the same, as the registry reads them.
    let config = from_the_builder().scope_config("site.example");
    assert_eq!(from_a_file().scope_config("site.example"), config);
    assert_eq!(from_set_scope().scope_config("site.example"), config);
}

#[tokio::test(start_paused = true)]
async fn every_setting_a_scope_leaves_out_is_the_default_scopes() {
    let registry = Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .concurrency(3)
                .delay(ms(700))
                .delay_per_slot(ms(900))
                .jitter(0.0)
                .count_whole_transfers(true)
                .ignore_robots_txt(true),
        )
        .scope("lanes.example", ScopeConfig::default().concurrency(5))
        .build()
        .unwrap();
    let config = registry.scope_config("lanes.example");
    assert_eq!(config.get_concurrency(), 5);
    assert_eq!(config.get_delay(), ms(700));
    assert_eq!(config.get_delay_per_slot(), ms(900), "set on the default scope");
    assert_eq!(config.get_jitter(), tower_throttle::registry::Jitter::NONE);
    assert!(config.get_count_whole_transfers());
}

#[tokio::test(start_paused = true)]
async fn one_lane_with_a_delay_alone_sends_at_that_delay() {
    let registry = Registry::builder()
        .scope(
            "one-lane.example",
            ScopeConfig::default().delay(ms(500)).jitter(0.0),
        )
        .build()
        .unwrap();
    assert_eq!(
        registry.scope_config("one-lane.example").get_delay_per_slot(),
        ms(500)
    );
    assert_eq!(send_times(registry, "one-lane.example", 3).await, [0, 500, 1000]);
}

#[tokio::test(start_paused = true)]
async fn the_per_lane_delay_follows_the_scopes_delay_not_the_default_scopes() {
    // The default scope sets a delay, not a per-lane delay: a scope with a
    // shorter delay of its own is paced by its own delay on its one lane.
    let registry = Registry::builder()
        .default_scope(ScopeConfig::default().delay(ms(2000)).jitter(0.0))
        .scope("quick.example", ScopeConfig::default().delay(ms(300)))
        .build()
        .unwrap();
    assert_eq!(send_times(registry, "quick.example", 3).await, [0, 300, 600]);
}

#[tokio::test(start_paused = true)]
async fn with_neither_delay_set_both_are_one_second() {
    let config = ScopeConfig::default();
    assert_eq!(config.get_delay(), Duration::from_secs(1));
    assert_eq!(config.get_delay_per_slot(), Duration::from_secs(1));
    let registry = Registry::builder()
        .scope("plain.example", ScopeConfig::default().concurrency(2).jitter(0.0))
        .build()
        .unwrap();
    assert_eq!(send_times(registry, "plain.example", 3).await, [0, 1000, 2000]);
}

#[tokio::test(start_paused = true)]
async fn the_seeds_staggered_example_given_as_a_scope_keeps_its_instants() {
    // Two lanes, 0.3 s between sends, 1 s per lane: 0.0, 0.3, 1.0 s, even
    // under a default scope whose per-lane delay is zero.
    let registry = Registry::builder()
        .default_scope(default_scope())
        .scope(
            "staggered.example",
            ScopeConfig::default()
                .concurrency(2)
                .delay(ms(300))
                .delay_per_slot(ms(1000)),
        )
        .build()
        .unwrap();
    assert_eq!(send_times(registry, "staggered.example", 3).await, [0, 300, 1000]);
}

#[test]
fn keys_the_host_resolver_never_gives_are_errors_naming_the_key() {
    let cases = [
        ("example.com:8080", "it has a port"),
        ("http://example.com/", "it has a scheme and a path"),
        ("Example.COM", "it has upper case"),
        ("example.com.", "it has a trailing dot"),
    ];
    for (key, why) in cases {
        let err = Registry::builder()
            .scope(key, ScopeConfig::default().concurrency(2))
            .build()
            .unwrap_err();
        assert_eq!(err.field(), "scope key");
        assert_eq!(err.value(), format!("{key:?}"));
        assert_eq!(
            err.to_string(),
            format!(
                r#"invalid scope key = {key:?}: the host resolver never gives a request this key ({why}); it would match "example.com""#
            )
        );

        // set_scope refuses it too, and the registry keeps what it had.
        let registry = Registry::default();
        let err = registry.set_scope(key, ScopeConfig::default()).unwrap_err();
        assert_eq!(err.value(), format!("{key:?}"));
        assert_eq!(
            registry.scope_config(key),
            registry.scope_config("never-set.example"),
            "no config of its own"
        );
    }
}

#[test]
fn keys_the_host_resolver_gives_build() {
    let registry = Registry::builder()
        .scope("example.com", ScopeConfig::default())
        .scope("127.0.0.3", ScopeConfig::default())
        .scope("[::1]", ScopeConfig::default())
        .scope("ip:203.0.113.7", ScopeConfig::default())
        .scope("api", ScopeConfig::default())
        .build();
    assert!(registry.is_ok(), "{registry:?}");
}

#[test]
fn endpoint_resolver_keys_of_a_host_and_a_path_still_build() {
    let registry = Registry::builder()
        .resolver(EndpointResolver::segments(2))
        .scope("api.example.com/v1/users", ScopeConfig::default())
        .scope("api.example.com/v1", ScopeConfig::default())
        .build();
    assert!(registry.is_ok(), "{registry:?}");
    // Its own check: a key with more segments than it keeps never matches.
    let err = Registry::builder()
        .resolver(EndpointResolver::segments(1))
        .scope("api.example.com/v1/users", ScopeConfig::default())
        .build()
        .unwrap_err();
    assert!(
        err.to_string()
            .ends_with(r#"it would match "api.example.com/v1""#),
        "{err}"
    );
}

#[test]
fn a_custom_resolver_decides_which_keys_it_can_give() {
    // A closure cannot tell: every key builds.
    let registry = Registry::builder()
        .resolver(|_: &tower_throttle::scope::RequestHead<'_>| tower_throttle::Scopes::from("Anything:1"))
        .scope("Anything:1", ScopeConfig::default())
        .build();
    assert!(registry.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_request_to_a_host_with_a_trailing_dot_is_in_the_hosts_scope() {
    let registry = Registry::builder()
        .scope("dot.example", ScopeConfig::default().delay(ms(250)).jitter(0.0))
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
    service
        .clone()
        .oneshot(get("https://dot.example./a"))
        .await
        .unwrap();
    service
        .clone()
        .oneshot(get("https://DOT.example/b"))
        .await
        .unwrap();
    assert_eq!(recorder.millis(), [0, 250]);
    assert_eq!(registry.scope_stats("dot.example").unwrap().sent, 2);
}
