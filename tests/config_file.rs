//! Loading the registry from TOML and JSON files, the errors bad files
//! give, and writing a running registry's config back.

use std::time::Duration;

use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::config_file::RegistryConfig;
use tower_throttle::{ScopeConfig, ThrottleLayer};

/// Every key the file format has.
const FULL: &str = include_str!("support/full_config.toml");

#[test]
fn a_full_file_sets_every_setting_and_scopes_inherit_what_they_leave_out() {
    let config = RegistryConfig::from_toml_str(FULL).unwrap();
    let registry = config.clone().build().unwrap();

    // Each value read is checked by the unit tests of `config_file`; here,
    // that the scopes of the built registry are the file's (the config it
    // reports, compared whole at the end) and that each name gets its own.
    let api = registry.scope_config("api.example");
    assert_ne!(api, registry.scope_config("fast"));
    assert_ne!(api, registry.scope_config("unknown.example"));

    // The config the registry reports is the one it was built from.
    assert_eq!(registry.config(), config);
}

#[tokio::test(start_paused = true)]
async fn the_delay_and_concurrency_of_a_file_hold_when_sending() {
    let registry = RegistryConfig::from_toml_str(FULL).unwrap().build().unwrap();
    let start = Instant::now();
    let sends = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorded = sends.clone();
    let inner = tower::service_fn(move |_request: http::Request<()>| {
        recorded.lock().unwrap().push(start.elapsed());
        async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<_, std::convert::Infallible>(http::Response::new(()))
        }
    });
    let mut client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .service(inner);
    let mut responses = Vec::new();
    for _ in 0..3 {
        let request = http::Request::get("http://fast/").body(()).unwrap();
        responses.push(tokio::spawn(client.ready().await.unwrap().call(request)));
    }
    for response in responses {
        response.await.unwrap().unwrap();
    }
    // The second send waits for the first answer (a scope's first request
    // opens the connection) plus the 100 ms delay; the third goes 100 ms
    // later on the other lane while the second is still in flight:
    // two lanes.
    assert_eq!(
        *sends.lock().unwrap(),
        [
            Duration::ZERO,
            Duration::from_millis(1100),
            Duration::from_millis(1200)
        ]
    );
    let stats = registry.scope_stats("fast").unwrap();
    assert_eq!(stats.sent, 3);
    assert_eq!(stats.concurrency, 2);
}

