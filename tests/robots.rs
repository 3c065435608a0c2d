//! RobotsDelay in front of Throttle.
//!
//! Every test but the last runs in paused virtual time with an in-process
//! site (`support::RobotsSite`, a `tower::service_fn`), so the instants it
//! asserts are exact. The last one talks to a real hyper server over
//! loopback in real time, and asserts counts, order and lower bounds only.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_throttle::throttle::ThrottledBody;

use futures::future::join_all;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use support::{
    after, endless_body, get, loopback_client, redirect, robots_txt, serve, status, text, RobotsSite,
    TestBody,
};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::registry::LimitSource;
use tower_throttle::{Priority, Registry, RobotsDelayLayer, ScopeConfig, Scopes, ThrottleLayer};

fn secs(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

/// Four lanes, no delay, no jitter: what a scope does without robots.txt,
/// and exact instants.
fn fast_scope() -> ScopeConfig {
    ScopeConfig::default()
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
        .concurrency(4)
}

fn registry() -> Registry {
    Registry::builder().default_scope(fast_scope()).build().unwrap()
}

/// RobotsDelay → Throttle → the site, as the module docs recommend.
fn client<F>(
    registry: &Registry,
    layer: RobotsDelayLayer,
    site: &RobotsSite,
    robots: F,
) -> impl Service<
    http::Request<()>,
    Response = http::Response<ThrottledBody<TestBody>>,
    Error = tower_throttle::Error,
    Future = impl Send,
> + Clone
       + Send
       + 'static
where
    F: Fn(&http::Request<()>, usize) -> http::Response<TestBody> + Send + Sync + 'static,
{
    ServiceBuilder::new()
        .layer(layer)
        .layer(ThrottleLayer::new(registry.clone()))
        .service(site.service(robots))
}

/// What a request to the throttled client gave, its body unwrapped (so
/// its lanes are free: the test bodies are in memory).
type Outcome = Result<http::Response<TestBody>, tower_throttle::Error>;

/// What the throttled client answers.
type Answer = Result<http::Response<ThrottledBody<TestBody>>, tower_throttle::Error>;

/// Sends every request at once, each on a task of its own.
fn send_all<S>(client: &S, uris: &[&str]) -> Vec<tokio::task::JoinHandle<Outcome>>
where
    S: Service<
            http::Request<()>,
            Response = http::Response<ThrottledBody<TestBody>>,
            Error = tower_throttle::Error,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    uris.iter()
        .map(|uri| tokio::spawn(support::at_head(client.clone().oneshot(get(uri)))))
        .collect()
}

async fn outcomes(handles: Vec<tokio::task::JoinHandle<Outcome>>) -> Vec<Outcome> {
    join_all(handles)
        .await
        .into_iter()
        .map(|joined| joined.unwrap())
        .collect()
}

async fn send_ok<S>(client: &S, uris: &[&str])
where
    S: Service<
            http::Request<()>,
            Response = http::Response<ThrottledBody<TestBody>>,
            Error = tower_throttle::Error,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    for outcome in outcomes(send_all(client, uris)).await {
        outcome.unwrap();
    }
}

/// Sleeps until `at` after `start` (virtual time).
async fn until(start: Instant, at: Duration) {
    tokio::time::sleep_until(start + at).await;
}

const PAGES: [&str; 4] = [
    "https://example.com/1",
    "https://example.com/2",
    "https://example.com/3",
    "https://example.com/4",
];

#[tokio::test(start_paused = true)]
async fn crawl_delay_3_sends_one_request_at_a_time_3_s_apart() {
    let registry = registry();
    let site = RobotsSite::new();
    let layer = RobotsDelayLayer::new(registry.clone()).user_agent("mybot/1.0");
    // Our group, not `*`, decides.
    let client = client(&registry, layer, &site, |_, _| {
        robots_txt("User-agent: *\nCrawl-delay: 10\n\nUser-agent: MyBot\nCrawl-delay: 3\n")
    });
    send_ok(&client, &PAGES).await;
    assert_eq!(site.fetches.millis(), vec![0]);
    // The fetch was the scope's first send; Crawl-delay counts from it.
    assert_eq!(site.pages.millis(), vec![3000, 6000, 9000, 12000]);
    let stats = registry.scope_stats("example.com").unwrap();
    assert_eq!(stats.robots_delay, Some(secs(3)));
    assert!(stats.robots_delay_applies);
    assert_eq!(
        (stats.delay, stats.delay_limited_by),
        (secs(3), LimitSource::Robots)
    );
    assert_eq!(
        (stats.concurrency, stats.concurrency_limited_by),
        (1, LimitSource::Robots)
    );
}

