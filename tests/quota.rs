//! Quotas with costs: at most Q units per window per scope, reconciled with
//! what the server says a request cost, in paused virtual time with an
//! in-process inner service, so every instant asserted is exact.

mod support;

use std::convert::Infallible;
use std::time::Duration;

use support::{get, Recorder};
use tokio::task::JoinHandle;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_throttle::registry::{Feedback, LimitSource};
use tower_throttle::{BackoffLayer, Priority, Registry, RetryAfterLayer, ScopeConfig, Scopes, ThrottleLayer};

const WINDOW: Duration = Duration::from_secs(60);

/// No delays, no jitter, lanes to spare: only the quota limits.
fn free() -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(100)
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
}

/// Scope `api` with quota 10 per 60 s.
fn api_registry() -> Registry {
    Registry::builder()
        .max_concurrency(100)
        .default_scope(free())
        .scope("api", free().quota(10.0).window(WINDOW))
        .build()
        .unwrap()
}

/// A request to `path` costing `cost` in scope `api`.
fn costing(path: &str, cost: f64) -> http::Request<()> {
    let mut request = get(&format!("https://api.example{path}"));
    request
        .extensions_mut()
        .insert(Scopes::with_costs([("api", cost)]));
    request
}

async fn launch<S, B>(service: &mut S, requests: Vec<http::Request<()>>) -> Vec<JoinHandle<()>>
where
    S: Service<http::Request<()>, Response = http::Response<B>>,
    B: Send + 'static,
    S::Future: Send + 'static,
    S::Error: std::fmt::Debug + Send,
{
    let mut handles = Vec::new();
    for request in requests {
        service.ready().await.unwrap();
        let future = service.call(request);
        handles.push(tokio::spawn(async move {
            future.await.unwrap();
        }));
    }
    handles
}

async fn finish_all(handles: Vec<JoinHandle<()>>) {
    for handle in handles {
        handle.await.unwrap();
    }
}

fn used(registry: &Registry, scope: &str) -> f64 {
    registry.scope_stats(scope).unwrap().quota.unwrap().used
}

#[tokio::test(start_paused = true)]
async fn costs_6_then_3_then_3_send_the_third_when_the_window_ends() {
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(api_registry()).layer(recorder.service(Duration::ZERO));
    let requests = vec![costing("/a", 6.0), costing("/b", 3.0), costing("/c", 3.0)];
    finish_all(launch(&mut service, requests).await).await;
    assert_eq!(recorder.millis(), vec![0, 0, 60_000]);
}

#[tokio::test(start_paused = true)]
async fn a_request_costing_more_than_the_quota_goes_at_once_and_the_next_waits_a_window() {
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(api_registry()).layer(recorder.service(Duration::ZERO));
    let requests = vec![costing("/huge", 999.0), costing("/small", 1.0)];
    finish_all(launch(&mut service, requests).await).await;
    assert_eq!(recorder.millis(), vec![0, 60_000]);
}

#[tokio::test(start_paused = true)]
async fn an_oversized_request_waits_for_an_empty_window_not_forever() {
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(api_registry()).layer(recorder.service(Duration::ZERO));
    let requests = vec![costing("/a", 4.0), costing("/huge", 25.0), costing("/b", 1.0)];
    finish_all(launch(&mut service, requests).await).await;
    // /huge starts the second window alone; /b waits for the third.
    assert_eq!(recorder.millis(), vec![0, 60_000, 120_000]);
}

#[tokio::test(start_paused = true)]
async fn an_actual_cost_header_corrects_the_window_expected_2_reported_2_5() {
    let registry = api_registry();
    let api = tower::service_fn(|_request: http::Request<()>| async {
        let response = http::Response::builder()
            .header("X-Actual-Cost", "2.5")
            .body(())
            .unwrap();
        Ok::<_, Infallible>(response)
    });
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(
            BackoffLayer::new(registry.clone())
                .actual_cost_header(http::HeaderName::from_static("x-actual-cost")),
        )
        .service(api);
    client.oneshot(costing("/", 2.0)).await.unwrap();
    let stats = registry.scope_stats("api").unwrap();
    let quota = stats.quota.unwrap();
    assert_eq!((quota.used, quota.remaining), (2.5, 7.5));
    assert_eq!(quota.resets_in, Some(WINDOW));
    assert_eq!(stats.reported_cost, 2.5);
}

