//! One report per response: each feedback layer reports what a response
//! says about all of its request's scopes under one lock of the registry,
//! and none when it says nothing (a plain success); the departure takes a
//! lock of its own only where a gap depends on it. Locks are counted with
//! the registry's debug lock counter (debug builds only).

use std::convert::Infallible;
use std::time::Duration;

use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::{BackoffLayer, Registry, RetryAfterLayer, ScopeConfig, Scopes, ThrottleLayer};

/// One lane and no delay: the departure rides with the completion, so the
/// throttle itself takes two locks per request (admission, completion).
fn registry() -> Registry {
    registry_with(1, Duration::ZERO)
}

fn registry_with(lanes: u32, delay: Duration) -> Registry {
    Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .concurrency(lanes)
                .delay(delay)
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()
        .unwrap()
}

/// The registry locks one request through RetryAfter → Backoff under a
/// throttle costs, for a response with `status` and `headers`, with
/// `scopes`; `None` in a release build.
async fn locks_for(
    scopes: &[&str],
    status: u16,
    headers: &[(&'static str, &'static str)],
) -> Option<(u64, Registry)> {
    locks_through(registry(), scopes, status, headers).await
}

/// [`locks_for`] through `registry`.
async fn locks_through(
    registry: Registry,
    scopes: &[&str],
    status: u16,
    headers: &[(&'static str, &'static str)],
) -> Option<(u64, Registry)> {
    let response = {
        let mut builder = http::Response::builder().status(status);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    };
    let inner = tower::service_fn(move |_request: http::Request<()>| {
        let response = response.clone();
        async move { Ok::<_, Infallible>(response) }
    });
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(RetryAfterLayer::new(registry.clone()))
        .layer(BackoffLayer::new(registry.clone()))
        .service(inner);
    let mut request = http::Request::get("https://example.com/").body(()).unwrap();
    request.extensions_mut().insert(Scopes::from(scopes.to_vec()));
    let before = registry.debug_lock_count()?;
    client.oneshot(request).await.unwrap();
    Some((registry.debug_lock_count()? - before, registry))
}

/// Scopes, status and headers of a response, and the locks it should cost.
type Case = (
    &'static [&'static str],
    u16,
    &'static [(&'static str, &'static str)],
    u64,
);

#[tokio::test(start_paused = true)]
async fn a_response_costs_at_most_one_lock_per_reporting_layer_and_none_when_it_says_nothing() {
    const LIMITED: &[(&str, &str)] = &[
        ("retry-after", "5"),
        ("ratelimit", "\"default\";r=0;t=30"),
        ("ratelimit-policy", "\"default\";q=100;w=60"),
    ];
    let cases: [Case; 4] = [
        // Admission and completion: a 200 is a backoff status in no
        // config, so Backoff knows it is success everywhere without the
        // lock, and RetryAfter has no header to read.
        (&["a"], 200, &[], 2),
        (&["a", "b", "c"], 200, &[], 2),
        // Admission, Backoff's report (backoff in each scope), RetryAfter's
        // report (holds, announced limits in each scope), completion. The
        // code before this change took 3, 5, 7 and 17 for these four cases: Backoff a lock per scope for its config and one for
        // its feedback, RetryAfter one per scope for the backoff status,
        // the hold and the announced limits.
        (&["a"], 429, LIMITED, 4),
        (&["a", "b", "c"], 429, LIMITED, 4),
    ];
    for (scopes, status, headers, expected) in cases {
        let Some((locks, registry)) = locks_for(scopes, status, headers).await else {
            eprintln!("a release build does not count locks: nothing to check");
            return;
        };
        assert_eq!(
            locks, expected,
            "{scopes:?}, status {status}, headers {headers:?}"
        );
        if status == 429 {
            for scope in scopes {
                let stats = registry.scope_stats(scope).unwrap();
                assert_eq!(stats.backoff_level, 1, "{scope}: backoff applied");
                assert!(stats.held_for.is_some(), "{scope}: hold applied");
                assert!(stats.announced.is_some(), "{scope}: announced limits recorded");
            }
        }
    }
}

/// The departure takes a lock of its own only where another request of the
/// scope could be admitted before this one ends (a delay and more than one
/// lane); elsewhere it rides with the completion.
#[tokio::test(start_paused = true)]
async fn the_departure_takes_a_lock_of_its_own_only_where_a_gap_depends_on_it() {
    let delay = Duration::from_millis(100);
    for (lanes, delay, expected) in [
        (1, Duration::ZERO, 2),
        (1, delay, 2),
        (4, Duration::ZERO, 2),
        (4, delay, 3),
    ] {
        let Some((locks, _)) = locks_through(registry_with(lanes, delay), &["a"], 200, &[]).await else {
            eprintln!("a release build does not count locks: nothing to check");
            return;
        };
        assert_eq!(locks, expected, "{lanes} lanes, delay {delay:?}");
    }
}

/// A status that some scope's config counts as backoff (here, set at
/// runtime) is judged under the lock again, and backs that scope off.
#[tokio::test(start_paused = true)]
async fn a_status_made_a_backoff_status_at_runtime_is_judged_under_the_lock() {
    let registry = registry();
    registry
        .set_scope(
            "strict",
            ScopeConfig::default()
                .concurrency(1)
                .delay(Duration::ZERO)
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0)
                .backoff(tower_throttle::BackoffConfig::default().http_codes([200])),
        )
        .unwrap();
    let Some((locks, registry)) = locks_through(registry, &["strict"], 200, &[]).await else {
        eprintln!("a release build does not count locks: nothing to check");
        return;
    };
    assert_eq!(locks, 3, "admission, Backoff's report, completion");
    assert_eq!(registry.scope_stats("strict").unwrap().backoff_level, 1);
}
