//! Connections to the server a request was throttled for.
//!
//! [`IpScopeLayer`](crate::ip::IpScopeLayer) throttles each request for one
//! server address and records it on the request as a
//! [`ServerAddr`](crate::ip::ServerAddr). A client that resolves the name
//! again on its own may connect elsewhere: DNS round robin hands out
//! another address, or the record changed since. The server that receives
//! the request is then not the one whose scope admitted it. Two pieces hold
//! the connection to the throttled address:
//!
//! - [`PinServerLayer`], the innermost layer, right around the client,
//!   writes the request's address into its URI as userinfo:
//!   `http://books.example/a` becomes `http://203.0.113.7@books.example/a`.
//! - [`PinnedConnector`], around the client's TCP connector (under the TLS
//!   connector, for https), dials the address it finds there instead of
//!   resolving the name. A URI without one is resolved as usual.
//!
//! ```text
//! request ──► IpScope ──► Throttle ──► … ──► PinServer ──► hyper-util Client
//!             ServerAddr 203.0.113.7          http://203.0.113.7@books.example/a
//!                                                          │
//!                          HttpsConnector ──► PinnedConnector ──► HttpConnector
//!                          (SNI books.example)  dials 203.0.113.7
//! ```
//!
//! # Why the URI
//!
//! hyper-util's client hands its connector the URI alone, never the
//! request, and keys its pool of kept-alive connections by scheme and
//! authority. With the address in the authority's userinfo:
//!
//! - each pair of name and address has connections of its own, so a
//!   request throttled for `203.0.113.7` never rides a connection opened
//!   to `203.0.113.8` before the record changed;
//! - the host stays the name, so the `Host` header, the TLS server name
//!   (SNI) and the certificate check are the name's, as without pinning;
//! - over HTTP/1 the client sends the path alone (origin form), so the
//!   userinfo never goes on the wire.
//!
//! # Limits
//!
//! - **HTTP/1 only.** An HTTP/2 client sends the authority, userinfo and
//!   all, as its `:authority`; and a request sent through an HTTP proxy
//!   names the host to the proxy, which resolves it itself.
//! - **Userinfo is the layer's.** `PinServer` replaces a request's own
//!   userinfo, and removes it from requests without a `ServerAddr` (hyper
//!   never sends it: it is not credentials to hyper). This matters: a
//!   crawled link such as `http://10.0.0.1@example.com/` would otherwise
//!   make `PinnedConnector` dial `10.0.0.1`. Put `PinServerLayer` directly
//!   around the client, so every request the client sees went through it.
//! - reqwest has no hook for a per-request address: its connector sees
//!   neither the request nor a URI of ours, so a reqwest client connects
//!   where its own resolution says (its `dns_resolver` hook takes one
//!   resolver for every request).
//!
//! ```
//! use std::time::Duration;
//! use http_body_util::Empty;
//! use hyper::body::Bytes;
//! use hyper_util::client::legacy::{connect::HttpConnector, Client};
//! use hyper_util::rt::TokioExecutor;
//! use tower::ServiceBuilder;
//! use tower_throttle::connect::{PinServerLayer, PinnedConnector};
//! use tower_throttle::ip::IpScopeLayer;
//! use tower_throttle::{Registry, ScopeConfig, ThrottleLayer};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = Registry::builder()
//!     .ip_scopes(ScopeConfig::default().concurrency(2).delay(Duration::from_millis(50)))
//!     .build()?;
//! let connector = PinnedConnector::new(HttpConnector::new());
//! let client = ServiceBuilder::new()
//!     .layer(IpScopeLayer::new(registry.clone()))
//!     .layer(ThrottleLayer::new(registry))
//!     .layer(PinServerLayer::new())
//!     .service(Client::builder(TokioExecutor::new()).build::<_, Empty<Bytes>>(connector));
//! # let _ = client;
//! # Ok(())
//! # }
//! ```
//!
//! For https, put the TLS connector around it: with hyper-rustls,
//! `HttpsConnectorBuilder::new()…wrap_connector(PinnedConnector::new(http))`,
//! where `http` is an `HttpConnector` with `enforce_http(false)`.

mod connector;
mod layer;
mod service;
mod userinfo;

pub use connector::PinnedConnector;
pub use layer::PinServerLayer;
pub use service::PinServer;
