//! Polite and fast HTTP clients, as composable [tower] middleware.
//!
//! Crawlers and API clients must not overwhelm the servers they call, yet
//! they want every request per second a server will give. `tower-throttle`
//! follows Scrapy's throttling design: requests are grouped into **scopes**
//! (by default, one per host), and each scope has a number of lanes
//! (concurrency), a minimum delay between sends, a minimum delay per lane,
//! and jitter.
//!
//! # The stack
//!
//! ```text
//! request ──► RobotsDelay ──► Throttle ──► RetryAfter ──► Backoff ──► inner client
//! ```
//!
//! [`Throttle`] is the one scheduler: it decides *when* a request is sent,
//! and lets backpressure flow through `poll_ready`. The other layers
//! observe each response and report to the registry, which changes what
//! `Throttle` allows next: [`Backoff`] slows a scope down on 429/5xx and
//! timeouts, [`RetryAfter`] holds it as `Retry-After` and rate-limit headers
//! say, [`RobotsDelay`] applies each site's robots.txt Crawl-delay. Only
//! `Throttle` is needed; add the others for the feedback they bring.
//!
//! # What you configure
//!
//! - [`Registry`], built with [`Registry::builder`]: the shared state of
//!   every scope, one `Arc` that all the layers (and every clone of the
//!   stack) hold; the global concurrency and queue bounds.
//! - [`ScopeConfig`]: a scope's lanes, delays, jitter, backoff,
//!   AutoThrottle, rampup and quota; a default for all scopes, and one per
//!   scope name.
//! - The layers: [`ThrottleLayer`], [`RetryAfterLayer`], [`BackoffLayer`],
//!   [`RobotsDelayLayer`], each built from the registry.
//!
//! ```
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_throttle::{BackoffLayer, Registry, RetryAfterLayer, ScopeConfig, Scopes, ThrottleLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = Registry::builder()
//!     .max_concurrency(16)
//!     .default_scope(ScopeConfig::default())
//!     .scope("quotes.toscrape.com", ScopeConfig::default().concurrency(16).delay(Duration::ZERO))
//!     .build()?;
//!
//! let client = ServiceBuilder::new()
//!     .layer(ThrottleLayer::new(registry.clone()))
//!     .layer(RetryAfterLayer::new(registry.clone()))
//!     .layer(BackoffLayer::new(registry.clone()))
//!     .service(tower::service_fn(|_request: http::Request<()>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(()))
//!     }));
//!
//! // Per-request scopes replace the host scope.
//! let mut request = http::Request::get("https://api.example/users").body(())?;
//! request.extensions_mut().insert(Scopes::from(["api", "users"]));
//! client.oneshot(request).await?;
//! assert_eq!(registry.scope_stats("users").unwrap().sent, 1);
//! # Ok(())
//! # }
//! ```
//!
//! # Where things live
//!
//! The crate root holds what a first program needs. The rest is in the
//! module of the part it belongs to:
//!
//! | module | what is in it |
//! |---|---|
//! | [`registry`] | the builder, feedback ([`registry::Feedback`]), statistics ([`registry::Stats`], [`registry::LimitSource`]), the configs of backoff, AutoThrottle and rampup, the state model and admission rules |
//! | [`registry::manager`] | [`ScopeManager`](registry::manager::ScopeManager): how a scope reacts to feedback, pluggable per scope |
//! | [`scope`] | resolvers (request → scopes): by host, endpoint, registrable domain, scraping API |
//! | [`throttle`], [`backoff`], [`retry_after`], [`robots`] | each layer, its service, its response future and its hooks ([`backoff::BackoffRetry`] re-sends through the throttle) |
//! | [`departure`] | departures timed by the client's write, for busy machines |
//! | [`waited`] | why a request waited: [`Waited`], on its response, by cause |
//! | [`store`] | a store shared by a fleet of workers (in memory, Redis) |
//! | [`ip`] | scopes by server address, with name resolution before admission |
//! | [`connect`] | connections to the address a request was throttled for (a layer and a hyper-util connector) |
//! | `config_file` | the registry from a TOML or JSON file (feature `serde`) |
//! | `reqwest` | the stack for a `reqwest::Client` (feature `reqwest`) |
//!
//! The effective limits of a scope are the most restrictive of its config
//! and every contribution (backoff, AutoThrottle, robots.txt, rampup, a
//! fleet); [`Registry::scope_stats`] shows each of them and which one is in
//! force.
//!
//! [tower]: https://docs.rs/tower

#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backoff;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod config_file;
pub mod connect;
pub mod departure;
mod error;
pub mod frontier;
pub mod ip;
mod parse;
mod precise_wake;
mod readiness;
#[cfg(feature = "follow-redirect")]
#[cfg_attr(docsrs, doc(cfg(feature = "follow-redirect")))]
pub mod redirect;
pub mod registry;
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub mod reqwest;
pub mod retry_after;
#[cfg(feature = "robots")]
#[cfg_attr(docsrs, doc(cfg(feature = "robots")))]
pub mod robots;
pub mod scope;
pub mod store;
pub mod throttle;
mod time;
pub mod waited;

pub use backoff::{Backoff, BackoffLayer};
pub use error::{ConfigError, Error};
pub use registry::{Registry, ScopeConfig, ScopeStats};
pub use retry_after::{RetryAfter, RetryAfterLayer};
#[cfg(feature = "robots")]
#[cfg_attr(docsrs, doc(cfg(feature = "robots")))]
pub use robots::{RobotsDelay, RobotsDelayLayer};
pub use scope::{Priority, Scope, Scopes};
pub use throttle::{Throttle, ThrottleLayer};
pub use waited::Waited;

/// The examples of the README and of the pages under `docs/`, compiled and
/// run as doc tests (each page under the features its examples need).
#[cfg(doctest)]
mod doc_pages {
    #[doc = include_str!("../README.md")]
    pub struct Readme;
    #[doc = include_str!("../docs/autothrottle.md")]
    pub struct AutoThrottle;
    #[doc = include_str!("../docs/bounded-waits.md")]
    pub struct BoundedWaits;
    #[cfg(feature = "serde")]
    #[doc = include_str!("../docs/config-file.md")]
    pub struct ConfigFile;
    #[doc = include_str!("../docs/departures.md")]
    pub struct Departures;
    #[cfg(feature = "redis")]
    #[doc = include_str!("../docs/fleets.md")]
    pub struct Fleets;
    #[doc = include_str!("../docs/frontier.md")]
    pub struct Frontier;
    #[doc = include_str!("../docs/ip-scopes.md")]
    pub struct IpScopes;
    #[doc = include_str!("../docs/performance.md")]
    pub struct Performance;
    #[doc = include_str!("../docs/quotas.md")]
    pub struct Quotas;
    #[cfg(all(
        feature = "follow-redirect",
        feature = "robots",
        feature = "hyper-util",
        feature = "reqwest"
    ))]
    #[doc = include_str!("../docs/transfers-and-redirects.md")]
    pub struct TransfersAndRedirects;
    #[doc = include_str!("../docs/why-waited.md")]
    pub struct WhyWaited;
}
