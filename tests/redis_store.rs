//! A fleet of workers sharing one Redis: separate registries, each with its
//! own hyper-util client, crawling one loopback site. Real sockets and real
//! time: the tests assert order and bounds seen by the server, never exact
//! instants.
//!
//! They need a Redis on `REDIS_URL` (default `redis://127.0.0.1:6379`):
//! `.ci/run` starts one. Without it they fail under `CI=true` and are
//! skipped, with the reason printed, elsewhere. The failure-mode tests need
//! no Redis: they point at a port nothing listens on.
#![cfg(feature = "redis")]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::store::{RedisStore, StoreFailure};
use tower_throttle::{Registry, RetryAfterLayer, ThrottleLayer};

use support::{full_request, loopback_client, one_lane_every, serve, text};

const DELAY: Duration = Duration::from_millis(100);

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// Whether a Redis answers `PING` at the default address. Outside CI a
/// missing Redis skips the test (printing why); in CI it fails it.
fn redis_is_there() -> bool {
    let address = redis_url()
        .trim_start_matches("redis://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let answered = (|| {
        let address: SocketAddr = address.parse().ok()?;
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        stream.write_all(b"PING\r\n").ok()?;
        let mut answer = [0; 5];
        stream.read_exact(&mut answer).ok()?;
        Some(&answer == b"+PONG")
    })()
    .unwrap_or(false);
    if !answered {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "no Redis answers at {address}: CI must run these tests against one (.ci/run starts it)"
        );
        eprintln!("skipped: no Redis answers at {address} (start one with `redis-server --daemonize yes`, or set REDIS_URL)");
    }
    answered
}

/// One test of this file at a time: their servers and workers share the
/// machine's two cores, and a busy runtime delays a send past its instant
/// (the server then sees the next gap short by as much).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A key prefix no other test (or earlier run) uses.
fn fresh_prefix() -> String {
    format!("tower-throttle-test:{:016x}:", fastrand::u64(..))
}

/// What the server saw: arrival instants and the most requests it had at
/// once.
#[derive(Default)]
struct Site {
    arrivals: Mutex<Vec<(Instant, String)>>,
    in_flight: AtomicUsize,
    most_at_once: AtomicUsize,
}

impl Site {
    /// Gaps between arrivals, connection warm-ups (`/warm`) left out.
    fn gaps(&self) -> Vec<Duration> {
        let mut arrivals: Vec<Instant> = self
            .arrivals
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, path)| path != WARM_UP)
            .map(|(at, _)| *at)
            .collect();
        arrivals.sort();
        arrivals.windows(2).map(|pair| pair[1] - pair[0]).collect()
    }

    fn arrival_of(&self, path: &str) -> Option<Instant> {
        let arrivals = self.arrivals.lock().unwrap();
        arrivals.iter().find(|(_, seen)| seen == path).map(|(at, _)| *at)
    }
}

/// A site answering after 5 ms; `/hang` never answers, `/429` answers 429
/// with `Retry-After: 1`. It runs on a thread and runtime of its own, as a
/// real site is another process: the workers' tasks cannot delay the
/// instants it records.
async fn site() -> (Arc<Site>, SocketAddr) {
    let site = Arc::new(Site::default());
    let seen = site.clone();
    let (addr_sender, addr) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let addr = serve_site(seen).await;
            addr_sender.send(addr).unwrap();
            std::future::pending::<()>().await;
        });
    });
    (site, addr.await.unwrap())
}

