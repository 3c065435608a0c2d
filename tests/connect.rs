//! Issue 23: the connection goes to the address the request was throttled
//! for, through a real hyper-util client, to real loopback servers (one per
//! 127.0.0.x address, on one port), over http and https.
//!
//! The names (`site.test`) resolve nowhere but in the tests' fixed map, so
//! a request that reaches a server got there by the pinned address.
#![allow(missing_docs)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_throttle::connect::{PinServerLayer, PinnedConnector};
use tower_throttle::ip::{FixedResolver, IpScopeLayer};
use tower_throttle::{Registry, ThrottleLayer};

const FIRST: [u8; 4] = [127, 0, 0, 2];
const SECOND: [u8; 4] = [127, 0, 0, 3];

/// Each server answers with its own name and the `Host` it was sent.
fn answer_as(
    name: &'static str,
) -> impl Fn(http::Request<hyper::body::Incoming>) -> std::future::Ready<http::Response<Full<Bytes>>> + Clone
{
    move |request| {
        let host = request
            .headers()
            .get(http::header::HOST)
            .and_then(|host| host.to_str().ok())
            .unwrap_or("")
            .to_owned();
        std::future::ready(support::text(format!("{name} {host}")))
    }
}

/// Servers `first` on 127.0.0.2 and `second` on 127.0.0.3, on one port
/// (which the URI carries, so only the address tells them apart).
fn two_servers_on_one_port() -> u16 {
    for _ in 0..50 {
        let first = support::serve_at(SocketAddr::from((FIRST, 0)), answer_as("first")).unwrap();
        if support::serve_at(SocketAddr::from((SECOND, first.port())), answer_as("second")).is_ok() {
            return first.port();
        }
    }
    panic!("no port free on both 127.0.0.2 and 127.0.0.3");
}

/// The registry, and the layer that resolves through `resolver`, asking it
/// again for every request (no cache), so a change shows at once.
fn ip_scopes(resolver: &FixedResolver) -> (Registry, IpScopeLayer) {
    let registry = Registry::builder().build().unwrap();
    let layer = IpScopeLayer::builder(registry.clone())
        .resolver(resolver.clone())
        .cache_ttl(std::time::Duration::ZERO)
        .build()
        .unwrap();
    (registry, layer)
}

/// Sends GET `uri` through `client`; the body.
async fn body_of<S, B>(client: &mut S, uri: &str) -> Result<String, BoxError>
where
    S: Service<http::Request<Full<Bytes>>, Response = http::Response<B>>,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
    S::Error: Into<BoxError>,
{
    let request = http::Request::get(uri).body(Full::new(Bytes::new())).unwrap();
    let response = client
        .ready()
        .await
        .map_err(Into::into)?
        .call(request)
        .await
        .map_err(Into::into)?;
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Ok(String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn a_changed_resolution_connects_to_the_address_the_scope_was_throttled_for() {
    let port = two_servers_on_one_port();
    let resolver = FixedResolver::new();
    resolver.set("site.test", [FIRST]);
    let (registry, ip_layer) = ip_scopes(&resolver);
    let connector = PinnedConnector::new(HttpConnector::new());
    let mut client = ServiceBuilder::new()
        .layer(ip_layer)
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(PinServerLayer::new())
        .service(Client::builder(TokioExecutor::new()).build(connector));
    let uri = format!("http://site.test:{port}/");

    let host = format!("site.test:{port}");
    assert_eq!(body_of(&mut client, &uri).await.unwrap(), format!("first {host}"));
    // The record changes; the connection kept alive to the first server
    // must not carry a request throttled for the second.
    resolver.set("site.test", [SECOND]);
    assert_eq!(
        body_of(&mut client, &uri).await.unwrap(),
        format!("second {host}")
    );
    resolver.set("site.test", [FIRST]);
    assert_eq!(body_of(&mut client, &uri).await.unwrap(), format!("first {host}"));

    let sent = |scope: &str| registry.scope_stats(scope).map(|stats| stats.sent);
    assert_eq!(sent("ip:127.0.0.2"), Some(2));
    assert_eq!(sent("ip:127.0.0.3"), Some(1));
    assert_eq!(sent("site.test"), Some(3));
}

/// The same crawl without the connector: the client's own resolution
/// (here, always the first server) decides, whatever was throttled. This
/// is what the test above would see if pinning did not work.
#[tokio::test]
async fn without_the_connector_the_clients_own_resolution_decides() {
    let port = two_servers_on_one_port();
    let resolver = FixedResolver::new();
    resolver.set("site.test", [SECOND]);
    let (registry, ip_layer) = ip_scopes(&resolver);
    let always_first = tower::service_fn(|_name: hyper_util::client::legacy::connect::dns::Name| {
        std::future::ready(Ok::<_, std::io::Error>(
            vec![SocketAddr::from((FIRST, 0))].into_iter(),
        ))
    });
    let mut client = ServiceBuilder::new()
        .layer(ip_layer)
        .layer(ThrottleLayer::new(registry.clone()))
        .service(Client::builder(TokioExecutor::new()).build(HttpConnector::new_with_resolver(always_first)));
    let answer = body_of(&mut client, &format!("http://site.test:{port}/"))
        .await
        .unwrap();
    assert!(
        answer.starts_with("first"),
        "throttled for 127.0.0.3, sent to {answer}"
    );
    assert_eq!(registry.scope_stats("ip:127.0.0.3").unwrap().sent, 1);
}

/// A loopback https server on 127.0.0.2 with a certificate made here for
/// `site.test` (rcgen); its port and the certificate.
async fn https_site() -> (u16, rustls_pki_types::CertificateDer<'static>) {
    let (address, certificate, _) = support::tls::serve_https(
        SocketAddr::from((FIRST, 0)),
        "site.test",
        |server_name, _request| support::text(format!("tls for {server_name}")),
    )
    .await;
    (address.port(), certificate)
}

#[tokio::test]
async fn https_checks_the_names_certificate_on_the_pinned_address() {
    let (port, certificate) = https_site().await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certificate).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .wrap_connector(PinnedConnector::new(http));
    // Two names on the server; its certificate is for one of them.
    let resolver = FixedResolver::new();
    resolver.set("site.test", [FIRST]);
    resolver.set("other.test", [FIRST]);
    let (registry, ip_layer) = ip_scopes(&resolver);
    let mut client = ServiceBuilder::new()
        .layer(ip_layer)
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(tower_throttle::BackoffLayer::new(registry.clone()))
        .layer(PinServerLayer::new())
        .service(Client::builder(TokioExecutor::new()).build(connector));

    // The server name the client sent is the name, not the address.
    let answer = body_of(&mut client, &format!("https://site.test:{port}/"))
        .await
        .unwrap();
    assert_eq!(answer, "tls for site.test");

    // The same server under a name its certificate does not cover: a
    // connection error (the certificate), not a response, not a panic.
    let error = body_of(&mut client, &format!("https://other.test:{port}/"))
        .await
        .expect_err("the certificate is not for other.test");
    let chain = error_chain(&*error);
    assert!(chain.contains("certificate"), "{chain}");
    assert_eq!(registry.scope_stats("ip:127.0.0.2").unwrap().sent, 2);
    // Backoff feedback, as a refused connection is.
    let feedbacks = |scope: &str| registry.scope_stats(scope).unwrap().backoff_feedbacks;
    assert_eq!(feedbacks("other.test"), 1);
    assert_eq!(feedbacks("site.test"), 0);
}

/// An error and its sources, one line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut words = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        words.push_str(": ");
        words.push_str(&cause.to_string());
        source = cause.source();
    }
    words
}

