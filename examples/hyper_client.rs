//! A hyper-util client through the whole stack (Retry → IpScope →
//! RobotsDelay → Throttle → RetryAfter → Backoff → PinServer), over https,
//! against a loopback server started here with a certificate made here
//! (rcgen) for `localhost`. Its robots.txt asks for `Crawl-delay: 0.3`, and
//! it answers the first request for page 2 with `503 Service Unavailable`:
//! the scope backs off and the request is re-sent through the throttle.
//!
//! The client is the one a crawler of the real web would build: rustls
//! (here trusting the test certificate; webpki-roots or the system's roots
//! for the web) around `PinnedConnector`, so every request connects to the
//! address its IP scope was throttled for, with the name's certificate.
//!
//! ```text
//! cargo run --example hyper_client
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::time::Instant;
use tower::retry::RetryLayer;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::connect::{PinServerLayer, PinnedConnector};
use tower_throttle::departure::{DepartureStampLayer, StampedBody, StampingConnector};
use tower_throttle::ip::{FixedResolver, IpScopeLayer};
use tower_throttle::{BackoffLayer, Registry, RetryAfterLayer, RobotsDelayLayer, ScopeConfig, ThrottleLayer};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The client of this example: rustls over stamping, pinned connections.
type HttpsClient = Client<
    hyper_rustls::HttpsConnector<StampingConnector<PinnedConnector<HttpConnector>>>,
    StampedBody<Full<Bytes>>,
>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // Warnings (a setting that can never take effect, a hold capped) go to
    // `tracing`: print them on stderr (RUST_LOG=debug shows more).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::builder()
                .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
                .from_env_lossy(),
        )
        .with_writer(std::io::stderr)
        .init();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])?;
    let addr = start_server(&certified).await?;

    let registry = Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .delay(Duration::from_millis(200))
                .delay_per_slot(Duration::ZERO),
        )
        .build()?;
    // The site is on loopback: `localhost` is pinned to it here. A crawler
    // of the web keeps the default, the system's resolver.
    let resolver = FixedResolver::new();
    resolver.set("localhost", [addr.ip()]);
    let backoff = BackoffLayer::new(registry.clone());
    let mut client = ServiceBuilder::new()
        .layer(RetryLayer::new(backoff.retry_policy(2)))
        .layer(
            IpScopeLayer::builder(registry.clone())
                .resolver(resolver)
                .build()?,
        )
        .layer(RobotsDelayLayer::new(registry.clone()).user_agent("example-bot/1.0"))
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(RetryAfterLayer::new(registry.clone()))
        .layer(backoff)
        .layer(PinServerLayer::new())
        // Innermost: a send departs when the socket write of its head
        // returns (the encrypted bytes), not when the client takes it.
        .layer(DepartureStampLayer::new().at_socket_write())
        .service(https_client(certified.cert.der().clone())?);

    let start = Instant::now();
    let mut pages = Vec::new();
    for page in 0..5 {
        let request = http::Request::get(format!("https://localhost:{}/page/{page}", addr.port()))
            .body(Full::default())?;
        // Ready, then call: the throttle takes requests in this order.
        let response = client.ready().await?.call(request);
        pages.push(tokio::spawn(async move {
            let response = response.await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            let body = String::from_utf8_lossy(&body);
            println!("{:>5} ms  {status}  {body}", start.elapsed().as_millis());
            Ok::<_, BoxError>(())
        }));
    }
    for page in pages {
        page.await??;
    }

    for scope in ["localhost", "ip:127.0.0.1"] {
        let stats = registry.scope_stats(scope).expect("the site was crawled");
        println!(
            "{scope}: {} sent (robots.txt and one retry included), delay {} ms set by {:?}, {} backoff feedback(s)",
            stats.sent,
            stats.delay.as_millis(),
            stats.delay_limited_by,
            stats.backoff_feedbacks,
        );
    }
    Ok(())
}

/// An https (and http) client that trusts `certificate`, connects to
/// each request's pinned server address, and stamps each request's
/// departure when the socket write of its head returns (under TLS).
fn https_client(certificate: rustls_pki_types::CertificateDer<'static>) -> Result<HttpsClient, BoxError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certificate)?;
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(StampingConnector::new(PinnedConnector::new(http)));
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}

/// A small https site: robots.txt with a Crawl-delay, pages, and one 503.
async fn start_server(certified: &rcgen::CertifiedKey) -> Result<SocketAddr, BoxError> {
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(certified.key_pair.serialize_der().into());
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let failed_once = Arc::new(AtomicBool::new(false));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, failed_once) = (acceptor.clone(), failed_once.clone());
            // The handshake on the connection's own task, so a slow one
            // holds up no other.
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let service =
                    hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                        let (status, body) = match request.uri().path() {
                            "/robots.txt" => (200, "User-agent: *\nCrawl-delay: 0.3\n".to_owned()),
                            "/page/2" if !failed_once.swap(true, Ordering::SeqCst) => {
                                (503, "busy".to_owned())
                            }
                            path => (200, format!("the page at {path}")),
                        };
                        let response = http::Response::builder()
                            .status(status)
                            .body(Full::new(Bytes::from(body)));
                        async move { Ok::<_, Infallible>(response.expect("a valid response")) }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}
