//! Every redirect hop is a throttled request in the scope of the host it
//! goes to: tower-http's `FollowRedirectLayer` placed outside
//! `ThrottleLayer` (and `RobotsDelayLayer`). Real hyper servers and
//! hyper-util's client on loopback, real time: counts and lower bounds.

#![cfg(feature = "follow-redirect")]

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use support::{loopback_client, serve_at, text};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_throttle::redirect::{FailOnLoops, FollowRedirectLayer, RedirectError};
use tower_throttle::throttle::ThrottledBody;
use tower_throttle::{Registry, RobotsDelayLayer, ScopeConfig, ThrottleLayer};

/// Arrivals at a site: path and instant.
type Arrivals = Arc<Mutex<Vec<(String, Instant)>>>;

/// A loopback site at `ip` that notes each arrival and answers with
/// `answer(path)`; its address.
fn site(
    ip: [u8; 4],
    arrivals: &Arrivals,
    answer: impl Fn(&str) -> http::Response<Full<Bytes>> + Clone + Send + Sync + 'static,
) -> SocketAddr {
    let log = arrivals.clone();
    serve_at(
        SocketAddr::from((IpAddr::from(ip), 0)),
        move |request: http::Request<hyper::body::Incoming>| {
            let path = request.uri().path().to_owned();
            log.lock().unwrap().push((path.clone(), Instant::now()));
            let response = answer(&path);
            async move { response }
        },
    )
    .unwrap()
}

fn moved_to(location: &str) -> http::Response<Full<Bytes>> {
    http::Response::builder()
        .status(301)
        .header(http::header::LOCATION, location)
        .body(Full::default())
        .unwrap()
}

fn free() -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(5)
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
}

/// FollowRedirect → RobotsDelay → Throttle → hyper-util's client.
fn client(
    registry: &Registry,
) -> impl Service<
    http::Request<Full<Bytes>>,
    Response = http::Response<ThrottledBody<hyper::body::Incoming>>,
    Error = BoxError,
    Future: Send,
> + Clone {
    ServiceBuilder::new()
        .layer(FollowRedirectLayer::with_policy(FailOnLoops::new(5)))
        .map_err(BoxError::from)
        .layer(RobotsDelayLayer::new(registry.clone()).user_agent("test-bot/1.0"))
        .layer(ThrottleLayer::new(registry.clone()))
        .service(loopback_client())
}

/// Site B's delay between sends.
const B_DELAY: Duration = Duration::from_millis(500);

/// What the path may take off a gap at the site: the throttle stamps a
/// departure when it hands the request over, and on a loaded machine the
/// earlier request's bytes may wait a little longer in the client's
/// runtime than the later one's (docs/performance.md, "Departure stamps";
/// the loopback load test allows the same 2 ms). Without the scope, hops
/// would arrive a millisecond apart.
const PATH_SLACK: Duration = Duration::from_millis(2);

/// Every scope free, but site B's: one lane, [`B_DELAY`] between sends.
fn registry_for(b: SocketAddr) -> Registry {
    Registry::builder()
        .max_concurrency(64)
        .default_scope(free())
        .scope(b.ip().to_string(), free().concurrency(1).delay(B_DELAY))
        .build()
        .unwrap()
}

fn get(uri: &str) -> http::Request<Full<Bytes>> {
    http::Request::get(uri).body(Full::default()).unwrap()
}