#[tokio::test]
async fn a_request_without_a_server_address_is_resolved_as_usual_and_loses_its_userinfo() {
    let server = support::serve(answer_as("plain")).await;
    let mut client = ServiceBuilder::new()
        .layer(PinServerLayer::new())
        .service(Client::builder(TokioExecutor::new()).build(PinnedConnector::new(HttpConnector::new())));
    let port = server.port();
    let answer = body_of(&mut client, &format!("http://localhost:{port}/"))
        .await
        .unwrap();
    assert_eq!(answer, format!("plain localhost:{port}"));
    // Userinfo from elsewhere (a crawled link) names no address to dial:
    // nothing listens on 127.0.0.9, and the request still reaches the site.
    let answer = body_of(&mut client, &format!("http://127.0.0.9@localhost:{port}/"))
        .await
        .unwrap();
    assert_eq!(answer, format!("plain localhost:{port}"));
}

/// RobotsDelay's own fetch of robots.txt goes where the pages go: it
/// carries the server address of the page that asked for it.
#[cfg(feature = "robots")]
#[tokio::test]
async fn the_robots_txt_fetch_connects_to_the_pages_server() {
    let paths = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = paths.clone();
    let server = support::serve_at(
        SocketAddr::from((FIRST, 0)),
        move |request: http::Request<hyper::body::Incoming>| {
            seen.lock().unwrap().push(request.uri().path().to_owned());
            std::future::ready(support::text("User-agent: *\nAllow: /\n"))
        },
    )
    .unwrap();
    let resolver = FixedResolver::new();
    resolver.set("site.test", [FIRST]);
    let (registry, ip_layer) = ip_scopes(&resolver);
    let mut client = ServiceBuilder::new()
        .layer(ip_layer)
        .layer(tower_throttle::RobotsDelayLayer::new(registry.clone()))
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(PinServerLayer::new())
        .service(Client::builder(TokioExecutor::new()).build(PinnedConnector::new(HttpConnector::new())));
    body_of(&mut client, &format!("http://site.test:{}/page", server.port()))
        .await
        .unwrap();
    // The name resolves nowhere else: a fetch that missed the address
    // would have failed to connect, and the server would see the page alone.
    assert_eq!(*paths.lock().unwrap(), ["/robots.txt", "/page"]);
}
