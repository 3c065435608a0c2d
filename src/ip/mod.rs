//! Scopes by server address: politeness per server, not only per name.
//!
//! On shared hosting a thousand names resolve to one server. Scoped by host
//! alone, a crawler sends that server a thousand times what one scope
//! allows. [`IpScopeLayer`], placed **outside** [`ThrottleLayer`](crate::ThrottleLayer),
//! resolves each request's host before admission and adds the scope of the
//! address it found, `ip:203.0.113.7`, to the request's own scopes (the
//! host scope, by default): the request is sent when *all* of them allow it,
//! as any multi-scope request. Configure every IP scope at once with
//! [`RegistryBuilder::ip_scopes`](crate::registry::RegistryBuilder::ip_scopes)
//! (`[ip_scopes]` in the config file), and one address or network by
//! name: `Registry::builder().scope("ip:203.0.113.7", config)`. With
//! [`ipv4_prefix`](IpScopeLayerBuilder::ipv4_prefix) or
//! [`ipv6_prefix`](IpScopeLayerBuilder::ipv6_prefix) one scope covers a
//! network (`ip:203.0.113.0/24`, `ip:2001:db8::/64`). IP scopes show in
//! [`Registry::scope_stats`](crate::Registry::scope_stats) and metrics as
//! any other scope.
//!
//! ```text
//! request ──► IpScope ──► Throttle ──► … ──► client
//!             resolves books.example → 203.0.113.7
//!             scopes: books.example + ip:203.0.113.7
//! ```
//!
//! # Resolution
//!
//! - Before admission, asynchronously, through a pluggable [`Resolve`]:
//!   [`SystemResolver`] (the operating system's, the default) or a
//!   [`FixedResolver`] (a map, for tests and pinned crawls).
//! - A bounded cache keeps each answer for the resolver's TTL, at most
//!   [`cache_ttl`](IpScopeLayerBuilder::cache_ttl) (60 s; the system
//!   resolver does not tell TTLs), and a failure for
//!   [`failure_ttl`](IpScopeLayerBuilder::failure_ttl) (5 s). A lookup
//!   fails after [`lookup_timeout`](IpScopeLayerBuilder::lookup_timeout)
//!   (10 s), so no request waits on a resolver for ever.
//! - The requests of a name that arrive during its lookup share it (one
//!   lookup per name at a time), and hold no readiness of the inner
//!   service while they wait (with `Throttle` inside, no queue place).
//! - A request to an IP literal needs no lookup; a request without a host
//!   goes on unchanged.
//! - A failed lookup fails its requests with an [`Error`](crate::Error)
//!   whose [`is_dns`](crate::Error::is_dns) is true; they never reach the
//!   inner service, so nothing is sent unthrottled and nothing stays
//!   queued. The request that started the lookup reports it as backoff
//!   feedback on its scopes (once per lookup), so a name that keeps failing
//!   slows down like a server that keeps refusing.
//!
//! # Which address
//!
//! The scope is the **first** address the resolver lists, which the
//! request also carries as a [`ServerAddr`] extension. A client that
//! resolves the name again may connect elsewhere (DNS round robin, a record
//! that changed since): with hyper-util, [`connect`](crate::connect) holds
//! the connection to the `ServerAddr` (`PinServerLayer` around the client,
//! `PinnedConnector` around its `HttpConnector`). Without it, the system
//! resolver's order is the order `HttpConnector` tries addresses in, so
//! one address per name (shared hosting) or a stable order is held too.
//!
//! ```
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_throttle::ip::{FixedResolver, IpScopeLayer, ServerAddr};
//! use tower_throttle::{Registry, ScopeConfig, Scopes, ThrottleLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Two names on one server: one request to the server every 50 ms.
//! let server = ScopeConfig::default()
//!     .delay(Duration::from_millis(50))
//!     .delay_per_slot(Duration::ZERO)
//!     .jitter(0.0);
//! let registry = Registry::builder()
//!     .default_scope(ScopeConfig::default().concurrency(8).delay(Duration::ZERO))
//!     .ip_scopes(server)
//!     .build()?;
//! let resolver = FixedResolver::new();
//! resolver.set("a.example", [[127, 0, 0, 2]]);
//! resolver.set("b.example", [[127, 0, 0, 2]]);
//! let client = ServiceBuilder::new()
//!     .layer(IpScopeLayer::builder(registry.clone()).resolver(resolver).build()?)
//!     .layer(ThrottleLayer::new(registry.clone()))
//!     .service(tower::service_fn(|request: http::Request<()>| async move {
//!         let scopes = request.extensions().get::<Scopes>().unwrap().clone();
//!         assert!(scopes.contains("ip:127.0.0.2"));
//!         assert!(request.extensions().get::<ServerAddr>().is_some());
//!         Ok::<_, std::convert::Infallible>(http::Response::new(()))
//!     }));
//! let start = tokio::time::Instant::now();
//! client.clone().oneshot(http::Request::get("http://a.example/").body(())?).await?;
//! client.oneshot(http::Request::get("http://b.example/").body(())?).await?;
//! assert_eq!(start.elapsed(), Duration::from_millis(50));
//! assert_eq!(registry.scope_stats("ip:127.0.0.2").unwrap().sent, 2);
//! # Ok(())
//! # }
//! ```