#[test]
fn bad_files_name_the_key_path_and_the_value() {
    let cases = [
        (
            "max_concurency = 3",
            "max_concurency: unknown field `max_concurency`, expected one of `max_concurrency`, `max_queued`, \
             `quota_window`, `idle_ttl`, `max_hold`, `max_scopes`, `delayed_warn_threshold`, `metrics_per_scope`, \
             `jitter_seed`, `default_scope`, `ip_scopes`, `scopes`",
        ),
        (
            "[scopes.\"api.example\"]\ndelai = 1",
            "scopes.\"api.example\".delai: unknown field `delai`, expected one of `concurrency`, `delay`, \
             `delay_per_slot`, `jitter`, `ignore_robots_txt`, `count_whole_transfers`, `release_at_head`, `quota`, `window`, `max_wait`, `max_waiting`, `backoff`, `autothrottle`, `rampup`",
        ),
        (
            "[default_scope]\nrampup = { foo = 1 }",
            "default_scope.rampup.foo: unknown field `foo`, expected one of `backoff_target`, `window`, \
             `min_delay`, `max_delay`, `factor`",
        ),
        (
            "[scopes.a]\ndelay = \"1.5d\"",
            "scopes.a.delay: unknown duration unit (use ms, s, m or h), got \"1.5d\"",
        ),
        (
            "[scopes.a]\ndelay = \"-1s\"",
            "scopes.a.delay: a duration must not be negative, got \"-1s\"",
        ),
        ("idle_ttl = -1", "idle_ttl: a duration must not be negative, got -1"),
        (
            "[default_scope]\ndelay = nan",
            "default_scope.delay: a duration must be a finite number of seconds, got NaN",
        ),
        (
            "[scopes.a]\ndelay = \"\"",
            "scopes.a.delay: a duration must not be empty, got \"\"",
        ),
        (
            "[scopes.\"api.example\".backoff]\ndelay_factor = 0.5",
            "scopes.\"api.example\".backoff.delay_factor: must be finite and at least 1.0, got 0.5",
        ),
        (
            "[scopes.a]\njitter = 1.5",
            "scopes.a.jitter: the part below 1 must be at most 1 (waits cannot be negative), got 1.5",
        ),
        (
            "[scopes.a]\njitter = [0.5, 200]",
            "scopes.a.jitter: the part above 1 must be at most 100, got [0.5, 200.0]",
        ),
        (
            "[scopes.a]\njitter = [1, 2, 3]",
            "scopes.a.jitter: invalid length 3, expected a pair [low, high]",
        ),
        ("[scopes.a]\nconcurrency = 0", "scopes.a.concurrency: must be at least 1, got 0"),
        ("max_concurrency = 0", "max_concurrency: must be at least 1, got 0"),
        (
            "[scopes.a]\nconcurrency = \"x\"",
            "scopes.a.concurrency: invalid type: string \"x\", expected u32",
        ),
        (
            "[scopes.a]\nconcurrency = -1",
            "scopes.a.concurrency: invalid value: integer `-1`, expected u32",
        ),
        (
            "[default_scope]\nrampup = 3",
            "default_scope.rampup: invalid type: integer `3`, expected true, false or a table of settings",
        ),
        (
            "[scopes.a]\nbackoff = { http_codes = [429, 700] }",
            "scopes.a.backoff.http_codes: must be HTTP status codes (100-599), got 700",
        ),
        (
            "[scopes.a.backoff]\nmin_delay = 400",
            "scopes.a.backoff.min_delay: must not exceed max_delay, got 400s",
        ),
        (
            "[scopes.a]\nautothrottle = { target_concurrency = 0 }",
            "scopes.a.autothrottle.target_concurrency: must be finite and greater than 0, got 0.0",
        ),
        (
            "[scopes.a]\njitter = \"x\"",
            "scopes.a.jitter: invalid type: string \"x\", expected a number, or a pair [low, high]",
        ),
        (
            "[scopes.a.rampup]\nbackoff_target = -1",
            "scopes.a.rampup.backoff_target: invalid value: integer `-1`, expected u32",
        ),
        (
            "[scopes.a.rampup]\nbackoff_target = [3, 1]",
            "scopes.a.rampup.backoff_target: must not be empty, got 3..=1",
        ),
        ("[scopes.a]\nquota = 0", "scopes.a.quota: must be a finite number above 0, got 0.0"),
        ("quota_window = 0", "quota_window: must be longer than zero, got 0ns"),
        ("max_hold = \"25h\"", "max_hold: must be longer than zero and at most 24 h, got 90000s"),
        ("max_hold = 0", "max_hold: must be longer than zero and at most 24 h, got 0ns"),
        (
            "[scopes.a]\ndelay = \"8d\"",
            "scopes.a.delay: unknown duration unit (use ms, s, m or h), got \"8d\"",
        ),
        (
            "[scopes.a]\ndelay = \"200h\"",
            "scopes.a.delay: must be at most 7 days, got 720000s",
        ),
        (
            "max_concurrency = ",
            "line 1, column 19: string values must be quoted, expected literal string",
        ),
    ];
    for (file, message) in cases {
        let err = RegistryConfig::from_toml_str(file).unwrap_err();
        assert_eq!(err.to_string(), message, "for {file:?}");
    }
}

#[test]
fn json_files_have_the_same_keys_and_errors() {
    let config = RegistryConfig::from_json_str(
        r#"{
            "max_concurrency": 4,
            "default_scope": { "delay": "250ms", "jitter": 0 },
            "scopes": { "api.example": { "concurrency": 3, "rampup": true } }
        }"#,
    )
    .unwrap();
    let toml = RegistryConfig::from_toml_str(
        r#"
        max_concurrency = 4
        [default_scope]
        delay = "250ms"
        jitter = 0
        [scopes."api.example"]
        concurrency = 3
        rampup = true
        "#,
    )
    .unwrap();
    assert_eq!(config, toml);
    let registry = config.clone().build().unwrap();
    assert_eq!(registry.config(), config);
    assert_ne!(
        registry.scope_config("other"),
        registry.scope_config("api.example")
    );

    let err = RegistryConfig::from_json_str(r#"{"scopes": {"a.b": {"backoff": {"delay_factor": 0.5}}}}"#)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "scopes.\"a.b\".backoff.delay_factor: must be finite and at least 1.0, got 0.5"
    );
    let err = RegistryConfig::from_json_str(r#"{"scopes": {"a": {"concurrency": "x"}}}"#).unwrap_err();
    assert_eq!(err.key_path(), "scopes.a.concurrency");
    assert_eq!(
        err.message(),
        "invalid type: string \"x\", expected u32 at line 1 column 36"
    );

    // A TOML file and its JSON form are the same config.
    let from_toml = RegistryConfig::from_toml_str(FULL).unwrap();
    let json = from_toml.to_json_string().unwrap();
    assert_eq!(RegistryConfig::from_json_str(&json).unwrap(), from_toml);
}

