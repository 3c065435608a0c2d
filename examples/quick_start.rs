//! Crawl pages of several sites with reqwest through a frontier: the sites
//! side by side, each at its own polite pace.
//! `cargo run --example quick_start --features reqwest -- URL...`
use std::time::{Duration, Instant};

use futures::StreamExt;
use tower::{BoxError, ServiceBuilder};
use tower_throttle::frontier::FrontierBuilder;
use tower_throttle::reqwest::HttpClient;
use tower_throttle::{BackoffLayer, Registry, RetryAfterLayer, ScopeConfig, ThrottleLayer};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // The registry's warnings (a setting that can never take effect, a hold
    // capped) go to `tracing`: this prints them on stderr.
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    let mut urls: Vec<String> = std::env::args().skip(1).collect();
    if urls.is_empty() {
        // Site by site, as a crawler finds its links.
        for page in 1..=4 {
            urls.push(format!("http://quotes.toscrape.com/page/{page}/"));
        }
        for page in 1..=4 {
            urls.push(format!("http://books.toscrape.com/catalogue/page-{page}.html"));
        }
    }
    crawl(urls).await
}

/// Pushes every URL into a frontier, which hands the stack each page only
/// when its site may have it, and reads the results as they come.
pub async fn crawl(urls: Vec<String>) -> Result<(), BoxError> {
    // One scope per host, each: 1 lane, 500 ms between sends, ±50 % jitter.
    let registry = Registry::builder()
        .default_scope(ScopeConfig::default().delay(Duration::from_millis(500)))
        .build()?;
    // The frontier follows redirects itself, so each hop waits its turn.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let client = ServiceBuilder::new()
        .map_err(BoxError::from)
        .layer(ThrottleLayer::new(registry.clone())) // decides when each request goes
        .layer(RetryAfterLayer::new(registry.clone())) // Retry-After, RateLimit: holds the site
        .layer(BackoffLayer::new(registry.clone())) // 429, 5xx, timeouts: slows the site down
        .service(HttpClient::new(http));
    // At most 64 pages in the stack at once, none of them waiting there.
    let (frontier, pages) = FrontierBuilder::new(registry).in_flight(64).build(client)?;
    let mut frontier = frontier.follow_redirects(10);

    let start = Instant::now();
    for url in urls {
        // A crawler keeps a handle (it clones) to push the links it finds.
        pages
            .push(http::Request::get(url).body(reqwest::Body::default())?)
            .await?;
    }
    drop(pages); // the stream ends once nothing is pending or in flight
    while let Some((url, response)) = frontier.next().await {
        let response = reqwest::Response::from(response?);
        let status = response.status();
        let page = response.text().await?;
        println!(
            "{:5.2} s  {status}  {url}  ({} bytes)",
            start.elapsed().as_secs_f64(),
            page.len()
        );
    }
    Ok(())
}
