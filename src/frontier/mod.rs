//! A crawl fed in readiness order: the [`Frontier`] holds a crawl's pending
//! requests in a queue per scope and hands the throttled service only the
//! requests whose scopes would admit them now.
//!
//! The natural crawl loop, `stream::iter(requests).map(|r|
//! client.clone().oneshot(r)).buffer_unordered(N)`, spends its N slots on
//! whatever comes first. A crawler's requests come site by site (a page
//! links mostly to its own site), so the slots fill with one site's pages,
//! each sitting out its delay inside the throttle, while every other site
//! idles. The frontier instead asks the registry when each scope's next
//! request could go ([`Registry::predict_request`](crate::Registry::predict_request))
//! and sends a request only when the answer is *now*:
//!
//! - **Order.** Among scopes that may go, the one that has been ready the
//!   longest goes first (as BUbiNG's workbench orders hosts); among scopes
//!   ready from the same instant (the names of one server, waiting for its
//!   next send; instants within half a millisecond count as one), the one
//!   with the most pending, so a server's names finish together; within a
//!   scope, [`Priority`](crate::Priority) first, then
//!   arrival.
//! - **Shared servers.** With [`FrontierBuilder::ip_scopes`], a request's
//!   name is resolved (through the stack's
//!   [`IpScopeLayer`](crate::ip::IpScopeLayer), sharing its cache) before
//!   the request is ordered, so it is ordered by its server's IP scope as
//!   well as its own; a request whose name is being looked up waits for
//!   the lookup in the frontier.
//! - **Budget.** At most [`in_flight`](FrontierBuilder::in_flight) requests
//!   are in the service at once, and none of them waits on a delay, a hold
//!   or a full scope: a held site takes no slot and no CPU until its hold
//!   ends. The frontier keeps one timer, for the next instant a scope may
//!   go, not one per scope.
//! - **Input.** Requests come in through a cloneable [`FrontierHandle`]
//!   (`push`, so a crawler can push the links it finds while the crawl
//!   runs) and from any `Stream` ([`Frontier::with_source`]).
//!   [`max_pending`](FrontierBuilder::max_pending) pushes back: `push`
//!   waits, and the source is not polled, while the frontier is full.
//! - **Output.** The frontier is a `Stream` of `(tag, result)`: the
//!   request's tag (its URI with [`FrontierHandle::push`], or the value
//!   given to [`FrontierHandle::push_tagged`]) and what the service
//!   answered. It ends when nothing is pending or in flight, the source
//!   (if any) has ended and every handle is dropped.
//! - **Drop.** Dropping the frontier drops its pending requests and the
//!   requests in the service, which gives back every lane, permit and queue
//!   place they held.
//!
//! A request is queued under its first scope (as the registry resolves
//! it: its [`Scopes`](crate::Scopes) extension, or the resolver) and its
//! readiness is predicted for all of its scopes. A prediction where lanes
//! bind rests on the scope's latency average; the frontier also looks at a
//! scope again as soon as one of its own requests of that scope ends.
//!
//! ```
//! use std::time::Duration;
//!
//! use futures::StreamExt;
//! use tower::{BoxError, ServiceBuilder};
//! use tower_throttle::frontier::FrontierBuilder;
//! use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! let registry = Registry::builder()
//!     .default_scope(ScopeConfig::default().delay(Duration::from_millis(100)).delay_per_slot(Duration::from_millis(100)).jitter(0.0))
//!     .build()?;
//! // Any throttled stack: here an in-process "site" that answers at once.
//! let client = ServiceBuilder::new()
//!     .layer(ThrottleLayer::new(registry.clone()))
//!     .service(tower::service_fn(|_: http::Request<()>| async {
//!         Ok::<_, BoxError>(http::Response::new(()))
//!     }));
//! let (mut frontier, pages) = FrontierBuilder::new(registry).in_flight(20).build(client)?;
//! // Site by site: the frontier still sends the two sites' pages in turn.
//! for site in ["a.example", "b.example"] {
//!     for page in 0..3 {
//!         let request = http::Request::get(format!("https://{site}/{page}")).body(())?;
//!         pages.push(request).await?;
//!     }
//! }
//! drop(pages);
//! while let Some((uri, response)) = frontier.next().await {
//!     println!("{uri}: {}", response?.status());
//! }
//! # Ok(())
//! # }
//! ```

mod boxed;
mod clock;
mod handle;
mod in_flight;
mod queues;
mod redirects;
mod resolving;
mod shared;
mod stream;

pub use handle::{FrontierHandle, PushError};
pub use stream::{Built, Fetched, Frontier, FrontierBuilder, DEFAULT_IN_FLIGHT, DEFAULT_MAX_PENDING};
