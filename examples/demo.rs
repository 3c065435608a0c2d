//! The tower-throttle demo: a crawl of four virtual sites, served by a
//! loopback hyper server, through a hyper-util client wrapped in the whole
//! stack (Retry → RobotsDelay → Throttle → RetryAfter → Backoff). Then, per site,
//! when each request was sent and what limited it.
//!
//! ```text
//! cargo run --release --example demo
//! RUST_LOG=tower_throttle=debug cargo run --release --example demo   # every wait, send and adjustment
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
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
use tower::retry::RetryLayer;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::{BackoffLayer, Registry, RetryAfterLayer, RobotsDelayLayer, ScopeConfig, ThrottleLayer};

/// What each virtual site does, and why it is in the demo.
struct Site {
    host: &'static str,
    latency: Duration,
    robots_txt: &'static str,
    /// Every n-th request is answered 429 with `Retry-After: 1`.
    rate_limit_every: Option<u32>,
    note: &'static str,
}

const SITES: [Site; 4] = [
    Site {
        host: "quotes.toscrape.test",
        latency: Duration::from_millis(40),
        robots_txt: "User-agent: *\nDisallow:\n",
        rate_limit_every: None,
        note: "own config: 4 lanes, no delay",
    },
    Site {
        host: "books.toscrape.test",
        latency: Duration::from_millis(20),
        robots_txt: "User-agent: *\nCrawl-delay: 1.5\n",
        rate_limit_every: None,
        note: "robots.txt asks for Crawl-delay 1.5",
    },
    Site {
        host: "api.example.test",
        latency: Duration::from_millis(10),
        robots_txt: "",
        rate_limit_every: Some(5),
        note: "answers 429 + Retry-After: 1 to every 5th request",
    },
    Site {
        host: "slow.example.test",
        latency: Duration::from_millis(300),
        robots_txt: "",
        rate_limit_every: None,
        note: "default config: 1 lane, 500 ms ± 50 %",
    },
];

const PAGES_PER_SITE: usize = 8;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let addr = start_server().await?;
    println!("four virtual sites on http://{addr} (the Host header picks the site)\n");

    let registry = Registry::builder()
        .max_concurrency(16)
        .default_scope(
            ScopeConfig::default()
                .delay(Duration::from_millis(500))
                .delay_per_slot(Duration::ZERO),
        )
        .scope(
            "quotes.toscrape.test",
            ScopeConfig::default()
                .concurrency(4)
                .delay(Duration::ZERO)
                .delay_per_slot(Duration::ZERO),
        )
        .scope(
            "api.example.test",
            ScopeConfig::default()
                .concurrency(2)
                .delay(Duration::from_millis(100))
                .jitter(0.0),
        )
        .build()?;

    let start = Instant::now();
    // Between the layers and the client: records when each request is
    // actually sent, which is what the site experiences.
    let sends: Arc<Mutex<Vec<(String, String, Duration)>>> = Arc::default();
    let record_send = {
        let sends = sends.clone();
        move |request: http::Request<Full<Bytes>>| {
            let host = request.uri().host().unwrap_or_default().to_owned();
            let path = request.uri().path().to_owned();
            sends.lock().unwrap().push((host, path, start.elapsed()));
            request
        }
    };
    let backoff = BackoffLayer::new(registry.clone());
    let client = ServiceBuilder::new()
        // A 429 is re-sent (at most 3 times) through the throttle.
        .layer(RetryLayer::new(backoff.retry_policy(3)))
        .layer(RobotsDelayLayer::new(registry.clone()).user_agent("demo-bot/1.0"))
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(RetryAfterLayer::new(registry.clone()))
        .layer(backoff)
        .map_request(record_send)
        .service(loopback_client());

    let mut crawl = Vec::new();
    for page in 0..PAGES_PER_SITE {
        for site in &SITES {
            let uri = format!("http://{}:{}/page/{page}", site.host, addr.port());
            let request = http::Request::get(uri).body(Full::new(Bytes::new()))?;
            let mut client = client.clone();
            client.ready().await?;
            let response = client.call(request);
            crawl.push(tokio::spawn(async move {
                let response = response.await?;
                let status = response.status();
                response.into_body().collect().await?;
                Ok::<_, BoxError>(status)
            }));
        }
    }
    let mut statuses = Vec::new();
    for task in crawl {
        statuses.push(task.await??);
    }
    let total = start.elapsed();

    let sends = sends.lock().unwrap();
    for site in &SITES {
        let stats = registry.scope_stats(site.host).expect("the site was crawled");
        let sent_at: Vec<String> = sends
            .iter()
            .filter(|(host, ..)| host == site.host)
            .map(|(_, path, at)| {
                let robots = if path == "/robots.txt" { "r" } else { "" };
                format!("{robots}{}", at.as_millis())
            })
            .collect();
        println!("{} ({})", site.host, site.note);
        println!("  sent at [{}] ms   (r = robots.txt)", sent_at.join(", "));
        println!(
            "  now: {} lane(s) ({:?}), delay {} ms ({:?}); backoff feedbacks {}, robots delay {:?}",
            stats.concurrency,
            stats.concurrency_limited_by,
            stats.delay.as_millis(),
            stats.delay_limited_by,
            stats.backoff_feedbacks,
            stats.robots_delay,
        );
    }
    let ok = statuses.iter().filter(|s| s.is_success()).count();
    let retried: u64 = SITES
        .iter()
        .filter_map(|site| registry.scope_stats(site.host))
        .map(|stats| stats.backoff_feedbacks)
        .sum();
    println!(
        "\n{} pages crawled in {:.2} s: {ok} answered 2xx in the end; {retried} 429 answer(s) were retried after the server's Retry-After",
        statuses.len(),
        total.as_secs_f64(),
    );
    Ok(())
}

/// Answers as the site named by the Host header would.
async fn start_server() -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let counters: Arc<Vec<AtomicU32>> = Arc::new(SITES.iter().map(|_| AtomicU32::new(0)).collect());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counters = counters.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                        let counters = counters.clone();
                        async move { Ok::<_, Infallible>(answer(&request, &counters).await) }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

async fn answer(
    request: &http::Request<hyper::body::Incoming>,
    counters: &[AtomicU32],
) -> http::Response<Full<Bytes>> {
    let host = request
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.split(':').next())
        .unwrap_or_default();
    let Some((index, site)) = SITES.iter().enumerate().find(|(_, site)| site.host == host) else {
        return respond(404, "no such site");
    };
    tokio::time::sleep(site.latency).await;
    if request.uri().path() == "/robots.txt" {
        return if site.robots_txt.is_empty() {
            respond(404, "")
        } else {
            respond(200, site.robots_txt)
        };
    }
    let count = counters[index].fetch_add(1, Ordering::SeqCst) + 1;
    if site
        .rate_limit_every
        .is_some_and(|every| count.is_multiple_of(every))
    {
        let mut response = respond(429, "slow down");
        response
            .headers_mut()
            .insert("retry-after", http::HeaderValue::from_static("1"));
        return response;
    }
    respond(200, &format!("{host} {}", request.uri().path()))
}

fn respond(status: u16, body: &str) -> http::Response<Full<Bytes>> {
    let mut response = http::Response::new(Full::new(Bytes::from(body.to_owned())));
    *response.status_mut() = http::StatusCode::from_u16(status).expect("valid status");
    response
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
