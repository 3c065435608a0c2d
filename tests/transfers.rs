//! What a lane counts: by default it goes back at the response head; a
//! scope that counts whole transfers keeps it busy until the response body
//! ends, fails or is dropped. In
//! paused virtual time with an in-process inner service whose body streams,
//! so every instant asserted is exact.

mod support;

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use support::Recorder;
use tokio::time::{sleep, sleep_until, Instant};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::throttle::ThrottledBody;
use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// A body that yields ten chunks, one every 100 ms from its making, as a
/// site sends them whether or not they are read yet: it streams for 1 s.
type Streaming = StreamBody<futures::stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;

fn streaming_for_one_second() -> Streaming {
    let start = Instant::now();
    let chunks = futures::stream::iter(1..=10).then(move |chunk| async move {
        sleep_until(start + ms(100) * chunk).await;
        Ok(Frame::data(Bytes::from_static(&[0; 1024])))
    });
    StreamBody::new(chunks.boxed())
}

/// One lane, no delay: only the lane decides when the next request goes;
/// `whole_transfers`: whether the lane is busy until the body ends.
fn one_lane(whole_transfers: bool) -> Registry {
    Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .concurrency(1)
                .delay(Duration::ZERO)
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0)
                .count_whole_transfers(whole_transfers),
        )
        .build()
        .unwrap()
}

/// The throttle around a site that answers after `head` and then streams
/// its body for 1 s; the recorder notes when each request reached it.
fn client(
    registry: &Registry,
    recorder: &Recorder,
    head: Duration,
) -> impl Service<
    http::Request<()>,
    Response = http::Response<ThrottledBody<Streaming>>,
    Error = Infallible,
    Future: Send,
> + Clone
       + Send
       + 'static {
    let recorder = recorder.clone();
    ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .service(tower::service_fn(move |request: http::Request<()>| {
            recorder.record(&request);
            async move {
                sleep(head).await;
                Ok::<_, Infallible>(http::Response::new(streaming_for_one_second()))
            }
        }))
}

fn get(path: &str) -> http::Request<()> {
    support::get(&format!("https://site.test{path}"))
}

#[tokio::test(start_paused = true)]
async fn with_whole_transfers_the_next_request_goes_when_the_body_ends_not_at_the_head() {
    let registry = one_lane(true);
    let recorder = Recorder::new();
    let client = client(&registry, &recorder, Duration::ZERO);
    let start = Instant::now();

    let first = client.clone().oneshot(get("/first")).await.unwrap();
    assert!(first.body().holds_lanes());
    let second = tokio::spawn(client.clone().oneshot(get("/second")));
    sleep(ms(500)).await;
    // Half way through the body: the transfer holds the lane.
    assert_eq!(recorder.millis(), vec![0]);
    assert_eq!(registry.scope_stats("site.test").unwrap().in_flight, 1);
    assert_eq!(registry.scope_stats("site.test").unwrap().queued, 1);

    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 10 * 1024);
    assert_eq!(start.elapsed(), ms(1000));
    second.await.unwrap().unwrap();
    assert_eq!(recorder.millis(), vec![0, 1000]);
}

#[tokio::test(start_paused = true)]
async fn with_whole_transfers_dropping_an_unread_response_frees_its_lane_at_once() {
    let registry = one_lane(true);
    let recorder = Recorder::new();
    let client = client(&registry, &recorder, Duration::ZERO);

    let first = client.clone().oneshot(get("/first")).await.unwrap();
    let second = tokio::spawn(client.clone().oneshot(get("/second")));
    sleep(ms(300)).await;
    drop(first);
    second.await.unwrap().unwrap();
    assert_eq!(recorder.millis(), vec![0, 300]);
}

#[tokio::test(start_paused = true)]
async fn by_default_the_next_request_goes_at_the_head() {
    let registry = one_lane(false);
    let recorder = Recorder::new();
    let client = client(&registry, &recorder, ms(100));

    let first = client.clone().oneshot(get("/first")).await.unwrap();
    assert!(!first.body().holds_lanes());
    let second = client.clone().oneshot(get("/second")).await.unwrap();
    assert_eq!(recorder.millis(), vec![0, 100]);
    drop((first, second));
}

#[tokio::test(start_paused = true)]
async fn the_latency_is_the_time_to_the_head_while_the_lane_is_the_transfer() {
    let registry = one_lane(true);
    let recorder = Recorder::new();
    let client = client(&registry, &recorder, ms(100));

    let first = client.clone().oneshot(get("/first")).await.unwrap();
    let second = tokio::spawn(client.clone().oneshot(get("/second")));
    first.into_body().collect().await.unwrap();
    second.await.unwrap().unwrap();
    // Head at 100 ms, body over at 1 100 ms.
    assert_eq!(recorder.millis(), vec![0, 1100]);
    let stats = registry.scope_stats("site.test").unwrap();
    assert_eq!(stats.latency, Some(ms(100)));
    assert_eq!(stats.sent, 2);
}