#[tokio::test]
async fn each_hop_to_another_host_is_admitted_in_that_hosts_scope() {
    let (a_arrivals, b_arrivals) = (Arrivals::default(), Arrivals::default());
    let b = site([127, 0, 0, 221], &b_arrivals, |path| match path {
        "/robots.txt" => text("User-agent: *\nAllow: /\n"),
        _ => text("there"),
    });
    let target = format!("http://{b}/there");
    let a = site([127, 0, 0, 220], &a_arrivals, move |path| match path {
        "/robots.txt" => text("User-agent: *\nAllow: /\n"),
        _ => moved_to(&target),
    });
    let registry = registry_for(b);
    let client = client(&registry);
    let pages = (0..5).map(|page| {
        let client = client.clone();
        let uri = format!("http://{a}/{page}");
        async move {
            let response = client.oneshot(get(&uri)).await.unwrap();
            assert_eq!(response.status(), 200);
            response.into_body().collect().await.unwrap().to_bytes()
        }
    });
    for body in futures::future::join_all(pages).await {
        assert_eq!(body, "there");
    }

    let b_arrivals = b_arrivals.lock().unwrap();
    let robots = b_arrivals
        .iter()
        .filter(|(path, _)| path == "/robots.txt")
        .count();
    assert_eq!(robots, 1, "RobotsDelay saw the hop's origin: {b_arrivals:?}");
    let pages: Vec<Instant> = b_arrivals
        .iter()
        .filter(|(path, _)| path == "/there")
        .map(|(_, at)| *at)
        .collect();
    assert_eq!(pages.len(), 5);
    for pair in pages.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= B_DELAY - PATH_SLACK, "hops arrived {gap:?} apart");
    }
    // Each scope's robots.txt fetch goes through the throttle too.
    assert_eq!(registry.scope_stats(&b.ip().to_string()).unwrap().sent, 5 + 1);
    assert_eq!(registry.scope_stats(&a.ip().to_string()).unwrap().sent, 5 + 1);
}

#[tokio::test]
async fn a_redirect_loop_is_an_error_not_a_hang() {
    let arrivals = Arrivals::default();
    let address = Arc::new(Mutex::new(String::new()));
    let here = address.clone();
    let site_address = site([127, 0, 0, 222], &arrivals, move |path| match path {
        "/robots.txt" => text("User-agent: *\nAllow: /\n"),
        "/a" => moved_to(&format!("http://{}/b", here.lock().unwrap())),
        _ => moved_to(&format!("http://{}/a", here.lock().unwrap())),
    });
    *address.lock().unwrap() = site_address.to_string();
    let registry = Registry::builder().default_scope(free()).build().unwrap();
    let error = tokio::time::timeout(
        Duration::from_secs(10),
        client(&registry).oneshot(get(&format!("http://{site_address}/a"))),
    )
    .await
    .expect("no hang")
    .unwrap_err();
    let error = error.downcast::<RedirectError>().unwrap();
    assert!(matches!(*error, RedirectError::Loop(_)), "{error}");
    assert_eq!(
        registry
            .scope_stats(&site_address.ip().to_string())
            .unwrap()
            .in_flight,
        0
    );
}

#[tokio::test]
async fn a_chain_past_the_limit_is_an_error() {
    let arrivals = Arrivals::default();
    let address = Arc::new(Mutex::new(String::new()));
    let here = address.clone();
    let site_address = site([127, 0, 0, 223], &arrivals, move |path| match path {
        "/robots.txt" => text("User-agent: *\nAllow: /\n"),
        hop => {
            let next: u32 = hop.trim_start_matches('/').parse().unwrap_or(0) + 1;
            moved_to(&format!("http://{}/{next}", here.lock().unwrap()))
        }
    });
    *address.lock().unwrap() = site_address.to_string();
    let registry = Registry::builder().default_scope(free()).build().unwrap();
    let error = client(&registry)
        .oneshot(get(&format!("http://{site_address}/0")))
        .await
        .unwrap_err();
    let error = error.downcast::<RedirectError>().unwrap();
    assert_eq!(*error, RedirectError::TooMany(5));
    // The first request and five hops, each throttled, and robots.txt.
    assert_eq!(
        registry.scope_stats(&site_address.ip().to_string()).unwrap().sent,
        1 + 5 + 1
    );
}

