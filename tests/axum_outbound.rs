//! The router of `examples/axum_outbound.rs` under many concurrent inbound
//! requests: the upstream (a loopback hyper server) sees the configured
//! concurrency and delay hold. Real sockets and real time: order and
//! bounds, never exact instants.

mod support;

#[allow(dead_code)] // the example's `main` and its upstream are not used here
#[path = "../examples/axum_outbound.rs"]
mod example;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use tower_throttle::{Registry, ScopeConfig};

/// Real sockets add noise between the client's send and the upstream's
/// kernel, and a request that finds no idle pooled connection (the first
/// of each lane, or one sent at the head of a response whose body has not
/// been read to its end yet) opens one after the throttle lets it go (the
/// registry's "cold start" covers only a scope's first request), so the
/// next request, on a pooled connection, can arrive a little early. Gaps
/// are the upstream kernel's receive stamps (not when its busy thread got
/// to them), asserted with this much slack.
const SOCKET_SLACK: Duration = Duration::from_millis(10);

/// What the upstream saw.
#[derive(Default)]
struct Upstream {
    in_flight: AtomicU32,
    max_in_flight: AtomicU32,
    /// When the upstream's kernel received each request (the site's view).
    arrivals: Mutex<Vec<std::time::Instant>>,
}

async fn start_upstream(latency: Duration) -> (String, Arc<Upstream>) {
    let upstream = Arc::new(Upstream::default());
    let seen = upstream.clone();
    let addr = support::serve(move |request: http::Request<hyper::body::Incoming>| {
        let seen = seen.clone();
        async move {
            seen.arrivals
                .lock()
                .unwrap()
                .push(support::KernelArrival::of(&request));
            let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            seen.max_in_flight.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(latency).await;
            seen.in_flight.fetch_sub(1, Ordering::SeqCst);
            support::text(format!("upstream {}", request.uri().path()))
        }
    })
    .await;
    (format!("http://{addr}"), upstream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_inbound_requests_keep_the_upstream_within_its_limits() {
    let (upstream_base, upstream) = start_upstream(Duration::from_millis(100)).await;
    let lanes = 3;
    let delay = Duration::from_millis(40);
    let registry = Registry::builder()
        .scope(
            "127.0.0.1",
            ScopeConfig::default()
                .concurrency(lanes)
                .delay(delay)
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = example::app(&upstream_base, &registry);
    tokio::spawn(async move { axum::serve(listener, router).await });

    let inbound = support::loopback_client();
    let inbound_requests = 24;
    let mut requests = Vec::new();
    for id in 0..inbound_requests {
        let inbound = inbound.clone();
        let uri = format!("http://{addr}/quote/{id}");
        requests.push(tokio::spawn(async move {
            let request = http::Request::get(uri).body(Full::<Bytes>::default()).unwrap();
            let response = inbound.request(request).await.unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8(body.to_vec()).unwrap())
        }));
    }
    for (id, request) in requests.into_iter().enumerate() {
        let (status, body) = request.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(body, format!("quote {id}: upstream /quotes/{id}"));
    }

    let mut arrivals = upstream.arrivals.lock().unwrap().clone();
    arrivals.sort();
    assert_eq!(arrivals.len(), inbound_requests);
    for pair in arrivals.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= delay - SOCKET_SLACK, "gap {gap:?}");
    }
    // Latency (100 ms) over delay (40 ms) keeps 3 requests wanting to be in
    // flight: the lanes are used, and never exceeded.
    assert_eq!(upstream.max_in_flight.load(Ordering::SeqCst), lanes);
    let stats = registry.scope_stats("127.0.0.1").unwrap();
    assert_eq!(stats.sent, inbound_requests as u64);
    assert_eq!(stats.in_flight, 0);
}
