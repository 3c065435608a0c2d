//! A registry split into shards (`RegistryBuilder::shards`): each
//! scenario runs on one shard and on eight and must give the same instants,
//! to the nanosecond of virtual time; what differs is only which locks a
//! request takes. The multi-threaded interleavings are in `tests/stress.rs`
//! and the model's random schedules in `tests/model.rs`, both also run on
//! sharded registries.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_throttle::throttle::ThrottledBody;

use tokio::time::Instant;
use tower::{Service, ServiceExt};
use tower_throttle::store::MemoryStore;
use tower_throttle::{Registry, ScopeConfig, Scopes, ThrottleLayer};

/// When the inner service got each request (by its path), relative to
/// the test's start.
type Calls = Arc<Mutex<Vec<(String, Duration)>>>;

/// A throttled client whose inner service answers each request after the
/// milliseconds its query asks (`?ms=1000`; none: at once) and records
/// when it got it.
fn client(
    registry: &Registry,
    start: Instant,
    calls: &Calls,
) -> impl Service<
    http::Request<()>,
    Response = http::Response<ThrottledBody<()>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    let calls = calls.clone();
    let inner = tower::service_fn(move |request: http::Request<()>| {
        let path = format!(
            "{}{}",
            request.uri().host().unwrap_or_default(),
            request.uri().path()
        );
        let latency = request
            .uri()
            .query()
            .and_then(|query| query.strip_prefix("ms="))
            .map_or(0, |ms| ms.parse().unwrap());
        calls.lock().unwrap().push((path, start.elapsed()));
        async move {
            tokio::time::sleep(Duration::from_millis(latency)).await;
            Ok::<_, Infallible>(http::Response::new(()))
        }
    });
    tower::Layer::layer(&ThrottleLayer::new(registry.clone()), inner)
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
    let service = client(registry, start, &calls);
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

fn registry(shards: usize, max_concurrency: u32, default: ScopeConfig) -> Registry {
    Registry::builder()
        .shards(shards)
        .max_concurrency(max_concurrency)
        .default_scope(default)
        .build()
        .unwrap()
}

/// A name `{prefix}{i}.example` whose home among eight shards is not the
/// joint shard (shard 0), so that a request of several scopes moves it.
fn away_from_joint(prefix: &str) -> String {
    let probe = registry(8, 1, config(1, 0));
    (0..)
        .map(|i| format!("{prefix}{i}.example"))
        .find(|name| probe.debug_home_of(name) != 0)
        .expect("some name hashes elsewhere")
}

/// The hosts `host0.example` to `host{count-1}.example`.
/// Requests of `site` (whose home is not the joint shard), at their
/// millisecond: one in flight at home until 1 000 ms; one waiting at home
/// behind it (until 100 ms after its answer: the scope's first answer
/// starts its next gap); one that names the site with another scope, so
/// the site leaves its home for the joint shard; and a later one, which
/// waits in the joint shard behind it.
fn busy_at_home_then_named_with_another(site: &str) -> Vec<(u64, http::Request<()>)> {
    let path = |path: &str| format!("https://{site}/{path}");
    vec![
        (0, request(&path("a?ms=1000"), None)),
        (5, request(&path("b"), None)),
        (10, request(&path("both"), Some(&[site, "api"]))),
        (20, request(&path("c"), None)),
    ]
}

fn hosts(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("host{i}.example")).collect()
}

#[tokio::test(start_paused = true)]
async fn a_crawl_over_many_hosts_sends_at_the_same_instants_with_one_shard_and_with_eight() {
    let crawl = || {
        let mut requests = Vec::new();
        for (i, host) in hosts(24).iter().enumerate() {
            for page in 0..3 {
                let at = (i as u64 * 7 + page * 40) % 150;
                requests.push((at, request(&format!("https://{host}/p{page}?ms=300"), None)));
            }
        }
        requests
    };
    let one = run(&registry(1, 64, config(1, 500)), crawl()).await;
    let eight = run(&registry(8, 64, config(1, 500)), crawl()).await;
    assert_eq!(one.len(), 72);
    assert_eq!(ms(&one), ms(&eight));
    // Each host: its first page at once, the second 500 ms after the
    // first's answer (a cold scope's next gap runs from its first answer),
    // the third 500 ms after the second.
    let first_host: Vec<u128> = one
        .iter()
        .filter(|(path, _)| path.starts_with("host0.example/"))
        .map(|(_, at)| at.as_millis())
        .collect();
    assert_eq!(first_host, vec![0, 800, 1_300]);
}

