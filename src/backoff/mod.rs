//! Backoff feedback: slow a scope down when its server pushes back.
//!
//! [`Backoff`] watches every response and error of the service it wraps
//! and reports **feedback** for the request's scopes to the registry: a
//! status in the scope's backoff `http_codes` (429, 502, 503, 504, 520–524
//! by default), a timeout or a connection failure is *backoff feedback*;
//! the rest is success. Responses and errors reach the caller unchanged:
//! this layer only observes.
//!
//! Each backoff feedback is one step: the scope's delay is multiplied by
//! `delay_factor` (at least `min_delay`, at most `max_delay`) and its
//! concurrency by `concurrency_factor`; after `window` without new backoff
//! feedback the scope steps back, until it is on its configured limits again
//! (see [`BackoffConfig`](crate::registry::BackoffConfig)). A scope with
//! [rampup](crate::registry::RampupConfig) hands its backoff feedback to rampup
//! instead.
//!
//! The request's scopes are the ones [`Throttle`](crate::Throttle)
//! decided, which it hands over while it calls this layer
//! ([`Registry::scopes_of`](crate::Registry::scopes_of)), so put this layer
//! *inside* Throttle; used alone, it resolves them through the registry.
//! Whatever a response says is judged against the scopes' configs as soon
//! as it comes and reaches the registry as one report for all of the
//! request's scopes, under one lock of the registry; inside
//! a Throttle of the same registry, the report is applied under the lock
//! the throttle takes when the request ends (before it frees the request's
//! lanes), so the response costs no lock of its own.
//!
//! Classification is a hook: [`BackoffLayer::on_response`] and
//! [`BackoffLayer::on_error`] take functions returning a
//! [`Feedback`](crate::registry::Feedback). A scraping API that reports the target
//! site's status in a header, and the real cost of each call in another:
//!
//! ```
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_throttle::backoff::ResponseHead;
//! use tower_throttle::{BackoffLayer, Registry, ScopeConfig, ThrottleLayer};
//! use tower_throttle::registry::{BackoffConfig, Feedback};
//!
//! fn upstream_status(head: &ResponseHead<'_>, config: &BackoffConfig) -> Feedback {
//!     let upstream = head
//!         .headers
//!         .get("X-Upstream-Status-Code")
//!         .and_then(|value| value.to_str().ok()?.parse::<u16>().ok())
//!         .unwrap_or(head.status.as_u16());
//!     let feedback = if config.is_backoff_status(upstream) {
//!         Feedback::backoff()
//!     } else {
//!         Feedback::success()
//!     };
//!     match head.headers.get("X-Actual-Cost").and_then(|v| v.to_str().ok()?.parse::<f64>().ok()) {
//!         Some(cost) => feedback.with_actual_cost(cost),
//!         None => feedback,
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = Registry::builder()
//!     .default_scope(ScopeConfig::default().delay(Duration::ZERO).jitter(0.0))
//!     .build()?;
//! let api = tower::service_fn(|_request: http::Request<()>| async {
//!     let response = http::Response::builder()
//!         .status(200)
//!         .header("X-Upstream-Status-Code", "429")
//!         .header("X-Actual-Cost", "3")
//!         .body(())
//!         .unwrap();
//!     Ok::<_, std::convert::Infallible>(response)
//! });
//! let client = ServiceBuilder::new()
//!     .layer(ThrottleLayer::new(registry.clone()))
//!     .layer(BackoffLayer::new(registry.clone()).on_response(upstream_status))
//!     .service(api);
//!
//! client.oneshot(http::Request::get("https://api.example/").body(())?).await?;
//! let stats = registry.scope_stats("api.example").unwrap();
//! assert_eq!(stats.backoff_level, 1);
//! assert_eq!(stats.backoff_delay, Some(Duration::from_secs(1)));
//! assert_eq!(stats.reported_cost, 3.0);
//! # Ok(())
//! # }
//! ```
//!
//! Each response leaves this layer with a [`Judged`] extension carrying the
//! feedback reported for it, so layers outside judge it the same way.
//!
//! To re-send backoff responses, put a [`tower::retry::Retry`] with
//! [`BackoffLayer::retry_policy`] *outside*
//! Throttle: each retry then waits its turn in the (now slower) scope like
//! any other request, and what is retried is exactly what this layer
//! called backoff feedback.

mod classify;
pub mod future;
mod judged;
mod layer;
mod retry;
mod service;
mod shared;

pub use classify::{default_error_feedback, default_response_feedback, ErrorView, ResponseHead};
pub use judged::Judged;
pub use layer::BackoffLayer;
pub use retry::{BackoffRetry, CloneBody, CloneByTrait, TryCloneBody};
pub use service::Backoff;