async fn serve_site(seen: Arc<Site>) -> SocketAddr {
    serve(move |request| {
        let site = seen.clone();
        async move {
            let path = request.uri().path().to_owned();
            site.arrivals.lock().unwrap().push((Instant::now(), path.clone()));
            let now = site.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            site.most_at_once.fetch_max(now, Ordering::SeqCst);
            if path == "/hang" {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            site.in_flight.fetch_sub(1, Ordering::SeqCst);
            if path == "/429" {
                let mut response = text("slow down");
                *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
                response
                    .headers_mut()
                    .insert("retry-after", http::HeaderValue::from_static("1"));
                return response;
            }
            text("ok")
        }
    })
    .await
}

fn worker_registry(store: RedisStore, failure: StoreFailure) -> Registry {
    Registry::builder()
        .default_scope(one_lane_every(DELAY))
        .store(store)
        .store_failure(failure)
        .build()
        .unwrap()
}

type Worker = tower::util::BoxCloneSyncService<
    http::Request<Full<Bytes>>,
    http::Response<hyper::body::Incoming>,
    tower_throttle::Error,
>;

/// One worker: its own registry and its own hyper-util client.
fn worker(registry: &Registry) -> Worker {
    worker_over(registry, loopback_client())
}

fn worker_over(registry: &Registry, client: support::LoopbackClient) -> Worker {
    tower::util::BoxCloneSyncService::new(
        ServiceBuilder::new()
            .layer(ThrottleLayer::new(registry.clone()).store_errors())
            .layer(RetryAfterLayer::new(registry.clone()))
            .service(client),
    )
}

/// The path of a connection warm-up, left out of the site's gaps.
const WARM_UP: &str = "/warm";

/// A worker whose client already holds a connection to the site. The fleet
/// has no cold-start rule yet (issue 16): a worker's first request opens
/// its connection after its reservation, and the site sees it late by the
/// connection's setup. A test of the shared reservation starts warm.
async fn warm_worker(registry: &Registry, port: u16) -> Worker {
    let client = loopback_client();
    let warm_up = full_request(&format!("http://site.test:{port}{WARM_UP}"));
    client.clone().oneshot(warm_up).await.unwrap();
    worker_over(registry, client)
}

fn store(prefix: &str) -> RedisStore {
    RedisStore::new(&redis_url()).unwrap().prefix(prefix)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_keep_one_delay_and_one_lane_between_them() {
    let _alone = ONE_AT_A_TIME.lock().await;
    if !redis_is_there() {
        return;
    }
    let (site, addr) = site().await;
    let prefix = fresh_prefix();
    let mut workers: Vec<Worker> = Vec::new();
    for _ in 0..2 {
        let registry = worker_registry(store(&prefix), StoreFailure::FailClosed);
        workers.push(warm_worker(&registry, addr.port()).await);
    }
    let per_worker = 8;
    let crawls = workers.iter().enumerate().map(|(index, worker)| {
        let worker = worker.clone();
        async move {
            let requests = (0..per_worker).map(|page| {
                let uri = format!("http://site.test:{}/w{index}/{page}", addr.port());
                worker.clone().oneshot(full_request(&uri))
            });
            futures::future::join_all(requests).await
        }
    });
    for answers in futures::future::join_all(crawls).await {
        for answer in answers {
            assert_eq!(answer.unwrap().status(), 200);
        }
    }
    let gaps = site.gaps();
    assert_eq!(gaps.len(), 2 * per_worker - 1);
    let closest = gaps.iter().min().unwrap();
    assert!(
        *closest >= DELAY - Duration::from_millis(2),
        "two arrivals {closest:?} apart, delay {DELAY:?}: {gaps:?}"
    );
    assert_eq!(
        site.most_at_once.load(Ordering::SeqCst),
        1,
        "two requests at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_vanishes_holding_a_lane_gives_it_back_after_the_lease_ttl() {
    let _alone = ONE_AT_A_TIME.lock().await;
    if !redis_is_there() {
        return;
    }
    let (site, addr) = site().await;
    let prefix = fresh_prefix();
    let lease_ttl = Duration::from_secs(1);
    let crashed = worker_registry(store(&prefix).lease_ttl(lease_ttl), StoreFailure::FailClosed);
    let survivor = worker_registry(store(&prefix).lease_ttl(lease_ttl), StoreFailure::FailClosed);

    let hanging = worker(&crashed).oneshot(full_request(&format!("http://site.test:{}/hang", addr.port())));
    let mut hanging = Box::pin(hanging);
    let first_arrival = loop {
        tokio::select! {
            _ = &mut hanging => panic!("/hang answered"),
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        if let Some(at) = site.arrival_of("/hang") {
            break at;
        }
    };
    // A crash: nothing is released, not even by a destructor.
    std::mem::forget(hanging);
    drop(crashed);

    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        worker(&survivor).oneshot(full_request(&format!("http://site.test:{}/after", addr.port()))),
    )
    .await
    .expect("the lane came back")
    .unwrap();
    assert_eq!(answer.status(), 200);
    let waited = site.arrival_of("/after").unwrap() - first_arrival;
    assert!(
        waited >= lease_ttl - Duration::from_millis(50),
        "the lane was free after {waited:?}, before the lease TTL {lease_ttl:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_seen_by_one_worker_holds_the_other() {
    let _alone = ONE_AT_A_TIME.lock().await;
    if !redis_is_there() {
        return;
    }
    let (site, addr) = site().await;
    let prefix = fresh_prefix();
    let told = worker_registry(store(&prefix), StoreFailure::FailClosed);
    let other = worker_registry(store(&prefix), StoreFailure::FailClosed);

    let answer = worker(&told)
        .oneshot(full_request(&format!("http://site.test:{}/429", addr.port())))
        .await
        .unwrap();
    assert_eq!(answer.status(), 429);
    // The hold reaches Redis in the background; give it a moment.
    tokio::time::sleep(Duration::from_millis(100)).await;
    worker(&other)
        .oneshot(full_request(&format!("http://site.test:{}/next", addr.port())))
        .await
        .unwrap();
    let held_for = site.arrival_of("/next").unwrap() - site.arrival_of("/429").unwrap();
    assert!(
        held_for >= Duration::from_millis(950),
        "the other worker sent {held_for:?} after a Retry-After of 1 s"
    );
    assert_eq!(other.scope_stats("site.test").unwrap().sent, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_spend_one_quota_window_between_them() {
    let _alone = ONE_AT_A_TIME.lock().await;
    if !redis_is_there() {
        return;
    }
    let (site, addr) = site().await;
    let prefix = fresh_prefix();
    let window = Duration::from_secs(1);
    let registries: Vec<Registry> = (0..2)
        .map(|_| {
            Registry::builder()
                .default_scope(
                    one_lane_every(Duration::ZERO)
                        .concurrency(4)
                        .quota(3.0)
                        .window(window),
                )
                .store(store(&prefix))
                .build()
                .unwrap()
        })
        .collect();
    let requests = registries.iter().flat_map(|registry| {
        (0..3).map(|page| {
            worker(registry).oneshot(full_request(&format!("http://quota.test:{}/{page}", addr.port())))
        })
    });
    for answer in futures::future::join_all(requests).await {
        assert_eq!(answer.unwrap().status(), 200);
    }
    let mut arrivals: Vec<Instant> = site.arrivals.lock().unwrap().iter().map(|(at, _)| *at).collect();
    arrivals.sort();
    assert_eq!(arrivals.len(), 6);
    // Each worker alone would send its 3 at once; together they have 3 per
    // window, so the second three wait for the next one.
    let next_window = arrivals[3] - arrivals[0];
    assert!(
        next_window >= window - Duration::from_millis(50),
        "a 4th request {next_window:?} into a window of 3"
    );
}

/// A Redis address nothing listens on.
const NOWHERE: &str = "redis://127.0.0.1:1";

#[tokio::test]
async fn an_unreachable_store_fails_requests_with_a_store_error_when_failing_closed() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let (site, addr) = site().await;
    let store = RedisStore::new(NOWHERE).unwrap();
    let registry = worker_registry(store, StoreFailure::FailClosed);
    let error = worker(&registry)
        .oneshot(full_request(&format!("http://site.test:{}/closed", addr.port())))
        .await
        .unwrap_err();
    assert!(error.is_store(), "{error:?}");
    assert!(error.to_string().contains("scope store"), "{error}");
    assert!(
        site.arrival_of("/closed").is_none(),
        "sent without the store's word"
    );
    // The local lane was given back: the next request fails the same way
    // rather than waiting forever.
    let again = tokio::time::timeout(
        Duration::from_secs(5),
        worker(&registry).oneshot(full_request(&format!("http://site.test:{}/closed", addr.port()))),
    )
    .await
    .expect("not stuck");
    assert!(again.unwrap_err().is_store());
}

#[tokio::test]
async fn an_unreachable_store_falls_back_to_local_limits_with_one_warning_when_failing_local() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let events = support::captured_events(tracing::Level::WARN);
    let (site, addr) = site().await;
    let prefix = fresh_prefix();
    let store = RedisStore::new(NOWHERE).unwrap().prefix(&prefix);
    let registry = worker_registry(store, StoreFailure::FailLocal);
    for page in 0..3 {
        let answer = worker(&registry)
            .oneshot(full_request(&format!("http://local.test:{}/{page}", addr.port())))
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
    }
    // Still throttled: by the local delay.
    let gaps = site.gaps();
    assert_eq!(gaps.len(), 2);
    assert!(
        gaps.iter().all(|gap| *gap >= DELAY - Duration::from_millis(2)),
        "{gaps:?}"
    );
    let warnings = events
        .lock()
        .unwrap()
        .iter()
        .filter(|line| line.contains(&prefix) && line.contains("falling back to per-process limits"))
        .count();
    assert_eq!(warnings, 1, "one warning per outage");
}

/// A Redis of the test's own on a free port, to stop and start again.
struct OwnRedis {
    port: u16,
    process: Option<std::process::Child>,
}

impl OwnRedis {
    fn start(port: u16) -> Option<OwnRedis> {
        let process = std::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", ""])
            .stdout(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let mut redis = OwnRedis {
            port,
            process: Some(process),
        };
        for _ in 0..50 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(redis);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        redis.stop();
        None
    }

    fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            let _ = process.kill();
            let _ = process.wait();
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_stops_mid_run_falls_back_then_recovers_when_it_returns() {
    let _alone = ONE_AT_A_TIME.lock().await;
    if !redis_is_there() {
        return;
    }
    let events = support::captured_events(tracing::Level::WARN);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let Some(mut redis) = OwnRedis::start(port) else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "cannot start redis-server"
        );
        eprintln!("skipped: cannot start a redis-server of the test's own");
        return;
    };
    let (_site, addr) = site().await;
    let prefix = fresh_prefix();
    let store = RedisStore::new(&format!("redis://127.0.0.1:{}", redis.port))
        .unwrap()
        .prefix(&prefix);
    let registry = worker_registry(store, StoreFailure::FailLocal);
    let fetch = |page: &str| {
        worker(&registry).oneshot(full_request(&format!(
            "http://outage.test:{}/{page}",
            addr.port()
        )))
    };
    let lines = |text: &str| {
        events
            .lock()
            .unwrap()
            .iter()
            .filter(|line| line.contains(&prefix) && line.contains(text))
            .count()
    };
    assert_eq!(fetch("before").await.unwrap().status(), 200);
    assert_eq!(lines("unreachable"), 0);

    redis.stop();
    assert_eq!(fetch("during").await.unwrap().status(), 200);
    assert_eq!(fetch("during-too").await.unwrap().status(), 200);
    assert_eq!(lines("unreachable"), 1, "one warning per outage");

    let _redis = OwnRedis::start(port).expect("redis-server starts again");
    let mut recovered = false;
    for _ in 0..20 {
        assert_eq!(fetch("after").await.unwrap().status(), 200);
        if lines("reachable again") == 1 {
            recovered = true;
            break;
        }
    }
    assert!(recovered, "the store never answered again");
}
