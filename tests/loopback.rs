//! Throttle in front of a real hyper-util client talking to a real hyper
//! server on loopback. Real sockets and real time: these tests assert order,
//! counts and lower bounds, never exact instants.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use support::{loopback_client, serve, text};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};

fn request(uri: &str) -> http::Request<Full<Bytes>> {
    http::Request::get(uri).body(Full::new(Bytes::new())).unwrap()
}

#[tokio::test]
async fn throttled_hyper_util_client_crawls_two_virtual_sites_in_order() {
    let arrivals: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let log = arrivals.clone();
    let addr = serve(move |request: http::Request<hyper::body::Incoming>| {
        let host = request.headers()["host"]
            .to_str()
            .unwrap()
            .split(':')
            .next()
            .unwrap()
            .to_owned();
        let path = request.uri().path().to_owned();
        log.lock().unwrap().push((host.clone(), path.clone()));
        async move { text(format!("{host}{path}")) }
    })
    .await;
    let delay = Duration::from_millis(30);
    let registry = Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .delay(delay)
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()
        .unwrap();
    let mut client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .service(loopback_client());
    let start = Instant::now();
    let mut handles = Vec::new();
    for i in 0..5 {
        for site in ["books.toscrape.test", "quotes.toscrape.test"] {
            client.ready().await.unwrap();
            let future = client.call(request(&format!("http://{site}:{}/page{i}", addr.port())));
            handles.push(tokio::spawn(async move {
                let response = future.await.unwrap();
                assert_eq!(response.status(), 200);
                String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
            }));
        }
    }
    let mut bodies = Vec::new();
    for handle in handles {
        bodies.push(handle.await.unwrap());
    }
    // Five sends per site, each at least `delay` after the previous one:
    // the crawl cannot be faster than four delays.
    assert!(start.elapsed() >= delay * 4);
    assert_eq!(bodies[0], "books.toscrape.test/page0");
    assert_eq!(bodies[9], "quotes.toscrape.test/page4");
    let arrivals = arrivals.lock().unwrap();
    for site in ["books.toscrape.test", "quotes.toscrape.test"] {
        let paths: Vec<_> = arrivals
            .iter()
            .filter(|(host, _)| host == site)
            .map(|(_, p)| p.clone())
            .collect();
        assert_eq!(
            paths,
            ["/page0", "/page1", "/page2", "/page3", "/page4"],
            "{site}"
        );
        let stats = registry.scope_stats(site).unwrap();
        assert_eq!((stats.sent, stats.in_flight, stats.queued), (5, 0, 0));
    }
}

#[tokio::test]
async fn connection_errors_pass_through_unchanged_and_free_the_lane() {
    // Bind then drop a listener: nothing listens on that port any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let registry = Registry::builder()
        .default_scope(ScopeConfig::default().delay(Duration::ZERO).jitter(0.0))
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .service(loopback_client());
    let error = client
        .oneshot(request(&format!("http://down.test:{port}/")))
        .await
        .unwrap_err();
    assert!(
        error.is_connect(),
        "the hyper-util error is passed through: {error:?}"
    );
    let stats = registry.scope_stats("down.test").unwrap();
    assert_eq!((stats.sent, stats.in_flight), (1, 0));
}