/// `[ip_scopes]`: every IP scope without its own config (inheriting from
/// `[default_scope]`), an address of its own still by name; written back
/// as read; errors name the table.
#[test]
fn ip_scopes_have_a_table_of_their_own() {
    let text = r#"
        [default_scope]
        delay = "2s"
        jitter = 0.0

        [ip_scopes]
        concurrency = 2

        [scopes."ip:203.0.113.7"]
        concurrency = 1
        "#;
    let config = RegistryConfig::from_toml_str(text).unwrap();
    // (What each table reads, inherited keys included, is checked by the
    // unit tests of `config_file`.)
    let registry = config.clone().build().unwrap();
    assert_eq!(registry.config(), config);
    // Three tables, three configs: an IP scope without its own, the IP
    // scope with its own, a host.
    let any_server = registry.scope_config("ip:198.51.100.1");
    assert_ne!(any_server, registry.scope_config("ip:203.0.113.7"));
    assert_ne!(any_server, registry.scope_config("books.example"));
    assert_eq!(any_server, registry.scope_config("ip:198.51.100.2"));
    let written = registry.config().to_toml_string().unwrap();
    assert!(written.contains("[ip_scopes]\nconcurrency = 2\n"), "{written}");
    assert_eq!(RegistryConfig::from_toml_str(&written).unwrap(), config);
    let error = RegistryConfig::from_toml_str("[ip_scopes]\nconcurrency = 0").unwrap_err();
    assert!(error.to_string().starts_with("ip_scopes.concurrency"), "{error}");
}

#[test]
fn a_registry_config_written_back_reads_as_the_same_config() {
    let config = RegistryConfig::from_toml_str(FULL).unwrap();
    let registry = config.clone().build().unwrap();
    let written = registry.config().to_toml_string().unwrap();
    let reread = RegistryConfig::from_toml_str(&written).unwrap();
    assert_eq!(reread, config);
    // The canonical file is a fixed point.
    assert_eq!(reread.to_toml_string().unwrap(), written);
    // Its first lines: only keys that differ from the built-in defaults,
    // durations as seconds.
    assert!(
        written
            .starts_with("max_concurrency = 8\nmax_queued = 1000\nquota_window = 30.0\nidle_ttl = 600.0\nmax_hold = 10800.0\n"),
        "{written}"
    );
}

#[test]
fn the_canonical_file_leaves_out_what_a_key_would_be_anyway() {
    let config = RegistryConfig::from_toml_str(
        r#"
        max_concurrency = 16          # the built-in default
        [default_scope]
        delay = "250ms"
        jitter = 0.5                  # the built-in default
        [scopes.a]
        delay = 0.25                  # written by the scope: kept (it ranks above robots.txt)
        jitter = 0.5                  # the default scope's: left out
        backoff = { delay_factor = 2.0, max_delay = "1m" }
        "#,
    )
    .unwrap();
    assert_eq!(
        config.to_toml_string().unwrap(),
        "[default_scope]\ndelay = 0.25\n\n[scopes.a]\ndelay = 0.25\n\n[scopes.a.backoff]\nmax_delay = 60.0\n"
    );
    assert_eq!(
        RegistryConfig::from_toml_str("").unwrap(),
        RegistryConfig::default()
    );
    assert_eq!(RegistryConfig::default().to_toml_string().unwrap(), "");
}

#[test]
fn the_config_of_a_running_registry_includes_scopes_set_since() {
    let registry = RegistryConfig::from_toml_str(FULL).unwrap().build().unwrap();
    registry
        .set_scope(
            "late.example",
            ScopeConfig::default()
                .concurrency(4)
                .delay(Duration::from_millis(500)),
        )
        .unwrap();
    let written = registry.config().to_toml_string().unwrap();
    assert!(
        written.contains("[scopes.\"late.example\"]\nconcurrency = 4\ndelay = 0.5\n"),
        "{written}"
    );
    let reread = RegistryConfig::from_toml_str(&written).unwrap();
    assert_eq!(reread, registry.config());
    for table in [
        "[scopes.\"api.example\"]\n",
        "[scopes.fast]\n",
        "[scopes.\"late.example\"]\n",
    ] {
        assert!(written.contains(table), "{table} in {written}");
    }
}

mod generated {
    use proptest::prelude::*;
    use tower_throttle::config_file::RegistryConfig;

