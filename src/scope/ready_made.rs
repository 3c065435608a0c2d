//! Ready-made resolvers beyond the default [`HostResolver`](super::HostResolver).

use super::{RequestHead, ScopeResolver, Scopes};

/// One scope per host and path prefix: the host followed by the first
/// `segments` path segments (`https://api.example.com/v1/users/7` with two
/// segments → `api.example.com/v1/users`). Useful for APIs that limit each
/// endpoint separately. A path shorter than `segments` uses what it has.
///
/// ```
/// use tower_throttle::scope::EndpointResolver;
/// use tower_throttle::{Registry, RequestHead, ScopeResolver};
///
/// let resolver = EndpointResolver::segments(1);
/// let request = http::Request::get("https://api.example.com/v1/users/7").body(()).unwrap();
/// let scopes = resolver.resolve(&RequestHead::of(&request));
/// assert!(scopes.contains("api.example.com/v1"));
/// let registry = Registry::builder().resolver(resolver).build().unwrap();
/// # drop(registry);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct EndpointResolver {
    segments: usize,
}

impl EndpointResolver {
    /// Scopes by host and the first `segments` path segments.
    pub fn segments(segments: usize) -> Self {
        EndpointResolver { segments }
    }
}

impl ScopeResolver for EndpointResolver {
    fn resolve(&self, head: &RequestHead<'_>) -> Scopes {
        let host = head.host().unwrap_or_default();
        let mut key = String::with_capacity(host.len() + 16);
        key.push_str(&host);
        for segment in head
            .uri
            .path()
            .split('/')
            .filter(|s| !s.is_empty())
            .take(self.segments)
        {
            key.push('/');
            key.push_str(segment);
        }
        Scopes::one(key)
    }
}

#[cfg(feature = "public-suffix")]
pub use public_suffix::{HostAndParentsResolver, RegistrableDomainResolver};

#[cfg(feature = "public-suffix")]
mod public_suffix {
    use super::*;
    use crate::scope::Scope;

    /// The registrable domain of `host` (public suffix plus one label:
    /// `books.toscrape.com` → `toscrape.com`, `a.b.example.co.uk` →
    /// `example.co.uk`), or `None` for IP addresses, single labels such as
    /// `localhost`, and hosts that are public suffixes themselves.
    fn registrable_domain(host: &str) -> Option<&str> {
        if host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[') {
            return None;
        }
        let host = host.strip_suffix('.').unwrap_or(host);
        psl::domain_str(host).filter(|domain| !domain.is_empty())
    }

    /// One scope per registrable domain: every subdomain of `toscrape.com`
    /// shares the scope `toscrape.com` (Scrapy's "highest-level registrable
    /// domain" example). Uses the public suffix list, so `example.co.uk`
    /// and `other.co.uk` stay apart. Hosts without a registrable domain
    /// (IP addresses, `localhost`) are their own scope.
    ///
    /// ```
    /// use tower_throttle::scope::RegistrableDomainResolver;
    /// use tower_throttle::{RequestHead, ScopeResolver};
    ///
    /// let request = http::Request::get("https://books.toscrape.com/").body(()).unwrap();
    /// let scopes = RegistrableDomainResolver.resolve(&RequestHead::of(&request));
    /// assert!(scopes.contains("toscrape.com"));
    /// ```
    #[derive(Debug, Clone, Copy, Default)]
    pub struct RegistrableDomainResolver;

    impl ScopeResolver for RegistrableDomainResolver {
        fn resolve(&self, head: &RequestHead<'_>) -> Scopes {
            let host = head.host().unwrap_or_default();
            let scope = registrable_domain(&host).map_or_else(|| Scope::new(&*host), Scope::new);
            Scopes::one(scope)
        }
    }

