//! One report per response: the feedback layers inside a throttle leave
//! what a response says about its request's scopes for the lock the
//! throttle's completion takes, so a response costs that one lock however
//! many layers have something to say (and a layer outside a throttle one
//! of its own); the departure takes a lock of its own only where a gap
//! depends on it. Locks are counted with the registry's debug lock counter
//! (debug builds only).

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
        .default_scope(config(lanes, delay))
        .build()
        .unwrap()
}

fn config(lanes: u32, delay: Duration) -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(lanes)
        .delay(delay)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
}

/// The registry locks one request through RetryAfter → Backoff under a
/// throttle costs, for a response with `status` and `headers`, with
/// `scopes`; `None` in a release build.
async fn locks_for(
    scopes: &[&str],
    status: u16,
    headers: &[(&'static str, &'static str)],
) -> Option<(u64, Registry)> {
    let registry = Registry::builder()
        .default_scope(config(1, Duration::ZERO))
        .build()
        .unwrap();
    locks_through(registry, scopes, status, headers).await
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
async fn a_response_costs_the_completions_lock_whatever_its_layers_report() {
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
        // Admission and completion: Backoff's report (backoff in each
        // scope) and RetryAfter's (holds, announced limits in each scope)
        // are applied under the completion's lock. Earlier code took 3, 5,
        // 7 and 17 locks for these four cases (a lock per scope and
        // question), then 2, 2, 4 and 4 (one per reporting layer).
        // Lanes go back at the head by default, so the reports ride with
        // the completion's lock. (A scope that counts whole transfers
        // applies them at the head and frees its lanes at the body's end:
        // one lock more.)
        (&["a"], 429, LIMITED, 2),
        (&["a", "b", "c"], 429, LIMITED, 2),
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
/// runtime) is reported again, and backs that scope off.
#[tokio::test(start_paused = true)]
async fn a_status_made_a_backoff_status_at_runtime_is_reported_under_the_completions_lock() {
    let registry = registry();
    registry
        .set_scope(
            "strict",
            ScopeConfig::default()
                .concurrency(1)
                .delay(Duration::ZERO)
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0)
                .backoff(tower_throttle::registry::BackoffConfig::default().http_codes([200])),
        )
        .unwrap();
    let Some((locks, registry)) = locks_through(registry, &["strict"], 200, &[]).await else {
        eprintln!("a release build does not count locks: nothing to check");
        return;
    };
    assert_eq!(
        locks, 2,
        "admission, and Backoff's report with the completion at the head"
    );
    assert_eq!(registry.scope_stats("strict").unwrap().backoff_level, 1);
}

/// A feedback layer outside the throttle finds no completion to leave its
/// report for (the throttle's future is done when the layer's ends): it
/// applies the report under a lock of its own.
#[tokio::test(start_paused = true)]
async fn a_layer_outside_the_throttle_reports_under_a_lock_of_its_own() {
    let registry = registry();
    let inner = tower::service_fn(|_request: http::Request<()>| async {
        Ok::<_, Infallible>(http::Response::builder().status(503).body(()).unwrap())
    });
    let client = ServiceBuilder::new()
        .layer(BackoffLayer::new(registry.clone()))
        .layer(ThrottleLayer::new(registry.clone()).record_scopes(true))
        .service(inner);
    let request = http::Request::get("https://example.com/").body(()).unwrap();
    let Some(before) = registry.debug_lock_count() else {
        eprintln!("a release build does not count locks: nothing to check");
        return;
    };
    client.oneshot(request).await.unwrap();
    assert_eq!(
        registry.debug_lock_count().unwrap() - before,
        3,
        "admission, completion, Backoff's report"
    );
    assert_eq!(registry.scope_stats("example.com").unwrap().backoff_level, 1);
}

/// The reports a completion applies come before it frees the request's
/// lane: the request waiting behind a 429 that says `Retry-After: 5` is
/// held for those 5 s, not admitted by the completion itself.
#[tokio::test(start_paused = true)]
async fn the_request_behind_a_429_waits_for_its_hold_not_for_the_completion() {
    let registry = registry();
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = answered.clone();
    let inner = tower::service_fn(move |_request: http::Request<()>| {
        let first = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut response = http::Response::builder().status(if first { 429 } else { 200 });
            if first {
                response = response.header("retry-after", "5");
            }
            Ok::<_, Infallible>(response.body(()).unwrap())
        }
    });
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(RetryAfterLayer::new(registry.clone()))
        .layer(BackoffLayer::new(registry.clone()))
        .service(inner);
    let start = tokio::time::Instant::now();
    let send = |client: tower::util::BoxCloneService<_, _, _>| async move {
        let request = http::Request::get("https://example.com/").body(()).unwrap();
        client.oneshot(request).await.unwrap();
        start.elapsed()
    };
    let client = tower::util::BoxCloneService::new(client);
    let (first, second) = tokio::join!(send(client.clone()), send(client));
    assert_eq!(first, Duration::from_millis(100));
    // Held 5 s from the 429 (at 100 ms), then 100 ms in flight.
    assert_eq!(second, Duration::from_millis(5_200));
}

/// [`Registry::feedback`] applies at once, also inside a throttle's call:
/// a layer that reports and then reads the stats sees its report.
#[tokio::test(start_paused = true)]
async fn a_report_made_through_the_public_call_inside_a_throttle_applies_at_once() {
    let registry = registry();
    let seen = registry.clone();
    let inner = tower::service_fn(move |_request: http::Request<()>| {
        let registry = seen.clone();
        async move {
            registry.feedback(
                &Scopes::from("example.com"),
                tower_throttle::registry::Feedback::backoff(),
            );
            let level = registry.scope_stats("example.com").unwrap().backoff_level;
            Ok::<_, Infallible>(http::Response::new(level))
        }
    });
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .service(inner);
    let request = http::Request::get("https://example.com/").body(()).unwrap();
    let level = client.oneshot(request).await.unwrap().into_body().into_inner();
    assert_eq!(level, 1);
}

/// A scope that counts whole transfers applies a response's reports at its
/// head (a hold must stop the scope's other lanes while the body streams)
/// and frees its lanes at the body's end: one lock more than the default.
#[tokio::test(start_paused = true)]
async fn a_whole_transfer_applies_its_reports_at_the_head_and_frees_its_lanes_at_the_end() {
    let registry = Registry::builder()
        .default_scope(config(1, Duration::ZERO).count_whole_transfers(true))
        .build()
        .unwrap();
    let Some((locks, registry)) = locks_through(registry, &["a"], 429, &[("retry-after", "5")]).await else {
        eprintln!("a release build does not count locks: nothing to check");
        return;
    };
    assert_eq!(locks, 3, "admission, the reports at the head, the body's end");
    assert!(registry.scope_stats("a").unwrap().held_for.is_some());
}