#[tokio::test(start_paused = true)]
async fn crawl_delay_above_max_delay_is_capped_at_max_delay() {
    let registry = registry();
    let site = RobotsSite::new();
    let layer = RobotsDelayLayer::new(registry.clone()).max_delay(secs(2));
    let client = client(&registry, layer, &site, |_, _| {
        robots_txt("User-agent: *\nCrawl-delay: 30\n")
    });
    send_ok(&client, &PAGES[..3]).await;
    assert_eq!(site.pages.millis(), vec![2000, 4000, 6000]);
    assert_eq!(
        registry.scope_stats("example.com").unwrap().robots_delay,
        Some(secs(2))
    );
}

#[tokio::test(start_paused = true)]
async fn robots_txt_404_keeps_the_configured_limits_and_allows_everything() {
    let registry = registry();
    let site = RobotsSite::new();
    let layer = RobotsDelayLayer::new(registry.clone()).obey(true);
    let client = client(&registry, layer, &site, |_, _| status(404));
    send_ok(
        &client,
        &[
            "https://example.com/1",
            "https://example.com/private",
            "https://example.com/3",
            "https://example.com/4",
        ],
    )
    .await;
    assert_eq!(site.pages.millis(), vec![0, 0, 0, 0]);
    let stats = registry.scope_stats("example.com").unwrap();
    assert_eq!(stats.robots_delay, None);
    assert_eq!(
        (stats.concurrency, stats.concurrency_limited_by),
        (4, LimitSource::Config)
    );
    // Cached: later requests do not fetch again.
    send_ok(&client, &["https://example.com/5"]).await;
    assert_eq!(site.fetches.millis(), vec![0]);
}

#[tokio::test(start_paused = true)]
async fn robots_txt_503_lets_the_crawl_proceed_and_is_retried_with_doubling_backoff() {
    let start = Instant::now();
    let registry = registry();
    let site = RobotsSite::new();
    let client = client(
        &registry,
        RobotsDelayLayer::new(registry.clone()),
        &site,
        |_, _| status(503),
    );

    send_ok(&client, &PAGES).await;
    assert_eq!(site.pages.millis(), vec![0, 0, 0, 0]);
    assert_eq!(registry.scope_stats("example.com").unwrap().robots_delay, None);

    // The first retry waits one minute, the second two more.
    for (at, fetches) in [(30, 1), (61, 2), (120, 2), (180, 2), (182, 3), (420, 3), (422, 4)] {
        until(start, secs(at)).await;
        send_ok(&client, &["https://example.com/again"]).await;
        assert_eq!(site.fetches.sent().len(), fetches, "fetches after {at} s");
    }
    assert_eq!(site.fetches.millis(), vec![0, 61_000, 182_000, 422_000]);
    // Every page went at once, configured limits only.
    assert_eq!(
        site.pages.millis()[4..],
        [30_000, 61_000, 120_000, 180_000, 182_000, 420_000, 422_000]
    );
}

