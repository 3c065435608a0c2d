//! Plain scopes on their lock-free words (`RegistryBuilder::lock_free_plain_scopes`):
//! a busy plain scope admits and ends its requests without the registry's
//! lock, and everything the scheduler promises still holds when the word
//! closes with requests in flight (a waiter, a new delay, the global
//! limit). Each scenario runs with the words and without them (every
//! admission under the lock, the behaviour before) and must give the
//! same instants, to the nanosecond of virtual time. The multi-threaded
//! interleavings are in `tests/stress.rs`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use tokio::time::Instant;
use tower::{Service, ServiceExt};
use tower_throttle::{Registry, ScopeConfig, Scopes, ThrottleLayer};

mod support;
use support::Calls;

/// A request's label in the calls its client records: its path.
fn path(uri: &http::Uri) -> String {
    uri.path().to_owned()
}

fn plain(lanes: u32) -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(lanes)
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
}

fn registry(lock_free: bool, max_concurrency: u32, lanes: u32) -> Registry {
    Registry::builder()
        .max_concurrency(max_concurrency)
        .default_scope(plain(lanes))
        .lock_free_plain_scopes(lock_free)
        .build()
        .unwrap()
}

fn get(uri: &str) -> http::Request<()> {
    http::Request::get(uri).body(()).unwrap()
}

/// Sends `uri` through `client` in a task of its own.
fn spawn<S, B>(client: &S, uri: &str) -> tokio::task::JoinHandle<()>
where
    S: Service<http::Request<()>, Response = http::Response<B>, Error = Infallible> + Clone + Send + 'static,
    B: Send + 'static,
    S::Future: Send,
{
    spawn_request(client, get(uri))
}

/// Sends `request` through `client` in a task of its own.
fn spawn_request<S, B>(client: &S, request: http::Request<()>) -> tokio::task::JoinHandle<()>
where
    S: Service<http::Request<()>, Response = http::Response<B>, Error = Infallible> + Clone + Send + 'static,
    B: Send + 'static,
    S::Future: Send,
{
    let client = client.clone();
    tokio::spawn(async move {
        client.oneshot(request).await.unwrap();
    })
}

/// A request for `uri` of two scopes: its host's, and one beside it
/// (`api.<host>`), as a resolver that gives each request two scopes does.
fn of_two(uri: &str) -> http::Request<()> {
    let mut request = get(uri);
    let host = request.uri().host().unwrap().to_owned();
    let scopes = Scopes::from([host.clone(), format!("api.{host}")]);
    request.extensions_mut().insert(scopes);
    request
}

/// A request for `uri` of the one scope `scope`.
fn of_one(uri: &str, scope: &str) -> http::Request<()> {
    let mut request = get(uri);
    request.extensions_mut().insert(Scopes::from(scope));
    request
}

/// Two requests one after the other: the second opens the scope's word
/// (this thread asked for the scope twice), so later ones go on it.
async fn warm<S, B>(client: &S, host: &str)
where
    S: Service<http::Request<()>, Response = http::Response<B>, Error = Infallible> + Clone,
    B: Send + 'static,
{
    warm_by(client, || get(&format!("http://{host}/warm"))).await;
}

/// Two requests that `request` makes, one after the other: the second
/// opens (or makes) its scopes' words, each asked for again, so later
/// ones go on them.
async fn warm_by<S, B>(client: &S, request: impl Fn() -> http::Request<()>)
where
    S: Service<http::Request<()>, Response = http::Response<B>, Error = Infallible> + Clone,
    B: Send + 'static,
{
    for _ in 0..2 {
        client.clone().oneshot(request()).await.unwrap();
    }
}

/// The calls the inner service got, but the warm-up's.
fn calls_of(calls: &Calls) -> Vec<(String, Duration)> {
    calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(path, _)| path != "/warm")
        .cloned()
        .collect()
}

const MS: Duration = Duration::from_millis(1);

/// The locks ten requests took after the warm-up, and the scope's stats.
async fn ten_requests(lock_free: bool) -> (Option<u64>, tower_throttle::ScopeStats) {
    let registry = registry(lock_free, 16, 4);
    let calls = Calls::default();
    let client = support::timed_client(&registry, Instant::now(), &calls, path);
    warm(&client, "a.test").await;
    let before = registry.debug_lock_count();
    for i in 0..10 {
        client
            .clone()
            .oneshot(get(&format!("http://a.test/{i}?ms={}", 5 + i)))
            .await
            .unwrap();
    }
    let locks = before.map(|before| registry.debug_lock_count().unwrap() - before);
    (locks, registry.scope_stats("a.test").unwrap())
}

