//! A fleet of registries sharing one [`MemoryStore`] in one process: the
//! store protocol under paused time, with an in-process inner service, so
//! every instant is exact.

mod support;

use support::at_head;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_throttle::throttle::ThrottledBody;

use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::registry::{Feedback, LimitSource};
use tower_throttle::store::MemoryStore;
use tower_throttle::{Registry, Scopes, ThrottleLayer};

use support::one_lane_every;

const DELAY: Duration = Duration::from_millis(100);

type Sends = Arc<Mutex<Vec<(u64, &'static str)>>>;

fn registry(store: &MemoryStore) -> Registry {
    Registry::builder()
        .default_scope(one_lane_every(DELAY))
        .store(store.clone())
        .build()
        .unwrap()
}

/// Sends `count` requests to `site.test` through `registry`, all at once,
/// recording each send's instant (ms since `start`) and the worker's name.
async fn crawl(registry: &Registry, worker: &'static str, count: usize, sends: &Sends, start: Instant) {
    let sends = sends.clone();
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()).store_errors())
        .service(tower::service_fn(move |_request: http::Request<()>| {
            let sends = sends.clone();
            async move {
                sends
                    .lock()
                    .unwrap()
                    .push((start.elapsed().as_millis() as u64, worker));
                Ok::<_, Infallible>(http::Response::new(()))
            }
        }));
    let requests = (0..count).map(|_| {
        at_head(
            client
                .clone()
                .oneshot(http::Request::get("http://site.test/").body(()).unwrap()),
        )
    });
    for answer in futures::future::join_all(requests).await {
        answer.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn two_registries_sharing_a_store_send_one_delay_apart_between_them() {
    let store = MemoryStore::new();
    let (one, two) = (registry(&store), registry(&store));
    let sends = Sends::default();
    let start = Instant::now();
    tokio::join!(
        crawl(&one, "one", 3, &sends, start),
        crawl(&two, "two", 3, &sends, start)
    );
    let mut sends = sends.lock().unwrap().clone();
    sends.sort();
    let instants: Vec<u64> = sends.iter().map(|(at, _)| *at).collect();
    assert_eq!(instants, [0, 100, 200, 300, 400, 500]);
    // Both workers had their turns.
    assert_eq!(sends.iter().filter(|(_, worker)| *worker == "one").count(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_hold_set_on_one_registry_holds_the_other() {
    let store = MemoryStore::new();
    let (one, two) = (registry(&store), registry(&store));
    one.hold("site.test", Duration::from_secs(2));
    tokio::task::yield_now().await;
    let sends = Sends::default();
    let start = Instant::now();
    crawl(&two, "two", 1, &sends, start).await;
    assert_eq!(sends.lock().unwrap()[0].0, 2_000);
    // The other registry learnt the hold from the store's answer.
    assert!(two.scope_stats("site.test").is_some());
}

/// One backoff step seen by `one` and the sends of `two` after it.
async fn backoff_on_one_then_two_sends(learn_together: bool) -> (Vec<u64>, LimitSource) {
    let store = MemoryStore::new();
    let config =
        one_lane_every(DELAY).backoff(tower_throttle::registry::BackoffConfig::default().jitter(0.0));
    let registry = || support::fleet_worker(&config, &store, learn_together);
    let (one, two) = (registry(), registry());
    one.feedback(&Scopes::from("site.test"), Feedback::backoff());
    tokio::task::yield_now().await;
    let sends = Sends::default();
    let start = Instant::now();
    crawl(&two, "two", 2, &sends, start).await;
    let instants: Vec<u64> = sends.lock().unwrap().iter().map(|(at, _)| *at).collect();
    (instants, two.scope_stats("site.test").unwrap().delay_limited_by)
}

#[tokio::test(start_paused = true)]
async fn a_backoff_on_one_registry_slows_the_other() {
    // One backoff step: the delay doubles to at least `min_delay` (1 s).
    // The fleet learns together: `two` takes the fleet's backoff level as
    // its own backoff.
    assert_eq!(
        backoff_on_one_then_two_sends(true).await,
        (vec![0, 1_000], LimitSource::Backoff)
    );
    // Learning alone, the fleet's backoff delay is a limit of its own.
    assert_eq!(
        backoff_on_one_then_two_sends(false).await,
        (vec![0, 1_000], LimitSource::Fleet)
    );
}

#[tokio::test(start_paused = true)]
async fn without_a_store_a_registry_keeps_to_itself() {
    let local = || {
        Registry::builder()
            .default_scope(one_lane_every(DELAY))
            .build()
            .unwrap()
    };
    let (one, two) = (local(), local());
    let sends = Sends::default();
    let start = Instant::now();
    tokio::join!(
        crawl(&one, "one", 2, &sends, start),
        crawl(&two, "two", 2, &sends, start)
    );
    let mut instants: Vec<u64> = sends.lock().unwrap().iter().map(|(at, _)| *at).collect();
    instants.sort();
    assert_eq!(instants, [0, 0, 100, 100]);
}

/// A worker whose inner service answers after `latency`, recording each
/// send's instant (ms since `start`) with the worker's name.
fn answering_after(
    registry: &Registry,
    worker: &'static str,
    latency: Duration,
    sends: &Sends,
    start: Instant,
) -> impl tower::Service<
    http::Request<()>,
    Response = http::Response<ThrottledBody<()>>,
    Error = tower_throttle::Error,
    Future = impl Send,
> + Clone {
    let sends = sends.clone();
    ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()).store_errors())
        .service(tower::service_fn(move |_request: http::Request<()>| {
            sends
                .lock()
                .unwrap()
                .push((start.elapsed().as_millis() as u64, worker));
            async move {
                tokio::time::sleep(latency).await;
                Ok::<_, Infallible>(http::Response::new(()))
            }
        }))
}

fn get() -> http::Request<()> {
    http::Request::get("http://site.test/").body(()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_send_that_leaves_late_pushes_the_other_workers_next_send_to_its_departure() {
    let store = MemoryStore::new();
    let (one, two) = (registry(&store), registry(&store));
    let sends = Sends::default();
    let start = Instant::now();
    let late_worker = answering_after(&one, "one", Duration::ZERO, &sends, start);
    let other_worker = answering_after(&two, "two", Duration::ZERO, &sends, start);
    // Both workers warm (their first requests done): sends at 0 and 100.
    late_worker.clone().oneshot(get()).await.unwrap();
    tokio::task::yield_now().await;
    other_worker.clone().oneshot(get()).await.unwrap();
    tokio::task::yield_now().await;
    // The next request is granted 200 ms, but its task (a busy runtime's)
    // next runs at 240 ms: it leaves then.
    let mut late = std::pin::pin!(late_worker.oneshot(get()));
    assert!(futures::FutureExt::now_or_never(late.as_mut()).is_none());
    let other = tokio::spawn(at_head(other_worker.oneshot(get())));
    tokio::time::sleep(Duration::from_millis(140)).await;
    late.await.unwrap();
    other.await.unwrap().unwrap();
    // The other worker keeps its gap to the real departure: 340 ms, where
    // the granted instant alone would have let it go at 300 ms.
    assert_eq!(
        *sends.lock().unwrap(),
        [(0, "one"), (100, "two"), (240, "one"), (340, "two")]
    );
}

#[tokio::test(start_paused = true)]
async fn each_workers_first_request_holds_the_fleet_until_it_is_answered() {
    // Two lanes, a 100 ms delay, answers after 30 ms (a new connection's
    // setup): every worker's first request pays that setup after it
    // leaves, so the next send of the fleet comes 100 ms after it ends.
    let store = MemoryStore::new();
    let config = one_lane_every(DELAY).concurrency(2);
    let worker = |name| {
        let registry = Registry::builder()
            .default_scope(config.clone())
            .store(store.clone())
            .build()
            .unwrap();
        (registry, name)
    };
    let workers = [worker("one"), worker("two")];
    let sends = Sends::default();
    let start = Instant::now();
    let crawls = workers.iter().map(|(registry, name)| {
        let client = answering_after(registry, name, Duration::from_millis(30), &sends, start);
        async move {
            let requests = (0..2).map(|_| at_head(client.clone().oneshot(get())));
            for answer in futures::future::join_all(requests).await {
                answer.unwrap();
            }
        }
    });
    futures::future::join_all(crawls).await;
    // One's first at 0 (answered at 30), two's first 100 ms after that
    // answer (at 130, answered at 160), one's second 100 ms after it (260),
    // then gaps from sends as usual (360). Without the rule, two's first
    // would have gone at 100 ms, 70 ms after one's first reached the site.
    assert_eq!(
        *sends.lock().unwrap(),
        [(0, "one"), (130, "two"), (260, "one"), (360, "two")]
    );
}

/// A name's first request opens a connection of its own, so its server's
/// scope (shared with the other names) waits for its answer, fleet-wide
/// too: worker one sends `a` (cold everywhere), then `b`, a name new to it
/// on a server it knows; worker two's `c` goes the delay after `b`'s
/// answer, not after `b`'s departure. Names: one lane, no delay; the
/// server: one lane, 100 ms; 30 ms answers.
#[tokio::test(start_paused = true)]
async fn a_names_first_request_holds_its_servers_scope_fleet_wide_until_answered() {
    let store = MemoryStore::new();
    let worker = || {
        Registry::builder()
            .default_scope(one_lane_every(Duration::ZERO))
            .scope("server", one_lane_every(DELAY))
            .resolver(|head: &tower_throttle::scope::RequestHead<'_>| {
                Scopes::from([head.host().unwrap_or_default().to_string(), "server".to_string()])
            })
            .store(store.clone())
            .build()
            .unwrap()
    };
    let (one, two) = (worker(), worker());
    let sends = Sends::default();
    let start = Instant::now();
    let latency = Duration::from_millis(30);
    let on = |host: &str| http::Request::get(format!("http://{host}/")).body(()).unwrap();
    let one = answering_after(&one, "one", latency, &sends, start);
    let two = answering_after(&two, "two", latency, &sends, start);
    at_head(one.clone().oneshot(on("a.test"))).await.unwrap();
    let b = tokio::spawn(at_head(one.oneshot(on("b.test"))));
    tokio::time::sleep_until(start + Duration::from_millis(140)).await;
    at_head(two.oneshot(on("c.test"))).await.unwrap();
    b.await.unwrap().unwrap();
    // `a` at 0 (answered at 30): the server's next send 100 ms after that
    // answer; `b` at 130, a name's first (answered at 160): `c` at 260,
    // where `b`'s departure alone would have let it go at 230.
    assert_eq!(*sends.lock().unwrap(), [(0, "one"), (130, "one"), (260, "two")]);
}

/// A long hold (a server's "come back in an hour") is in the store, so a
/// worker started after it, with nothing of its own, still waits it out;
/// the store keeps it whole, capped only by `max_hold` (1 h), not by the
/// backoff `max_delay` (300 s).
#[tokio::test(start_paused = true)]
async fn a_long_hold_survives_a_worker_restart() {
    let store = MemoryStore::new();
    let worker = registry(&store);
    worker.hold("site.test", Duration::from_secs(2 * 3600));
    tokio::task::yield_now().await;
    drop(worker);
    tokio::time::advance(Duration::from_secs(600)).await;
    let restarted = registry(&store);
    let sends = Sends::default();
    let start = Instant::now();
    crawl(&restarted, "restarted", 1, &sends, start).await;
    assert_eq!(
        sends.lock().unwrap()[0].0,
        3_000_000,
        "the hour's last 50 minutes"
    );
}

/// A store that never renews leases: `MemoryStore` with the trait's default
/// `renew` and `lease_ttl` (what a store written before renewal does).
#[derive(Debug, Clone)]
struct NoRenewal(MemoryStore);

crate::memory_store_but!(NoRenewal {});

/// A worker of one lane and no delay on `store`.
fn one_lane_worker(store: &(impl tower_throttle::store::backend::ScopeStore + Clone)) -> Registry {
    Registry::builder()
        .default_scope(one_lane_every(Duration::ZERO))
        .store(store.clone())
        .build()
        .unwrap()
}

/// Sends `/long` through `registry` to an inner service that answers after
/// `latency`; 100 ms later `other` sends one request to the same scope:
/// when that one was sent (ms from the call).
async fn next_after_a_long_request(registry: &Registry, latency: Duration, other: &Registry) -> u64 {
    let start = Instant::now();
    let slow_client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()).store_errors())
        .service(tower::service_fn(move |_request: http::Request<()>| async move {
            tokio::time::sleep(latency).await;
            Ok::<_, Infallible>(http::Response::new(()))
        }));
    let long = tokio::spawn(at_head(
        slow_client.oneshot(http::Request::get("http://site.test/long").body(()).unwrap()),
    ));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let sends = Sends::default();
    crawl(other, "other", 1, &sends, start).await;
    long.await.unwrap().unwrap();
    let sent = sends.lock().unwrap()[0].0;
    eprintln!("the other worker's request was sent at {sent} ms");
    sent
}

/// [`next_after_a_long_request`] with two fresh workers on `store`.
async fn long_request_and_the_next(
    store: impl tower_throttle::store::backend::ScopeStore + Clone,
    latency: Duration,
) -> u64 {
    next_after_a_long_request(&one_lane_worker(&store), latency, &one_lane_worker(&store)).await
}

/// A request longer than the lease TTL (1 s) keeps its lane: its worker
/// renews the lease in the background, so the other worker's request waits
/// for the end of the long one (5 s), not for the TTL. With a store that
/// does not renew, the lane comes back after the TTL while the long request
/// is still in flight.
#[tokio::test(start_paused = true)]
async fn a_request_longer_than_the_lease_ttl_keeps_its_lane() {
    let ttl = Duration::from_secs(1);
    let renewed = long_request_and_the_next(MemoryStore::new().lease_ttl(ttl), Duration::from_secs(5)).await;
    assert!((5_000..5_100).contains(&renewed), "sent at {renewed} ms");
    let not_renewed = long_request_and_the_next(
        NoRenewal(MemoryStore::new().lease_ttl(ttl)),
        Duration::from_secs(5),
    )
    .await;
    assert!((1_000..1_100).contains(&not_renewed), "sent at {not_renewed} ms");
}

/// A scope that counts whole transfers holds its lane in the fleet too: a
/// body that streams for 5 s after an instant head keeps its lease renewed
/// while it streams, so the other worker's request goes when the body ends,
/// not after the lease's TTL (1 s).
#[tokio::test(start_paused = true)]
async fn a_body_streaming_past_the_lease_ttl_keeps_its_lane() {
    use futures::StreamExt;
    use http_body_util::{BodyExt, StreamBody};
    use hyper::body::{Bytes, Frame};

    let store = MemoryStore::new().lease_ttl(Duration::from_secs(1));
    let whole_transfers = || {
        Registry::builder()
            .default_scope(one_lane_every(Duration::ZERO).count_whole_transfers(true))
            .store(store.clone())
            .build()
            .unwrap()
    };
    let (worker, other) = (whole_transfers(), whole_transfers());
    let start = Instant::now();
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(worker).store_errors())
        .service(tower::service_fn(|_request: http::Request<()>| async {
            // Fifty chunks, 100 ms apart: the body ends at 5 s.
            let chunks = futures::stream::iter(0..50).then(|_| async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"x")))
            });
            Ok::<_, Infallible>(http::Response::new(StreamBody::new(chunks.boxed())))
        }));
    let long = tokio::spawn(async move {
        let request = http::Request::get("http://site.test/long").body(()).unwrap();
        let response = client.oneshot(request).await.unwrap();
        response.into_body().collect().await.unwrap().to_bytes().len()
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let sends = Sends::default();
    crawl(&other, "other", 1, &sends, start).await;
    assert_eq!(long.await.unwrap(), 50, "the whole body was read");
    let sent = sends.lock().unwrap()[0].0;
    assert!((5_000..5_100).contains(&sent), "sent at {sent} ms");
}

/// The renewal task lives on the runtime of the request that started it.
/// When that runtime shuts down, the next lease, on another runtime, starts
/// a new one: a registry that outlives a runtime still renews.
#[test]
fn renewal_starts_again_on_another_runtime_after_the_first_shut_down() {
    let paused = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
    };
    let store = MemoryStore::new().lease_ttl(Duration::from_secs(1));
    let (slow, other) = (one_lane_worker(&store), one_lane_worker(&store));
    // The first runtime: a lease, and so a renewal task, then a shutdown.
    let first = paused();
    first.block_on(async {
        let request = ServiceBuilder::new()
            .layer(ThrottleLayer::new(slow.clone()).store_errors())
            .service(tower::service_fn(|_request: http::Request<()>| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok::<_, Infallible>(http::Response::new(()))
            }))
            .oneshot(http::Request::get("http://site.test/first").body(()).unwrap());
        tokio::spawn(at_head(request));
        tokio::time::sleep(Duration::from_millis(100)).await;
    });
    drop(first);
    // The second: the lane the first request held comes back after the
    // TTL at most; then a long request keeps it for its 5 s.
    let sent = paused().block_on(async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        next_after_a_long_request(&slow, Duration::from_secs(5), &other).await
    });
    assert!((5_000..5_100).contains(&sent), "sent at {sent} ms");
}

