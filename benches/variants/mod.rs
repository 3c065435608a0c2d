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
    // The limiter in the closure, as in earlier releases (not a
    // `Governor`, whose clones share it through an `Arc`): its instruction
    // count is the DESIGN §5 reference, and a different shape shifts it by
    // a few (1 025 to 1 046 in the trials).
    tower::service_fn(move |request: http::Request<()>| {
        let key = request.uri().host().unwrap_or_default().to_ascii_lowercase();
        assert!(limiter.check_key(&key).is_ok());
        inner.call(request)
    })
}

/// [`governor_keyed`]'s check in front of `inner`, whose clones share one
/// limiter, so threads driving clones share its keys' state: the
/// lock-free peer of a hot scope in the scaling bench (one
/// compare-and-swap on the key's state per request). `governor_keyed`
/// keeps its limiter in the closure, as it always has, so the
/// instruction counts compare with earlier releases'.
#[derive(Clone)]
pub struct Governor<B> {
    limiter: std::sync::Arc<governor::DefaultKeyedRateLimiter<String>>,
    inner: B,
}

impl<B> Governor<B> {
    pub fn new(inner: B) -> Self {
        Governor {
            limiter: std::sync::Arc::new(RateLimiter::keyed(Quota::per_second(NonZeroU32::MAX))),
            inner,
        }
    }
}

impl<B: Service<http::Request<()>>> Service<http::Request<()>> for Governor<B> {
    type Response = B::Response;
    type Error = B::Error;
    type Future = B::Future;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), B::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<()>) -> B::Future {
        let key = request.uri().host().unwrap_or_default().to_ascii_lowercase();
        assert!(self.limiter.check_key(&key).is_ok());
        self.inner.call(request)
    }
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
