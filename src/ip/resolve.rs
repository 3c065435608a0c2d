//! Name resolution for IP scopes: the pluggable [`Resolve`] trait, the
//! system's resolver and a fixed map for tests.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// A lookup in flight: boxed, since resolvers differ and a lookup is once
/// per name per TTL, not per request.
pub type Lookup = Pin<Box<dyn Future<Output = io::Result<Resolved>> + Send>>;

/// Resolves host names to the addresses a client will connect to.
///
/// [`SystemResolver`] (the default) asks the operating system; a
/// [`FixedResolver`] answers from a map. Implement it to use another
/// resolver (hickory-resolver, say, which knows each record's TTL).
///
/// ```
/// use std::net::IpAddr;
/// use tower_throttle::ip::{Lookup, Resolve, Resolved};
///
/// #[derive(Debug)]
/// struct Everything(IpAddr);
///
/// impl Resolve for Everything {
///     fn resolve(&self, _host: &str) -> Lookup {
///         let address = self.0;
///         Box::pin(async move { Ok(Resolved::new(vec![address])) })
///     }
/// }
/// # let _ = Everything([127, 0, 0, 1].into());
/// ```
pub trait Resolve: fmt::Debug + Send + Sync + 'static {
    /// The addresses of `host` (a name, never an IP literal). An empty list
    /// is a failed lookup.
    fn resolve(&self, host: &str) -> Lookup;
}

/// What a lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Resolved {
    /// The addresses, in the order the client should try them.
    pub addresses: Vec<IpAddr>,
    /// How long the answer may be kept, if the resolver knows (DNS records
    /// carry a TTL); `None` keeps it for the layer's
    /// [`cache_ttl`](super::IpScopeLayerBuilder::cache_ttl).
    pub ttl: Option<Duration>,
}

impl Resolved {
    /// `addresses`, with no TTL of their own.
    pub fn new(addresses: Vec<IpAddr>) -> Self {
        Resolved { addresses, ttl: None }
    }

    /// The same, kept for `ttl` at most.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
}

/// The operating system's resolver (`getaddrinfo`, through tokio's
/// `lookup_host` on the blocking pool): `/etc/hosts`, nsswitch, the
/// system's DNS settings, and its address order (RFC 6724), which is the
/// order hyper-util's `HttpConnector` tries them in. It does not tell the
/// records' TTLs, so answers are kept for the layer's `cache_ttl`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, host: &str) -> Lookup {
        let host = host.to_owned();
        Box::pin(async move {
            let mut addresses: Vec<IpAddr> = Vec::new();
            for address in tokio::net::lookup_host((host.as_str(), 0)).await? {
                if !addresses.contains(&address.ip()) {
                    addresses.push(address.ip());
                }
            }
            Ok(Resolved::new(addresses))
        })
    }
}

/// Answers from a map of names to addresses, which may change at any time
/// (clones share it): for tests, and for crawls that pin names to servers.
/// A name not in the map fails its lookup (`NotFound`).
///
/// ```
/// use tower_throttle::ip::FixedResolver;
///
/// let resolver = FixedResolver::new();
/// resolver.set("books.example", [[127, 0, 0, 2]]);
/// resolver.set("quotes.example", [[127, 0, 0, 3]]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct FixedResolver {
    names: Arc<Mutex<HashMap<String, Vec<IpAddr>>>>,
}

impl FixedResolver {
    /// An empty map: every lookup fails.
    pub fn new() -> Self {
        FixedResolver::default()
    }

    /// Sets (or replaces) `name`'s addresses (lower-cased name); an empty
    /// list removes it. Clones of the resolver share the map.
    pub fn set<A: Into<IpAddr>>(&self, name: &str, addresses: impl IntoIterator<Item = A>) {
        let addresses: Vec<IpAddr> = addresses.into_iter().map(Into::into).collect();
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        if addresses.is_empty() {
            names.remove(&name.to_ascii_lowercase());
        } else {
            names.insert(name.to_ascii_lowercase(), addresses);
        }
    }
}

impl Resolve for FixedResolver {
    fn resolve(&self, host: &str) -> Lookup {
        let found = self
            .names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&host.to_ascii_lowercase())
            .cloned();
        Box::pin(async move {
            found
                .map(Resolved::new)
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such name in the fixed map"))
        })
    }
}
