//! Departures timed by the client's write (`departure::DepartureStampLayer`):
//! a real hyper HTTP/1 client, over an in-memory duplex pipe in paused time
//! (exact instants) and over loopback sockets.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::departure::{DepartureStampLayer, StampedBody, StampingConnector};
use tower_throttle::store::MemoryStore;
use tower_throttle::{Registry, ScopeConfig, Scopes, ThrottleLayer};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

fn registry(lanes: u32) -> Registry {
    Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .concurrency(lanes)
                .delay(ms(100))
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()
        .unwrap()
}

/// When the server saw each request's head, in ms from `start`.
#[derive(Clone, Default)]
struct Arrivals(Arc<Mutex<Vec<(String, u128)>>>);

impl Arrivals {
    fn of(&self, path: &str) -> u128 {
        let arrivals = self.0.lock().unwrap();
        arrivals.iter().find(|(seen, _)| seen == path).expect("arrived").1
    }
}

/// A real hyper client and server over a duplex pipe, one connection per
/// request; a request to `/slow…` opens its connection 30 ms after the
/// call: it is handed over at once, written later.
fn slow_to_write_client<B>(
    start: Instant,
    arrivals: Arrivals,
) -> impl Service<
    http::Request<B>,
    Response = http::Response<hyper::body::Incoming>,
    Error = hyper::Error,
    Future = impl std::future::Future<Output = Result<http::Response<hyper::body::Incoming>, hyper::Error>> + Send,
> + Clone
       + Send
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let handler = move |request: http::Request<hyper::body::Incoming>| {
        let path = request.uri().path().to_owned();
        arrivals
            .0
            .lock()
            .unwrap()
            .push((path, start.elapsed().as_millis()));
        async { http::Response::new(Full::new(Bytes::new())) }
    };
    support::duplex_service_with(handler, |request: &http::Request<B>| {
        if request.uri().path().starts_with("/slow") {
            ms(30)
        } else {
            Duration::ZERO
        }
    })
}