#[tokio::test(start_paused = true)]
async fn obeying_an_unreachable_robots_txt_disallows_everything_until_a_retry_succeeds() {
    let start = Instant::now();
    let registry = registry();
    let site = RobotsSite::new();
    let layer = RobotsDelayLayer::new(registry.clone()).obey(true);
    let client = client(&registry, layer, &site, |_, before| {
        if before == 0 {
            status(503)
        } else {
            robots_txt("User-agent: *\nCrawl-delay: 1\nDisallow: /private\n")
        }
    });

    for outcome in outcomes(send_all(&client, &PAGES)).await {
        let err = outcome.unwrap_err();
        assert!(err.is_robots_disallowed());
        assert!(!err.is_inner());
    }
    until(start, secs(30)).await;
    let err = client
        .clone()
        .oneshot(get("https://example.com/1"))
        .await
        .unwrap_err();
    assert!(err.is_robots_disallowed());
    assert_eq!(
        err.to_string(),
        "robots.txt of https://example.com is unreachable, so /1 is disallowed until it can be fetched"
    );
    assert!(site.pages.sent().is_empty());

    // The retry is due: this request waits for it, and it succeeds.
    until(start, secs(60)).await;
    send_ok(&client, &["https://example.com/1"]).await;
    assert_eq!(site.fetches.millis(), vec![0, 60_000]);
    assert_eq!(site.pages.millis(), vec![61_000]);
    let err = client
        .clone()
        .oneshot(get("https://example.com/private"))
        .await
        .unwrap_err();
    assert!(err.is_robots_disallowed());
    assert_eq!(
        err.to_string(),
        "robots.txt of https://example.com disallows /private"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hundred_concurrent_first_requests_cause_exactly_one_fetch() {
    let start = Instant::now();
    let registry = registry();
    let site = RobotsSite::new();
    let client = client(
        &registry,
        RobotsDelayLayer::new(registry.clone()),
        &site,
        |request, _| {
            let robots = robots_txt("User-agent: *\nDisallow:\n");
            match request.uri().host() {
                Some("example.com") => after(secs(1), robots),
                _ => robots,
            }
        },
    );
    let uris: Vec<String> = (0..100).map(|i| format!("https://example.com/{i}")).collect();
    let uris: Vec<&str> = uris.iter().map(String::as_str).collect();
    let handles = send_all(&client, &uris);
    while site.fetches.sent().is_empty() {
        tokio::task::yield_now().await;
    }
    // example.com's fetch is in flight; another origin is not held up by it.
    client
        .clone()
        .oneshot(get("https://other.example/"))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    for outcome in outcomes(handles).await {
        outcome.unwrap();
    }
    let fetched: Vec<String> = site.fetches.sent().into_iter().map(|sent| sent.host).collect();
    assert_eq!(fetched, vec!["example.com", "other.example"]);
    assert_eq!(site.fetches.millis(), vec![0, 0]);
    let example: Vec<u128> = site
        .pages
        .sent()
        .iter()
        .filter(|sent| sent.host == "example.com")
        .map(|sent| sent.at.as_millis())
        .collect();
    assert_eq!(example, vec![1000; 100]);
}

#[tokio::test(start_paused = true)]
async fn a_robots_txt_that_never_finishes_times_out_and_releases_the_origin() {
    let registry = registry();
    let site = RobotsSite::new();
    let layer = RobotsDelayLayer::new(registry.clone()).fetch_timeout(secs(10));
    let client = client(
        &registry,
        layer,
        &site,
        |_, _| http::Response::new(endless_body()),
    );
    send_ok(&client, &PAGES[..3]).await;
    assert_eq!(site.fetches.millis(), vec![0]);
    assert_eq!(site.pages.millis(), vec![10_000, 10_000, 10_000]);
    assert_eq!(registry.scope_stats("example.com").unwrap().robots_delay, None);
}

#[tokio::test(start_paused = true)]
async fn an_explicit_scope_config_keeps_its_limits() {
    let explicit = ScopeConfig::default()
        .concurrency(2)
        .delay(Duration::from_millis(500))
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0);
    let registry = Registry::builder()
        .default_scope(fast_scope())
        .scope("example.com", explicit)
        .build()
        .unwrap();
    let site = RobotsSite::new();
    let client = client(
        &registry,
        RobotsDelayLayer::new(registry.clone()),
        &site,
        |_, _| robots_txt("User-agent: *\nCrawl-delay: 3\n"),
    );
    send_ok(&client, &PAGES[..3]).await;
    assert_eq!(site.pages.millis(), vec![500, 1000, 1500]);
    let stats = registry.scope_stats("example.com").unwrap();
    assert_eq!(stats.robots_delay, Some(secs(3)));
    assert!(!stats.robots_delay_applies);
    assert_eq!(
        (stats.delay, stats.delay_limited_by),
        (Duration::from_millis(500), LimitSource::Config)
    );
}

#[tokio::test(start_paused = true)]
async fn obeyed_disallow_fails_private_paths_without_sending_them() {
    let registry = registry();
    let site = RobotsSite::new();
    let layer = RobotsDelayLayer::new(registry.clone()).obey(true);
    let client = client(&registry, layer, &site, |_, _| {
        robots_txt("User-agent: *\nDisallow: /private\n")
    });
    // The first waits for the fetch, the others find the rules cached.
    for (uri, allowed) in [
        ("https://example.com/private/x", false),
        ("https://example.com/public", true),
        ("https://example.com/private/y?z=1", false),
        ("https://example.com/robots.txt", true),
    ] {
        let outcome = client.clone().oneshot(get(uri)).await;
        match outcome {
            Ok(_) => assert!(allowed, "{uri} was sent"),
            Err(err) => {
                assert!(!allowed, "{uri} failed");
                assert!(err.is_robots_disallowed());
                assert!(std::error::Error::source(&err).is_none());
            }
        }
    }
    assert_eq!(site.page_paths(), vec!["/public"]);
    // Only our fetch and the user's own /robots.txt request reach the site.
    assert_eq!(site.fetch_paths(), vec!["/robots.txt", "/robots.txt"]);
    assert_eq!(registry.scope_stats("example.com").unwrap().sent, 3);
}

#[tokio::test(start_paused = true)]
async fn a_redirected_robots_txt_applies_to_the_original_origin() {
    let registry = registry();
    let site = RobotsSite::new();
    let client = client(
        &registry,
        RobotsDelayLayer::new(registry.clone()),
        &site,
        |request, _| match request.uri().path() {
            "/robots.txt" => redirect(301, "/real-robots.txt"),
            _ => robots_txt("User-agent: *\nCrawl-delay: 2\n"),
        },
    );
    send_ok(&client, &PAGES[..2]).await;
    assert_eq!(site.fetch_paths(), vec!["/robots.txt", "/real-robots.txt"]);
    assert_eq!(site.pages.millis(), vec![2000, 4000]);
    assert_eq!(
        registry.scope_stats("example.com").unwrap().robots_delay,
        Some(secs(2))
    );
}

#[tokio::test(start_paused = true)]
async fn a_robots_txt_redirected_to_another_host_applies_to_the_original_origin() {
    let registry = registry();
    let site = RobotsSite::new();
    let client = client(
        &registry,
        RobotsDelayLayer::new(registry.clone()),
        &site,
        |request, _| match request.uri().host() {
            Some("example.com") => redirect(308, "https://www.example.com/robots.txt"),
            _ => robots_txt("User-agent: *\nCrawl-delay: 2\n"),
        },
    );
    send_ok(&client, &PAGES[..2]).await;
    let hosts: Vec<String> = site.fetches.sent().into_iter().map(|sent| sent.host).collect();
    assert_eq!(hosts, vec!["example.com", "www.example.com"]);
    assert_eq!(
        registry.scope_stats("example.com").unwrap().robots_delay,
        Some(secs(2))
    );
    assert_eq!(
        registry.scope_stats("www.example.com").unwrap().robots_delay,
        None
    );
}

#[tokio::test(start_paused = true)]
async fn a_redirect_loop_stops_after_five_redirects_and_allows_everything() {
    let registry = registry();
    let site = RobotsSite::new();
    let layer = RobotsDelayLayer::new(registry.clone()).obey(true);
    let client = client(&registry, layer, &site, |_, _| redirect(302, "/robots.txt"));
    send_ok(&client, &["https://example.com/private", "https://example.com/2"]).await;
    // The first request and five redirects; the sixth redirect is not
    // followed, and the file counts as unavailable (like a 404).
    assert_eq!(site.fetches.sent().len(), 6);
    assert_eq!(site.pages.millis(), vec![0, 0]);
    assert_eq!(registry.scope_stats("example.com").unwrap().robots_delay, None);
}

#[tokio::test(start_paused = true)]
async fn dropping_every_waiting_request_leaves_the_fetch_running_for_the_next_one() {
    let start = Instant::now();
    let registry = registry();
    let site = RobotsSite::new();
    let client = client(
        &registry,
        RobotsDelayLayer::new(registry.clone()),
        &site,
        |_, _| after(secs(5), robots_txt("User-agent: *\nCrawl-delay: 1\n")),
    );
    let waiting = send_all(&client, &PAGES);
    until(start, secs(1)).await;
    for handle in &waiting {
        handle.abort();
    }
    for outcome in join_all(waiting).await {
        assert!(outcome.unwrap_err().is_cancelled());
    }
    until(start, secs(10)).await;
    send_ok(
        &client,
        &["https://example.com/later", "https://example.com/later2"],
    )
    .await;
    // The fetch finished at 5 s on its own; the later requests use it.
    assert_eq!(site.fetches.millis(), vec![0]);
    assert_eq!(site.pages.millis(), vec![10_000, 11_000]);
    assert_eq!(site.page_paths(), vec!["/later", "/later2"]);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_waiters_of_a_fetch_that_times_out_does_not_poison_the_origin() {
    let start = Instant::now();
    let registry = registry();
    let site = RobotsSite::new();
    let client = client(
        &registry,
        RobotsDelayLayer::new(registry.clone()),
        &site,
        |_, before| {
            if before == 0 {
                http::Response::new(endless_body())
            } else {
                robots_txt("User-agent: *\nCrawl-delay: 1\n")
            }
        },
    );
    let waiting = send_all(&client, &PAGES);
    until(start, secs(1)).await;
    for handle in &waiting {
        handle.abort();
    }
    until(start, secs(11)).await;
    // Unreachable at 10 s: no Crawl-delay, the page goes at once.
    send_ok(&client, &["https://example.com/a"]).await;
    assert_eq!(site.pages.millis(), vec![11_000]);
    // The retry after a minute reads the file.
    until(start, secs(70)).await;
    send_ok(&client, &["https://example.com/b", "https://example.com/c"]).await;
    assert_eq!(site.fetches.millis(), vec![0, 70_000]);
    assert_eq!(site.pages.millis(), vec![11_000, 71_000, 72_000]);
}

#[tokio::test(start_paused = true)]
async fn the_cache_expires_after_its_ttl() {
    let start = Instant::now();
    let registry = registry();
    let site = RobotsSite::new();
    let layer = RobotsDelayLayer::new(registry.clone()).cache_ttl(secs(3600));
    let client = client(&registry, layer, &site, |_, before| {
        robots_txt(if before == 0 {
            "User-agent: *\nCrawl-delay: 2\n"
        } else {
            "User-agent: *\n"
        })
    });
    send_ok(&client, &["https://example.com/1"]).await;
    until(start, secs(3000)).await;
    send_ok(&client, &["https://example.com/2"]).await;
    assert_eq!(site.fetches.millis(), vec![0]);
    assert_eq!(
        registry.scope_stats("example.com").unwrap().robots_delay,
        Some(secs(2))
    );
    until(start, secs(3600)).await;
    send_ok(&client, &["https://example.com/3", "https://example.com/4"]).await;
    assert_eq!(site.fetches.millis(), vec![0, 3_600_000]);
    // The new file has no Crawl-delay: the scope is back to its config.
    assert_eq!(registry.scope_stats("example.com").unwrap().robots_delay, None);
    assert_eq!(site.pages.millis(), vec![2000, 3_000_000, 3_600_000, 3_600_000]);
}

#[tokio::test(start_paused = true)]
async fn an_endless_robots_txt_is_read_up_to_the_bound_and_no_further() {
    let registry = registry();
    let site = RobotsSite::new();
    let layer = RobotsDelayLayer::new(registry.clone()).max_body_bytes(64 * 1024);
    let client = client(&registry, layer, &site, |_, _| {
        let head = futures::stream::once(async { Bytes::from("User-agent: *\nCrawl-delay: 2\n") });
        let comments = futures::stream::repeat(Bytes::from("# no end in sight\n"));
        let frames = head
            .chain(comments)
            .map(|chunk| Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(chunk)));
        http::Response::new(BodyExt::boxed(http_body_util::StreamBody::new(frames)))
    });
    send_ok(&client, &PAGES[..2]).await;
    assert_eq!(site.pages.millis(), vec![2000, 4000]);
}

#[tokio::test(start_paused = true)]
async fn each_origin_is_fetched_once_and_origin_form_requests_pass_through() {
    let registry = registry();
    let site = RobotsSite::new();
    let client = client(
        &registry,
        RobotsDelayLayer::new(registry.clone()),
        &site,
        |_, _| status(404),
    );
    send_ok(
        &client,
        &[
            "https://example.com/a",
            "https://EXAMPLE.com:443/b",
            "http://example.com/c",
            "http://example.com:8080/d",
            "/origin-form",
        ],
    )
    .await;
    let fetched: Vec<String> = site.fetches.sent().into_iter().map(|sent| sent.path).collect();
    assert_eq!(fetched.len(), 3, "one fetch per (scheme, host, port)");
    assert_eq!(site.pages.sent().len(), 5);
}

#[tokio::test(start_paused = true)]
async fn the_fetch_carries_the_user_agent_the_scopes_and_a_top_priority() {
    let registry = registry();
    let site = RobotsSite::new();
    // (User-Agent, Priority, Scopes) of each fetch.
    type Seen = (Option<String>, Option<Priority>, Option<Scopes>);
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let log = seen.clone();
    let inner_registry = registry.clone();
    let layer = RobotsDelayLayer::new(registry.clone()).user_agent("mybot/1.0");
    let client = client(&registry, layer, &site, move |request, _| {
        log.lock().unwrap().push((
            request
                .headers()
                .get(http::header::USER_AGENT)
                .map(|value| value.to_str().unwrap().to_owned()),
            request.extensions().get::<Priority>().copied(),
            // The scopes an inner layer reports to.
            Some(inner_registry.scopes_of(request)),
        ));
        status(404)
    });
    send_ok(&client, &["https://a.example/"]).await;
    let mut request = get("https://b.example/");
    request.headers_mut().insert(
        http::header::USER_AGENT,
        "Mozilla/5.0 (compatible; MyBot/2.1)".parse().unwrap(),
    );
    request.extensions_mut().insert(Scopes::from("crawl"));
    client.clone().oneshot(request).await.unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].0.as_deref(), Some("mybot/1.0"));
    assert_eq!(seen[0].1, Some(Priority(i32::MAX)));
    assert_eq!(seen[0].2, Some(Scopes::from("a.example")));
    assert_eq!(seen[1].0.as_deref(), Some("Mozilla/5.0 (compatible; MyBot/2.1)"));
    assert_eq!(seen[1].2, Some(Scopes::from("crawl")));
}

