//! Feeds arbitrary UTF-8 to `RegistryConfig::from_toml_str` and
//! `RegistryConfig::from_json_str`.
//!
//! Beyond "no panic", for every text that reads as a config it checks what
//! the `config_file` module documents:
//!
//! * the canonical TOML file reads back as an equal config, and is a fixed
//!   point (writing the config read from it gives the same text);
//! * the same for the canonical JSON file;
//! * a config that was read (and so checked) builds: `build()` neither
//!   panics nor fails.
//!
//! The one documented write failure is a `jitter_seed` above `i64::MAX`,
//! which TOML cannot hold and JSON can: only a JSON text can produce it.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tower_throttle::config_file::RegistryConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = RegistryConfig::from_toml_str(text) {
        let toml = config
            .to_toml_string()
            .unwrap_or_else(|err| panic!("a config read from TOML must write as TOML: {err}"));
        check_toml_round_trip(&config, &toml);
        check_json_round_trip(&config);
        check_builds(config);
    }
    if let Ok(config) = RegistryConfig::from_json_str(text) {
        match config.to_toml_string() {
            Ok(toml) => check_toml_round_trip(&config, &toml),
            Err(err) => assert!(
                seed_beyond_toml(&config),
                "JSON config does not write as TOML: {err}"
            ),
        }
        check_json_round_trip(&config);
        check_builds(config);
    }
});

fn check_toml_round_trip(config: &RegistryConfig, toml: &str) {
    let again = RegistryConfig::from_toml_str(toml)
        .unwrap_or_else(|err| panic!("canonical TOML does not read back: {err}\n{toml}"));
    assert!(again == *config, "TOML round trip changed the config:\n{toml}");
    let rewritten = again.to_toml_string().expect("written once, so writable");
    assert_eq!(rewritten, toml, "canonical TOML is not a fixed point");
}

fn check_json_round_trip(config: &RegistryConfig) {
    let json = config.to_json_string().expect("every value has a JSON form");
    let again = RegistryConfig::from_json_str(&json)
        .unwrap_or_else(|err| panic!("canonical JSON does not read back: {err}\n{json}"));
    assert!(again == *config, "JSON round trip changed the config:\n{json}");
    assert_eq!(again.to_json_string().expect("writable"), json);
}

/// Whether the config's `jitter_seed` is above `i64::MAX`, read from its
/// canonical JSON (the seed itself is not public).
fn seed_beyond_toml(config: &RegistryConfig) -> bool {
    let json = config.to_json_string().expect("every value has a JSON form");
    let Some((_, after)) = json.split_once("\"jitter_seed\": ") else {
        return false;
    };
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse::<u64>().is_ok_and(|seed| seed > i64::MAX as u64)
}

fn check_builds(config: RegistryConfig) {
    if let Err(err) = config.build() {
        panic!("a config that was read and checked must build: {err}");
    }
}