fn request(path: &str) -> http::Request<Full<Bytes>> {
    http::Request::get(format!("http://example.com{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// Warms the scope (its first request holds it until it ends), then at
/// 1 s sends `/slow` (handed over at once, written 30 ms later) and `/next`
/// together; returns when the server saw `/next`, in ms after 1 s.
async fn next_arrival<S>(client: S, arrivals: &Arrivals) -> u128
where
    S: Service<http::Request<Full<Bytes>>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug + Send,
    S::Response: Send,
{
    client.clone().oneshot(request("/warm")).await.unwrap();
    tokio::time::sleep_until(Instant::now() + ms(1_000) - ms(arrivals.of("/warm") as u64)).await;
    let slow = tokio::spawn(support::dropped(client.clone().oneshot(request("/slow"))));
    tokio::task::yield_now().await;
    client.oneshot(request("/next")).await.unwrap();
    slow.await.unwrap().unwrap();
    assert_eq!(arrivals.of("/slow"), 1_030, "written 30 ms after its hand-over");
    arrivals.of("/next") - 1_000
}

#[tokio::test(start_paused = true)]
async fn with_a_departure_stamp_the_next_gap_runs_from_the_write_not_the_hand_over() {
    for lanes in [2, 1] {
        let start = Instant::now();
        let arrivals = Arrivals::default();
        let client = ServiceBuilder::new()
            .layer(ThrottleLayer::new(registry(lanes)))
            .layer(DepartureStampLayer::new())
            .service(slow_to_write_client::<StampedBody<Full<Bytes>>>(
                start,
                arrivals.clone(),
            ));
        // Two lanes: the write stamp wakes the request's task, which
        // reports the departure; one lane: the completion brings it.
        assert_eq!(next_arrival(client, &arrivals).await, 130, "{lanes} lane(s)");
    }
}

/// The same for a request with two scopes, as `ip::IpScopeLayer` gives it
/// (its host, no delay and 8 lanes; its server, 100 ms and 2 lanes): the
/// server's gap runs from the write.
#[tokio::test(start_paused = true)]
async fn a_request_of_two_scopes_departs_at_its_write_in_both() {
    let start = Instant::now();
    let arrivals = Arrivals::default();
    let registry = Registry::builder()
        .default_scope(ScopeConfig::default().concurrency(8).delay(Duration::ZERO))
        .scope(
            "server",
            ScopeConfig::default()
                .concurrency(2)
                .delay(ms(100))
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .map_request(|mut request: http::Request<Full<Bytes>>| {
            request
                .extensions_mut()
                .insert(Scopes::from(["example.com", "server"]));
            request
        })
        .layer(ThrottleLayer::new(registry))
        .layer(DepartureStampLayer::new())
        .service(slow_to_write_client::<StampedBody<Full<Bytes>>>(
            start,
            arrivals.clone(),
        ));
    assert_eq!(next_arrival(client, &arrivals).await, 130);
}

#[tokio::test(start_paused = true)]
async fn without_it_the_gap_runs_from_the_hand_over_and_the_site_sees_it_short() {
    let start = Instant::now();
    let arrivals = Arrivals::default();
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry(2)))
        .service(slow_to_write_client::<Full<Bytes>>(start, arrivals.clone()));
    // 70 ms at the site, for a delay of 100 ms: what the layer prevents.
    assert_eq!(next_arrival(client, &arrivals).await, 100);
}

/// In a fleet the store spaces the workers: the lane's lease, given back
/// when `/slow` ends, carries the gap from its write, so the other worker's
/// next request reaches the site the delay after `/slow` did (with the
/// hand-over's reading it came 70 ms after).
#[tokio::test(start_paused = true)]
async fn in_a_fleet_the_next_workers_gap_runs_from_the_write() {
    let store = MemoryStore::new();
    let start = Instant::now();
    let arrivals = Arrivals::default();
    let worker = || {
        let registry = Registry::builder()
            .default_scope(
                ScopeConfig::default()
                    .delay(ms(100))
                    .delay_per_slot(Duration::ZERO)
                    .jitter(0.0),
            )
            .store(store.clone())
            .build()
            .unwrap();
        ServiceBuilder::new()
            .layer(ThrottleLayer::new(registry))
            .layer(DepartureStampLayer::new())
            .service(slow_to_write_client::<StampedBody<Full<Bytes>>>(
                start,
                arrivals.clone(),
            ))
    };
    let (one, two) = (worker(), worker());
    // Each worker's first request to a scope is spaced from its end.
    one.clone().oneshot(request("/warm-one")).await.unwrap();
    two.clone().oneshot(request("/warm-two")).await.unwrap();
    tokio::time::sleep_until(start + ms(1_000)).await;
    let slow = tokio::spawn(support::dropped(one.oneshot(request("/slow"))));
    tokio::task::yield_now().await;
    two.oneshot(request("/next")).await.unwrap();
    slow.await.unwrap().unwrap();
    assert_eq!(arrivals.of("/slow"), 1_030, "written 30 ms after its hand-over");
    assert_eq!(arrivals.of("/next") - arrivals.of("/slow"), 100);
}

/// A request whose body the client never asks (it failed before writing)
/// gets no stamp; it departs at its hand-over, as it would without the
/// layer (the safe side: a client that writes without asking the body
/// would otherwise send with no gap at all), and holds nothing after it
/// ends.
#[tokio::test(start_paused = true)]
async fn a_request_the_client_never_writes_departs_at_its_hand_over_and_holds_nothing() {
    let registry = registry(2);
    let never_written = tower::service_fn(|request: http::Request<StampedBody<Full<Bytes>>>| async move {
        drop(request);
        tokio::time::sleep(ms(10)).await;
        Err::<http::Response<()>, _>(std::io::Error::other("connection refused"))
    });
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(DepartureStampLayer::new())
        .service(never_written);
    let start = Instant::now();
    let mut ended = Vec::new();
    for path in ["/a", "/b", "/c"] {
        assert!(client.clone().oneshot(request(path)).await.is_err());
        ended.push(start.elapsed());
    }
    // The cold scope's first gap runs from its first request's end
    // (10 ms); the next from the second's hand-over (110 ms); each fails
    // 10 ms after its hand-over.
    assert_eq!(ended, [ms(10), ms(120), ms(220)]);
    let stats = registry.scope_stats("example.com").unwrap();
    assert_eq!((stats.in_flight, stats.queued), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn without_a_throttle_outside_the_body_is_passed_through_unstamped() {
    let arrivals = Arrivals::default();
    let client = ServiceBuilder::new()
        .layer(DepartureStampLayer::new())
        .service(slow_to_write_client::<StampedBody<Full<Bytes>>>(
            Instant::now(),
            arrivals.clone(),
        ));
    let response = client.oneshot(request("/alone")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(arrivals.0.lock().unwrap().len(), 1);
}

/// Over loopback sockets with hyper-util's pooled client: the requests go
/// through and the body the server reads is the request's own; the gaps
/// the server sees are at least the delay (a bound, not an exact instant:
/// real sockets).
#[tokio::test]
async fn hyper_utils_client_sends_the_stamped_requests_and_keeps_the_gaps() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let addr = support::serve(move |request: http::Request<hyper::body::Incoming>| {
        let log = log.clone();
        async move {
            let arrived = std::time::Instant::now();
            let body = request.into_body().collect().await.unwrap().to_bytes();
            log.lock().unwrap().push(arrived);
            support::text(String::from_utf8(body.to_vec()).unwrap())
        }
    })
    .await;
    let registry = Registry::builder()
        .default_scope(ScopeConfig::default().concurrency(2).delay(ms(50)).jitter(0.0))
        .build()
        .unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<StampedBody<Full<Bytes>>>();
    let service = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry))
        .layer(DepartureStampLayer::new())
        .service(client);
    let sends = (0..4).map(|index| {
        let request = http::Request::post(format!("http://{addr}/"))
            .body(Full::new(Bytes::from(format!("body {index}"))))
            .unwrap();
        let service = service.clone();
        // Each body read as it comes: an unread response keeps its lane.
        async move {
            let response = service.oneshot(request).await.unwrap();
            response.into_body().collect().await.unwrap().to_bytes()
        }
    });
    for (index, body) in futures::future::join_all(sends).await.into_iter().enumerate() {
        assert_eq!(body, format!("body {index}"));
    }
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    for pair in seen.windows(2) {
        assert!(pair[1] - pair[0] >= ms(50), "{:?} apart", pair[1] - pair[0]);
    }
}

/// One end of an in-memory connection to a hyper server that records
/// arrivals; its first write waits `first_write_after` (a socket that is
/// not writable at once), in paused time.
struct SlowSocket {
    io: hyper_util::rt::TokioIo<tokio::io::DuplexStream>,
    wait: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl hyper::rt::Write for SlowSocket {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if let Some(wait) = &mut self.wait {
            std::task::ready!(std::future::Future::poll(wait.as_mut(), cx));
            self.wait = None;
        }
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl hyper::rt::Read for SlowSocket {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl hyper_util::client::legacy::connect::Connection for SlowSocket {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        hyper_util::client::legacy::connect::Connected::new()
    }
}

/// Connects to a hyper server over an in-memory [`SlowSocket`]: a
/// connection to `slow.example` cannot write for 30 ms, any other at once.
#[derive(Clone)]
struct SlowConnector {
    start: Instant,
    arrivals: Arrivals,
}

impl Service<http::Uri> for SlowConnector {
    type Response = SlowSocket;
    type Error = std::io::Error;
    type Future = std::future::Ready<std::io::Result<SlowSocket>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let (client_end, server_end) = tokio::io::duplex(64 * 1024);
        let (start, arrivals) = (self.start, self.arrivals.clone());
        let handler = hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
            let path = request.uri().path().to_owned();
            arrivals
                .0
                .lock()
                .unwrap()
                .push((path, start.elapsed().as_millis()));
            async { Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new()))) }
        });
        tokio::spawn(
            hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(server_end), handler),
        );
        let wait = (uri.host() == Some("slow.example")).then(|| Box::pin(tokio::time::sleep(ms(30))));
        std::future::ready(Ok(SlowSocket {
            io: hyper_util::rt::TokioIo::new(client_end),
            wait,
        }))
    }
}

