//! The registry keeps every scope under one lock: requests of one scope
//! and of several share one order of waiters (for their scopes and for
//! `max_concurrency`), a request costs its lock round trips and no more,
//! and the scheduler evicts idle scopes as requests come, those that end
//! on lock-free words included. Each scenario runs in virtual time, to the
//! millisecond. The multi-threaded interleavings are in `tests/stress.rs`
//! and the model's random schedules in `tests/model.rs`.

use std::time::Duration;

use tokio::time::Instant;
use tower::ServiceExt;
use tower_throttle::{Registry, ScopeConfig, Scopes};

mod support;
use support::Calls;

/// A request's label in the calls its client records: its host and path.
fn host_and_path(uri: &http::Uri) -> String {
    format!("{}{}", uri.host().unwrap_or_default(), uri.path())
}

/// A request to `uri`, throttled by `scopes` when given (else by its host).
fn request(uri: &str, scopes: Option<&[&str]>) -> http::Request<()> {
    let mut request = http::Request::get(uri).body(()).unwrap();
    if let Some(scopes) = scopes {
        let scopes: Vec<String> = scopes.iter().map(|scope| scope.to_string()).collect();
        request.extensions_mut().insert(Scopes::from(scopes));
    }
    request
}

/// Sends `requests` (each after its offset from the start) and waits for
/// all of them; returns when the inner service got each, in that order.
async fn run(registry: &Registry, requests: Vec<(u64, http::Request<()>)>) -> Vec<(String, Duration)> {
    let start = Instant::now();
    let calls = Calls::default();
    let service = support::timed_client(registry, start, &calls, host_and_path);
    let mut tasks = Vec::new();
    for (at_ms, request) in requests {
        let service = service.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(start + Duration::from_millis(at_ms)).await;
            service.oneshot(request).await.unwrap();
        }));
    }
    let all = async {
        for task in tasks {
            task.await.unwrap();
        }
    };
    // A request left waiting with nothing to wake it would park the
    // paused runtime for good: fail instead.
    tokio::time::timeout(Duration::from_secs(3_600), all)
        .await
        .expect("every request is sent within an hour of virtual time");
    // In the order the inner service got them (a stable sort: equal
    // instants keep it).
    let mut calls = calls.lock().unwrap().clone();
    calls.sort_by_key(|(_, at)| *at);
    calls
}

/// Each call's path and instant, in milliseconds.
fn ms(calls: &[(String, Duration)]) -> Vec<(String, u128)> {
    calls
        .iter()
        .map(|(path, at)| (path.clone(), at.as_millis()))
        .collect()
}

fn config(lanes: u32, delay_ms: u64) -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(lanes)
        .delay(Duration::from_millis(delay_ms))
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
}

fn registry(max_concurrency: u32, default: ScopeConfig) -> Registry {
    Registry::builder()
        .max_concurrency(max_concurrency)
        .default_scope(default)
        .build()
        .unwrap()
}

/// Requests of `site`, at their millisecond: one in flight until 1 000
/// ms; one waiting behind it (until 100 ms after its answer: the scope's
/// first answer starts its next gap); one that names the site with
/// another scope; and a later one, which waits behind it.
fn busy_then_named_with_another(site: &str) -> Vec<(u64, http::Request<()>)> {
    let path = |path: &str| format!("https://{site}/{path}");
    vec![
        (0, request(&path("a?ms=1000"), None)),
        (5, request(&path("b"), None)),
        (10, request(&path("both"), Some(&[site, "api"]))),
        (20, request(&path("c"), None)),
    ]
}

/// The hosts `host0.example` to `host{count-1}.example`.
fn hosts(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("host{i}.example")).collect()
}

#[tokio::test(start_paused = true)]
async fn a_crawl_over_many_hosts_sends_each_host_at_its_gaps() {
    let mut requests = Vec::new();
    for (i, host) in hosts(24).iter().enumerate() {
        for page in 0..3 {
            let at = (i as u64 * 7 + page * 40) % 150;
            requests.push((at, request(&format!("https://{host}/p{page}?ms=300"), None)));
        }
    }
    let calls = run(&registry(64, config(1, 500)), requests).await;
    assert_eq!(calls.len(), 72);
    // Each host: its first page at once, the second 500 ms after the
    // first's answer (a cold scope's next gap runs from its first answer),
    // the third 500 ms after the second.
    let first_host: Vec<u128> = calls
        .iter()
        .filter(|(path, _)| path.starts_with("host0.example/"))
        .map(|(_, at)| at.as_millis())
        .collect();
    assert_eq!(first_host, vec![0, 800, 1_300]);
}