#[tokio::test(start_paused = true)]
async fn waiting_requests_hold_no_readiness_of_the_inner_service() {
    // A fixed-scope Throttle admits in `poll_ready`. A request waiting for
    // robots.txt that kept the admission of the handle it was called on
    // would hold the scope's only lane, which the fetch needs.
    let registry = Registry::builder()
        .default_scope(fast_scope().concurrency(1))
        .build()
        .unwrap();
    let site = RobotsSite::new();
    let mut client = ServiceBuilder::new()
        .layer(RobotsDelayLayer::new(registry.clone()))
        .layer(ThrottleLayer::new(registry.clone()).fixed_scope("example.com"))
        .service(site.service(|_, _| robots_txt("User-agent: *\nCrawl-delay: 2\n")));
    // One long-lived handle, readied before each call.
    let mut handles = Vec::new();
    for uri in &PAGES[..2] {
        client.ready().await.unwrap();
        handles.push(tokio::spawn(support::at_head(client.call(get(uri)))));
    }
    let all = tokio::time::timeout(secs(60), outcomes(handles)).await;
    for outcome in all.expect("the fetch never got the lane") {
        outcome.unwrap();
    }
    assert_eq!(site.fetches.millis(), vec![0]);
    assert_eq!(site.pages.millis(), vec![2000, 4000]);
    drop(client);
}

