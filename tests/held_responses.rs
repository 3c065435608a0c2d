//! Responses held the way users hold them: collected with `join_all` or in
//! a `Vec` before any body is read, read late or never. By default a lane
//! goes back at the response head, so none of it waits for good. The
//! paused-time tests use in-process inner services (exact instants); the
//! loopback tests use real hyper servers, hyper-util's and reqwest's
//! clients, and assert completion and bounds, never wall-clock speed.

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::join_all;
use futures::StreamExt;
use http_body::Frame;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use support::Recorder;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// The seeds' worked example: 2 lanes, 0.3 s between sends, 1.0 s per lane,
/// no jitter.
fn worked_example() -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(2)
        .delay(ms(300))
        .delay_per_slot(ms(1000))
        .jitter(0.0)
}

fn registry(config: ScopeConfig) -> Registry {
    Registry::builder().default_scope(config).build().unwrap()
}

/// A body that never ends: a site still streaming.
type Endless = StreamBody<futures::stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;

fn endless() -> Endless {
    StreamBody::new(futures::stream::pending().boxed())
}

/// Sends `count` requests through the throttle around `inner` with
/// `join_all`, holding every response until the last arrives, and returns
/// the responses, still unread.
async fn sent_with_join_all<S, B>(
    registry: &Registry,
    inner: S,
    count: usize,
) -> Vec<http::Response<tower_throttle::throttle::ThrottledBody<B>>>
where
    S: Service<http::Request<()>, Response = http::Response<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .service(inner);
    let requests = (0..count).map(|page| {
        client
            .clone()
            .oneshot(support::get(&format!("https://site.test/{page}")))
    });
    join_all(requests)
        .await
        .into_iter()
        .map(|response| response.unwrap())
        .collect()
}

/// An inner service recording each call and answering at once with `body()`.
fn answering<B: Send + 'static>(
    recorder: &Recorder,
    body: fn() -> B,
) -> impl Service<
    http::Request<()>,
    Response = http::Response<B>,
    Error = Infallible,
    Future = impl std::future::Future<Output = Result<http::Response<B>, Infallible>> + Send,
> + Clone
       + Send
       + 'static {
    let recorder = recorder.clone();
    tower::service_fn(move |request: http::Request<()>| {
        recorder.record(&request);
        async move { Ok::<_, Infallible>(http::Response::new(body())) }
    })
}

#[tokio::test(start_paused = true)]
async fn the_worked_example_sent_with_join_all_and_held_sends_at_0_300_and_1000_ms() {
    let registry = registry(worked_example());
    let recorder = Recorder::new();
    let responses = sent_with_join_all(&registry, recorder.service(Duration::ZERO), 3).await;
    assert_eq!(responses.len(), 3);
    assert_eq!(recorder.millis(), vec![0, 300, 1000]);
    let stats = registry.scope_stats("site.test").unwrap();
    assert_eq!(stats.in_flight, 0, "held responses hold no lane");
}

/// Ten requests on one lane, 1 s apart, all held: sends at 0, 1 000, ...
fn one_lane_every_second() -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(1)
        .delay(ms(1000))
        .delay_per_slot(ms(1000))
        .jitter(0.0)
}

fn every_second(count: u128) -> Vec<u128> {
    (0..count).map(|k| k * 1000).collect()
}