#[tokio::test(start_paused = true)]
async fn a_request_of_one_scope_takes_the_lock_for_its_admission_departure_and_end() {
    let registry = registry(64, config(2, 100));
    let host = "https://host.example/a";
    run(&registry, vec![(0, request(host, None))]).await;
    // Past the scope's delay: the next request goes at once.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = registry.debug_lock_count();
    run(&registry, vec![(0, request(host, None))]).await;
    if let (Some(before), Some(after)) = (before, registry.debug_lock_count()) {
        // The admission, the departure (a delay and two lanes: another
        // request could go before this one ends), the completion.
        assert_eq!(after - before, 3);
    }
}

#[tokio::test(start_paused = true)]
async fn requests_of_one_scope_and_of_several_wait_in_one_order() {
    let site = "site.example";
    let registry = registry(64, config(1, 100));
    let calls = run(&registry, busy_then_named_with_another(site)).await;
    let expected: Vec<(String, u128)> = [("a", 0), ("b", 1_100), ("both", 1_200), ("c", 1_300)]
        .iter()
        .map(|(path, at)| (format!("{site}/{path}"), *at))
        .collect();
    assert_eq!(ms(&calls), expected);
    let stats = registry.stats();
    assert_eq!((stats.scopes_tracked, stats.in_flight, stats.waiting), (2, 0, 0));
    let names: Vec<String> = registry
        .all_scope_stats()
        .iter()
        .map(|scope| scope.scope.to_string())
        .collect();
    assert_eq!(names, ["api".to_owned(), site.to_owned()]);
}

#[tokio::test(start_paused = true)]
async fn a_hold_on_an_idle_scope_holds_a_request_that_names_it_with_another() {
    let site = "site.example";
    let registry = registry(64, config(1, 0));
    run(
        &registry,
        vec![(0, request(&format!("https://{site}/first"), None))],
    )
    .await;
    registry.hold(site, Duration::from_secs(5));
    let calls = run(
        &registry,
        vec![
            (0, request(&format!("https://{site}/both"), Some(&[site, "api"]))),
            (10, request(&format!("https://{site}/after"), None)),
        ],
    )
    .await;
    assert_eq!(
        ms(&calls),
        vec![(format!("{site}/both"), 5_000), (format!("{site}/after"), 5_000)]
    );
}

#[tokio::test(start_paused = true)]
async fn the_oldest_request_waiting_for_a_global_permit_goes_first_whatever_its_scope() {
    let requests = hosts(8)
        .iter()
        .enumerate()
        .map(|(i, host)| (i as u64, request(&format!("https://{host}/?ms=100"), None)))
        .collect();
    let calls = run(&registry(1, config(1, 0)), requests).await;
    let expected: Vec<(String, u128)> = hosts(8)
        .iter()
        .enumerate()
        .map(|(i, host)| (format!("{host}/"), 100 * i as u128))
        .collect();
    assert_eq!(ms(&calls), expected);
}

#[tokio::test(start_paused = true)]
async fn the_scopes_of_a_request_of_several_are_evicted_once_idle() {
    let registry = Registry::builder()
        .max_concurrency(64)
        .default_scope(config(1, 0))
        .idle_ttl(Duration::from_secs(1))
        .build()
        .unwrap();
    let single = "https://host.example/x";
    run(&registry, vec![(0, request(single, None))]).await;
    run(
        &registry,
        vec![(0, request(single, Some(&["host.example", "group"])))],
    )
    .await;
    // Idle past `idle_ttl`; a request of two other scopes evicts the two.
    tokio::time::sleep(Duration::from_secs(2)).await;
    run(
        &registry,
        vec![(
            0,
            request("https://other.example/", Some(&["other.example", "group2"])),
        )],
    )
    .await;
    run(&registry, vec![(0, request(single, None))]).await;
    let names: Vec<String> = registry
        .all_scope_stats()
        .iter()
        .map(|scope| scope.scope.to_string())
        .collect();
    assert_eq!(names, ["group2", "host.example", "other.example"]);
    assert_eq!(registry.stats().evictions, 2);
}