/// Real hyper server, real hyper-util client, real time: counts, order and
/// lower bounds only.
#[tokio::test]
async fn loopback_crawl_delay_spaces_page_arrivals_and_fetches_robots_txt_once() {
    let arrivals: Arc<Mutex<Vec<(String, std::time::Instant)>>> = Arc::default();
    let log = arrivals.clone();
    let addr = serve(move |request: http::Request<hyper::body::Incoming>| {
        let path = request.uri().path().to_owned();
        log.lock()
            .unwrap()
            .push((path.clone(), std::time::Instant::now()));
        async move {
            if path == "/robots.txt" {
                text("User-agent: *\nCrawl-delay: 0.2\n")
            } else {
                text(path)
            }
        }
    })
    .await;
    let registry = registry();
    let client = ServiceBuilder::new()
        .layer(RobotsDelayLayer::new(registry.clone()).user_agent("mybot/1.0"))
        .layer(ThrottleLayer::new(registry.clone()))
        .service(loopback_client());
    let handles: Vec<_> = (1..=3)
        .map(|i| {
            let request = http::Request::get(format!("http://site.test:{}/page{i}", addr.port()))
                .body(Full::<Bytes>::default())
                .unwrap();
            let client = client.clone();
            tokio::spawn(async move {
                let response = client.oneshot(request).await.unwrap();
                response.into_body().collect().await.unwrap().to_bytes()
            })
        })
        .collect();
    let mut bodies: Vec<String> = Vec::new();
    for handle in handles {
        bodies.push(String::from_utf8(handle.await.unwrap().to_vec()).unwrap());
    }
    bodies.sort();
    assert_eq!(bodies, ["/page1", "/page2", "/page3"]);

    let arrivals = arrivals.lock().unwrap();
    let paths: Vec<&str> = arrivals.iter().map(|(path, _)| path.as_str()).collect();
    assert_eq!(paths.iter().filter(|path| **path == "/robots.txt").count(), 1);
    assert_eq!(paths[0], "/robots.txt");
    let pages: Vec<std::time::Instant> = arrivals[1..].iter().map(|(_, at)| *at).collect();
    assert_eq!(pages.len(), 3);
    for pair in pages.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= Duration::from_millis(200), "pages arrived {gap:?} apart");
    }
    assert_eq!(
        registry.scope_stats("site.test").unwrap().robots_delay,
        Some(Duration::from_millis(200))
    );
}