#[tokio::test(start_paused = true)]
async fn a_busy_plain_scope_admits_and_ends_without_the_lock() {
    let (locks, stats) = ten_requests(true).await;
    // Without the words each request takes the lock twice: its admission
    // and its end.
    let (locks_before, stats_before) = ten_requests(false).await;
    match (locks, locks_before) {
        (Some(locks), Some(before)) => assert_eq!((locks, before), (0, 20)),
        _ => eprintln!("lock counts skipped: the registry counts its locks in debug builds only"),
    }
    assert_eq!((stats.sent, stats.in_flight), (12, 0));
    // The latency average moves on the word as it does under the lock.
    assert!(stats.latency.is_some());
    assert_eq!(stats.latency, stats_before.latency);
    assert_eq!((stats_before.sent, stats_before.in_flight), (12, 0));
}

/// Requests in flight on the word count in the stats, the scope's and the
/// registry's.
#[tokio::test(start_paused = true)]
async fn requests_on_a_word_count_in_flight_in_the_stats() {
    let registry = registry(true, 16, 4);
    let calls = Calls::default();
    let client = support::timed_client(&registry, Instant::now(), &calls, path);
    warm(&client, "a.test").await;
    let before = registry.debug_lock_count();
    let tasks = [
        spawn(&client, "http://a.test/1?ms=100"),
        spawn(&client, "http://a.test/2?ms=100"),
    ];
    tokio::time::sleep(10 * MS).await;
    if let (Some(before), Some(after)) = (before, registry.debug_lock_count()) {
        assert_eq!(after - before, 0, "both went on the word");
    }
    let stats = registry.scope_stats("a.test").unwrap();
    assert_eq!((stats.in_flight, stats.sent, stats.idle_for), (2, 4, None));
    assert_eq!(registry.stats().in_flight, 2);
    for task in tasks {
        task.await.unwrap();
    }
    let stats = registry.scope_stats("a.test").unwrap();
    assert_eq!((stats.in_flight, stats.sent), (0, 4));
    assert_eq!(registry.stats().in_flight, 0);
}

/// What one scenario gave: the inner service's calls, by path and instant.
async fn scenario<F, Fut>(
    lock_free: bool,
    max_concurrency: u32,
    lanes: u32,
    run: F,
) -> Vec<(String, Duration)>
where
    F: FnOnce(Registry, Instant, Calls) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let registry = registry(lock_free, max_concurrency, lanes);
    let calls = Calls::default();
    run(registry, Instant::now(), calls.clone()).await;
    calls_of(&calls)
}

/// Runs a scenario with the words and without them, checks that both
/// gave the same calls at the same instants, and returns when each path
/// reached the inner service.
async fn both_ways<F, Fut>(run: F) -> HashMap<String, Duration>
where
    F: Fn(bool) -> Fut,
    Fut: std::future::Future<Output = Vec<(String, Duration)>>,
{
    let with_words = run(true).await;
    assert_eq!(
        with_words,
        run(false).await,
        "the same instants without the words"
    );
    with_words.into_iter().collect()
}

/// A new delay closes the word with two requests in flight: the
/// scheduler adopts them, so the next request waits until they ended (a
/// scope with a delay sends nothing while a request's departure is
/// unknown, as without the word) and its gap runs from their sends.
#[tokio::test(start_paused = true)]
async fn a_new_delay_closes_the_word_and_counts_its_requests_in_flight() {
    let run = |lock_free| {
        scenario(lock_free, 16, 2, |registry, start, calls| async move {
            let client = support::timed_client(&registry, start, &calls, path);
            warm(&client, "a.test").await;
            let a = spawn(&client, "http://a.test/a?ms=1000");
            let b = spawn(&client, "http://a.test/b?ms=1000");
            tokio::time::sleep(100 * MS).await;
            registry
                .set_scope("a.test", plain(2).delay(Duration::from_millis(300)))
                .unwrap();
            tokio::time::sleep(100 * MS).await;
            let c = spawn(&client, "http://a.test/c");
            let d = spawn(&client, "http://a.test/d");
            for task in [a, b, c, d] {
                task.await.unwrap();
            }
        })
    };
    let at = both_ways(run).await;
    assert_eq!((at["/a"], at["/b"]), (Duration::ZERO, Duration::ZERO));
    // c goes as a and b end; d one delay after c.
    assert_eq!(at["/c"], 1000 * MS);
    assert_eq!(at["/d"], 1300 * MS);
}