    /// The host and each parent domain down to the registrable domain:
    /// `books.toscrape.com` → `books.toscrape.com` and `toscrape.com`, so a
    /// limit on `toscrape.com` caps the whole site while each subdomain keeps
    /// its own (the seeds' `toscrape.com` 32 / `books` 24 / `quotes` 16
    /// example). Public suffixes (`co.uk`) are never scopes.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::scope::HostAndParentsResolver;
    /// use tower_throttle::{Registry, RequestHead, ScopeConfig, ScopeResolver};
    ///
    /// let request = http::Request::get("https://books.toscrape.com/").body(()).unwrap();
    /// let scopes = HostAndParentsResolver.resolve(&RequestHead::of(&request));
    /// assert!(scopes.contains("books.toscrape.com") && scopes.contains("toscrape.com"));
    ///
    /// let registry = Registry::builder()
    ///     .resolver(HostAndParentsResolver)
    ///     .default_scope(ScopeConfig::default().delay(Duration::ZERO))
    ///     .scope("toscrape.com", ScopeConfig::default().concurrency(32).delay(Duration::ZERO))
    ///     .scope("books.toscrape.com", ScopeConfig::default().concurrency(24).delay(Duration::ZERO))
    ///     .scope("quotes.toscrape.com", ScopeConfig::default().concurrency(16).delay(Duration::ZERO))
    ///     .build()?;
    /// # Ok::<(), tower_throttle::ConfigError>(())
    /// ```
    #[derive(Debug, Clone, Copy, Default)]
    pub struct HostAndParentsResolver;

    impl ScopeResolver for HostAndParentsResolver {
        fn resolve(&self, head: &RequestHead<'_>) -> Scopes {
            let host = head.host().unwrap_or_default();
            let Some(domain) = registrable_domain(&host) else {
                return Scopes::one(&*host);
            };
            let mut scopes = vec![host.to_string()];
            let mut rest: &str = &host;
            while rest.len() > domain.len() {
                match rest.split_once('.') {
                    Some((_, parent)) if parent.len() >= domain.len() => {
                        rest = parent;
                        scopes.push(parent.to_owned());
                    }
                    _ => break,
                }
            }
            Scopes::from(scopes)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(resolver: &impl ScopeResolver, uri: &str) -> Vec<String> {
        let request = http::Request::get(uri).body(()).unwrap();
        resolver
            .resolve(&RequestHead::of(&request))
            .iter()
            .map(|(scope, _)| scope.to_string())
            .collect()
    }

    #[test]
    fn endpoint_scopes_keep_the_first_path_segments() {
        let two = EndpointResolver::segments(2);
        assert_eq!(
            resolve(&two, "https://API.example.com/v1/users/7"),
            ["api.example.com/v1/users"]
        );
        assert_eq!(
            resolve(&two, "https://api.example.com/v1"),
            ["api.example.com/v1"]
        );
        assert_eq!(resolve(&two, "https://api.example.com/"), ["api.example.com"]);
        assert_eq!(
            resolve(&EndpointResolver::segments(0), "https://a.example/x"),
            ["a.example"]
        );
    }

    #[cfg(feature = "public-suffix")]
    #[test]
    fn registrable_domains_follow_the_public_suffix_list() {
        let cases = [
            ("https://books.toscrape.com/", "toscrape.com"),
            ("https://toscrape.com/", "toscrape.com"),
            ("https://a.b.example.co.uk/", "example.co.uk"),
            ("https://user.github.io/", "user.github.io"),
            ("http://127.0.0.1:8080/", "127.0.0.1"),
            ("http://[::1]:8080/", "[::1]"),
            ("http://localhost/", "localhost"),
        ];
        for (uri, expected) in cases {
            assert_eq!(resolve(&RegistrableDomainResolver, uri), [expected], "{uri}");
        }
    }

    #[cfg(feature = "public-suffix")]
    #[test]
    fn host_and_parents_stop_at_the_registrable_domain() {
        assert_eq!(
            resolve(&HostAndParentsResolver, "https://books.toscrape.com/"),
            ["books.toscrape.com", "toscrape.com"]
        );
        assert_eq!(
            resolve(&HostAndParentsResolver, "https://toscrape.com/"),
            ["toscrape.com"]
        );
        assert_eq!(
            resolve(&HostAndParentsResolver, "https://a.b.example.co.uk/"),
            ["a.b.example.co.uk", "b.example.co.uk", "example.co.uk"]
        );
        assert_eq!(
            resolve(&HostAndParentsResolver, "http://127.0.0.1/"),
            ["127.0.0.1"]
        );
        assert_eq!(
            resolve(&HostAndParentsResolver, "http://localhost/"),
            ["localhost"]
        );
    }
}
