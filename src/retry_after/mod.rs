//! The rate-limit header middleware: pauses a scope when the server asks.
//!
//! Servers say "slow down" in their response headers: `Retry-After` (on a
//! 429, a 503 or a redirect), the IETF `RateLimit` / `RateLimit-Policy`
//! fields, the older `RateLimit-Reset` / `RateLimit-Remaining`, and the
//! common `X-RateLimit-Remaining` / `X-RateLimit-Reset` that GitHub and many
//! APIs send. [`RetryAfter`] reads them on every response and tells the
//! [`Registry`](crate::Registry), which holds the request's scopes: nothing
//! of a held scope is sent before the hold ends, while every other scope
//! goes on as before. It adds no failure mode; responses and errors pass
//! through unchanged.
//!
//! # What holds a scope
//!
//! | response | hold |
//! |---|---|
//! | a backoff status of the scope (its [`BackoffConfig`](crate::registry::BackoffConfig) `http_codes`: 429, 502, 503, 504, 520–524 by default) | `Retry-After`; without it, the quota reset (`RateLimit` `t`, `RateLimit-Reset`, `X-RateLimit-Reset`). `Retry-After` wins when both are present, as the IETF draft requires |
//! | any status whose remaining quota is 0 (`RateLimit: "p";r=0;t=10`, `RateLimit-Remaining: 0`, `X-RateLimit-Remaining: 0`) | until the announced reset, *before* the server has to refuse anything. A 403 with `X-RateLimit-Remaining: 0` is a rate limit (GitHub's), not a ban |
//! | a redirect (3xx) with `Retry-After` | `Retry-After`, at most `redirect_max_delay` (default 10 s): the followed redirect, sent through the same scopes, waits |
//! | `Retry-After` on any other status (a 200, a 403 with quota left) | none: RFC 9110 gives it no meaning there |
//!
//! - Every hold is capped at the registry's
//!   [`max_hold`](crate::registry::RegistryBuilder::max_hold) (1 h by
//!   default, up to 24 h; a longer ask is capped with a warning), not at
//!   the backoff `max_delay`: a server that says "come back in an hour" is
//!   asked again in an hour. A hold never shortens a longer one already in
//!   force.
//! - A request with several [`Scopes`](crate::Scopes) holds each of them,
//!   each checked against its own backoff statuses.
//! - `0`, a date in the past, `-5`, `1.5`, `nan`, non-ASCII digits and any
//!   other malformed value mean "no hold" and cost a `tracing` debug event
//!   (target `tower_throttle`) naming the header and the scopes; never a
//!   panic (the parsers are fuzzed: `fuzz/`).
//! - A hold is a one-time pause, not a new steady delay: once it ends the
//!   scope sends at its effective limits again. Backoff steps are the
//!   backoff feedback's business (the same 429 is backoff feedback too);
//!   this layer only holds.
//! - Whatever the headers announce (quota, window, remaining, reset) is
//!   recorded per scope and shown in [`ScopeStats::announced`](crate::ScopeStats::announced).
//!
//! HTTP dates and epoch resets are wall-clock values, so they are read
//! against [`SystemTime::now`](std::time::SystemTime::now) the moment the
//! response arrives and turned into a duration at once; the hold itself
//! runs on tokio time, so tests with paused time see exact instants.
//!
//! # Where it goes
//!
//! Inside [`Throttle`](crate::Throttle):
//! `ServiceBuilder::new().layer(ThrottleLayer::new(r.clone())).layer(RetryAfterLayer::new(r.clone()))`.
//! It reads the scopes Throttle decided when the request is called
//! ([`Registry::scopes_of`](crate::Registry::scopes_of), which returns the
//! scopes Throttle is handing over), and reports the response before
//! Throttle frees the request's lane, so the next waiter of the scope
//! already sees the hold: holds, pacing and announced limits of every scope
//! as one report, applied
//! under the lock Throttle takes when the request ends anyway. Without a
//! Throttle outside it, it resolves the scopes itself with the registry's
//! resolver and applies its report under a lock of its own.
//!
//! # Redirects
//!
//! A `Retry-After` on a 3xx asks the client to wait before following the
//! redirect (RFC 9110 §10.2.3). The hold applies to the request's scopes,
//! so the followed redirect waits whichever layer follows it. The default
//! cap, [`DEFAULT_REDIRECT_MAX_DELAY`] (10 s), is deliberately much shorter
//! than the backoff cap: a redirect is not a refusal, the waits servers
//! really send with one are a few seconds (a job-status URL polled with
//! `303` + `Retry-After`), and a long hold there stalls a whole site for a
//! hint that was never about load. Raise it with
//! [`RetryAfterLayer::redirect_max_delay`]; `Duration::ZERO` ignores
//! `Retry-After` on redirects.
//!
//! # Pacing to an announced policy
//!
//! Holding only when the quota is spent lets a client burst into a wall:
//! it sends everything left at once, then waits out the reset. With
//! [`RetryAfterLayer::pace_to_policy`] on, a response that announces `r`
//! units remaining and a reset in `t` paces its scopes at
//!
//! ```text
//! delay = t / max(r, 1)        until now + t
//! ```
//!
//! between sends (for `r=4;t=20`: 5 s gaps, the last unit used as the quota
//! resets). Every response re-derives it from its own headers, so the pace
//! follows the server's count. A response with a `RateLimit-Policy`
//! (`"p";q=100;w=60`) but no remaining count and reset paces at `w / q`
//! for one window, from the policy with the lowest rate. When `r` is 0 the
//! hold until the reset covers it and the pacing is left alone. The pacing
//! delay is capped at the scope's backoff `max_delay`, is the largest of
//! the delays in force (config, backoff, AutoThrottle, robots.txt), and
//! shows in stats as [`LimitSource::RateLimitPolicy`](crate::registry::LimitSource::RateLimitPolicy).
//! It spaces sends; it does not count requests already in flight, so a
//! scope with many lanes may still use up the quota a little early.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tokio::time::Instant;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_throttle::{Registry, RetryAfterLayer, ScopeConfig, ThrottleLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = Registry::builder()
//!     .default_scope(ScopeConfig::default().delay(Duration::ZERO).jitter(0.0))
//!     .build()?;
//! let client = ServiceBuilder::new()
//!     .layer(ThrottleLayer::new(registry.clone()))
//!     .layer(RetryAfterLayer::new(registry.clone()))
//!     .service(tower::service_fn(|_request: http::Request<()>| async {
//!         // A server out of quota: come back in 30 s.
//!         http::Response::builder().status(429).header("retry-after", "30").body(())
//!     }));
//!
//! let start = Instant::now();
//! let request = http::Request::get("https://api.example/items").body(())?;
//! let response = client.clone().oneshot(request).await?;
//! assert_eq!(response.status(), 429);
//! drop(response); // its lane is free once the response is read or dropped
//! let stats = registry.scope_stats("api.example").unwrap();
//! assert_eq!(stats.held_for, Some(Duration::from_secs(30)));
//!
//! // The next request to api.example is sent 30 s later.
//! let request = http::Request::get("https://api.example/items").body(())?;
//! client.oneshot(request).await?;
//! assert_eq!(start.elapsed(), Duration::from_secs(30));
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

pub mod future;
mod layer;
mod observe;
mod service;

pub use layer::RetryAfterLayer;
pub use service::RetryAfter;

/// How long a `Retry-After` on a redirect holds the scopes at most, unless
/// [`RetryAfterLayer::redirect_max_delay`] says otherwise: 10 s. See
/// [Redirects](self#redirects) for why it is short.
pub const DEFAULT_REDIRECT_MAX_DELAY: Duration = Duration::from_secs(10);