mod ahead;
mod attach;
mod cache;
pub mod future;
mod layer;
mod resolve;
mod service;
mod shared;

use std::net::IpAddr;

pub(crate) use ahead::{Ahead, LookedUp};
pub use layer::{
    IpScopeLayer, IpScopeLayerBuilder, DEFAULT_CACHE_TTL, DEFAULT_FAILURE_TTL, DEFAULT_LOOKUP_TIMEOUT,
    DEFAULT_MAX_NAMES,
};
pub use resolve::{FixedResolver, Lookup, Resolve, Resolved, SystemResolver};
pub use service::IpScope;

use crate::scope::Scope;

/// How the names of IP scopes begin: the registry gives such scopes the
/// IP scopes' config.
pub(crate) const IP_SCOPE_PREFIX: &str = "ip:";

/// The server address a request was throttled for (a request extension
/// [`IpScope`] sets): the address to connect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ServerAddr(pub IpAddr);

/// A server a request goes to: its address, and its IP scope, named once
/// per lookup (not once per request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Server {
    pub(crate) address: IpAddr,
    pub(crate) scope: Scope,
}

impl Server {
    /// The server at `address`, its scope cut at these prefix lengths.
    pub(crate) fn new(address: IpAddr, ipv4_prefix: u8, ipv6_prefix: u8) -> Self {
        Server {
            address,
            scope: ip_scope(address, ipv4_prefix, ipv6_prefix),
        }
    }
}

/// The scope of `address`: `ip:` and the address, or its network with a
/// prefix shorter than the address.
fn ip_scope(address: IpAddr, ipv4_prefix: u8, ipv6_prefix: u8) -> Scope {
    let name = match address {
        IpAddr::V4(v4) if ipv4_prefix < 32 => {
            let mask = u32::MAX << (32 - u32::from(ipv4_prefix));
            let network = std::net::Ipv4Addr::from(u32::from(v4) & mask);
            format!("{IP_SCOPE_PREFIX}{network}/{ipv4_prefix}")
        }
        IpAddr::V6(v6) if ipv6_prefix < 128 => {
            let mask = u128::MAX << (128 - u32::from(ipv6_prefix));
            let network = std::net::Ipv6Addr::from(u128::from(v6) & mask);
            format!("{IP_SCOPE_PREFIX}{network}/{ipv6_prefix}")
        }
        address => format!("{IP_SCOPE_PREFIX}{address}"),
    };
    Scope::new(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_name_the_address_or_its_network() {
        let v4: IpAddr = "203.0.113.7".parse().unwrap();
        let v6: IpAddr = "2001:db8::1:2:3:4".parse().unwrap();
        assert_eq!(ip_scope(v4, 32, 128).as_str(), "ip:203.0.113.7");
        assert_eq!(ip_scope(v4, 24, 128).as_str(), "ip:203.0.113.0/24");
        assert_eq!(ip_scope(v4, 1, 128).as_str(), "ip:128.0.0.0/1");
        assert_eq!(ip_scope(v6, 32, 128).as_str(), "ip:2001:db8::1:2:3:4");
        assert_eq!(ip_scope(v6, 32, 64).as_str(), "ip:2001:db8::/64");
    }
}