#[tokio::test(start_paused = true)]
async fn a_request_of_one_scope_takes_its_shards_lock_alone() {
    let locks = |shards: usize| async move {
        let registry = registry(shards, 64, config(2, 100));
        let host = format!("https://{}/a", away_from_joint("host"));
        let host = host.as_str();
        run(&registry, vec![(0, request(host, None))]).await;
        // Past the scope's delay: the next request goes at once.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before = registry.debug_lock_count();
        run(&registry, vec![(0, request(host, None))]).await;
        Some(registry.debug_lock_count()? - before?)
    };
    let (one, eight) = (locks(1).await, locks(8).await);
    assert_eq!(one, eight);
    if let Some(locks) = eight {
        // The admission, the departure (a delay and two lanes: another
        // request could go before this one ends), the completion.
        assert_eq!(locks, 3);
    }
}

#[tokio::test(start_paused = true)]
async fn a_scope_busy_at_home_leaves_for_the_joint_shard_once_its_requests_there_are_done() {
    let site = away_from_joint("site");
    let scenario = || busy_at_home_then_named_with_another(&site);
    for shards in [1, 8] {
        let registry = registry(shards, 64, config(1, 100));
        let calls = run(&registry, scenario()).await;
        let expected: Vec<(String, u128)> = [("a", 0), ("b", 1_100), ("both", 1_200), ("c", 1_300)]
            .iter()
            .map(|(path, at)| (format!("{site}/{path}"), *at))
            .collect();
        assert_eq!(ms(&calls), expected, "{shards} shards");
        let stats = registry.stats();
        assert_eq!((stats.scopes_tracked, stats.in_flight, stats.waiting), (2, 0, 0));
        let names: Vec<String> = registry
            .all_scope_stats()
            .iter()
            .map(|scope| scope.scope.to_string())
            .collect();
        assert_eq!(names, ["api".to_owned(), site.clone()]);
    }
}