/// A registry whose idle scopes go after `idle_ttl`, or first past
/// `max_scopes`.
fn evicting(idle_ttl: Duration, max_scopes: usize) -> Registry {
    Registry::builder()
        .max_concurrency(64)
        .default_scope(config(4, 0))
        .idle_ttl(idle_ttl)
        .max_scopes(max_scopes)
        .build()
        .unwrap()
}

/// Sends one request to `https://{host}/` and waits for its answer.
async fn send(registry: &Registry, host: &str) {
    run(registry, vec![(0, request(&format!("https://{host}/"), None))]).await;
}

#[tokio::test(start_paused = true)]
async fn a_request_ending_on_an_open_word_takes_the_lock_once_to_evict_an_idle_scope() {
    let registry = evicting(Duration::from_secs(60), 1_000);
    let (old, busy) = ("old.example", "busy.example");
    send(&registry, old).await;
    // A plain scope asked for again and again: its requests admit and end
    // on its lock-free word.
    let start = Instant::now();
    let many = |count: u64| {
        (0..count)
            .map(|i| (i * 100, request(&format!("https://{busy}/{i}"), None)))
            .collect::<Vec<_>>()
    };
    let start_locks = registry.debug_lock_count();
    run(&registry, many(590)).await;
    let first_locks = registry.debug_lock_count();
    assert_eq!(start.elapsed(), Duration::from_millis(58_900));
    assert!(registry.scope_stats(old).is_some(), "idle 58.9 s of 60");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = registry.debug_lock_count();
    run(&registry, many(20)).await;
    let after = registry.debug_lock_count();
    assert!(registry.scope_stats(old).is_none(), "idle 60.9 s and more of 60");
    assert_eq!(registry.stats().evictions, 1);
    if let (Some(start_locks), Some(first_locks), Some(before), Some(after)) =
        (start_locks, first_locks, before, after)
    {
        // The first requests open the word; the rest take no lock but
        // the word's looks (is it idle yet?), at most one a second: 59 in
        // 58.9 s.
        let first = first_locks - start_locks;
        assert!(first < 10 + 59, "{first}");
        // The first request to end once the idle scope is due takes the
        // lock, and evicts it there; the word's looks take at most one a
        // second more, over these 2 s.
        let last = after - before;
        assert!((1..=1 + 2).contains(&last), "{last}");
    }
}

#[tokio::test(start_paused = true)]
async fn max_scopes_holds_when_scope_after_scope_is_made() {
    let registry = evicting(Duration::from_secs(3_600), 10);
    for i in 0..200 {
        send(&registry, &format!("site{i}.example")).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(registry.stats().scopes_tracked <= 10, "after site{i}");
    }
    let stats = registry.stats();
    assert_eq!((stats.scopes_tracked, stats.evictions), (10, 190));
}

#[tokio::test(start_paused = true)]
async fn a_scope_counts_every_request_waiting_for_it_alone_or_with_another() {
    let site = "site.example";
    let registry = registry(64, config(1, 100));
    let crawl = {
        let registry = registry.clone();
        tokio::spawn(async move { run(&registry, busy_then_named_with_another(site)).await })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    let stats = registry.scope_stats(site).unwrap();
    assert_eq!((stats.in_flight, stats.queued, stats.idle_for), (1, 3, None));
    assert_eq!(registry.stats().waiting, 3);
    // Listed once among every scope, with the same counts.
    let listed: Vec<_> = registry
        .all_scope_stats()
        .into_iter()
        .filter(|scope| scope.scope.as_str() == site)
        .collect();
    assert_eq!(listed, vec![stats]);
    crawl.await.unwrap();
    let stats = registry.scope_stats(site).unwrap();
    assert_eq!((stats.in_flight, stats.queued, stats.sent), (0, 0, 4));
}
