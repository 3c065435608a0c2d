//! An axum server whose handler calls an upstream API through one shared,
//! throttled hyper-util client. However many requests come in at once, the
//! upstream sees at most 2 in flight and sends at least 50 ms apart.
//!
//! The throttled client is a `Clone` tower service and every clone shares
//! the registry, so the limits hold across all handlers. A handler clones
//! it, waits until it is ready and calls it (`oneshot` does both); it never
//! calls a clone that was not readied.
//!
//! A handler never waits long for the upstream: each call carries a bound
//! (`MaxWait`, 5 s). When the registry predicts a longer wait (the
//! upstream answered `429` with `Retry-After: 3600`, say), the call fails
//! at once and the handler answers `503 Service Unavailable` with a
//! `Retry-After` of the predicted wait, rounded up to whole seconds,
//! instead of holding its caller, a task and a queue place for an hour.
//!
//! ```text
//! cargo run --example axum_outbound
//! ```
//!
//! `app` is reused by `tests/axum_outbound.rs`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::scope::MaxWait;
use tower_throttle::throttle::StoreErrors;
use tower_throttle::{
    Backoff, BackoffLayer, Registry, RetryAfter, RetryAfterLayer, ScopeConfig, Throttle, ThrottleLayer,
};

/// The throttled upstream client every handler shares. It returns the
/// crate's `Error`, which can say that a call would wait past its bound.
pub type Upstream = Throttle<RetryAfter<Backoff<Client<HttpConnector, Full<Bytes>>>>, StoreErrors>;

/// The longest a handler waits for its turn at the upstream.
pub const MAX_WAIT: Duration = Duration::from_secs(5);

#[derive(Clone)]
struct AppState {
    upstream: Upstream,
    upstream_base: String,
}

/// The router: `GET /quote/{id}` fetches `{upstream_base}/quotes/{id}`
/// through one client throttled by `registry`.
pub fn app(upstream_base: &str, registry: &Registry) -> Router {
    let upstream = ServiceBuilder::new()
        .layer(ThrottleLayer::new(registry.clone()).crate_errors())
        .layer(RetryAfterLayer::new(registry.clone()))
        .layer(BackoffLayer::new(registry.clone()))
        .service(Client::builder(TokioExecutor::new()).build_http());
    let state = AppState {
        upstream,
        upstream_base: upstream_base.trim_end_matches('/').to_owned(),
    };
    Router::new().route("/quote/{id}", get(quote)).with_state(state)
}

async fn quote(State(state): State<AppState>, Path(id): Path<u32>) -> Result<String, Response> {
    let uri = format!("{}/quotes/{id}", state.upstream_base);
    let mut request = http::Request::get(uri)
        .body(Full::default())
        .map_err(bad_gateway)?;
    request.extensions_mut().insert(MaxWait(MAX_WAIT));
    // Clone the shared client, wait until it is ready, call it.
    let response = state
        .upstream
        .clone()
        .oneshot(request)
        .await
        .map_err(upstream_failed)?;
    if !response.status().is_success() {
        return Err((
            StatusCode::BAD_GATEWAY,
            format!("upstream answered {}", response.status()),
        )
            .into_response());
    }
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(bad_gateway)?
        .to_bytes();
    Ok(format!("quote {id}: {}", String::from_utf8_lossy(&body)))
}

/// A call that would wait past its bound is `503` with the predicted wait
/// as `Retry-After` (whole seconds, rounded up); any other failure `502`.
fn upstream_failed(error: tower_throttle::Error) -> Response {
    match error.retry_after() {
        Some(wait) if error.is_would_wait() => {
            let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, HeaderValue::from(seconds))],
                format!("upstream busy: {error}"),
            )
                .into_response()
        }
        _ => bad_gateway(error),
    }
}

fn bad_gateway(error: impl std::fmt::Display) -> Response {
    (StatusCode::BAD_GATEWAY, format!("upstream failed: {error}")).into_response()
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

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
    let upstream = start_upstream().await?;
    let registry = Registry::builder()
        .scope(
            "127.0.0.1",
            ScopeConfig::default()
                .concurrency(2)
                .delay(Duration::from_millis(50))
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()?;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let router = app(&format!("http://{upstream}"), &registry);
    tokio::spawn(async move { axum::serve(listener, router).await });
    println!("axum on http://{addr}, upstream on http://{upstream}; 10 requests at once:");

    let inbound = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let start = Instant::now();
    let mut requests = tokio::task::JoinSet::new();
    for id in 0..10 {
        let inbound = inbound.clone();
        requests.spawn(async move {
            let response = inbound.get(format!("http://{addr}/quote/{id}").parse()?).await?;
            let body = response.into_body().collect().await?.to_bytes();
            let line = format!(
                "{:>5} ms  {}",
                start.elapsed().as_millis(),
                String::from_utf8_lossy(&body)
            );
            Ok::<_, BoxError>(line)
        });
    }
    while let Some(line) = requests.join_next().await {
        println!("{}", line??);
    }
    let stats = registry
        .scope_stats("127.0.0.1")
        .expect("the upstream was called");
    println!(
        "upstream: {} sent, {} lanes, delay {} ms",
        stats.sent,
        stats.concurrency,
        stats.delay.as_millis()
    );
    Ok(())
}

/// The upstream API: answers each quote after 100 ms.
async fn start_upstream() -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service =
                hyper::service::service_fn(|request: http::Request<hyper::body::Incoming>| async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let body = format!("wisdom from {}", request.uri().path());
                    Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(body))))
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    Ok(addr)
}
