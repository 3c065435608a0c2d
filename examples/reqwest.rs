//! A `reqwest::Client` through the whole stack (Retry → RobotsDelay →
//! Throttle → RetryAfter → Backoff), crawling two virtual sites that a
//! loopback server started here plays: one whose robots.txt asks for a
//! Crawl-delay, one API that answers every 4th request 429 with
//! `Retry-After: 1`. Requests and responses stay reqwest's own types.
//!
//! ```text
//! cargo run --example reqwest --features reqwest
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use tokio::time::Instant;
use tower::retry::RetryLayer;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::reqwest::{HttpClient, ReqwestLayer};
use tower_throttle::{BackoffLayer, Registry, RetryAfterLayer, RobotsDelayLayer, ScopeConfig, ThrottleLayer};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SITES: [&str; 2] = ["books.toscrape.test", "api.example.test"];

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
    let addr = start_server().await?;
    // Your reqwest client, as you build it today (here: every virtual
    // site resolves to the loopback server).
    let http = reqwest::Client::builder()
        .no_proxy()
        // Redirects are followed through the stack, never inside the
        // client, where no scope would admit them.
        .redirect(reqwest::redirect::Policy::none())
        .resolve(SITES[0], addr)
        .resolve(SITES[1], addr)
        .build()?;

    let registry = Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .delay(Duration::from_millis(200))
                .delay_per_slot(Duration::ZERO),
        )
        .scope(
            "api.example.test",
            ScopeConfig::default()
                .concurrency(2)
                .delay(Duration::from_millis(50))
                .delay_per_slot(Duration::ZERO),
        )
        .build()?;
    let backoff = BackoffLayer::new(registry.clone());
    let mut client = ServiceBuilder::new()
        .layer(ReqwestLayer::new()) // reqwest::Request in, reqwest::Response out
        .layer(RetryLayer::new(backoff.retry_policy(3)))
        .layer(RobotsDelayLayer::new(registry.clone()).user_agent("example-bot/1.0"))
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(RetryAfterLayer::new(registry.clone()))
        .layer(backoff)
        .service(HttpClient::new(http.clone()));

    let start = Instant::now();
    let mut crawl = tokio::task::JoinSet::new();
    for page in 0..6 {
        for site in SITES {
            let request = http
                .get(format!("http://{site}:{}/page/{page}", addr.port()))
                .build()?;
            // Readied and called in this order, so each site is crawled
            // first come, first served; the responses arrive concurrently.
            let response = client.ready().await?.call(request);
            crawl.spawn(async move {
                let response: reqwest::Response = response.await?;
                let line = format!(
                    "{:>6} ms  {}  {}",
                    start.elapsed().as_millis(),
                    response.status(),
                    response.url()
                );
                Ok::<_, BoxError>(line)
            });
        }
    }
    while let Some(done) = crawl.join_next().await {
        println!("{}", done??);
    }

    for site in SITES {
        let stats = registry.scope_stats(site).expect("the site was crawled");
        println!(
            "{site}: {} sent, delay {} ms set by {:?}, {} backoff feedback(s)",
            stats.sent,
            stats.delay.as_millis(),
            stats.delay_limited_by,
            stats.backoff_feedbacks,
        );
    }
    Ok(())
}

/// Plays both sites; the `Host` header says which one is asked.
async fn start_server() -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let api_calls = Arc::new(AtomicU32::new(0));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let api_calls = api_calls.clone();
            let service = hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                let answer = answer(&request, &api_calls);
                async move { Ok::<_, Infallible>(answer) }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
            );
        }
    });
    Ok(addr)
}

fn answer(
    request: &http::Request<hyper::body::Incoming>,
    api_calls: &AtomicU32,
) -> http::Response<Full<Bytes>> {
    let host = request.headers()[http::header::HOST].to_str().unwrap_or_default();
    let robots = request.uri().path() == "/robots.txt";
    let response = http::Response::builder();
    let response = match (host.split(':').next(), robots) {
        (Some("books.toscrape.test"), true) => response.body("User-agent: *\nCrawl-delay: 0.5\n"),
        (_, true) => response.status(404).body(""),
        (Some("api.example.test"), false) if api_calls.fetch_add(1, Ordering::SeqCst) % 4 == 3 => {
            response.status(429).header("retry-after", "1").body("slow down")
        }
        (_, false) => response.body("a page"),
    };
    response
        .expect("a valid response")
        .map(|body| Full::new(Bytes::from(body)))
}