#[tokio::test(start_paused = true)]
async fn ten_requests_on_one_lane_held_with_unit_bodies_all_go() {
    let registry = registry(one_lane_every_second());
    let recorder = Recorder::new();
    let responses = sent_with_join_all(&registry, answering(&recorder, || ()), 10).await;
    assert_eq!(responses.len(), 10);
    assert_eq!(recorder.millis(), every_second(10));
    assert!(responses.iter().all(|response| !response.body().holds_lanes()));
    assert_eq!(registry.scope_stats("site.test").unwrap().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn ten_requests_on_one_lane_held_with_empty_bodies_all_go() {
    let registry = registry(one_lane_every_second());
    let recorder = Recorder::new();
    let responses = sent_with_join_all(&registry, answering(&recorder, Empty::<Bytes>::new), 10).await;
    assert_eq!(recorder.millis(), every_second(10));
    assert_eq!(registry.scope_stats("site.test").unwrap().in_flight, 0);
    // Read late: every body is still there.
    for response in responses {
        assert!(response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .is_empty());
    }
}

#[tokio::test(start_paused = true)]
async fn ten_requests_on_one_lane_held_with_streaming_bodies_all_go() {
    let registry = registry(one_lane_every_second());
    let recorder = Recorder::new();
    let responses = sent_with_join_all(&registry, answering(&recorder, endless), 10).await;
    assert_eq!(responses.len(), 10);
    assert_eq!(recorder.millis(), every_second(10));
    assert_eq!(
        registry.scope_stats("site.test").unwrap().in_flight,
        0,
        "ten bodies still streaming, unread, hold no lane"
    );
}

#[tokio::test(start_paused = true)]
async fn in_flight_is_zero_once_every_head_came_whether_responses_are_held_or_not() {
    let registry = registry(
        worked_example()
            .delay(Duration::ZERO)
            .delay_per_slot(Duration::ZERO),
    );
    let recorder = Recorder::new();
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .service(recorder.service(ms(100)));
    let held = client
        .clone()
        .oneshot(support::get("https://site.test/held"))
        .await
        .unwrap();
    let dropped = client
        .clone()
        .oneshot(support::get("https://site.test/dropped"))
        .await
        .unwrap();
    drop(dropped);
    let stats = registry.scope_stats("site.test").unwrap();
    assert_eq!((stats.in_flight, stats.sent), (0, 2));
    assert_eq!(registry.stats().in_flight, 0);
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn a_request_of_two_scopes_held_with_join_all_frees_both_at_the_head() {
    // The parent-domain case: each page counts in its host and in the
    // parent domain, both of one lane.
    let registry = Registry::builder()
        .default_scope(one_lane_every_second().delay(ms(200)).delay_per_slot(ms(200)))
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .service(recorder.service(Duration::ZERO));
    let requests = ["a.example.com", "b.example.com", "a.example.com"].map(|host| {
        let mut request = support::get(&format!("https://{host}/"));
        request
            .extensions_mut()
            .insert(tower_throttle::Scopes::with_costs([
                (host, 1.0),
                ("example.com", 1.0),
            ]));
        client.clone().oneshot(request)
    });
    let responses: Vec<_> = join_all(requests).await.into_iter().map(Result::unwrap).collect();
    assert_eq!(responses.len(), 3);
    assert_eq!(recorder.millis(), vec![0, 200, 400]);
    assert_eq!(registry.scope_stats("example.com").unwrap().in_flight, 0);
}

/// A loopback site at `ip` that answers each request after 100 ms and
/// counts how many heads it has pending at once; its address and the most.
fn counting_site(ip: [u8; 4]) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let most_seen = most.clone();
    let addr = support::serve_at(
        std::net::SocketAddr::from((std::net::IpAddr::from(ip), 0)),
        move |request: http::Request<hyper::body::Incoming>| {
            let (now, most) = (now.clone(), most_seen.clone());
            async move {
                let pending = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(pending, Ordering::SeqCst);
                tokio::time::sleep(ms(100)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                support::text(request.uri().path().to_owned())
            }
        },
    )
    .unwrap();
    (addr, most)
}

fn two_free_lanes() -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(2)
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
}

/// A hang fails the test instead of stalling the suite.
const NO_HANG: Duration = Duration::from_secs(30);

#[tokio::test]
async fn hyper_util_three_requests_on_two_lanes_collected_then_read() {
    let (addr, most) = counting_site([127, 0, 0, 231]);
    let registry = registry(two_free_lanes());
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .service(support::loopback_client());
    let requests = (0..3).map(|page| {
        let request = http::Request::get(format!("http://{addr}/{page}"))
            .body(Full::<Bytes>::default())
            .unwrap();
        client.clone().oneshot(request)
    });
    let responses = tokio::time::timeout(NO_HANG, join_all(requests))
        .await
        .expect("three requests on two lanes, responses held, all answered");
    let mut bodies = Vec::new();
    for response in responses {
        bodies.push(response.unwrap().into_body().collect().await.unwrap().to_bytes());
    }
    assert_eq!(bodies, ["/0", "/1", "/2"]);
    assert_eq!(
        most.load(Ordering::SeqCst),
        2,
        "never more heads pending at the site than lanes"
    );
}

#[cfg(feature = "reqwest")]
#[tokio::test]
async fn reqwest_three_requests_on_two_lanes_collected_then_read() {
    use tower_throttle::reqwest::{HttpClient, ReqwestLayer};

    let (addr, most) = counting_site([127, 0, 0, 232]);
    let registry = registry(two_free_lanes());
    let http = reqwest::Client::new();
    let client = ServiceBuilder::new()
        .layer(ReqwestLayer::new())
        .layer(ThrottleLayer::new(registry.clone()))
        .service(HttpClient::new(http.clone()));
    let requests = (0..3).map(|page| {
        let request = http.get(format!("http://{addr}/{page}")).build().unwrap();
        client.clone().oneshot(request)
    });
    let responses = tokio::time::timeout(NO_HANG, join_all(requests))
        .await
        .expect("three requests on two lanes, responses held, all answered");
    let mut bodies = Vec::new();
    for response in responses {
        bodies.push(response.unwrap().text().await.unwrap());
    }
    assert_eq!(bodies, ["/0", "/1", "/2"]);
    assert_eq!(
        most.load(Ordering::SeqCst),
        2,
        "never more heads pending at the site than lanes"
    );
}

#[cfg(feature = "follow-redirect")]
#[tokio::test]
async fn follow_redirect_five_hops_to_a_one_lane_site_with_responses_held() {
    use std::sync::Mutex;
    use tower_throttle::redirect::{FailOnLoops, FollowRedirectLayer};

    const DELAY: Duration = Duration::from_millis(200);
    // What the path may take off a gap at the site (see tests/redirects.rs).
    const PATH_SLACK: Duration = Duration::from_millis(2);
    let arrivals: Arc<Mutex<Vec<std::time::Instant>>> = Arc::default();
    let log = arrivals.clone();
    let addr = support::serve_at(
        std::net::SocketAddr::from(([127, 0, 0, 233], 0)),
        move |request: http::Request<hyper::body::Incoming>| {
            log.lock().unwrap().push(std::time::Instant::now());
            let path = request.uri().path().to_owned();
            async move {
                // /chain/hop: five hops, then the page.
                let hop: u32 = path.rsplit('/').next().unwrap().parse().unwrap();
                if hop < 5 {
                    let chain = path.split('/').nth(1).unwrap().to_owned();
                    http::Response::builder()
                        .status(301)
                        .header(http::header::LOCATION, format!("/{chain}/{}", hop + 1))
                        .body(Full::default())
                        .unwrap()
                } else {
                    support::text(path)
                }
            }
        },
    )
    .unwrap();
    let registry = Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .concurrency(1)
                .delay(DELAY)
                .delay_per_slot(DELAY)
                .jitter(0.0),
        )
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(FollowRedirectLayer::with_policy(FailOnLoops::new(10)))
        .map_err(tower::BoxError::from)
        .layer(ThrottleLayer::new(registry.clone()))
        .service(support::loopback_client());
    let chains = ["a", "b"].map(|chain| {
        let request = http::Request::get(format!("http://{addr}/{chain}/0"))
            .body(Full::<Bytes>::default())
            .unwrap();
        client.clone().oneshot(request)
    });
    let responses = tokio::time::timeout(NO_HANG, join_all(chains))
        .await
        .expect("two chains of five redirects on one lane, responses held, all answered");
    let mut pages = Vec::new();
    for response in responses {
        pages.push(response.unwrap().into_body().collect().await.unwrap().to_bytes());
    }
    assert_eq!(pages, ["/a/5", "/b/5"]);
    let arrivals = arrivals.lock().unwrap().clone();
    assert_eq!(arrivals.len(), 12, "six requests per chain");
    for pair in arrivals.windows(2) {
        let gap = pair[1].duration_since(pair[0]);
        assert!(gap + PATH_SLACK >= DELAY, "hops {gap:?} apart at the site");
    }
}

/// Whole transfers counted: the stuck-scope warning.
mod whole_transfers {
    use super::*;

    fn whole(concurrency: u32) -> ScopeConfig {
        two_free_lanes()
            .concurrency(concurrency)
            .count_whole_transfers(true)
    }

    fn warnings_about(scope: &str) -> Vec<String> {
        let needle = format!("scope {scope:?} is stuck");
        support::captured_events(tracing::Level::WARN)
            .lock()
            .unwrap()
            .iter()
            .filter(|line| line.contains(&needle))
            .cloned()
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn responses_held_unread_keep_every_lane_and_the_scope_is_named_once() {
        support::captured_events(tracing::Level::WARN);
        let registry = Registry::builder().default_scope(whole(2)).build().unwrap();
        let recorder = Recorder::new();
        let client = ServiceBuilder::new()
            .layer(ThrottleLayer::new(registry.clone()))
            .service(answering(&recorder, endless));
        let start = tokio::time::Instant::now();
        let held = tokio::spawn({
            let client = client.clone();
            async move {
                let requests = (0..3).map(|page| {
                    client
                        .clone()
                        .oneshot(support::get(&format!("https://held.test/{page}")))
                });
                join_all(requests).await
            }
        });
        tokio::time::sleep(ms(9_999)).await;
        assert!(warnings_about("held.test").is_empty(), "not before 10 s");
        tokio::time::sleep(ms(60_000)).await;
        assert_eq!(recorder.millis(), vec![0, 0], "the third request waits for good");
        let warnings = warnings_about("held.test");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("held unread keeps its lane"),
            "{}",
            warnings[0]
        );
        assert!(start.elapsed() >= ms(10_000));
        // Dropping the join gives every lane back.
        held.abort();
        let _ = held.await;
        tokio::task::yield_now().await;
        assert_eq!(registry.scope_stats("held.test").unwrap().in_flight, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn responses_whose_bodies_are_read_never_warn() {
        support::captured_events(tracing::Level::WARN);
        let registry = Registry::builder().default_scope(whole(2)).build().unwrap();
        let recorder = Recorder::new();
        // Bodies that stream for 15 s, read as they come: every lane is
        // busy for longer than 10 s while requests wait, but not unread.
        fn slow() -> Endless {
            let start = tokio::time::Instant::now();
            StreamBody::new(
                futures::stream::iter(1..=15u64)
                    .then(move |second| async move {
                        tokio::time::sleep_until(start + Duration::from_secs(second)).await;
                        Ok(Frame::data(Bytes::from_static(b"x")))
                    })
                    .boxed(),
            )
        }
        let client = ServiceBuilder::new()
            .layer(ThrottleLayer::new(registry.clone()))
            .service(answering(&recorder, slow));
        let pages = (0..4).map(|page| {
            let client = client.clone();
            async move {
                let response = client
                    .oneshot(support::get(&format!("https://reader.test/{page}")))
                    .await
                    .unwrap();
                response.into_body().collect().await.unwrap().to_bytes().len()
            }
        });
        assert_eq!(join_all(pages).await, vec![15; 4]);
        assert_eq!(recorder.millis(), vec![0, 0, 15_000, 15_000]);
        assert!(warnings_about("reader.test").is_empty());
    }
}

/// The lock-free word's shards, used as users use a client: a plain scope
/// (2 lanes, no delay) on a runtime of two worker threads, 40 requests
/// spawned at once (more than the lanes), each holding a response whose
/// body streams on unread, and every other one dropped while it waits.
/// None hangs, the held ones all come, and once the tasks are done
/// nothing is left in flight or waiting: the next request goes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_scope_on_two_threads_with_held_bodies_and_dropped_waits_releases_everything() {
    let registry = registry(
        ScopeConfig::default()
            .concurrency(2)
            .delay(Duration::ZERO)
            .jitter(0.0),
    );
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .service(tower::service_fn(|_request: http::Request<()>| async {
            tokio::time::sleep(ms(2)).await;
            Ok::<_, Infallible>(http::Response::new(endless()))
        }));
    let tasks: Vec<_> = (0..40)
        .map(|page| {
            let call = client
                .clone()
                .oneshot(support::get(&format!("https://plain.test/{page}")));
            tokio::spawn(async move {
                if page % 2 == 1 {
                    // Gone before it could be sent, or while it is.
                    return tokio::time::timeout(ms(1), call).await.ok().map(Result::unwrap);
                }
                Some(call.await.unwrap())
            })
        })
        .collect();
    let done = tokio::time::timeout(Duration::from_secs(10), join_all(tasks))
        .await
        .expect("no request hangs");
    // Every response kept, bodies unread, until the end of the test.
    let held: Vec<_> = done.into_iter().map(Result::unwrap).collect();
    let answered = held
        .iter()
        .step_by(2)
        .filter(|response| response.is_some())
        .count();
    assert_eq!(answered, 20, "every request that was not dropped was answered");
    let stats = registry.stats();
    assert_eq!((stats.in_flight, stats.waiting), (0, 0));
    let next = tokio::time::timeout(ms(500), client.oneshot(support::get("https://plain.test/next")))
        .await
        .expect("the next request goes at once");
    drop(next.unwrap());
    drop(held);
}
