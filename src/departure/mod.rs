//! Departures timed by the client's write: the site's view of a gap, on a
//! busy client too.
//!
//! [`Throttle`](crate::Throttle) times a scope's gaps from each request's
//! *departure*. By default that is a clock reading taken once the inner
//! service has the request (its future's first poll; see the
//! [`throttle`](crate::throttle) module docs), which is as close as a tower
//! layer can see. With hyper-util's client the bytes leave later: the
//! request waits in the connection's queue until the client's runtime runs
//! the connection task. On a busy runtime that wait can reach milliseconds,
//! and when an earlier request waited longer than the later one, the site
//! sees the two closer than the delay (`loadtest` found 0 to 5 gaps in
//! 19 000 below `d − 2 ms`, client lag up to 4 ms, with the client on a
//! core of its own).
//!
//! [`DepartureStampLayer`], placed directly around the client, closes that
//! gap. It hands the client the request with a [`StampedBody`], which
//! stamps the first time the client asks the body anything: hyper asks
//! whether the body is empty in its connection task, right before it
//! writes the request's head to the socket. The throttle then takes as the
//! departure the later of its own reading and that stamp, and a scope with
//! a delay admits nothing more until the stamp has come. It never makes a
//! departure earlier than the throttle's own reading, so it can only
//! lengthen a gap the site would have seen short.
//!
//! What it costs:
//!
//! - the client must send `StampedBody<B>` (the request's own body
//!   inside): build it with `Client::builder(..).build::<_, StampedBody<B>>(..)`;
//! - one allocation per request (the stamp, shared by the body and the
//!   throttle's future), and for a scope with a delay and more than one
//!   lane, a wake-up of the request's task when the stamp comes (its
//!   departure is reported from there, under the registry's lock, as it is
//!   without this layer);
//! - a request whose body the client never asks (it failed to connect)
//!   departs at its hand-over, as without this layer: the safe side, should
//!   a client write without asking.
//!
//! # At the socket write
//!
//! Between hyper asking the body and the bytes reaching the kernel, the
//! connection task still encodes the head and makes the write; on a busy
//! machine the OS can preempt it in between, and a site then sees a gap up
//! to a few milliseconds short (`tests/ip_scopes.rs` measured up to 3.5 ms
//! on a debug build). With [`DepartureStampLayer::at_socket_write`] and the
//! client's connector wrapped in [`StampingConnector`] (feature
//! `hyper-util`), hyper asking the body only *arms* the stamp, on the
//! connection task's thread, and the connection stamps it when the socket
//! write that carries the head returns: the kernel has the bytes by then,
//! so the next request of the scope cannot reach the site sooner than the
//! delay after this one. A write that cannot be made at once keeps the
//! stamp until the connection's next write returns. Use the two together:
//! a stamp armed where no `StampingConnector` writes is stamped, late, when
//! the next request is armed on that thread, or else departs at its
//! hand-over when its response comes.
//!
//! With reqwest there is nothing to add: the crate's `reqwest::HttpClient`
//! (feature `reqwest`) stamps a throttled request's body itself, when hyper under reqwest asks
//! whether it is empty (reqwest asks its size earlier, which does not
//! stamp).
//!
//! It only helps between a `Throttle` and a client that asks the body when
//! it writes (hyper's and hyper-util's HTTP/1 and HTTP/2 clients do). Put
//! nothing between it and the client that reads the body early, and keep
//! it inside the throttle: it learns from the throttle, on the same
//! thread, during the throttle's call (as the feedback layers learn the
//! scopes). Without a throttle outside, it stamps nothing.
//!
//! ```
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use http_body_util::Empty;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_throttle::departure::{DepartureStampLayer, StampedBody};
//! use tower_throttle::{BackoffLayer, Registry, ScopeConfig, ThrottleLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let registry = Registry::builder()
//!     .default_scope(ScopeConfig::default().concurrency(2).delay(Duration::from_millis(500)))
//!     .build()
//!     .unwrap();
//! let client = Client::builder(TokioExecutor::new()).build_http::<StampedBody<Empty<Bytes>>>();
//! let crawler = ServiceBuilder::new()
//!     .layer(ThrottleLayer::new(registry.clone()))
//!     .layer(BackoffLayer::new(registry))
//!     .layer(DepartureStampLayer::new())
//!     .service(client);
//! let request = http::Request::get("http://127.0.0.1:9/").body(Empty::<Bytes>::new()).unwrap();
//! // Nothing listens on port 9: the request fails to connect.
//! assert!(crawler.oneshot(request).await.is_err());
//! # }
//! ```

mod body;
#[cfg(feature = "hyper-util")]
mod io;
mod layer;
mod service;
pub(crate) mod stamp;

pub use body::StampedBody;
#[cfg(feature = "reqwest")]
pub(crate) use body::StampedBy;
#[cfg(feature = "hyper-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "hyper-util")))]
pub use io::{Connecting, StampedIo, StampingConnector};
pub use layer::DepartureStampLayer;
pub use service::DepartureStamp;