/// A request that finds every lane taken closes the word and waits; the
/// request in flight on the word, adopted, lets it go as it ends.
#[tokio::test(start_paused = true)]
async fn a_waiter_closes_the_word_and_goes_when_the_adopted_request_ends() {
    let run = |lock_free| {
        scenario(lock_free, 16, 1, |registry, start, calls| async move {
            let client = support::timed_client(&registry, start, &calls, path);
            warm(&client, "a.test").await;
            let a = spawn(&client, "http://a.test/a?ms=1000");
            tokio::time::sleep(10 * MS).await;
            let b = spawn(&client, "http://a.test/b?ms=500");
            a.await.unwrap();
            b.await.unwrap();
            // Nothing in flight or waiting: the word opens again.
            warm(&client, "a.test").await;
            assert_eq!(registry.stats().in_flight, 0);
            let c = spawn(&client, "http://a.test/c");
            c.await.unwrap();
            assert_eq!(registry.scope_stats("a.test").unwrap().sent, 7);
        })
    };
    let at = both_ways(run).await;
    assert_eq!(
        (at["/a"], at["/b"], at["/c"]),
        (Duration::ZERO, 1000 * MS, 1500 * MS)
    );
}

/// With one global permit and the words of x.test and y.test open: a
/// request on x.test's word (1 s) and one of y.test that waits for the
/// permit.
async fn one_on_x_and_one_waiting_on_y<S, B>(
    registry: &Registry,
    client: &S,
) -> (tokio::task::JoinHandle<()>, tokio::task::JoinHandle<()>)
where
    S: Service<http::Request<()>, Response = http::Response<B>, Error = Infallible> + Clone + Send + 'static,
    B: Send + 'static,
    S::Future: Send,
{
    warm(client, "x.test").await;
    warm(client, "y.test").await;
    let a = spawn(client, "http://x.test/a?ms=1000");
    tokio::time::sleep(10 * MS).await;
    let b = spawn(client, "http://y.test/b?ms=1000");
    tokio::time::sleep(10 * MS).await;
    assert_eq!(registry.stats().waiting, 1, "b waits for the global permit");
    (a, b)
}

/// The global limit is shared by the words and the scheduler: a request
/// of another open scope waits for the permit of a request on a word, and
/// goes as that one ends on its word.
#[tokio::test(start_paused = true)]
async fn the_global_limit_holds_across_words_and_frees_its_waiters() {
    let run = |lock_free| {
        scenario(lock_free, 1, 4, |registry, start, calls| async move {
            let client = support::timed_client(&registry, start, &calls, path);
            let (a, b) = one_on_x_and_one_waiting_on_y(&registry, &client).await;
            let c = spawn(&client, "http://x.test/c");
            a.await.unwrap();
            b.await.unwrap();
            c.await.unwrap();
        })
    };
    let at = both_ways(run).await;
    // b asked first, so it has the permit first; c after it.
    assert_eq!(
        (at["/a"], at["/b"], at["/c"]),
        (Duration::ZERO, 1000 * MS, 2000 * MS)
    );
}