#[tokio::test(start_paused = true)]
async fn extreme_settings_neither_panic_nor_stall() {
    let registry = registry();
    let site = RobotsSite::new();
    let layer = RobotsDelayLayer::new(registry.clone())
        .max_delay(Duration::MAX)
        .cache_ttl(Duration::ZERO)
        .fetch_timeout(Duration::MAX)
        .max_body_bytes(0)
        .user_agent("");
    let client = client(&registry, layer, &site, |_, _| {
        robots_txt("User-agent: *\nCrawl-delay: 1e300\n")
    });
    send_ok(&client, &PAGES[..2]).await;
    // A zero-byte bound reads nothing, so no Crawl-delay is known.
    assert_eq!(registry.scope_stats("example.com").unwrap().robots_delay, None);

    let registry = registry_with_huge_crawl_delay().await;
    let stats = registry.scope_stats("example.com").unwrap();
    assert_eq!(stats.robots_delay, Some(Duration::MAX));
}

/// A Crawl-delay too large for a Duration, with no cap: the delay saturates
/// and the scope still answers stats; nothing panics.
async fn registry_with_huge_crawl_delay() -> Registry {
    let registry = registry();
    let site = RobotsSite::new();
    let layer = RobotsDelayLayer::new(registry.clone()).max_delay(Duration::MAX);
    let client = client(&registry, layer, &site, |_, _| {
        robots_txt("User-agent: *\nCrawl-delay: 1e300\n")
    });
    send_ok(&client, &PAGES[..1]).await;
    registry
}

