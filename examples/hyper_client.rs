//! A hyper-util client through the whole stack (Retry → RobotsDelay →
//! Throttle → RetryAfter → Backoff), against a loopback server started
//! here. Its robots.txt asks for `Crawl-delay: 0.3`, and it answers the
//! first request for page 2 with `503 Service Unavailable`: the scope
//! backs off and the request is re-sent through the throttle.
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
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::time::Instant;
use tower::retry::RetryLayer;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::{BackoffLayer, Registry, RetryAfterLayer, RobotsDelayLayer, ScopeConfig, ThrottleLayer};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let addr = start_server().await?;

    let registry = Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .delay(Duration::from_millis(200))
                .delay_per_slot(Duration::ZERO),
        )
        .build()?;
    let backoff = BackoffLayer::new(registry.clone());
    let mut client = ServiceBuilder::new()
        .layer(RetryLayer::new(backoff.retry_policy(2)))
        .layer(RobotsDelayLayer::new(registry.clone()).user_agent("example-bot/1.0"))
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(RetryAfterLayer::new(registry.clone()))
        .layer(backoff)
        .service(Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>());

    let start = Instant::now();
    let mut pages = Vec::new();
    for page in 0..5 {
        let request = http::Request::get(format!("http://{addr}/page/{page}")).body(Full::default())?;
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

    let stats = registry.scope_stats("127.0.0.1").expect("the site was crawled");
    println!(
        "127.0.0.1: {} sent (robots.txt and one retry included), delay {} ms set by {:?}, {} backoff feedback(s)",
        stats.sent,
        stats.delay.as_millis(),
        stats.delay_limited_by,
        stats.backoff_feedbacks,
    );
    Ok(())
}

/// A small site: robots.txt with a Crawl-delay, pages, and one 503.
async fn start_server() -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let failed_once = Arc::new(AtomicBool::new(false));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let failed_once = failed_once.clone();
            let service = hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                let (status, body) = match request.uri().path() {
                    "/robots.txt" => (200, "User-agent: *\nCrawl-delay: 0.3\n".to_owned()),
                    "/page/2" if !failed_once.swap(true, Ordering::SeqCst) => (503, "busy".to_owned()),
                    path => (200, format!("the page at {path}")),
                };
                let response = http::Response::builder()
                    .status(status)
                    .body(Full::new(Bytes::from(body)));
                async move { Ok::<_, Infallible>(response.expect("a valid response")) }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    Ok(addr)
}