/// A registry of plain scopes (4 lanes) that evicts a scope idle for 10 s.
fn evicting_after_10_s() -> Registry {
    Registry::builder()
        .default_scope(plain(4))
        .idle_ttl(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// One request to `host` a second, for 12 s: past the eviction's 10.
async fn once_a_second_for_12_s<S, B>(client: &S, host: &str)
where
    S: Service<http::Request<()>, Response = http::Response<B>, Error = Infallible> + Clone,
    B: Send + 'static,
{
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        client
            .clone()
            .oneshot(get(&format!("http://{host}/")))
            .await
            .unwrap();
    }
}

/// Idle scopes are evicted after `idle_ttl` although the only traffic
/// left ends on a word, without the lock: the end that finds eviction due
/// does the work that arriving requests do under the lock.
#[tokio::test(start_paused = true)]
async fn idle_scopes_are_evicted_while_only_words_are_busy() {
    let registry = evicting_after_10_s();
    let calls = Calls::default();
    let client = support::timed_client(&registry, Instant::now(), &calls, path);
    client.clone().oneshot(get("http://idle.test/")).await.unwrap();
    warm(&client, "busy.test").await;
    assert_eq!(registry.stats().scopes_tracked, 2);
    once_a_second_for_12_s(&client, "busy.test").await;
    assert!(registry.scope_stats("idle.test").is_none(), "idle.test evicted");
    assert!(registry.scope_stats("busy.test").is_some(), "busy.test kept");
    assert_eq!(registry.stats().evictions, 1);
}

/// A scope whose word is open is evicted once idle past `idle_ttl`, as
/// any scope (its word closed on every shard, then retired), and comes
/// back with a new word that admits and counts as before.
#[tokio::test(start_paused = true)]
async fn a_scope_evicted_with_its_word_open_comes_back_with_a_new_one() {
    let registry = evicting_after_10_s();
    let calls = Calls::default();
    let client = support::timed_client(&registry, Instant::now(), &calls, path);
    warm(&client, "open.test").await;
    let before = registry.scope_stats("open.test").expect("tracked");
    assert!(before.sent >= 2, "the word opened at the second send");
    once_a_second_for_12_s(&client, "other.test").await;
    assert!(registry.scope_stats("open.test").is_none(), "open.test evicted");
    assert_eq!(registry.stats().evictions, 1);
    // Back, on a new word: every request admitted and ended, none left in
    // flight, the sends counted from zero.
    warm(&client, "open.test").await;
    let after = registry.scope_stats("open.test").expect("tracked again");
    assert_eq!(after.in_flight, 0);
    assert_eq!(registry.stats().in_flight, 0);
    assert_eq!(after.sent, before.sent, "as many sends as the first time");
}

/// A request that ends on its open word, while another scope's request
/// waits for the global permit, takes the lock to let that one go (its
/// word stays open: nothing else touched it).
#[tokio::test(start_paused = true)]
async fn a_request_ending_on_an_open_word_lets_a_global_waiter_go() {
    let run = |lock_free| {
        scenario(lock_free, 1, 4, |registry, start, calls| async move {
            let client = support::timed_client(&registry, start, &calls, path);
            let (a, b) = one_on_x_and_one_waiting_on_y(&registry, &client).await;
            a.await.unwrap();
            tokio::time::timeout(Duration::from_secs(60), b)
                .await
                .expect("b went once a ended")
                .unwrap();
        })
    };
    let at = both_ways(run).await;
    assert_eq!((at["/a"], at["/b"]), (Duration::ZERO, 1000 * MS));
}

/// The usual stack, Throttle → RetryAfter → Backoff, keeps a busy plain
/// scope on its word: a 200 is nobody's feedback, so its end takes no
/// lock. A 503 closes the word (a backoff step: the scope has a delay
/// now) and the next request goes through the lock, a backoff delay (and
/// its jitter) after the 503's send.
#[tokio::test(start_paused = true)]
async fn the_feedback_layers_keep_the_word_open_for_successes_and_close_it_on_a_backoff() {
    use tower_throttle::{BackoffLayer, RetryAfterLayer};
    let registry = registry(true, 16, 4);
    let start = Instant::now();
    let calls = Calls::default();
    let recorded = calls.clone();
    let inner = tower::service_fn(move |request: http::Request<()>| {
        let path = request.uri().path().to_owned();
        recorded.lock().unwrap().push((path.clone(), start.elapsed()));
        let status = if path == "/busy" { 503 } else { 200 };
        async move { Ok::<_, Infallible>(http::Response::builder().status(status).body(()).unwrap()) }
    });
    let client = tower::ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(RetryAfterLayer::new(registry.clone()))
        .layer(BackoffLayer::new(registry.clone()))
        .service(inner);
    warm(&client, "a.test").await;
    let before = registry.debug_lock_count();
    for i in 0..5 {
        client
            .clone()
            .oneshot(get(&format!("http://a.test/{i}")))
            .await
            .unwrap();
    }
    if let (Some(before), Some(after)) = (before, registry.debug_lock_count()) {
        assert_eq!(after - before, 0, "five 200s on the word, no lock");
    }
    // Later than every send before it, so the gap can only run from its
    // own send.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let response = client.clone().oneshot(get("http://a.test/busy")).await.unwrap();
    assert_eq!(response.status(), 503);
    // Its lane is free once the response is gone.
    drop(response);
    let stats = registry.scope_stats("a.test").unwrap();
    assert!(stats.backoff_delay.is_some(), "{stats:?}");
    let delay = stats.delay;
    assert!(delay > Duration::ZERO, "{stats:?}");
    client.clone().oneshot(get("http://a.test/after")).await.unwrap();
    let at: HashMap<String, Duration> = calls_of(&calls).into_iter().collect();
    // Backoff's jitter moves its delay by up to a tenth either way.
    let gap = at["/after"] - at["/busy"];
    assert!(
        gap >= delay.mul_f64(0.9) && gap <= delay.mul_f64(1.1),
        "a backoff delay after the 503's send: {gap:?} for {delay:?}"
    );
    assert_eq!(registry.scope_stats("a.test").unwrap().sent, 9);
}

/// The locks requests of two scopes took after the warm-up, the in-flight
/// counts (each scope's, the registry's) while two were in flight, and the
/// scopes' stats at the end.
async fn requests_of_two(lock_free: bool) -> (Option<u64>, [u32; 3], [tower_throttle::ScopeStats; 2]) {
    // Lanes enough that both requests in flight at once are on this
    // thread's shard of each word, whose latency average is then the
    // scope's, exactly as under the lock.
    let registry = registry(lock_free, 32, 16);
    let calls = Calls::default();
    let client = support::timed_client(&registry, Instant::now(), &calls, path);
    warm_by(&client, || of_two("http://a.test/warm")).await;
    let before = registry.debug_lock_count();
    let tasks = [
        spawn_request(&client, of_two("http://a.test/1?ms=100")),
        spawn_request(&client, of_two("http://a.test/2?ms=100")),
    ];
    tokio::time::sleep(10 * MS).await;
    let in_flight = |scope| registry.scope_stats(scope).unwrap().in_flight;
    let during = [
        in_flight("a.test"),
        in_flight("api.a.test"),
        registry.stats().in_flight,
    ];
    for task in tasks {
        task.await.unwrap();
    }
    for i in 0..8 {
        let request = of_two(&format!("http://a.test/{i}?ms={}", 5 + i));
        client.clone().oneshot(request).await.unwrap();
    }
    // The three reads of the stats above took the lock.
    let locks = before.map(|before| registry.debug_lock_count().unwrap() - before - 3);
    let stats = ["a.test", "api.a.test"].map(|scope| registry.scope_stats(scope).unwrap());
    (locks, during, stats)
}

/// Requests of two busy plain scopes admit and end on both scopes' words
/// without the lock, and count in both scopes' stats as they do under it.
#[tokio::test(start_paused = true)]
async fn requests_of_two_busy_plain_scopes_admit_and_end_without_the_lock() {
    let (locks, during, stats) = requests_of_two(true).await;
    let (locks_before, during_before, stats_before) = requests_of_two(false).await;
    match (locks, locks_before) {
        // Without the words each request takes the lock twice.
        (Some(locks), Some(before)) => assert_eq!((locks, before), (0, 20)),
        _ => eprintln!("lock counts skipped: the registry counts its locks in debug builds only"),
    }
    assert_eq!(during, [2, 2, 2]);
    assert_eq!(during_before, during);
    for (stats, before) in stats.iter().zip(&stats_before) {
        assert_eq!((stats.sent, stats.in_flight), (12, 0));
        assert_eq!((before.sent, before.in_flight), (12, 0));
        assert_eq!(stats.latency, before.latency);
        assert!(stats.latency.is_some());
    }
}

/// A request of two scopes whose second scope has no lane free gives the
/// lane it took on the first back, and waits under the lock like any
/// other: the first scope counts nothing of it while it waits.
#[tokio::test(start_paused = true)]
async fn a_request_of_two_scopes_refused_by_the_second_gives_the_first_lane_back() {
    let run = |lock_free| {
        scenario(lock_free, 16, 4, |registry, start, calls| async move {
            registry.set_scope("api.a.test", plain(1)).unwrap();
            let client = support::timed_client(&registry, start, &calls, path);
            warm_by(&client, || of_two("http://a.test/warm")).await;
            let api = spawn_request(&client, of_one("http://a.test/api?ms=1000", "api.a.test"));
            tokio::time::sleep(10 * MS).await;
            let both = spawn_request(&client, of_two("http://a.test/both"));
            tokio::time::sleep(10 * MS).await;
            let in_flight = |scope| registry.scope_stats(scope).unwrap().in_flight;
            assert_eq!((in_flight("a.test"), in_flight("api.a.test")), (0, 1));
            assert_eq!(registry.stats().in_flight, 1);
            for task in [api, both] {
                task.await.unwrap();
            }
            assert_eq!(registry.stats().in_flight, 0);
        })
    };
    let at = both_ways(run).await;
    assert_eq!((at["/api"], at["/both"]), (Duration::ZERO, 1000 * MS));
}

/// A new delay on one of two scopes closes its word with requests of both
/// in flight: that scope's word adopts them (they end there under the
/// lock), the other's stays open (they end there on its word), and the
/// next request waits for them as it would without the words.
#[tokio::test(start_paused = true)]
async fn a_new_delay_on_one_of_two_scopes_adopts_its_requests_there_only() {
    let run = |lock_free| {
        scenario(lock_free, 16, 4, |registry, start, calls| async move {
            let client = support::timed_client(&registry, start, &calls, path);
            warm_by(&client, || of_two("http://a.test/warm")).await;
            let a = spawn_request(&client, of_two("http://a.test/a?ms=1000"));
            let b = spawn_request(&client, of_two("http://a.test/b?ms=1000"));
            tokio::time::sleep(100 * MS).await;
            registry
                .set_scope("api.a.test", plain(4).delay(Duration::from_millis(300)))
                .unwrap();
            tokio::time::sleep(100 * MS).await;
            let c = spawn_request(&client, of_two("http://a.test/c"));
            for task in [a, b, c] {
                task.await.unwrap();
            }
            for scope in ["a.test", "api.a.test"] {
                let stats = registry.scope_stats(scope).unwrap();
                assert_eq!((stats.sent, stats.in_flight), (5, 0), "{scope}");
            }
            assert_eq!(registry.stats().in_flight, 0);
        })
    };
    let at = both_ways(run).await;
    assert_eq!((at["/a"], at["/b"]), (Duration::ZERO, Duration::ZERO));
    // c goes as a and b end (the new delay runs from their sends).
    assert_eq!(at["/c"], 1000 * MS);
}

/// Requests of two scopes on their words, sent the way clients send them:
/// more at once than the second scope has lanes, their responses collected
/// before any body is read (and the bodies never read), and some futures
/// dropped while they wait. None hangs, each goes when a lane is free, and
/// everything they held goes back.
#[tokio::test(start_paused = true)]
async fn requests_of_two_scopes_sent_as_clients_send_them_end_and_give_everything_back() {
    let registry = registry(true, 16, 4);
    registry.set_scope("api.a.test", plain(2)).unwrap();
    let calls = Calls::default();
    let start = Instant::now();
    let client = support::timed_client(&registry, start, &calls, path);
    warm_by(&client, || of_two("http://a.test/warm")).await;
    // Six at once on two lanes, 100 ms each: collected, bodies unread.
    let requests = (0..6).map(|i| {
        client
            .clone()
            .oneshot(of_two(&format!("http://a.test/{i}?ms=100")))
    });
    let responses: Vec<_> = futures::future::join_all(requests).await;
    assert!(responses.iter().all(Result::is_ok));
    assert_eq!(start.elapsed(), 300 * MS, "two at a time");
    // Two hold both lanes; three more wait, and are dropped while they do.
    let holders = [
        spawn_request(&client, of_two("http://a.test/h1?ms=1000")),
        spawn_request(&client, of_two("http://a.test/h2?ms=1000")),
    ];
    tokio::time::sleep(MS).await;
    for i in 0..3 {
        let waiting = client
            .clone()
            .oneshot(of_two(&format!("http://a.test/dropped{i}")));
        let gave_up = tokio::time::timeout(10 * MS, waiting).await;
        assert!(gave_up.is_err(), "no lane free: it waits");
    }
    for holder in holders {
        holder.await.unwrap();
    }
    drop(responses);
    assert_eq!((registry.stats().in_flight, registry.stats().waiting), (0, 0));
    for scope in ["a.test", "api.a.test"] {
        assert_eq!(registry.scope_stats(scope).unwrap().in_flight, 0, "{scope}");
    }
    // Nothing leaked: both lanes are free at once.
    let before = Instant::now();
    let last = [
        spawn_request(&client, of_two("http://a.test/l1?ms=5")),
        spawn_request(&client, of_two("http://a.test/l2?ms=5")),
    ];
    for task in last {
        task.await.unwrap();
    }
    assert_eq!(before.elapsed(), 5 * MS);
    let dropped = calls_of(&calls)
        .iter()
        .filter(|(path, _)| path.starts_with("/dropped"))
        .count();
    assert_eq!(dropped, 0, "a dropped future never reaches the service");
}
