//! Property: whatever rate-limit headers a response carries, the layer
//! never panics, never holds a scope beyond the registry's `max_hold`, and
//! never paces it beyond its backoff `max_delay`.

use std::convert::Infallible;
use std::time::Duration;

use proptest::prelude::*;
use tower::{Layer, ServiceExt};
use tower_throttle::registry::BackoffConfig;
use tower_throttle::{Registry, RetryAfterLayer, ScopeConfig, ThrottleLayer};

/// Every header the layer reads (its module docs list them).
const HEADERS: [&str; 9] = [
    "retry-after",
    "ratelimit",
    "ratelimit-policy",
    "ratelimit-reset",
    "ratelimit-remaining",
    "x-ratelimit-reset",
    "x-rate-limit-reset",
    "x-ratelimit-remaining",
    "x-rate-limit-remaining",
];

fn header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..40),
        "[0-9]{1,25}".prop_map(String::into_bytes),
        "\"[a-z]{0,4}\";[rtqw]=[0-9-]{1,20}(;[rtqw]=[0-9]{1,20})?".prop_map(String::into_bytes),
        "(Mon|Sun), 0[1-9] (Jan|Nov) (1994|2031|2999) 0[0-9]:[0-5][0-9]:[0-5][0-9] GMT"
            .prop_map(String::into_bytes),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn no_header_panics_or_holds_beyond_the_cap(
        status in prop_oneof![Just(200u16), Just(301), Just(403), Just(429), Just(503), 100u16..600],
        headers in proptest::collection::vec((0..HEADERS.len(), header_value()), 0..6),
        pace in any::<bool>(),
    ) {
        // Pacing is capped by the backoff max_delay, holds by max_hold.
        let cap = Duration::from_secs(45);
        let hold_cap = Duration::from_secs(90);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            let registry = Registry::builder()
                .max_hold(hold_cap)
                .default_scope(ScopeConfig::default().backoff(BackoffConfig::default().max_delay(cap)))
                .build()
                .unwrap();
            let response_headers = headers.clone();
            let inner = tower::service_fn(move |_request: http::Request<()>| {
                let mut response = http::Response::builder().status(status).body(()).unwrap();
                for (name, value) in &response_headers {
                    if let Ok(value) = http::HeaderValue::from_bytes(value) {
                        response.headers_mut().append(HEADERS[*name], value);
                    }
                }
                async move { Ok::<_, Infallible>(response) }
            });
            let layer = RetryAfterLayer::new(registry.clone()).pace_to_policy(pace);
            let service = ThrottleLayer::new(registry.clone()).layer(layer.layer(inner));
            service.oneshot(http::Request::get("https://site.example/").body(()).unwrap()).await.unwrap();
            let stats = registry.scope_stats("site.example").unwrap();
            prop_assert!(stats.held_for.is_none_or(|held| held <= hold_cap), "held {:?}", stats.held_for);
            prop_assert!(stats.pacing_delay.is_none_or(|paced| paced <= cap), "paced {:?}", stats.pacing_delay);
            Ok(())
        })?;
    }
}