#[tokio::test(start_paused = true)]
async fn a_remaining_3_report_sets_used_to_7() {
    let registry = api_registry();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
    finish_all(launch(&mut service, vec![costing("/", 1.0)]).await).await;
    registry.feedback(&Scopes::from("api"), Feedback::ignore().with_remaining_quota(3.0));
    assert_eq!(used(&registry, "api"), 7.0);
    // 7 + 3 fits, 7 + 3 + 1 does not.
    let requests = vec![costing("/three", 3.0), costing("/one", 1.0)];
    finish_all(launch(&mut service, requests).await).await;
    assert_eq!(recorder.millis(), vec![0, 0, 60_000]);
}

#[tokio::test(start_paused = true)]
async fn the_rate_limit_headers_remaining_quota_feeds_scopes_with_a_quota_when_asked() {
    let registry = api_registry();
    let api = tower::service_fn(|_request: http::Request<()>| async {
        let response = http::Response::builder()
            .header("RateLimit", "\"default\";r=4;t=60")
            .body(())
            .unwrap();
        Ok::<_, Infallible>(response)
    });
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(RetryAfterLayer::new(registry.clone()).remaining_quota(true))
        .service(api);
    let mut request = costing("/", 1.0);
    request
        .extensions_mut()
        .insert(Scopes::with_costs([("api", 1.0), ("site", 1.0)]));
    client.oneshot(request).await.unwrap();
    assert_eq!(used(&registry, "api"), 6.0);
    // A scope without a quota of its own is left alone.
    assert_eq!(registry.scope_stats("site").unwrap().quota, None);
}

#[tokio::test(start_paused = true)]
async fn a_multi_scope_request_waiting_on_a_quota_holds_no_lane_in_its_other_scope() {
    let registry = Registry::builder()
        .default_scope(free())
        .scope("api", free().quota(10.0).window(WINDOW))
        .scope("site", free().concurrency(1))
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::from_secs(1)));
    let mut both = get("https://site.example/both");
    both.extensions_mut()
        .insert(Scopes::with_costs([("api", 6.0), ("site", 1.0)]));
    let mut site_only = get("https://site.example/site");
    site_only.extensions_mut().insert(Scopes::from("site"));
    let requests = vec![costing("/spend", 6.0), both, site_only];
    let handles = launch(&mut service, requests).await;
    tokio::task::yield_now().await;
    // /both waits for the api window; the site's only lane went to /site.
    assert_eq!(recorder.millis_of("/site"), vec![0]);
    let site = registry.scope_stats("site").unwrap();
    assert_eq!((site.in_flight, site.queued), (1, 1));
    let api = registry.scope_stats("api").unwrap();
    assert_eq!(api.held_back_by, Some(LimitSource::Quota));
    finish_all(handles).await;
    assert_eq!(recorder.millis_of("/both"), vec![60_000]);
}

