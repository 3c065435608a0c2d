//! [`IpScopeLayer`] and its builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::cache::{CacheSettings, DnsCache};
use super::resolve::{Resolve, SystemResolver};
use super::shared::IpShared;
use super::IpScope;
use crate::error::ConfigError;
use crate::registry::Registry;

/// How long a lookup's answer is kept by default, when the resolver does
/// not say (the system resolver never does).
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(60);
/// How long a failed lookup is remembered by default: its name's requests
/// fail at once meanwhile, instead of asking again each.
pub const DEFAULT_FAILURE_TTL: Duration = Duration::from_secs(5);
/// How long a lookup may take by default before it fails (`TimedOut`).
pub const DEFAULT_LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How many names the cache keeps by default.
pub const DEFAULT_MAX_NAMES: usize = 10_000;

/// Adds to every request the scope of the server address it will connect
/// to (`ip:203.0.113.7`), beside its own scopes: see the [module
/// docs](super).
///
/// ```
/// use tower::ServiceBuilder;
/// use tower_throttle::ip::{FixedResolver, IpScopeLayer};
/// use tower_throttle::{Registry, ThrottleLayer};
///
/// # fn main() -> Result<(), tower_throttle::ConfigError> {
/// let registry = Registry::builder().build()?;
/// let resolver = FixedResolver::new();
/// resolver.set("books.example", [[127, 0, 0, 2]]);
/// let ip_scopes = IpScopeLayer::builder(registry.clone())
///     .resolver(resolver)
///     .ipv4_prefix(24)
///     .build()?;
/// let client = ServiceBuilder::new()
///     .layer(ip_scopes)
///     .layer(ThrottleLayer::new(registry))
///     .service(tower::service_fn(|_request: http::Request<()>| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(()))
///     }));
/// # let _ = client;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct IpScopeLayer {
    shared: Arc<IpShared>,
}

impl fmt::Debug for IpScopeLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpScopeLayer")
            .field("cache", &self.shared.cache)
            .finish()
    }
}

impl IpScopeLayer {
    /// The layer with the system's resolver and the defaults: one scope per
    /// address, answers kept 60 s, lookups at most 10 s, failures kept 5 s,
    /// 10 000 names.
    pub fn new(registry: Registry) -> Self {
        IpScopeLayer::builder(registry)
            .build()
            .expect("the defaults are valid")
    }

    /// A builder, to choose the resolver, the cache and the prefixes.
    pub fn builder(registry: Registry) -> IpScopeLayerBuilder {
        IpScopeLayerBuilder {
            registry,
            resolver: Arc::new(SystemResolver),
            cache_ttl: DEFAULT_CACHE_TTL,
            lookup_timeout: DEFAULT_LOOKUP_TIMEOUT,
            failure_ttl: DEFAULT_FAILURE_TTL,
            max_names: DEFAULT_MAX_NAMES,
            ipv4_prefix: 32,
            ipv6_prefix: 128,
        }
    }
}

impl IpScopeLayer {
    pub(super) fn shared(&self) -> &IpShared {
        &self.shared
    }
}

impl<S> Layer<S> for IpScopeLayer {
    type Service = IpScope<S>;

    fn layer(&self, inner: S) -> IpScope<S> {
        IpScope::from_shared(inner, self.shared.clone())
    }
}

/// Builds an [`IpScopeLayer`]; [`build`](Self::build) checks the settings.
#[derive(Debug)]
pub struct IpScopeLayerBuilder {
    registry: Registry,
    resolver: Arc<dyn Resolve>,
    cache_ttl: Duration,
    lookup_timeout: Duration,
    failure_ttl: Duration,
    max_names: usize,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
}

impl IpScopeLayerBuilder {
    /// The resolver ([`SystemResolver`] by default).
    #[must_use]
    pub fn resolver(mut self, resolver: impl Resolve) -> Self {
        self.resolver = Arc::new(resolver);
        self
    }

    /// How long an answer is kept at most (60 s); a resolver that knows the
    /// record's TTL may keep it shorter. Zero asks on every request.
    #[must_use]
    pub fn cache_ttl(mut self, ttl: Duration) -> Self {
        self.cache_ttl = ttl;
        self
    }

    /// How long a lookup may take (10 s): a resolver that does not answer
    /// by then fails its requests (`Error::is_dns`), as any failed lookup.
    #[must_use]
    pub fn lookup_timeout(mut self, timeout: Duration) -> Self {
        self.lookup_timeout = timeout;
        self
    }

    /// How long a failed lookup is remembered (5 s).
    #[must_use]
    pub fn failure_ttl(mut self, ttl: Duration) -> Self {
        self.failure_ttl = ttl;
        self
    }

    /// How many names the cache keeps (10 000, at least 1). When full, the
    /// expired answers go first, else the one that expires first.
    #[must_use]
    pub fn max_names(mut self, names: usize) -> Self {
        self.max_names = names;
        self
    }

    /// One IP scope per IPv4 network of this prefix length (32, one per
    /// address; 24 puts a /24 in one scope): `ip:203.0.113.0/24`.
    #[must_use]
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.ipv4_prefix = bits;
        self
    }

    /// One IP scope per IPv6 network of this prefix length (128; 64 puts a
    /// /64, often one host, in one scope): `ip:2001:db8::/64`.
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits;
        self
    }

    /// The layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field: a prefix longer than the
    /// address (32 bits for IPv4, 128 for IPv6) or zero, `max_names` 0, or
    /// a zero `lookup_timeout`.
    pub fn build(self) -> Result<IpScopeLayer, ConfigError> {
        if !(1..=32).contains(&self.ipv4_prefix) {
            return Err(ConfigError::new(
                "ipv4_prefix",
                self.ipv4_prefix,
                "must be 1 to 32 bits",
            ));
        }
        if !(1..=128).contains(&self.ipv6_prefix) {
            return Err(ConfigError::new(
                "ipv6_prefix",
                self.ipv6_prefix,
                "must be 1 to 128 bits",
            ));
        }
        if self.lookup_timeout.is_zero() {
            return Err(ConfigError::new(
                "lookup_timeout",
                self.lookup_timeout,
                "must be more than zero",
            ));
        }
        if self.max_names == 0 {
            return Err(ConfigError::new(
                "max_names",
                self.max_names,
                "must be at least 1",
            ));
        }
        let settings = CacheSettings {
            ttl: self.cache_ttl,
            timeout: self.lookup_timeout,
            failure_ttl: self.failure_ttl,
            max_names: self.max_names,
            prefixes: (self.ipv4_prefix, self.ipv6_prefix),
        };
        Ok(IpScopeLayer {
            shared: Arc::new(IpShared {
                registry: self.registry,
                cache: Arc::new(DnsCache::new(self.resolver, settings)),
            }),
        })
    }
}