#[tokio::test(start_paused = true)]
async fn a_hold_on_an_idle_scope_moves_with_it_to_the_joint_shard() {
    let site = away_from_joint("site");
    for shards in [1, 8] {
        let registry = registry(shards, 64, config(1, 0));
        run(
            &registry,
            vec![(0, request(&format!("https://{site}/first"), None))],
        )
        .await;
        registry.hold(site.as_str(), Duration::from_secs(5));
        let calls = run(
            &registry,
            vec![
                (
                    0,
                    request(&format!("https://{site}/both"), Some(&[site.as_str(), "api"])),
                ),
                (10, request(&format!("https://{site}/after"), None)),
            ],
        )
        .await;
        assert_eq!(
            ms(&calls),
            vec![(format!("{site}/both"), 5_000), (format!("{site}/after"), 5_000)],
            "{shards} shards"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_oldest_request_waiting_for_a_global_permit_goes_first_whatever_its_shard() {
    let scenario = || {
        hosts(8)
            .iter()
            .enumerate()
            .map(|(i, host)| (i as u64, request(&format!("https://{host}/?ms=100"), None)))
            .collect::<Vec<_>>()
    };
    for shards in [1, 8] {
        let calls = run(&registry(shards, 1, config(1, 0)), scenario()).await;
        let expected: Vec<(String, u128)> = hosts(8)
            .iter()
            .enumerate()
            .map(|(i, host)| (format!("{host}/"), 100 * i as u128))
            .collect();
        assert_eq!(ms(&calls), expected, "{shards} shards");
    }
}

#[tokio::test(start_paused = true)]
async fn a_scope_the_joint_shard_evicts_belongs_to_its_home_again() {
    let registry = Registry::builder()
        .shards(8)
        .max_concurrency(64)
        .default_scope(config(1, 0))
        .idle_ttl(Duration::from_secs(1))
        .build()
        .unwrap();
    let host = away_from_joint("host");
    let single = format!("https://{host}/x");
    let single = single.as_str();
    // The lock count of a one-scope request of the host's scope.
    let locks_of_one = |registry: Registry| async move {
        let before = registry.debug_lock_count();
        run(&registry, vec![(0, request(single, None))]).await;
        Some(registry.debug_lock_count()? - before?)
    };
    let at_home = locks_of_one(registry.clone()).await;
    run(
        &registry,
        vec![(0, request(single, Some(&[host.as_str(), "group"])))],
    )
    .await;
    let in_the_joint_shard = locks_of_one(registry.clone()).await;
    // Idle past `idle_ttl`; a request of the joint shard evicts the two.
    tokio::time::sleep(Duration::from_secs(2)).await;
    run(
        &registry,
        vec![(
            0,
            request("https://other.example/", Some(&["other.example", "group2"])),
        )],
    )
    .await;
    let back_home = locks_of_one(registry.clone()).await;
    if let (Some(at_home), Some(in_the_joint_shard), Some(back_home)) =
        (at_home, in_the_joint_shard, back_home)
    {
        // The admission takes the home's lock, then the joint shard's.
        assert_eq!(in_the_joint_shard, at_home + 1);
        assert_eq!(back_home, at_home);
    }
    let names: Vec<String> = registry
        .all_scope_stats()
        .iter()
        .map(|scope| scope.scope.to_string())
        .collect();
    let mut expected = vec!["group2".to_owned(), host.clone(), "other.example".to_owned()];
    expected.sort();
    assert_eq!(names, expected);
    assert_eq!(registry.stats().evictions, 2);
}

/// Names `{prefix}{i}.example`, each in a shard of eight of its own
/// (none the joint shard when `away` says so), `count` of them.
fn in_distinct_shards(prefix: &str, count: usize, away: bool) -> Vec<String> {
    let probe = registry(8, 1, config(1, 0));
    let mut taken = Vec::new();
    let mut names = Vec::new();
    for name in (0..).map(|i| format!("{prefix}{i}.example")) {
        let home = probe.debug_home_of(&name);
        if (away && home == 0) || taken.contains(&home) {
            continue;
        }
        taken.push(home);
        names.push(name);
        if names.len() == count {
            return names;
        }
    }
    unreachable!()
}

/// A name `{prefix}{i}.example` whose home among eight shards is `shard`.
fn in_shard(prefix: &str, shard: usize) -> String {
    let probe = registry(8, 1, config(1, 0));
    (0..)
        .map(|i| format!("{prefix}{i}.example"))
        .find(|name| probe.debug_home_of(name) == shard)
        .expect("some name hashes there")
}

/// A registry of eight shards whose idle scopes go after `idle_ttl`, or
/// first past `max_scopes`.
fn evicting(idle_ttl: Duration, max_scopes: usize) -> Registry {
    Registry::builder()
        .shards(8)
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
async fn a_scope_idle_past_idle_ttl_goes_when_requests_arrive_in_another_shard() {
    let registry = evicting(Duration::from_secs(60), 1_000);
    let [old, busy] = <[String; 2]>::try_from(in_distinct_shards("idle", 2, false)).unwrap();
    send(&registry, &old).await;
    // Only `busy`'s shard sees requests from now on.
    tokio::time::sleep(Duration::from_secs(59)).await;
    send(&registry, &busy).await;
    let stats = registry.scope_stats(&old).expect("idle 59 s of 60");
    assert_eq!(stats.idle_for, Some(Duration::from_secs(59)));
    tokio::time::sleep(Duration::from_secs(2)).await;
    send(&registry, &busy).await;
    assert!(registry.scope_stats(&old).is_none(), "idle 61 s of 60");
    let stats = registry.stats();
    assert_eq!((stats.scopes_tracked, stats.evictions), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn requests_ending_on_an_open_word_evict_idle_scopes_of_other_shards() {
    let registry = evicting(Duration::from_secs(60), 1_000);
    let [old, busy] = <[String; 2]>::try_from(in_distinct_shards("word", 2, false)).unwrap();
    send(&registry, &old).await;
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
    assert!(registry.scope_stats(&old).is_some(), "idle 58.9 s of 60");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = registry.debug_lock_count();
    run(&registry, many(20)).await;
    let after = registry.debug_lock_count();
    assert!(registry.scope_stats(&old).is_none(), "idle 60.9 s and more of 60");
    assert_eq!(registry.stats().evictions, 1);
    if let (Some(start_locks), Some(first_locks), Some(before), Some(after)) =
        (start_locks, first_locks, before, after)
    {
        // The first requests open the word; the rest take no lock.
        assert!(first_locks - start_locks < 10, "{}", first_locks - start_locks);
        // The first request to end once the idle scope is due takes its
        // own shard's lock, whose epilogue sweeps the idle scope's shard.
        assert_eq!(after - before, 2);
    }
}

#[tokio::test(start_paused = true)]
async fn past_max_scopes_a_shard_without_idle_scopes_has_the_oldest_of_another_go() {
    let registry = evicting(Duration::from_secs(3_600), 3);
    let names = in_distinct_shards("full", 4, false);
    for name in &names[..3] {
        send(&registry, name).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // The first is used again: the second is now the least recently used.
    send(&registry, &names[0]).await;
    // Made in a shard that holds no idle scope.
    send(&registry, &names[3]).await;
    let tracked: Vec<bool> = names
        .iter()
        .map(|name| registry.scope_stats(name).is_some())
        .collect();
    assert_eq!(tracked, vec![true, false, true, true]);
    let stats = registry.stats();
    assert_eq!((stats.scopes_tracked, stats.evictions), (3, 1));
}

#[tokio::test(start_paused = true)]
async fn past_max_scopes_an_older_idle_scope_of_another_shard_goes_before_one_of_its_own() {
    let registry = evicting(Duration::from_secs(3_600), 3);
    let [older, younger] = <[String; 2]>::try_from(in_distinct_shards("lru", 2, false)).unwrap();
    let neighbour = (0..)
        .map(|i| format!("next{i}.example"))
        .find(|name| registry.debug_home_of(name) == registry.debug_home_of(&younger))
        .unwrap();
    let new = in_shard("new", registry.debug_home_of(&younger));
    assert_ne!(new, neighbour);
    for name in [&older, &younger, &neighbour] {
        send(&registry, name).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Its own shard's oldest idle scope (`younger`) is younger than
    // another shard's (`older`): that one goes.
    send(&registry, &new).await;
    let tracked: Vec<bool> = [&older, &younger, &neighbour, &new]
        .iter()
        .map(|name| registry.scope_stats(name).is_some())
        .collect();
    assert_eq!(tracked, vec![false, true, true, true]);
    assert_eq!(registry.stats().scopes_tracked, 3);
}

#[tokio::test(start_paused = true)]
async fn max_scopes_holds_over_every_shard_when_scopes_are_made_in_many() {
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
async fn a_leaving_scope_counts_the_requests_waiting_for_it_in_the_joint_shard() {
    let site = away_from_joint("leaving");
    let scenario = || busy_at_home_then_named_with_another(&site);
    for shards in [1, 8] {
        let registry = registry(shards, 64, config(1, 100));
        let crawl = {
            let registry = registry.clone();
            let requests = scenario();
            tokio::spawn(async move { run(&registry, requests).await })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        let stats = registry.scope_stats(&site).unwrap();
        assert_eq!(
            (stats.in_flight, stats.queued, stats.idle_for),
            (1, 3, None),
            "{shards} shards"
        );
        assert_eq!(registry.stats().waiting, 3, "{shards} shards");
        // Listed once among every scope, with the same counts.
        let listed: Vec<_> = registry
            .all_scope_stats()
            .into_iter()
            .filter(|scope| scope.scope.as_str() == site)
            .collect();
        assert_eq!(listed, vec![stats], "{shards} shards");
        crawl.await.unwrap();
        let stats = registry.scope_stats(&site).unwrap();
        assert_eq!(
            (stats.in_flight, stats.queued, stats.sent),
            (0, 0, 4),
            "{shards} shards"
        );
    }
}

#[test]
fn shards_must_be_a_power_of_two_up_to_256_and_one_with_a_store() {
    for shards in [0, 3, 12, 512] {
        let error = Registry::builder().shards(shards).build().unwrap_err();
        assert_eq!(error.field(), "shards");
        assert_eq!(error.value(), shards.to_string());
        assert!(error.to_string().contains("power of two"), "{error}");
    }
    for shards in [1, 2, 256] {
        assert!(Registry::builder().shards(shards).build().is_ok());
    }
    let error = Registry::builder()
        .shards(4)
        .store(MemoryStore::new())
        .build()
        .unwrap_err();
    assert_eq!(error.field(), "shards");
    assert!(error.to_string().contains("store"), "{error}");
    assert!(Registry::builder()
        .shards(1)
        .store(MemoryStore::new())
        .build()
        .is_ok());
}