/// A worker that learns of the fleet's backoff from its first request's
/// answer (it asked with its own 100 ms) still spaces the next send by the
/// fleet's 1 s from that request's end (the cold-start rule): a first
/// request reaches the site late by the connection's setup.
#[tokio::test(start_paused = true)]
async fn the_gap_after_a_first_request_is_the_fleets_backoff_delay_when_it_is_longer() {
    let store = MemoryStore::new();
    // Backoff jitter in [0.5, 1): this worker alone would send again 0.5
    // to 1 s after the first request's end.
    let config =
        one_lane_every(DELAY).backoff(tower_throttle::registry::BackoffConfig::default().jitter((0.5, 0.0)));
    let registry = || support::fleet_worker(&config, &store, true);
    let (one, two) = (registry(), registry());
    one.feedback(&Scopes::from("site.test"), Feedback::backoff());
    tokio::task::yield_now().await;
    let start = Instant::now();
    let sends = Arc::new(Mutex::new(Vec::new()));
    let recorded = sends.clone();
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(two).store_errors())
        .service(tower::service_fn(move |_request: http::Request<()>| {
            recorded.lock().unwrap().push(start.elapsed().as_millis() as u64);
            async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, Infallible>(http::Response::new(()))
            }
        }));
    let get = || http::Request::get("http://site.test/").body(()).unwrap();
    let (first, second) = tokio::join!(
        at_head(client.clone().oneshot(get())),
        at_head(client.clone().oneshot(get()))
    );
    first.unwrap();
    second.unwrap();
    // The first request ends at 300 ms; the second goes the fleet's 1 s
    // after (not at 1 s, the fleet's 1 s after the first's send, nor its
    // own jittered 0.5 to 1 s after that end).
    assert_eq!(*sends.lock().unwrap(), [0, 1_300]);
}