#[tokio::test(start_paused = true)]
async fn small_requests_do_not_overtake_a_waiting_large_one() {
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(api_registry()).layer(recorder.service(Duration::ZERO));
    // 8 spent; /large (5) waits; /small (1) would fit now but keeps its turn.
    let requests = vec![
        costing("/spend", 8.0),
        costing("/large", 5.0),
        costing("/small", 1.0),
    ];
    finish_all(launch(&mut service, requests).await).await;
    let order: Vec<_> = recorder
        .sent()
        .iter()
        .map(|sent| (sent.path.clone(), sent.at.as_millis()))
        .collect();
    assert_eq!(
        order,
        vec![
            ("/spend".to_owned(), 0),
            ("/large".to_owned(), 60_000),
            ("/small".to_owned(), 60_000)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn priorities_still_order_waiters_on_a_quota() {
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(api_registry()).layer(recorder.service(Duration::ZERO));
    let mut urgent = costing("/urgent", 6.0);
    urgent.extensions_mut().insert(Priority(5));
    let requests = vec![costing("/spend", 8.0), costing("/first", 6.0), urgent];
    finish_all(launch(&mut service, requests).await).await;
    // Both wait for the second window; the urgent one takes it, the other
    // (6 + 6 > 10) the third.
    assert_eq!(recorder.millis_of("/urgent"), vec![60_000]);
    assert_eq!(recorder.millis_of("/first"), vec![120_000]);
}

#[tokio::test(start_paused = true)]
async fn a_cheaper_actual_cost_lets_a_waiter_go_at_once() {
    let registry = api_registry();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
    let handles = launch(&mut service, vec![costing("/a", 8.0), costing("/b", 5.0)]).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    // /a really cost 2: 2 + 5 fits, /b goes now rather than at 60 s.
    registry.feedback(
        &Scopes::with_costs([("api", 8.0)]),
        Feedback::success().with_actual_cost(2.0),
    );
    finish_all(handles).await;
    assert_eq!(recorder.millis(), vec![0, 10_000]);
    assert_eq!(used(&registry, "api"), 7.0);
}

#[tokio::test(start_paused = true)]
async fn the_builder_window_is_the_default_for_scopes_with_a_quota() {
    let registry = Registry::builder()
        .quota_window(Duration::from_secs(10))
        .default_scope(free())
        .scope("api", free().quota(1.0))
        .build()
        .unwrap();
    assert_eq!(
        registry.scope_config("api"),
        free().quota(1.0).window(Duration::from_secs(10))
    );
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry).layer(recorder.service(Duration::ZERO));
    let requests = vec![costing("/a", 1.0), costing("/b", 1.0)];
    finish_all(launch(&mut service, requests).await).await;
    assert_eq!(recorder.millis(), vec![0, 10_000]);
    let err = Registry::builder()
        .quota_window(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "quota_window");
}

/// Scope `api` with quota 10 per 60 s, and scope `slow`: 1 lane, 5 s apart.
fn api_and_slow_registry() -> Registry {
    Registry::builder()
        .max_concurrency(100)
        .default_scope(free())
        .scope("api", free().quota(10.0).window(WINDOW))
        .scope("slow", free().concurrency(1).delay(Duration::from_secs(5)))
        .build()
        .unwrap()
}

/// A request to `path` of scopes `slow` (cost 1) and `api` (cost 5).
fn slow_and_api(path: &str) -> http::Request<()> {
    let mut request = get(&format!("https://api.example{path}"));
    request
        .extensions_mut()
        .insert(Scopes::with_costs([("slow", 1.0), ("api", 5.0)]));
    request
}

/// The paths `recorder` saw, with when (milliseconds from the start).
fn sent_at_ms(recorder: &Recorder) -> Vec<(String, u128)> {
    recorder
        .sent()
        .iter()
        .map(|sent| (sent.path.clone(), sent.at.as_millis()))
        .collect()
}

/// A request of two scopes that one of them holds back (here a delay) and
/// whose cost the other's quota cannot take yet does not keep a cheaper
/// request behind it in the quota's scope from going: it could not go
/// anyway, so it stands aside, as a request held by another scope does.
#[tokio::test(start_paused = true)]
async fn a_request_held_by_another_scope_does_not_keep_a_cheaper_one_behind_it_from_the_quota() {
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(api_and_slow_registry()).layer(recorder.service(Duration::ZERO));
    let mut slow = get("https://slow.example/first");
    slow.extensions_mut().insert(Scopes::from(["slow"]));
    let both = slow_and_api("/both");
    let requests = vec![costing("/a", 6.0), slow, both, costing("/c", 3.0)];
    finish_all(launch(&mut service, requests).await).await;
    assert_eq!(
        sent_at_ms(&recorder),
        [
            ("/a".to_owned(), 0),
            ("/first".to_owned(), 0),
            ("/c".to_owned(), 0),
            // 6 + 3 of the window's 10 are spent: 5 more fit once it ends.
            ("/both".to_owned(), 60_000),
        ]
    );
}

/// A request of two scopes waiting at the head of a quota scope for its
/// window, whose other scope then sends another request and so holds it
/// far longer, stands aside at once: the cheaper request behind it in the
/// quota scope goes with that send, not when the window ends.
#[tokio::test(start_paused = true)]
async fn a_head_waiting_for_the_quota_stands_aside_once_its_other_scope_holds_it_longer() {
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(api_and_slow_registry()).layer(recorder.service(Duration::ZERO));
    let both = slow_and_api("/both");
    // `/both` waits for the quota (4 of 10 left) at the head of `api`, and
    // stands aside in `slow`, which it does not hold.
    let mut handles = launch(&mut service, vec![costing("/a", 6.0), both, costing("/c", 3.0)]).await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    let mut slow = get("https://slow.example/first");
    slow.extensions_mut().insert(Scopes::from(["slow"]));
    handles.extend(launch(&mut service, vec![slow]).await);
    finish_all(handles).await;
    assert_eq!(
        sent_at_ms(&recorder),
        [
            ("/a".to_owned(), 0),
            // `/first` holds `/both` in `slow` for 5 s: `/c` fits what is
            // left of the window and goes with it.
            ("/first".to_owned(), 1),
            ("/c".to_owned(), 1),
            // 6 + 3 of the window's 10 are spent: 5 more fit once it ends.
            ("/both".to_owned(), 60_000),
        ]
    );
}
