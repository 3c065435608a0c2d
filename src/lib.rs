//! Polite and fast HTTP clients, as composable [tower] middleware.
//!
//! Crawlers and API clients must not overwhelm the servers they call, yet
//! they want every request per second a server will give. `tower-throttle`
//! follows Scrapy's throttling design: requests are grouped into **scopes**
//! (by default, one per host), and each scope has a number of lanes
//! (concurrency), a minimum delay between sends, a minimum delay per lane,
//! and jitter. One shared [`Registry`] holds all of it; [`ThrottleLayer`]
//! wraps any `Service<http::Request<B>>` (a hyper-util client, reqwest, an
//! axum outbound call) and sends each request when its scopes allow it.
//!
//! ```
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_throttle::{Registry, ScopeConfig, Scopes, ThrottleLayer};
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
//! # The layers
//!
//! ```text
//! request ──► RobotsDelay ──► Throttle ──► RetryAfter ──► Backoff ──► inner client
//! ```
//!
//! [`Throttle`] is the one scheduler: it decides *when* a request is sent.
//! The other layers observe and report **feedback** to the registry, which
//! changes what `Throttle` allows next:
//!
//! - [`backoff`]: 429/5xx, timeouts and connection failures slow the scope
//!   down exponentially; quiet windows recover it. Opt-in
//!   [rampup](RampupConfig) searches for the fastest pace a server accepts;
//!   [`backoff::BackoffRetry`] re-sends through the throttle.
//! - [`retry_after`]: `Retry-After` and rate-limit headers hold scopes until
//!   the server says, and can pace a scope to an announced quota.
//! - AutoThrottle ([`AutoThrottleConfig`]): Scrapy's latency-adaptive delay,
//!   computed by `Throttle` itself.
//! - [`robots`]: [`RobotsDelayLayer`] fetches each site's robots.txt once,
//!   applies its Crawl-delay and, optionally, its Allow/Disallow rules.
//!
//! How a scope *reacts* to backoff feedback is pluggable too: a
//! [`ScopeManager`] (per scope or for all) replaces the built-in
//! exponential backoff and rampup; see [`registry::manager`].
//!
//! The effective limits of a scope are the most restrictive of its config
//! and every contribution; [`Registry::scope_stats`] shows each of them and
//! which one is in force. See the [`registry`] module for the state model
//! and admission rules.
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
pub mod departure;
mod error;
pub mod parse;
pub mod registry;
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub mod reqwest;
pub mod retry_after;
pub mod robots;
pub mod scope;
pub mod store;
pub mod throttle;
mod time;

pub use backoff::{Backoff, BackoffLayer};
#[cfg(feature = "serde")]
pub use config_file::{ConfigFileError, RegistryConfig};
pub use error::{ConfigError, Error};
pub use registry::{
    AnnouncedLimits, AutoThrottleConfig, BackoffConfig, BaseLimits, ErrorKind, Feedback, FeedbackKind,
    Jitter, LimitSource, ManagerFeedback, ManagerLimits, QuotaStats, RampupConfig, Registry, RegistryBuilder,
    ScopeConfig, ScopeManager, ScopeStats, Stats,
};
pub use retry_after::{RetryAfter, RetryAfterLayer};
pub use robots::{RobotsDelay, RobotsDelayLayer};
pub use scope::{AutoThrottleExempt, HostResolver, Priority, RequestHead, Scope, ScopeResolver, Scopes};
pub use throttle::{Throttle, ThrottleLayer};

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