#[tokio::test(start_paused = true)]
async fn a_request_of_several_scopes_keeps_its_lanes_for_the_transfer_if_any_of_them_counts_it() {
    let registry = Registry::builder()
        .default_scope(one_lane_config().count_whole_transfers(true))
        // A scope inherits what it leaves out: these two say no themselves.
        .scope("feed.test", one_lane_config().count_whole_transfers(false))
        .scope("events.test", one_lane_config().count_whole_transfers(false))
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let client = client(&registry, &recorder, Duration::ZERO);
    let with = |scopes: &[&str]| {
        let mut request = get("/");
        request
            .extensions_mut()
            .insert(tower_throttle::Scopes::with_costs(
                scopes.iter().map(|scope| (*scope, 1.0)),
            ));
        request
    };
    let opted_out = client
        .clone()
        .oneshot(with(&["feed.test", "events.test"]))
        .await
        .unwrap();
    assert!(!opted_out.body().holds_lanes());
    let mixed = client
        .clone()
        .oneshot(with(&["feed.test", "site.test"]))
        .await
        .unwrap();
    assert!(mixed.body().holds_lanes());
    drop((opted_out, mixed));
}

fn one_lane_config() -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(1)
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
}

/// Transfers in progress at one site, as its server counts them.
#[derive(Default)]
struct SiteCount {
    now: std::sync::atomic::AtomicUsize,
    max: std::sync::atomic::AtomicUsize,
}

impl SiteCount {
    fn start(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.now.fetch_add(1, SeqCst) + 1;
        self.max.fetch_max(now, SeqCst);
    }

    fn end(&self) {
        self.now.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// One transfer's place in its site's count: given back when its body's
/// stream ends (before the server writes the chunked body's last chunk,
/// so before the client can see the end), or when it is dropped early.
struct Counted(Option<std::sync::Arc<SiteCount>>);

impl Counted {
    fn end(&mut self) {
        if let Some(count) = self.0.take() {
            count.end();
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.end();
    }
}

/// 1 MiB in 16 chunks of 64 KiB, 20 ms apart: the site paces its writes,
/// so a body takes at least 300 ms. No length header: the client sees the
/// end only after the stream ended, and with it the count.
fn paced_megabyte(
    count: std::sync::Arc<SiteCount>,
) -> StreamBody<futures::stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>> {
    count.start();
    let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
    let stream = futures::stream::unfold((0, Counted(Some(count))), move |(sent, mut counted)| {
        let chunk = chunk.clone();
        async move {
            if sent == 16 {
                counted.end();
                return None;
            }
            sleep(ms(20)).await;
            Some((Ok(Frame::data(chunk)), (sent + 1, counted)))
        }
    });
    StreamBody::new(stream.boxed())
}

/// A loopback site at `ip` serving paced megabytes, counting its
/// transfers in `count`; its address.
async fn paced_site(ip: std::net::IpAddr, count: std::sync::Arc<SiteCount>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |_request: http::Request<hyper::body::Incoming>| {
                        let body = paced_megabyte(count.clone());
                        async move { Ok::<_, Infallible>(http::Response::new(body)) }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// 200 loopback sites (127.0.0.2 to 127.0.0.201, each its own scope) of
/// 2 lanes, three requests each, all at once, through hyper-util's client;
/// each body read to its end. The most transfers any site saw at once.
async fn most_transfers_at_once(whole_transfers: bool) -> usize {
    const SITES: u8 = 200;
    const REQUESTS_PER_SITE: usize = 3;
    let mut sites = Vec::new();
    for index in 0..SITES {
        let count = std::sync::Arc::new(SiteCount::default());
        let ip = std::net::IpAddr::from([127, 0, 0, 2 + index]);
        sites.push((paced_site(ip, count.clone()).await, count));
    }
    let registry = Registry::builder()
        .max_concurrency(1_000)
        .default_scope(
            ScopeConfig::default()
                .concurrency(2)
                .delay(Duration::ZERO)
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0)
                .count_whole_transfers(whole_transfers),
        )
        .build()
        .unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<Bytes>>();
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .service(client);
    let mut transfers = tokio::task::JoinSet::new();
    for (addr, _) in &sites {
        for page in 0..REQUESTS_PER_SITE {
            let request = http::Request::get(format!("http://{addr}/{page}"))
                .body(http_body_util::Empty::new())
                .unwrap();
            let client = client.clone();
            transfers.spawn(async move {
                let mut body = client.oneshot(request).await.unwrap().into_body();
                let mut read = 0;
                while let Some(frame) = body.frame().await {
                    read += frame.unwrap().into_data().map_or(0, |data| data.len());
                }
                assert_eq!(read, 1 << 20);
            });
        }
    }
    while let Some(transfer) = transfers.join_next().await {
        transfer.unwrap();
    }
    let stats = registry.stats();
    assert_eq!(stats.in_flight, 0, "every lane free once every body was read");
    sites
        .iter()
        .map(|(_, count)| count.max.load(std::sync::atomic::Ordering::SeqCst))
        .max()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_loopback_two_hundred_sites_of_two_lanes_counting_whole_transfers_never_see_three() {
    let most = most_transfers_at_once(true).await;
    println!("lanes held for the transfer: at most {most} transfers at once at one site");
    assert_eq!(most, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_loopback_by_default_sites_see_more_transfers_than_lanes() {
    // What lanes freed at the head do: the third request goes while two
    // bodies still stream.
    let most = most_transfers_at_once(false).await;
    println!("lanes freed at the head: at most {most} transfers at once at one site");
    assert!(most > 2);
}