/// Credentials stay with their origin: a hop within a host keeps the
/// request's `Authorization` header; a hop to another host goes without it,
/// and later hops do not get it back (tower-http's own `FilterCredentials`
/// would send it again on the hop within the new host).
#[tokio::test]
async fn credentials_do_not_follow_a_hop_to_another_origin() {
    let seen: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
    let log = seen.clone();
    let b = serve_at(
        SocketAddr::from(([127, 0, 0, 226], 0)),
        move |request: http::Request<hyper::body::Incoming>| {
            let authorized = request.headers().contains_key(http::header::AUTHORIZATION);
            log.lock()
                .unwrap()
                .push((request.uri().path().to_owned(), authorized));
            let response = match request.uri().path() {
                "/robots.txt" => text("User-agent: *\nAllow: /\n"),
                "/start" => moved_to("/same-host"),
                _ => text("there"),
            };
            async move { response }
        },
    )
    .unwrap();
    let target = format!("http://{b}/start");
    let a = site([127, 0, 0, 227], &Arrivals::default(), move |path| match path {
        "/robots.txt" => text("User-agent: *\nAllow: /\n"),
        _ => moved_to(&target),
    });
    let registry = Registry::builder().default_scope(free()).build().unwrap();
    let authorized = |uri: String| {
        let mut request = get(&uri);
        request
            .headers_mut()
            .insert(http::header::AUTHORIZATION, "Bearer secret".parse().unwrap());
        request
    };
    for start in [format!("http://{b}/start"), format!("http://{a}/")] {
        let response = client(&registry).oneshot(authorized(start)).await.unwrap();
        assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "there");
    }
    let seen = seen.lock().unwrap();
    let pages: Vec<_> = seen
        .iter()
        .filter(|(path, _)| path != "/robots.txt")
        .cloned()
        .collect();
    let expected = [
        ("/start", true),
        ("/same-host", true),
        ("/start", false),
        ("/same-host", false),
    ];
    assert_eq!(
        pages,
        expected.map(|(path, authorized)| (path.to_owned(), authorized))
    );
}

/// The same with reqwest: ReqwestLayer → FollowRedirect → Throttle →
/// HttpClient on a client that follows no redirects itself.
#[cfg(feature = "reqwest")]
mod with_reqwest {
    use super::*;
    use tower_throttle::reqwest::{HttpClient, ReqwestLayer};

    /// Site A (127.0.0.224) answers 301 to site B (127.0.0.225), whose
    /// scope has 500 ms; B's arrivals.
    fn a_to_b() -> (SocketAddr, SocketAddr, Arrivals) {
        let (a_arrivals, b_arrivals) = (Arrivals::default(), Arrivals::default());
        let b = site([127, 0, 0, 225], &b_arrivals, |_| text("there"));
        let target = format!("http://{b}/there");
        let a = site([127, 0, 0, 224], &a_arrivals, move |_| moved_to(&target));
        (a, b, b_arrivals)
    }

    #[tokio::test]
    async fn each_hop_is_admitted_in_the_scope_of_the_host_it_goes_to() {
        let (a, b, b_arrivals) = a_to_b();
        let registry = registry_for(b);
        let http = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let client = ServiceBuilder::new()
            .layer(ReqwestLayer::new())
            .layer(FollowRedirectLayer::with_policy(FailOnLoops::new(5)))
            .map_err(BoxError::from)
            .layer(ThrottleLayer::new(registry.clone()))
            .service(HttpClient::new(http.clone()));
        let pages = (0..5).map(|page| {
            let client = client.clone();
            let request = http.get(format!("http://{a}/{page}")).build().unwrap();
            async move {
                let response = client.oneshot(request).await.unwrap();
                assert_eq!(response.status(), 200);
                response.text().await.unwrap()
            }
        });
        for body in futures::future::join_all(pages).await {
            assert_eq!(body, "there");
        }
        let arrivals: Vec<Instant> = b_arrivals.lock().unwrap().iter().map(|(_, at)| *at).collect();
        assert_eq!(arrivals.len(), 5);
        for pair in arrivals.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(gap >= B_DELAY - PATH_SLACK, "hops arrived {gap:?} apart");
        }
        assert_eq!(registry.scope_stats(&b.ip().to_string()).unwrap().sent, 5);
    }

    /// What goes wrong with a client that follows redirects itself
    /// (reqwest's default): the hops reach B inside one call, and B's
    /// scope never admits one.
    #[tokio::test]
    async fn a_client_that_follows_redirects_itself_bypasses_the_throttle() {
        let (a, b, b_arrivals) = a_to_b();
        let registry = registry_for(b);
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let client = ServiceBuilder::new()
            .layer(ReqwestLayer::new())
            .layer(ThrottleLayer::new(registry.clone()))
            .service(HttpClient::new(http.clone()));
        for page in 0..2 {
            let request = http.get(format!("http://{a}/{page}")).build().unwrap();
            let response = client.clone().oneshot(request).await.unwrap();
            assert_eq!(response.text().await.unwrap(), "there");
        }
        assert_eq!(b_arrivals.lock().unwrap().len(), 2);
        assert!(
            registry.scope_stats(&b.ip().to_string()).is_none(),
            "B's scope admitted nothing"
        );
    }
}
