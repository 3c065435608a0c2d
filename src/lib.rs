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
//! See the [`registry`] module for the state model and admission rules,
//! [`throttle`] for the middleware itself, and [`robots`] for
//! [`RobotsDelayLayer`], which fetches each site's robots.txt and applies its
//! Crawl-delay (and, optionally, its rules).
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

mod error;
pub mod parse;
pub mod registry;
pub mod robots;
pub mod scope;
pub mod throttle;

pub use error::{ConfigError, Error};
pub use registry::{
    AnnouncedLimits, AutoThrottleConfig, BackoffConfig, Feedback, FeedbackKind, Jitter, LimitSource,
    Registry, RegistryBuilder, ScopeConfig, ScopeStats, Stats,
};
pub use robots::{RobotsDelay, RobotsDelayLayer};
pub use scope::{AutoThrottleExempt, HostResolver, Priority, RequestHead, Scope, ScopeResolver, Scopes};
pub use throttle::{Throttle, ThrottleLayer};

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
