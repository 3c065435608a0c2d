//! A fleet of registries sharing one [`MemoryStore`] in one process: the
//! store protocol under paused time, with an in-process inner service, so
//! every instant is exact.

mod support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::store::MemoryStore;
use tower_throttle::{Feedback, LimitSource, Registry, Scopes, ThrottleLayer};

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
        client
            .clone()
            .oneshot(http::Request::get("http://site.test/").body(()).unwrap())
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

#[tokio::test(start_paused = true)]
async fn a_backoff_on_one_registry_slows_the_other() {
    let store = MemoryStore::new();
    let (one, two) = (registry(&store), registry(&store));
    one.feedback(&Scopes::from("site.test"), Feedback::backoff());
    tokio::task::yield_now().await;
    let sends = Sends::default();
    let start = Instant::now();
    crawl(&two, "two", 2, &sends, start).await;
    let instants: Vec<u64> = sends.lock().unwrap().iter().map(|(at, _)| *at).collect();
    // One backoff step: the delay doubles to at least `min_delay` (1 s).
    assert_eq!(instants, [0, 1_000]);
    let stats = two.scope_stats("site.test").unwrap();
    assert_eq!(stats.delay_limited_by, LimitSource::Fleet);
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
