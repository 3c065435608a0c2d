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

pub mod backlog;

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
    // count is the reference of the overhead target (docs/performance.md),
    // and a different shape shifts it by
    // a few (1 025 to 1 046 in the trials).
    tower::service_fn(move |request: http::Request<()>| {
        let key = request.uri().host().unwrap_or_default().to_ascii_lowercase();
        assert!(limiter.check_key(&key).is_ok());
        inner.call(request)
    })
}

/// A peer of the scaling bench: `work` done on each request's key (its
/// lower-cased host, as Throttle's host resolver gives) around the call
/// to `inner`. Clones share the work's state, so threads driving clones
/// share its keys'.
#[derive(Clone)]
pub struct Keyed<W, B> {
    work: W,
    inner: B,
}

/// What a [`Keyed`] peer does with a request's key before and after the
/// call to its inner service. (A `String`: governor's keys are, and a
/// copy per request would add to its figures.)
#[allow(clippy::ptr_arg)]
pub trait KeyWork {
    fn before(&self, key: &String);
    fn after(&self, _key: &String) {}
}

impl<W: KeyWork, B: Service<http::Request<()>>> Service<http::Request<()>> for Keyed<W, B> {
    type Response = B::Response;
    type Error = B::Error;
    type Future = B::Future;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), B::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<()>) -> B::Future {
        let key = request.uri().host().unwrap_or_default().to_ascii_lowercase();
        self.work.before(&key);
        let future = self.inner.call(request);
        self.work.after(&key);
        future
    }
}

/// [`governor_keyed`]'s check in front of `inner`, whose clones share one
/// limiter: the lock-free peer of a hot scope in the scaling bench (one
/// compare-and-swap on the key's state per request), and over 10 000
/// hosts the peer of `scopes_10k` (its keys in a sharded map).
/// `governor_keyed` keeps its limiter in the closure, as it always has,
/// so the instruction counts compare with earlier releases'.
pub type Governor<B> = Keyed<GovernorCheck, B>;

/// governor's keyed check, one limiter shared by the clones.
#[derive(Clone)]
pub struct GovernorCheck(std::sync::Arc<governor::DefaultKeyedRateLimiter<String>>);

impl KeyWork for GovernorCheck {
    fn before(&self, key: &String) {
        assert!(self.0.check_key(key).is_ok());
    }
}

impl<B> Governor<B> {
    pub fn new(inner: B) -> Self {
        Keyed {
            work: GovernorCheck(std::sync::Arc::new(RateLimiter::keyed(Quota::per_second(
                NonZeroU32::MAX,
            )))),
            inner,
        }
    }
}

/// The least a registry of locked shards does per request, as a peer of
/// the scaling bench's 10 000 scopes: the key hashed to one of `shards`
/// mutexes (each on lines of its own), locked once to count the request
/// in on its key and once more to count it out, as the throttle's lock
/// path takes the registry's lock at admission and at the end. Built with
/// [`Locks::Once`], it only counts the request in: what a registry whose
/// requests end without the lock would pay.
pub type LockedShards<B> = Keyed<ShardCounts, B>;

/// How many times a [`LockedShards`] request takes its shard's lock.
#[derive(Clone, Copy, PartialEq)]
pub enum Locks {
    /// In and out, as the throttle's lock path does.
    Twice,
    /// In only.
    Once,
}

/// [`LockedShards`]' state: each shard's keys' counts, shared by the
/// clones.
#[derive(Clone)]
pub struct ShardCounts {
    shards: std::sync::Arc<[LockedShard]>,
    hasher: std::collections::hash_map::RandomState,
    locks: Locks,
}

/// One shard of [`ShardCounts`], on lines of its own.
#[repr(align(128))]
struct LockedShard(std::sync::Mutex<std::collections::HashMap<String, u64>>);

impl ShardCounts {
    /// Adds `change` to `key`'s count under its shard's lock.
    fn count(&self, key: &str, change: i64) {
        use std::hash::BuildHasher;
        let shard = self.hasher.hash_one(key) as usize & (self.shards.len() - 1);
        let mut counts = self.shards[shard].0.lock().unwrap();
        match counts.get_mut(key) {
            Some(count) => *count = count.wrapping_add_signed(change),
            None => {
                counts.insert(key.to_owned(), change as u64);
            }
        }
    }
}

impl KeyWork for ShardCounts {
    fn before(&self, key: &String) {
        self.count(key, 1);
    }

    fn after(&self, key: &String) {
        if self.locks == Locks::Twice {
            self.count(key, -1);
        }
    }
}

impl<B> LockedShards<B> {
    /// `shards` shards (a power of two) in front of `inner`, each request
    /// locking its shard as `locks` says.
    pub fn new(inner: B, shards: usize, locks: Locks) -> Self {
        assert!(shards.is_power_of_two(), "shards are found by a mask");
        Keyed {
            work: ShardCounts {
                shards: (0..shards).map(|_| LockedShard(Default::default())).collect(),
                hasher: Default::default(),
                locks,
            },
            inner,
        }
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
    Registry::builder()
        .max_concurrency(1_000)
        .default_scope(unthrottled_scope())
}

/// The scope config of [`unthrottled_builder`]: 1 000 lanes, delay 0, no
/// jitter.
pub fn unthrottled_scope() -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(1_000)
        .delay(Duration::ZERO)
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
}

/// Runs `count` requests through `service`, cycling over `uris`, and says
/// how long they took.
pub async fn drive<S, B>(service: &mut S, uris: &[http::Uri], count: u64) -> Duration
where
    S: Service<http::Request<()>, Response = http::Response<B>>,
    B: Send + 'static,
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

/// A registry builder with one performance mechanism turned off, by its
/// hidden bench hook.
pub type TurnOff = fn(tower_throttle::registry::RegistryBuilder) -> tower_throttle::registry::RegistryBuilder;

/// The performance mechanisms the scaling bench (`SCALING_OFF`) and
/// `loadtest` (`--off`) turn off to measure what each is worth: each
/// one's name and its hook.
pub const MECHANISMS: &[(&str, TurnOff)] = &[
    // Lock-free words for plain scopes.
    ("words", |builder| builder.lock_free_plain_scopes(false)),
];