    const TABLES: &[&str] = &[
        "",
        "[default_scope]",
        "[default_scope.backoff]",
        "[default_scope.autothrottle]",
        "[scopes.\"a.example\"]",
        "[scopes.\"a.example\".rampup]",
        "[scopes.b]",
        "[scopes.b.backoff]",
    ];
    const KEYS: &[&str] = &[
        "max_concurrency",
        "max_queued",
        "quota_window",
        "idle_ttl",
        "max_hold",
        "max_scopes",
        "delayed_warn_threshold",
        "metrics_per_scope",
        "jitter_seed",
        "concurrency",
        "delay",
        "delay_per_slot",
        "jitter",
        "ignore_robots_txt",
        "quota",
        "window",
        "max_wait",
        "max_waiting",
        "autothrottle",
        "rampup",
        "http_codes",
        "delay_factor",
        "min_delay",
        "max_delay",
        "concurrency_factor",
        "target_concurrency",
        "start_delay",
        "backoff_target",
        "factor",
        "unknown",
    ];
    const VALUES: &[&str] = &[
        "0",
        "1",
        "2",
        "3",
        "16",
        "-1",
        "0.5",
        "1.5",
        "2.0",
        "300",
        "1e30",
        "nan",
        "inf",
        "-0.0",
        "\"1.5s\"",
        "\"250ms\"",
        "\"2m\"",
        "\"-1s\"",
        "\"\"",
        "\"1.000000001s\"",
        "\"99999999999h\"",
        "true",
        "false",
        "[0.1, 0.2]",
        "[1, 3]",
        "[3, 1]",
        "[429, 503]",
        "[700]",
        "{}",
        "{ delay_factor = 3 }",
        "9223372036854775807",
    ];

    fn file() -> impl Strategy<Value = String> {
        let line = (0..KEYS.len(), 0..VALUES.len()).prop_map(|(k, v)| format!("{} = {}", KEYS[k], VALUES[v]));
        prop::collection::vec((0..TABLES.len(), prop::collection::vec(line, 0..4)), 0..5).prop_map(|tables| {
            tables
                .into_iter()
                .map(|(table, lines)| format!("{}\n{}\n", TABLES[table], lines.join("\n")))
                .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any file is a config or an error, never a panic; a config's
        /// canonical file reads back as an equal config, in TOML and JSON.
        #[test]
        fn every_file_reads_as_an_error_or_a_config_that_round_trips(text in file()) {
            if let Ok(config) = RegistryConfig::from_toml_str(&text) {
                let toml = config.to_toml_string().unwrap();
                prop_assert_eq!(&RegistryConfig::from_toml_str(&toml).unwrap(), &config, "{}", toml);
                let json = config.to_json_string().unwrap();
                prop_assert_eq!(&RegistryConfig::from_json_str(&json).unwrap(), &config, "{}", json);
                prop_assert!(config.build().is_ok());
            }
        }
    }
}

#[test]
fn whole_transfers_are_a_scopes_choice_and_the_old_key_reads_as_its_opposite() {
    let config = RegistryConfig::from_toml_str(
        "[scopes.downloads]\ncount_whole_transfers = true\n\
         [scopes.old_hold]\nrelease_at_head = false\n\
         [scopes.old_release]\nrelease_at_head = true\n",
    )
    .unwrap();
    let registry = config.build().unwrap();
    assert!(!registry
        .scope_config("unknown.example")
        .get_count_whole_transfers());
    assert!(registry.scope_config("downloads").get_count_whole_transfers());
    assert!(registry.scope_config("old_hold").get_count_whole_transfers());
    assert!(!registry.scope_config("old_release").get_count_whole_transfers());
    let written = registry.config().to_toml_string().unwrap();
    assert!(written.contains("count_whole_transfers = true"), "{written}");
    assert!(!written.contains("release_at_head"), "{written}");
}

#[test]
fn a_scope_name_the_host_resolver_never_gives_is_an_error_at_its_key_path() {
    for (name, path, why) in [
        (
            "example.com:8080",
            r#"scopes."example.com:8080""#,
            "it has a port",
        ),
        (
            "http://example.com/",
            r#"scopes."http://example.com/""#,
            "it has a scheme and a path",
        ),
        ("Example.COM", r#"scopes."Example.COM""#, "it has upper case"),
    ] {
        let config = RegistryConfig::from_toml_str(&format!("[scopes.{name:?}]\nconcurrency = 2\n")).unwrap();
        let err = config.build().unwrap_err();
        assert_eq!(err.key_path(), path);
        assert_eq!(
            err.to_string(),
            format!(
                r#"{path}: the host resolver never gives a request this key ({why}); it would match "example.com""#
            )
        );
    }
    // With a resolver of its own, the keys are that resolver's call.
    let config = RegistryConfig::from_toml_str("[scopes.\"example.com/v1\"]\nconcurrency = 2\n").unwrap();
    let builder = config.into_builder().unwrap();
    assert!(builder
        .resolver(tower_throttle::scope::EndpointResolver::segments(1))
        .build()
        .is_ok());
}
