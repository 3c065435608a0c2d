//! The seeds' cost-capped scraping API: an API that charges each call
//! differently (here: 1 unit, 5 with JavaScript rendering), and a budget of
//! at most 20 units per 2-second window.
//!
//! Every call gets two scopes from the resolver: the API host (its own
//! concurrency and delay) and `cost`, whose expected cost is estimated from
//! the URL (`render=true` costs 5). The `cost` scope has a quota of 20 per
//! window, so a call waits while its estimate does not fit what is left of
//! the window. The API reports what each call really cost in
//! `X-Actual-Cost` (rendering is cheaper than estimated on small pages), and
//! `BackoffLayer::actual_cost_header` corrects the window with it, so the
//! budget is spent on what was really charged.
//!
//! The API is a loopback hyper server that records what it charged and
//! when. At the end the example prints the charges per window twice: by
//! the instants the calls left the throttle (the windows the quota runs
//! on), and by the instants the API received them (each shifted by its
//! path lag: a server's windows never line up exactly with a client's, so
//! leave a margin below a hard budget, or feed the server's remaining
//! quota back with `RetryAfterLayer::remaining_quota`). It exits non-zero
//! if a client window was charged more than the budget.
//!
//! ```text
//! cargo run --release --example cost_capped
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::scope::RequestHead;
use tower_throttle::{BackoffLayer, Registry, ScopeConfig, Scopes, ThrottleLayer};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const BUDGET: f64 = 20.0;
const WINDOW: Duration = Duration::from_secs(2);
const CALLS: usize = 24;

/// What a call is expected to cost, from its URL alone.
fn estimate_cost(uri: &http::Uri) -> f64 {
    if uri.query().is_some_and(|query| query.contains("render=true")) {
        5.0
    } else {
        1.0
    }
}

/// What the API really charges: rendering costs 3 on small pages.
fn actual_cost(uri: &http::Uri) -> f64 {
    let small = uri.query().is_some_and(|query| query.contains("size=small"));
    match (estimate_cost(uri), small) {
        (cost, true) if cost > 1.0 => 3.0,
        (cost, _) => cost,
    }
}

/// The API scope plus the `cost` scope with this call's estimate.
fn scopes_of(head: &RequestHead<'_>) -> Scopes {
    let host = head.host().unwrap_or_default().into_owned();
    Scopes::with_costs([(host, 1.0), ("cost".to_owned(), estimate_cost(head.uri))])
}

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
    let charges: Arc<Mutex<Vec<(Instant, f64)>>> = Arc::default();
    let addr = start_api(charges.clone()).await?;
    let registry = Registry::builder()
        .max_concurrency(8)
        .resolver(scopes_of)
        .default_scope(
            ScopeConfig::default()
                .concurrency(4)
                .delay(Duration::from_millis(20))
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .scope(
            "cost",
            ScopeConfig::default()
                .quota(BUDGET)
                .window(WINDOW)
                .concurrency(8)
                .delay(Duration::ZERO)
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()?;
    // What each call will be charged, stamped when it leaves the throttle:
    // the quota's windows run on these instants.
    let sends: Arc<Mutex<Vec<(Instant, f64)>>> = Arc::default();
    let record_send = {
        let sends = sends.clone();
        move |request: http::Request<Full<Bytes>>| {
            sends
                .lock()
                .unwrap()
                .push((Instant::now(), actual_cost(request.uri())));
            request
        }
    };
    let client = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()))
        .layer(
            BackoffLayer::new(registry.clone())
                .actual_cost_header(http::HeaderName::from_static("x-actual-cost")),
        )
        .map_request(record_send)
        .service(Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>());

    println!("budget: {BUDGET} units per {WINDOW:?} on scope `cost`; {CALLS} calls, every third rendered\n");
    let start = Instant::now();
    let calls = (0..CALLS).map(|i| {
        let render = if i % 3 == 0 { "&render=true" } else { "" };
        let size = if i % 2 == 0 { "&size=small" } else { "" };
        let uri = format!("http://{addr}/?url=https://site.example/page/{i}{render}{size}");
        let client = client.clone();
        async move {
            let request = http::Request::get(uri.as_str()).body(Full::default())?;
            let estimate = estimate_cost(request.uri());
            let response = client.oneshot(request).await?;
            let charged = response.headers()["x-actual-cost"].to_str()?.to_owned();
            Ok::<_, BoxError>((i, estimate, charged, start.elapsed()))
        }
    });
    for result in futures::future::join_all(calls).await {
        let (i, estimate, charged, done) = result?;
        println!(
            "call {i:>2}: estimated {estimate:>3}, charged {charged:>3}, answered at {:>6.2} s",
            done.as_secs_f64()
        );
    }

    let stats = registry.scope_stats("cost").expect("the cost scope was used");
    let quota = stats.quota.expect("the cost scope has a quota");
    println!(
        "\nscope `cost` now: {:.1} of {:.1} units used, {:.1} left, window resets in {:?}",
        quota.used, quota.quota, quota.remaining, quota.resets_in
    );
    let overspent = report_windows(
        "sent per window (the client's windows, which the quota runs on)",
        &sends.lock().unwrap(),
    );
    // Not judged: the API's first window starts when the first call
    // arrives, after its connection was set up, so the windows shift.
    report_windows(
        "charged per window as the API saw it (arrivals: shifted from the sends by each call's path lag; not judged)",
        &charges.lock().unwrap(),
    );
    if overspent {
        return Err("a window was charged more than the budget".into());
    }
    Ok(())
}

/// Prints the charges per window (windows start at the first charge after
/// the previous window ended, as the quota's do) and says whether any
/// window went over the budget.
fn report_windows(title: &str, charges: &[(Instant, f64)]) -> bool {
    let mut charges = charges.to_vec();
    charges.sort_by_key(|(at, _)| *at);
    let Some(&(first, _)) = charges.first() else {
        return false;
    };
    println!("\n{title}:");
    let mut overspent = false;
    let mut index = 0;
    while index < charges.len() {
        let start = charges[index].0;
        let in_window: Vec<f64> = charges[index..]
            .iter()
            .take_while(|(at, _)| *at < start + WINDOW)
            .map(|(_, cost)| *cost)
            .collect();
        let spent: f64 = in_window.iter().sum();
        // The quota admits on estimates; a call charged more than estimated
        // (none here: rendering is only ever cheaper) could exceed it by
        // the difference while in flight, until its answer corrects it.
        let over = spent > BUDGET;
        overspent |= over;
        println!(
            "  from {:>5.2} s: {:>2} calls, {:>4.1} units{}",
            (start - first).as_secs_f64(),
            in_window.len(),
            spent,
            if over { "  OVER BUDGET" } else { "" }
        );
        index += in_window.len();
    }
    overspent
}

/// A loopback API that answers each call after 50 ms with its charge in
/// `X-Actual-Cost`, recording when it charged what.
async fn start_api(charges: Arc<Mutex<Vec<(Instant, f64)>>>) -> Result<SocketAddr, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let charges = charges.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                        let cost = actual_cost(request.uri());
                        charges.lock().unwrap().push((Instant::now(), cost));
                        async move {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            let response = http::Response::builder()
                                .header("x-actual-cost", cost.to_string())
                                .body(Full::new(Bytes::from_static(b"{}")))
                                .expect("a valid response");
                            Ok::<_, Infallible>(response)
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}
