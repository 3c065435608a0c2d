//! The services and requests both the `overhead` bench and the
//! `instructions` example measure, so the two always measure the same
//! thing. Included with `#[path]` (not a bench of its own).
#![allow(dead_code)]

use std::convert::Infallible;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use governor::{Quota, RateLimiter};

use tower::{Service, ServiceExt};
use tower_throttle::{Registry, ScopeConfig};

/// The bare inner service: answers at once.
pub fn bare() -> impl Service<
    http::Request<()>,
    Response = http::Response<()>,
    Error = Infallible,
    Future = std::future::Ready<Result<http::Response<()>, Infallible>>,
> + Clone {
    tower::service_fn(|_request: http::Request<()>| std::future::ready(Ok(http::Response::new(()))))
}

/// The `governor` peer: a keyed rate-limit check (a quota that never
/// refuses) on the lower-cased host, the same key work Throttle's host
/// resolver does, in front of the bare service.
pub fn governor_keyed() -> impl Service<http::Request<()>, Response = http::Response<()>, Error = Infallible>
{
    let limiter = RateLimiter::keyed(Quota::per_second(NonZeroU32::MAX));
    let mut inner = bare();
    tower::service_fn(move |request: http::Request<()>| {
        let key = request.uri().host().unwrap_or_default().to_ascii_lowercase();
        assert!(limiter.check_key(&key).is_ok());
        inner.call(request)
    })
}

/// `count` URIs on distinct hosts, so `count` distinct scopes.
pub fn uris(count: usize) -> Vec<http::Uri> {
    (0..count)
        .map(|i| format!("https://host{i}.example/page").parse().unwrap())
        .collect()
}

/// A request to `uri` (a pre-parsed URI cloned into a new request).
pub fn request(uri: &http::Uri) -> http::Request<()> {
    let mut request = http::Request::new(());
    *request.uri_mut() = uri.clone();
    request
}

/// Delay 0 and lanes to spare: the throttle never waits, so what is
/// measured is pure bookkeeping.
pub fn unthrottled_registry() -> Registry {
    unthrottled_builder().build().unwrap()
}

/// The builder of [`unthrottled_registry`], for variants that add to it
/// (a scope store).
pub fn unthrottled_builder() -> tower_throttle::registry::RegistryBuilder {
    Registry::builder().max_concurrency(1_000).default_scope(
        ScopeConfig::default()
            .concurrency(1_000)
            .delay(Duration::ZERO)
            .delay_per_slot(Duration::ZERO)
            .jitter(0.0),
    )
}

/// Runs `count` requests through `service`, cycling over `uris`, and says
/// how long they took.
pub async fn drive<S>(service: &mut S, uris: &[http::Uri], count: u64) -> Duration
where
    S: Service<http::Request<()>, Response = http::Response<()>>,
    S::Error: std::fmt::Debug,
{
    let start = Instant::now();
    for i in 0..count as usize {
        let request = request(&uris[i % uris.len()]);
        let response = service.ready().await.unwrap().call(request).await.unwrap();
        black_box(response);
    }
    start.elapsed()
}