/// One lane and no delay behind RobotsDelay → Throttle, the robots.txt
/// answered after `robots_after`: the order pages reach the site is the
/// order they left the throttle's queue.
fn one_lane_site(
    robots_after: Duration,
) -> (
    Registry,
    RobotsSite,
    impl Service<
            http::Request<()>,
            Response = http::Response<ThrottledBody<TestBody>>,
            Error = tower_throttle::Error,
            Future = impl std::future::Future<Output = Answer> + Send + 'static,
        > + Clone,
) {
    let registry = Registry::builder()
        .default_scope(fast_scope().concurrency(1))
        .build()
        .unwrap();
    let site = RobotsSite::new();
    let client = ServiceBuilder::new()
        .layer(RobotsDelayLayer::new(registry.clone()))
        .layer(ThrottleLayer::new(registry.clone()))
        .service(site.service(move |_, _| after(robots_after, robots_txt("User-agent: *\nDisallow:\n"))));
    (registry, site, client)
}

/// Calls `client` for page `i` of example.com, each call made before the
/// next, and runs its response future on a task of its own.
async fn call_page<S>(client: &S, i: usize) -> tokio::task::JoinHandle<Outcome>
where
    S: Service<
            http::Request<()>,
            Response = http::Response<ThrottledBody<TestBody>>,
            Error = tower_throttle::Error,
        > + Clone,
    S::Future: std::future::Future<Output = Answer> + Send + 'static,
{
    let mut client = client.clone();
    let request = get(&format!("https://example.com/{i}"));
    tokio::spawn(support::at_head(client.ready().await.unwrap().call(request)))
}

