//! The tower-throttle demo: crawls three virtual sites served by a loopback
//! hyper server through a throttled hyper-util client, then prints, per
//! site, when each request was sent and what the registry says about it.
//!
//! ```text
//! cargo run --release --example demo
//! RUST_LOG=tower_throttle=debug cargo run --release --example demo   # every wait and send
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};

/// The sites the demo crawls, each with the latency its server answers with
/// and the throttling config the crawler uses for it.
fn sites() -> Vec<(&'static str, Duration, ScopeConfig)> {
    vec![
        (
            // Scrapy's tutorial site: fast and allowed to be crawled hard.
            "quotes.toscrape.test",
            Duration::from_millis(40),
            ScopeConfig::default()
                .concurrency(4)
                .delay(Duration::ZERO)
                .delay_per_slot(Duration::ZERO),
        ),
        (
            // Two lanes, 250 ms between any two sends, 1 s per lane (the
            // seeds' worked example, scaled).
            "books.toscrape.test",
            Duration::from_millis(20),
            ScopeConfig::default()
                .concurrency(2)
                .delay(Duration::from_millis(250))
                .delay_per_slot(Duration::from_secs(1))
                .jitter(0.0),
        ),
        (
            // No config of its own: the polite defaults (1 lane, 1 s ± 50 %).
            "slow.example.test",
            Duration::from_millis(300),
            ScopeConfig::default(),
        ),
    ]
}

const PAGES_PER_SITE: usize = 8;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let addr = start_server().await?;
    println!("virtual sites served on http://{addr} (the Host header picks the site)\n");

    let mut builder = Registry::builder().max_concurrency(16);
    for (site, _, config) in sites() {
        if site != "slow.example.test" {
            builder = builder.scope(site, config);
        }
    }
    let registry = builder.build()?;
    let start = Instant::now();
    // Between Throttle and the client: records the instant each request is
    // actually sent, which is what the site experiences.
    let sends: Arc<Mutex<Vec<(String, Duration)>>> = Arc::default();
    let record_send = {
        let sends = sends.clone();
        move |request: http::Request<Full<Bytes>>| {
            let host = request.uri().host().unwrap_or_default().to_owned();
            sends.lock().unwrap().push((host, start.elapsed()));
            request
        }
    };
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .map_request(record_send)
        .service(loopback_client());

    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut crawl = Vec::new();
    for page in 0..PAGES_PER_SITE {
        for (site, _, _) in sites() {
            let uri = format!("http://{site}:{}/page/{page}", addr.port());
            let request = http::Request::get(uri).body(Full::new(Bytes::new()))?;
            let mut client = client.clone();
            let log = log.clone();
            client.ready().await?;
            let response = client.call(request);
            crawl.push(tokio::spawn(async move {
                let response = response.await?;
                let status = response.status();
                let body = response.into_body().collect().await?.to_bytes();
                if !status.is_success() {
                    return Err(format!("{site}: {status}").into());
                }
                log.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&body).into_owned());
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            }));
        }
    }
    for task in crawl {
        task.await??;
    }
    let total = start.elapsed();

    let sends = sends.lock().unwrap();
    for (site, _, _) in sites() {
        let stats = registry.scope_stats(site).expect("the site was crawled");
        let sent_at: Vec<String> = sends
            .iter()
            .filter(|(host, _)| host == site)
            .map(|(_, at)| at.as_millis().to_string())
            .collect();
        println!(
            "{site:<22} {} pages, {} lane(s), delay {:>4} ms: sent at [{}] ms",
            stats.sent,
            stats.concurrency,
            stats.delay.as_millis(),
            sent_at.join(", ")
        );
    }
    println!(
        "\ncrawled {} pages in {:.2} s",
        log.lock().unwrap().len(),
        total.as_secs_f64()
    );
    Ok(())
}

/// Answers `<host> <path>` after the latency of the site the Host header
/// names.
async fn start_server() -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(|request: http::Request<hyper::body::Incoming>| async move {
                        let host = request
                            .headers()
                            .get(http::header::HOST)
                            .and_then(|h| h.to_str().ok())
                            .and_then(|h| h.split(':').next())
                            .unwrap_or_default()
                            .to_owned();
                        let latency = sites()
                            .into_iter()
                            .find(|(site, ..)| *site == host)
                            .map_or(Duration::ZERO, |(_, latency, _)| latency);
                        tokio::time::sleep(latency).await;
                        let body = format!("{host} {}", request.uri().path());
                        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(body))))
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// Resolves every host to 127.0.0.1, so the virtual sites need no DNS.
#[derive(Clone)]
struct LoopbackResolver;

impl Service<Name> for LoopbackResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Name) -> Self::Future {
        std::future::ready(Ok(vec![SocketAddr::from(([127, 0, 0, 1], 0))].into_iter()))
    }
}

fn loopback_client() -> Client<HttpConnector<LoopbackResolver>, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new_with_resolver(LoopbackResolver))
}
