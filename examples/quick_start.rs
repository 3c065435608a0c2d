//! Crawl pages of several sites at once with reqwest, each site at its own
//! polite pace. `cargo run --example quick_start --features reqwest -- URL...`
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_throttle::redirect::{FailOnLoops, FollowRedirectLayer};
use tower_throttle::reqwest::{HttpClient, ReqwestLayer};
use tower_throttle::{BackoffLayer, Registry, RetryAfterLayer, ScopeConfig, ThrottleLayer, Waited};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // The registry's warnings (a setting that can never take effect, a hold
    // capped) go to `tracing`: this prints them on stderr.
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    let mut urls: Vec<String> = std::env::args().skip(1).collect();
    if urls.is_empty() {
        for page in 1..=4 {
            urls.push(format!("http://quotes.toscrape.com/page/{page}/"));
            urls.push(format!("http://books.toscrape.com/catalogue/page-{page}.html"));
        }
    }
    crawl(urls).await
}

/// Sends every request at once; the throttle decides when each one leaves.
pub async fn crawl(urls: Vec<String>) -> Result<(), BoxError> {
    // One scope per host, each: 1 lane, 500 ms between sends, ±50 % jitter.
    let registry = Registry::builder()
        .default_scope(ScopeConfig::default().delay(Duration::from_millis(500)))
        .build()?;
    // Redirects are followed above the throttle, so each hop waits its turn.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let mut client = ServiceBuilder::new()
        .layer(ReqwestLayer::new()) // reqwest::Request in, reqwest::Response out
        .layer(FollowRedirectLayer::with_policy(FailOnLoops::new(10)))
        .map_err(BoxError::from)
        .layer(ThrottleLayer::new(registry.clone())) // decides when each request goes
        .layer(RetryAfterLayer::new(registry.clone())) // Retry-After, RateLimit: holds the site
        .layer(BackoffLayer::new(registry.clone())) // 429, 5xx, timeouts: slows the site down
        .service(HttpClient::new(http.clone()));

    let start = Instant::now();
    let mut pages = JoinSet::new();
    for url in urls {
        let request = http.get(url).build()?;
        // `ready` takes a place in the queue, so each site's pages go in order.
        let response = client.ready().await?.call(request);
        pages.spawn(response);
    }
    while let Some(response) = pages.join_next().await {
        let response = response??;
        let waited = Waited::from_extensions(response.extensions());
        println!(
            "{:5.2} s  {}  {}  (waited {:.2} s)",
            start.elapsed().as_secs_f64(),
            response.status(),
            response.url(),
            waited.total().as_secs_f64(),
        );
    }
    Ok(())
}