/// Requests that waited for an origin's robots.txt go on in the order they
/// came, whatever order the runtime wakes them in: on a multi-threaded
/// runtime tokio runs the most recently woken task first, which without a
/// turnstile let the last waiter overtake the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_for_robots_txt_go_on_in_the_order_they_came() {
    let (_registry, site, client) = one_lane_site(Duration::from_millis(50));
    let mut handles = Vec::new();
    for i in 0..20 {
        handles.push(call_page(&client, i).await);
    }
    for outcome in outcomes(handles).await {
        outcome.unwrap();
    }
    let paths: Vec<String> = (0..20).map(|i| format!("/{i}")).collect();
    assert_eq!(site.page_paths(), paths);
}

/// A waiter that goes away gives its turn up: the ones after it are not
/// held, and still go in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_dropped_before_its_turn_holds_up_nobody() {
    let (registry, site, client) = one_lane_site(Duration::from_millis(500));
    let mut kept = Vec::new();
    let mut handles = Vec::new();
    for i in 0..20 {
        let handle = call_page(&client, i).await;
        if i % 3 == 0 {
            handle.abort();
        } else {
            kept.push(format!("/{i}"));
            handles.push(handle);
        }
    }
    for outcome in outcomes(handles).await {
        outcome.unwrap();
    }
    assert_eq!(site.page_paths(), kept);
    assert_eq!(registry.stats().waiting, 0);
}

/// Issue 25: a page that waited for its origin's robots.txt says so on its
/// response (`Waited`): the fetch's time as `Robots`, then what the scope
/// held it for, in the order they came.
#[tokio::test(start_paused = true)]
async fn a_page_that_waited_for_robots_txt_says_so_on_its_response() {
    use tower_throttle::waited::{WaitCause, Waited};
    let registry = registry();
    let site = RobotsSite::new();
    let layer = RobotsDelayLayer::new(registry.clone());
    // The fetch goes at 0 and is answered at 500 ms. The scope was cold:
    // its second gap counts from the first answer, so the page goes 3 s
    // after the fetch's answer.
    let client = client(&registry, layer, &site, |_, _| {
        after(
            Duration::from_millis(500),
            robots_txt("User-agent: *\nCrawl-delay: 3\n"),
        )
    });
    let response = client.oneshot(get(PAGES[0])).await.unwrap();
    assert_eq!(site.pages.millis(), vec![3500]);
    let waited = Waited::from_extensions(response.extensions());
    assert_eq!(
        waited.causes().collect::<Vec<_>>(),
        [
            (
                WaitCause::Robots,
                Some(LimitSource::Robots),
                Duration::from_millis(500)
            ),
            (WaitCause::Delay, Some(LimitSource::Robots), secs(3)),
        ]
    );
    assert_eq!(waited.total(), Duration::from_millis(3500));
}
