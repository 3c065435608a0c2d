//! `ScrapingApiResolver` through `Throttle`: calls to a scraping API wait
//! for the API's limits and for the target site's. In-process service,
//! paused time: exact virtual instants.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_throttle::throttle::ThrottledBody;

use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::scope::ScrapingApiResolver;
use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};

fn api_call(target: &str, label: &str) -> http::Request<()> {
    let target = form_encoded(&format!("https://{target}/{label}"));
    http::Request::get(format!(
        "https://api.example/v1/scrape?url={target}&label={label}"
    ))
    .body(())
    .unwrap()
}

fn form_encoded(value: &str) -> String {
    value.replace('%', "%25").replace(':', "%3A").replace('/', "%2F")
}

/// The API, in process: records each call's label and virtual instant.
fn api(
    sent: Arc<Mutex<Vec<(String, u128)>>>,
) -> impl Service<http::Request<()>, Response = http::Response<()>, Error = Infallible, Future: Send> + Clone
{
    let start = Instant::now();
    tower::service_fn(move |request: http::Request<()>| {
        let label = request
            .uri()
            .query()
            .unwrap()
            .split("label=")
            .nth(1)
            .unwrap()
            .to_owned();
        sent.lock().unwrap().push((label, start.elapsed().as_millis()));
        async { Ok::<_, Infallible>(http::Response::new(())) }
    })
}

fn no_jitter() -> ScopeConfig {
    ScopeConfig::default().delay_per_slot(Duration::ZERO).jitter(0.0)
}

/// Sites 1 s apart, the API 100 ms apart with lanes to spare; the API
/// wrapped in `Throttle`, recording into the returned list.
#[allow(clippy::type_complexity)]
fn throttled_api() -> (
    Registry,
    impl Service<
            http::Request<()>,
            Response = http::Response<ThrottledBody<()>>,
            Error = Infallible,
            Future: Send,
        > + Clone,
    Arc<Mutex<Vec<(String, u128)>>>,
) {
    let registry = Registry::builder()
        .resolver(ScrapingApiResolver::new(["api.example"]))
        .default_scope(no_jitter().delay(Duration::from_secs(1)))
        .scope(
            "api.example",
            no_jitter().concurrency(100).delay(Duration::from_millis(100)),
        )
        .build()
        .unwrap();
    let sent = Arc::default();
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .service(api(Arc::clone(&sent)));
    (registry, client, sent)
}

#[tokio::test(start_paused = true)]
async fn the_same_site_waits_its_delay_while_other_sites_go_at_the_apis_pace() {
    let (registry, mut client, sent) = throttled_api();

    let calls = [
        ("a.example", "a1"),
        ("a.example", "a2"),
        ("b.example", "b1"),
        ("c.example", "c1"),
        ("a.example", "a3"),
        ("b.example", "b2"),
    ];
    let mut responses = Vec::new();
    for (target, label) in calls {
        client.ready().await.unwrap();
        responses.push(tokio::spawn(client.call(api_call(target, label))));
    }
    for response in responses {
        response.await.unwrap().unwrap();
    }

    let sent = sent.lock().unwrap().clone();
    let at = |label: &str| sent.iter().find(|(known, _)| known == label).unwrap().1;
    // Different sites: one API delay (100 ms) apart, in arrival order.
    assert_eq!((at("a1"), at("b1"), at("c1")), (0, 100, 200));
    // The same site: its own delay (1 s) apart, and never closer than the
    // API's delay to another call.
    assert_eq!((at("a2"), at("a3")), (1000, 2000));
    assert_eq!(at("b2"), 1100);
    let mut instants: Vec<u128> = sent.iter().map(|(_, at)| *at).collect();
    instants.sort_unstable();
    assert!(
        instants.windows(2).all(|pair| pair[1] - pair[0] >= 100),
        "{instants:?}"
    );

    assert_eq!(registry.scope_stats("api.example").unwrap().sent, 6);
    assert_eq!(registry.scope_stats("a.example").unwrap().sent, 3);
    assert_eq!(registry.scope_stats("b.example").unwrap().sent, 2);
}

#[tokio::test(start_paused = true)]
async fn a_call_without_a_target_is_throttled_by_the_api_alone() {
    let (registry, client, sent) = throttled_api();

    for label in ["x1", "x2"] {
        let request = http::Request::get(format!("https://api.example/account?url=not-a-url&label={label}"))
            .body(())
            .unwrap();
        client.clone().oneshot(request).await.unwrap();
    }

    let instants: Vec<u128> = sent.lock().unwrap().iter().map(|(_, at)| *at).collect();
    assert_eq!(instants, [0, 100]);
    assert_eq!(registry.stats().scopes_tracked, 1, "only the API's scope exists");
}
