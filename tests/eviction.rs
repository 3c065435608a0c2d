//! Idle-scope eviction: memory follows the active scopes, never at the cost
//! of a limit still in force. Paused virtual time, in-process services.

mod support;

use std::convert::Infallible;
use std::time::Duration;

use support::{get, Recorder};
#[cfg(feature = "robots")]
use support::{robots_txt, RobotsSite};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::registry::{AutoThrottleConfig, Feedback};
#[cfg(feature = "robots")]
use tower_throttle::RobotsDelayLayer;
use tower_throttle::{Registry, ScopeConfig, Scopes, ThrottleLayer};

fn secs(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn free() -> ScopeConfig {
    ScopeConfig::default()
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
}

async fn send<S, B>(service: &mut S, uri: &str)
where
    S: Service<http::Request<()>, Response = http::Response<B>, Error = Infallible>,
    B: Send + 'static,
{
    service.ready().await.unwrap().call(get(uri)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn scopes_idle_for_idle_ttl_are_evicted_as_requests_arrive() {
    let registry = Registry::builder()
        .default_scope(free())
        .idle_ttl(secs(60))
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
    send(&mut service, "https://old.example/").await;
    tokio::time::sleep(secs(59)).await;
    send(&mut service, "https://new.example/").await;
    assert!(registry.scope_stats("old.example").is_some(), "idle 59 s of 60");
    assert_eq!(
        registry.scope_stats("old.example").unwrap().idle_for,
        Some(secs(59))
    );
    tokio::time::sleep(secs(2)).await;
    send(&mut service, "https://newer.example/").await;
    assert!(registry.scope_stats("old.example").is_none(), "idle 61 s of 60");
    let stats = registry.stats();
    assert_eq!((stats.scopes_tracked, stats.evictions), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn past_max_scopes_the_least_recently_used_idle_scope_goes_first() {
    let registry = Registry::builder()
        .default_scope(free())
        .max_scopes(3)
        .build()
        .unwrap();
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
    for host in ["a", "b", "c"] {
        send(&mut service, &format!("https://{host}.example/")).await;
        tokio::time::sleep(secs(1)).await;
    }
    // `a` is used again: `b` is now the least recently used.
    send(&mut service, "https://a.example/").await;
    send(&mut service, "https://d.example/").await;
    let tracked: Vec<bool> = ["a", "b", "c", "d"]
        .iter()
        .map(|host| registry.scope_stats(&format!("{host}.example")).is_some())
        .collect();
    assert_eq!(tracked, vec![true, false, true, true]);
}

#[tokio::test(start_paused = true)]
async fn scopes_under_backoff_or_hold_are_not_evicted() {
    let registry = Registry::builder()
        .default_scope(free())
        .max_scopes(10)
        .idle_ttl(secs(1))
        .build()
        .unwrap();
    registry.feedback(&Scopes::from("backing-off.example"), Feedback::backoff());
    registry.hold("held.example", secs(120));
    let recorder = Recorder::new();
    let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
    for i in 0..100 {
        send(&mut service, &format!("https://site{i}.example/")).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(registry.stats().scopes_tracked <= 10);
    assert_eq!(
        registry.scope_stats("backing-off.example").unwrap().backoff_level,
        1
    );
    assert!(registry.scope_stats("held.example").unwrap().held_for.is_some());
    // Once the hold is over it goes like any idle scope.
    tokio::time::sleep(secs(120)).await;
    send(&mut service, "https://late.example/").await;
    send(&mut service, "https://later.example/").await;
    assert!(registry.scope_stats("held.example").is_none());
}

#[tokio::test(start_paused = true)]
async fn a_scope_created_again_starts_from_its_configured_limits() {
    let autothrottle = AutoThrottleConfig::default().start_delay(secs(5));
    let registry = Registry::builder()
        .default_scope(free().autothrottle(autothrottle))
        .idle_ttl(secs(60))
        .build()
        .unwrap();
    let recorder = Recorder::new();
    // Answers take 10 s: AutoThrottle raises the delay towards 10 s.
    let mut service = ThrottleLayer::new(registry.clone()).layer(recorder.service(secs(10)));
    send(&mut service, "https://slow.example/").await;
    let learnt = registry.scope_stats("slow.example").unwrap();
    assert_eq!(learnt.autothrottle_delay, Some(Duration::from_millis(10_000)));
    tokio::time::sleep(secs(61)).await;
    let mut other = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
    send(&mut other, "https://other.example/").await;
    assert!(registry.scope_stats("slow.example").is_none());
    let mut fresh = ThrottleLayer::new(registry.clone()).layer(recorder.service(Duration::ZERO));
    send(&mut fresh, "https://slow.example/").await;
    let again = registry.scope_stats("slow.example").unwrap();
    assert_eq!(again.sent, 1);
    // Back at the start delay, then one instant answer's adjustment.
    assert!(again.autothrottle_delay.unwrap() <= secs(5), "{again:?}");
}

#[cfg(feature = "robots")]
#[tokio::test(start_paused = true)]
async fn an_evicted_scopes_robots_crawl_delay_applies_when_it_comes_back() {
    let registry = Registry::builder()
        .default_scope(free().concurrency(4))
        .idle_ttl(secs(60))
        .build()
        .unwrap();
    let site = RobotsSite::new();
    let layer = RobotsDelayLayer::new(registry.clone()).cache_ttl(secs(120));
    let client = tower::ServiceBuilder::new()
        .layer(layer)
        .layer(ThrottleLayer::new(registry.clone()))
        .service(site.service(|_, _| robots_txt("User-agent: *\nCrawl-delay: 5\n")));
    let fetch = |uri: &'static str| client.clone().oneshot(get(uri));
    fetch("https://a.example/1").await.unwrap();
    assert_eq!(
        registry.scope_stats("a.example").unwrap().robots_delay,
        Some(secs(5))
    );
    // Idle past idle_ttl, but its robots.txt entry is valid until 120 s:
    // kept, or the cache (which tells each scope once) could not tell it again.
    tokio::time::sleep(secs(90)).await;
    fetch("https://b.example/1").await.unwrap();
    assert_eq!(
        registry.scope_stats("a.example").unwrap().robots_delay,
        Some(secs(5))
    );
    // Past the entry's expiry it goes.
    tokio::time::sleep(secs(110)).await;
    fetch("https://c.example/1").await.unwrap();
    assert!(registry.scope_stats("a.example").is_none());
    // It comes back: robots.txt is fetched again and the delay applies.
    fetch("https://a.example/2").await.unwrap();
    let back = registry.scope_stats("a.example").unwrap();
    assert_eq!(back.robots_delay, Some(secs(5)));
    assert_eq!(back.delay, secs(5));
    let a_fetches = site
        .fetches
        .sent()
        .iter()
        .filter(|fetch| fetch.host == "a.example")
        .count();
    assert_eq!(a_fetches, 2);
}

#[test]
fn eviction_settings_are_checked() {
    let zero_scopes = Registry::builder().max_scopes(0).build().unwrap_err();
    assert_eq!(zero_scopes.field(), "max_scopes");
    let zero_ttl = Registry::builder().idle_ttl(Duration::ZERO).build().unwrap_err();
    assert_eq!(zero_ttl.field(), "idle_ttl");
}