/// hyper-util's client over [`SlowConnector`] through a
/// `StampingConnector`, one connection per request.
fn slow_socket_client(
    start: Instant,
    arrivals: Arrivals,
) -> hyper_util::client::legacy::Client<StampingConnector<SlowConnector>, StampedBody<Full<Bytes>>> {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(StampingConnector::new(SlowConnector { start, arrivals }))
}

/// `path` on `host`, in the one scope `site` whatever the host.
fn request_on(host: &str, path: &str) -> http::Request<Full<Bytes>> {
    let mut request = http::Request::get(format!("http://{host}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    request.extensions_mut().insert(Scopes::from(["site"]));
    request
}

/// The client asks the body at once, but the socket cannot take the bytes
/// for 30 ms: stamped at the socket write, the next request of the scope
/// reaches the server a whole delay after the slow one; stamped when the
/// body is asked, 30 ms short of it.
#[tokio::test(start_paused = true)]
async fn at_socket_write_the_next_gap_runs_from_when_the_socket_took_the_bytes() {
    for (layer, expected) in [
        (DepartureStampLayer::new().at_socket_write(), 130),
        (DepartureStampLayer::new(), 100),
    ] {
        for lanes in [2, 1] {
            let start = Instant::now();
            let arrivals = Arrivals::default();
            let client = ServiceBuilder::new()
                .layer(ThrottleLayer::new(registry(lanes)))
                .layer(layer)
                .service(slow_socket_client(start, arrivals.clone()));
            client
                .clone()
                .oneshot(request_on("fast.example", "/warm"))
                .await
                .unwrap();
            tokio::time::sleep_until(start + ms(1_000)).await;
            let slow = tokio::spawn(support::dropped(
                client.clone().oneshot(request_on("slow.example", "/slow")),
            ));
            tokio::task::yield_now().await;
            client.oneshot(request_on("fast.example", "/next")).await.unwrap();
            slow.await.unwrap().unwrap();
            assert_eq!(arrivals.of("/slow"), 1_030, "written 30 ms after its hand-over");
            assert_eq!(
                arrivals.of("/next") - 1_000,
                expected,
                "{lanes} lane(s), {layer:?}"
            );
        }
    }
}
