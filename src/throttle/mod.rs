//! The scheduler middleware: decides *when* each request is sent.
//!
//! [`Throttle`] holds every request until all of its scopes allow it (a free
//! lane, the scope's delay and per-lane delay passed, no hold active) and
//! fewer than the registry's `max_concurrency` requests are in flight; then
//! it hands it to the inner service. A lane stays busy until the response
//! head arrives, or the inner future fails, or the response future is
//! dropped, as tower's `ConcurrencyLimit` keeps its permit: a caller may
//! collect responses before reading them (`join_all`, a `Vec`) and read
//! their bodies late or never. A scope that
//! [counts whole transfers](crate::ScopeConfig::count_whole_transfers)
//! keeps the lane until the response's [`ThrottledBody`] has been read to
//! its end, fails or is dropped instead, for crawls of large or slow
//! bodies; there, read (or drop) each response before awaiting more
//! requests of the scope.
//! AutoThrottle's latency is the time to the response head either way.
//!
//! Redirects: put tower-http's `FollowRedirectLayer` *outside*
//! `ThrottleLayer` (and `RobotsDelayLayer`), so each hop is a request of
//! its own, admitted in the scope of the host it goes to; see
//! `docs/transfers-and-redirects.md`. Requests of one scope go first-come first-served (or by
//! [`Priority`](crate::Priority)); a slow scope never delays another.
//!
//! Backpressure: `poll_ready` reserves one of the registry's `max_queued`
//! places, then readies the inner service; when every place is taken it
//! returns `Pending` until one frees. With [`ThrottleLayer::fixed_scope`],
//! `poll_ready` instead waits until that scope admits a send, then readies
//! the inner service, and `call` sends at once: useful in front of a
//! `tower::buffer::Buffer` or when you want to know readiness *before*
//! building the request.
//!
//! A request that has to wait for its scopes gives the inner service's
//! readiness back while it waits (it drops the readied handle and keeps an
//! unreadied clone), and readies its own handle once admitted. So an inner
//! service with limits of its own (`ConcurrencyLimit`, `Buffer`, a pool
//! that reserves) lends nothing to a waiting request, and a slow scope
//! never keeps another scope's requests out of it.
//!
//! Dropping a response future at any point (waiting, in flight) releases
//! everything it held: its queue place, its lanes, its global permit.
//!
//! Logging: with a `tracing` subscriber at DEBUG (target `tower_throttle`),
//! each send is one "request sent" event with its scope, lane, wait and
//! the gap that follows. A busy scope whose only limit is its lanes admits
//! its requests without the registry's lock; their events carry
//! `lock_free = true` and no lane. A subscriber only listens: requests are
//! admitted the same way, at the same instants, with or without one.
//!
//! A response whose request waited carries a [`Waited`](crate::Waited) in
//! its extensions: how long, and on what (lanes, delay, a hold, the quota,
//! another scope, the queue places, ...). Each request has a debug span
//! (target `tower_throttle`) with the same breakdown; see
//! [`waited`](crate::waited).
//!
//! # The send instant is the hand-over
//!
//! A scope's delay runs between *departures*: the instants its requests
//! were handed to the inner service, read from the clock after the
//! hand-over, never the instant the scheduler admitted them. The hand-over
//! is the **first poll of the inner service's future**, not the return of
//! its `call`: hyper-util's client and reqwest do nothing in `call` but
//! build a future, and the request reaches a pooled connection (or starts
//! opening one) when that future is first polled. A response future
//! created by `Throttle::call` may be polled much later than the call (a
//! spawned task waiting for a worker thread on a busy machine); stamping
//! at `call` would time the scope's next gap from an instant before the
//! request really left. Until a request's departure is recorded, a scope
//! with a delay admits nothing else. The cost is one clock reading per
//! request; the departure reaches the registry under its lock at once
//! only when the scope has a delay and more than one lane (another request
//! could be admitted before this one ends), and otherwise rides with the
//! request's completion, which takes that lock anyway.
//!
//! A request admitted but dropped before the inner service was called (or
//! whose inner service failed to get ready) never left: its scopes time
//! their next gaps as if it had not been admitted, and its quota cost goes
//! back to the window it was spent in (a registry's store keeps what it
//! granted). One dropped after the
//! call but before its future's first poll counts as sent when it was
//! dropped, the latest instant it can have left: not every service waits
//! for a poll to send.
//!
//! After the hand-over a client may still hold the bytes a while: hyper's
//! connection task writes them when the client's runtime runs it. With
//! [`DepartureStampLayer`](crate::departure::DepartureStampLayer) directly
//! around a hyper(-util) client, the departure is the later of the
//! hand-over and the instant that task takes the request to write it; see
//! the [`departure`](crate::departure) module.
//!
//! Inner layers report to the scopes the throttle decided: while it calls
//! its inner service, [`Registry::scopes_of`](crate::Registry::scopes_of),
//! called from an inner layer's `call`, returns them (a thread-local slot
//! set for the duration of that call, tagged with the registry; nothing is
//! allocated). [`ThrottleLayer::record_scopes`] also writes them into the
//! request's extensions, for layers that read them later or elsewhere.
//!
//! ```
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = Registry::builder()
//!     .default_scope(ScopeConfig::default().delay(Duration::from_millis(10)).jitter(0.0))
//!     .build()?;
//! let client = ServiceBuilder::new()
//!     .layer(ThrottleLayer::new(registry.clone()))
//!     .service(tower::service_fn(|request: http::Request<()>| async move {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(request.uri().to_string()))
//!     }));
//!
//! let request = http::Request::get("https://example.com/").body(())?;
//! let response = client.oneshot(request).await?;
//! assert_eq!(response.body().get_ref(), "https://example.com/");
//! assert_eq!(registry.scope_stats("example.com").unwrap().sent, 1);
//! # Ok(())
//! # }
//! ```

mod body;
mod errors;
pub mod future;
mod handles;
mod layer;
mod lease;
mod service;
mod store_admission;
mod ticket;
mod wake_timer;

pub use body::ThrottledBody;
pub use errors::{ErrorMode, InnerErrors, StoreErrors};
pub use layer::ThrottleLayer;
pub use service::Throttle;
