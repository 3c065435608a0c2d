//! Ready-made resolvers beyond the default [`HostResolver`].

use std::borrow::Cow;

use super::{HostResolver, RequestHead, ScopeResolver, Scopes};

/// One scope per host and path prefix: the host followed by the first
/// `segments` path segments (`https://api.example.com/v1/users/7` with two
/// segments → `api.example.com/v1/users`). Useful for APIs that limit each
/// endpoint separately. A path shorter than `segments` uses what it has.
///
/// ```
/// use tower_throttle::scope::EndpointResolver;
/// use tower_throttle::{Registry};
/// use tower_throttle::scope::{RequestHead, ScopeResolver};
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

    fn check_key(&self, key: &str) -> Result<(), String> {
        super::key_check::check_endpoint_key(key, self.segments)
    }
}

/// Requests to a scraping API (`https://api.example/?url=https%3A%2F%2Fsite.example%2Fpage`)
/// get the API's scope *and* the target site's scope, so the API's limits
/// and each site's politeness hold together (the seeds' "Web scraping API
/// throttling"): give the API many lanes and a short delay, and two
/// requests for the same site still wait the site's delay, while requests
/// for different sites go through the API at the API's pace.
///
/// - A request to one of the `api_hosts` (compared with the request's
///   host, lower-cased, without port) gets the scopes of the
///   [`inner`](Self::inner) resolver (by default the host: the API's
///   scope), plus the scopes of the target URL, read from the query
///   parameter [`parameter`](Self::parameter) (default `url`),
///   percent-decoded as a form value (`+` is a space) unless
///   [`percent_decoded(false)`](Self::percent_decoded), and resolved by the
///   [`target`](Self::target) resolver (by default the host). Each scope
///   keeps the cost its resolver gave it (1.0 by default), as the seeds'
///   `add_scope` does.
/// - Any other request gets the inner resolver's scopes only.
/// - A request to the API whose parameter is missing, empty, or not an
///   absolute `http(s)` URL with a host (`site.example/page`, `/page`,
///   `mailto:me@site.example`, `%zz`) gets
///   only the API's scopes: it is still throttled by the API, never
///   refused, and the resolver never panics.
///
/// Target keys follow this crate's host rule (lower-cased, without port),
/// where the seeds' example uses the target's `netloc` (port included).
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::scope::ScrapingApiResolver;
/// use tower_throttle::{Registry, ScopeConfig};
/// use tower_throttle::scope::{RequestHead, ScopeResolver};
///
/// let resolver = ScrapingApiResolver::new(["api.example"]);
/// let request = http::Request::get("https://api.example/?url=https%3A%2F%2FSite.example%2Fa")
///     .body(())
///     .unwrap();
/// let scopes = resolver.resolve(&RequestHead::of(&request));
/// assert!(scopes.contains("api.example") && scopes.contains("site.example"));
///
/// let registry = Registry::builder()
///     .resolver(resolver)
///     .scope("api.example", ScopeConfig::default().concurrency(1000).delay(Duration::from_millis(80)))
///     .build()?;
/// # drop(registry);
/// # Ok::<(), tower_throttle::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ScrapingApiResolver<I = HostResolver, T = HostResolver> {
    api_hosts: Vec<String>,
    parameter: String,
    percent_decoded: bool,
    inner: I,
    target: T,
}

impl ScrapingApiResolver {
    /// Treats requests to `api_hosts` (host names, any case, no port) as
    /// scraping API calls whose target URL is in the `url` query parameter.
    pub fn new<H: AsRef<str>>(api_hosts: impl IntoIterator<Item = H>) -> Self {
        ScrapingApiResolver {
            api_hosts: api_hosts
                .into_iter()
                .map(|host| host.as_ref().to_ascii_lowercase())
                .collect(),
            parameter: "url".to_owned(),
            percent_decoded: true,
            inner: HostResolver,
            target: HostResolver,
        }
    }
}

impl<I, T> ScrapingApiResolver<I, T> {
    /// The query parameter that holds the target URL (default `url`).
    #[must_use]
    pub fn parameter(mut self, name: impl Into<String>) -> Self {
        self.parameter = name.into();
        self
    }

    /// Whether the parameter's value is percent-decoded as a form value
    /// (default `true`). With `false` the raw value up to the next `&` is
    /// the target URL, for APIs that take it unencoded.
    #[must_use]
    pub fn percent_decoded(mut self, decoded: bool) -> Self {
        self.percent_decoded = decoded;
        self
    }

    /// The resolver for every request's own scopes: the API's scopes for
    /// API calls, all scopes of other requests (default: the host).
    pub fn inner<R: ScopeResolver>(self, inner: R) -> ScrapingApiResolver<R, T> {
        ScrapingApiResolver {
            api_hosts: self.api_hosts,
            parameter: self.parameter,
            percent_decoded: self.percent_decoded,
            inner,
            target: self.target,
        }
    }

    /// The resolver applied to the target URL (default: its host). It sees
    /// the request's method and extensions, the target URL, and no headers
    /// (the request's headers are the API's).
    pub fn target<R: ScopeResolver>(self, target: R) -> ScrapingApiResolver<I, R> {
        ScrapingApiResolver {
            api_hosts: self.api_hosts,
            parameter: self.parameter,
            percent_decoded: self.percent_decoded,
            inner: self.inner,
            target,
        }
    }

    fn is_api(&self, head: &RequestHead<'_>) -> bool {
        head.host()
            .is_some_and(|host| self.api_hosts.iter().any(|api| *api == *host))
    }

    /// The target URL of an API call, when its query names an absolute
    /// `http` or `https` URL with a host.
    fn target_uri(&self, uri: &http::Uri) -> Option<http::Uri> {
        let value = query_parameter(uri.query()?, &self.parameter, self.percent_decoded)?;
        let target: http::Uri = value.parse().ok()?;
        let web = matches!(target.scheme_str(), Some(scheme) if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https"));
        let has_host = target.host().is_some_and(|host| !host.is_empty());
        (web && has_host).then_some(target)
    }
}

/// The first value of `name` in `query`, decoded as a form value or raw.
fn query_parameter<'a>(query: &'a str, name: &str, decoded: bool) -> Option<Cow<'a, str>> {
    if decoded {
        return form_urlencoded::parse(query.as_bytes())
            .find(|(key, _)| key == name)
            .map(|(_, value)| value);
    }
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
        .map(Cow::Borrowed)
}

impl<I: ScopeResolver, T: ScopeResolver> ScopeResolver for ScrapingApiResolver<I, T> {
    fn resolve(&self, head: &RequestHead<'_>) -> Scopes {
        let own = self.inner.resolve(head);
        if !self.is_api(head) {
            return own;
        }
        let Some(target_uri) = self.target_uri(head.uri) else {
            return own;
        };
        let no_headers = http::HeaderMap::new();
        let target_head = RequestHead {
            method: head.method,
            uri: &target_uri,
            headers: &no_headers,
            extensions: head.extensions,
        };
        let target = self.target.resolve(&target_head);
        Scopes::with_costs(
            own.iter()
                .chain(target.iter())
                .map(|(scope, cost)| (scope.clone(), cost)),
        )
    }

    /// A key either resolver can give (the API's scopes are the inner
    /// resolver's, the sites' the target resolver's).
    fn check_key(&self, key: &str) -> Result<(), String> {
        self.inner
            .check_key(key)
            .or_else(|why| self.target.check_key(key).map_err(|_| why))
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
    /// use tower_throttle::scope::{RequestHead, ScopeResolver};
    ///
    /// let request = http::Request::get("https://books.toscrape.com/").body(()).unwrap();
    /// let scopes = RegistrableDomainResolver.resolve(&RequestHead::of(&request));
    /// assert!(scopes.contains("toscrape.com"));
    /// ```
    #[derive(Debug, Clone, Copy, Default)]
    #[cfg_attr(docsrs, doc(cfg(feature = "public-suffix")))]
    pub struct RegistrableDomainResolver;

    impl ScopeResolver for RegistrableDomainResolver {
        fn resolve(&self, head: &RequestHead<'_>) -> Scopes {
            let host = head.host().unwrap_or_default();
            let scope = registrable_domain(&host).map_or_else(|| Scope::new(&*host), Scope::new);
            Scopes::one(scope)
        }

        fn check_key(&self, key: &str) -> Result<(), String> {
            crate::scope::key_check::check_host_key(key, "the registrable-domain resolver")
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
    /// use tower_throttle::{Registry, ScopeConfig};
    /// use tower_throttle::scope::{RequestHead, ScopeResolver};
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
    #[cfg_attr(docsrs, doc(cfg(feature = "public-suffix")))]
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

        fn check_key(&self, key: &str) -> Result<(), String> {
            crate::scope::key_check::check_host_key(key, "the host-and-parents resolver")
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

    fn scraping_api() -> ScrapingApiResolver {
        ScrapingApiResolver::new(["API.example", "proxy.example"])
    }

    #[test]
    fn api_calls_get_the_api_scope_and_the_target_sites_scope() {
        let cases = [
            (
                "https://api.example/?url=https%3A%2F%2Fsite.example%2Fpage%3Fa%3D1",
                &["api.example", "site.example"][..],
            ),
            (
                "https://api.example:8443/v1/scrape?render=1&url=http%3A%2F%2FWWW.Site.example%3A8080%2F",
                &["api.example", "www.site.example"],
            ),
            // Unencoded separators a lenient API accepts still decode.
            (
                "https://proxy.example/?url=https://other.example/x",
                &["proxy.example", "other.example"],
            ),
            // The first `url` parameter wins.
            (
                "https://api.example/?url=https%3A%2F%2Fa.example&url=https%3A%2F%2Fb.example",
                &["api.example", "a.example"],
            ),
            // Only the parameter itself counts, not one whose name ends in it.
            (
                "https://api.example/?callback_url=https%3A%2F%2Fhook.example",
                &["api.example"],
            ),
        ];
        for (uri, expected) in cases {
            assert_eq!(resolve(&scraping_api(), uri), expected, "{uri}");
        }
    }

    #[test]
    fn a_missing_or_malformed_target_leaves_only_the_api_scope() {
        for uri in [
            "https://api.example/",
            "https://api.example/?render=1",
            "https://api.example/?url=",
            "https://api.example/?url=site.example%2Fpage",
            "https://api.example/?url=%2Fpage",
            "https://api.example/?url=%zz%ff",
            "https://api.example/?url=https%3A%2F%2F",
            "https://api.example/?url=https%3A%2F%2Fsite.example%2Fa%20b",
            "https://api.example/?url=mailto%3Ame%40site.example",
        ] {
            assert_eq!(resolve(&scraping_api(), uri), ["api.example"], "{uri}");
        }
    }

    #[test]
    fn requests_not_to_the_api_use_the_inner_resolver() {
        assert_eq!(
            resolve(
                &scraping_api(),
                "https://site.example/?url=https%3A%2F%2Fother.example"
            ),
            ["site.example"]
        );
        let by_endpoint = scraping_api().inner(EndpointResolver::segments(1));
        assert_eq!(
            resolve(&by_endpoint, "https://site.example/shop/1"),
            ["site.example/shop"]
        );
        assert_eq!(
            resolve(
                &by_endpoint,
                "https://api.example/v2/?url=https%3A%2F%2Fsite.example%2Fshop"
            ),
            ["api.example/v2", "site.example"]
        );
    }

    #[test]
    fn parameter_decoding_and_target_resolver_are_configurable() {
        let custom = scraping_api()
            .parameter("target")
            .target(EndpointResolver::segments(1));
        assert_eq!(
            resolve(
                &custom,
                "https://api.example/?url=x&target=https%3A%2F%2Fsite.example%2Fshop%2F1"
            ),
            ["api.example", "site.example/shop"]
        );
        let raw = scraping_api().percent_decoded(false);
        assert_eq!(
            resolve(&raw, "https://api.example/?url=https://site.example/a+b&x=1"),
            ["api.example", "site.example"]
        );
        // Raw values are not decoded, so an encoded URL is malformed.
        assert_eq!(
            resolve(&raw, "https://api.example/?url=https%3A%2F%2Fsite.example%2F"),
            ["api.example"]
        );
    }

    #[test]
    fn target_scopes_keep_the_costs_their_resolver_gives() {
        let costly = scraping_api()
            .target(|head: &RequestHead<'_>| Scopes::with_costs([(head.host().unwrap_or_default(), 5.0)]));
        let request = http::Request::get("https://api.example/?url=https%3A%2F%2Fsite.example")
            .body(())
            .unwrap();
        let scopes = costly.resolve(&RequestHead::of(&request));
        let listed: Vec<_> = scopes.iter().map(|(s, c)| (s.to_string(), c)).collect();
        assert_eq!(
            listed,
            [("api.example".to_owned(), 1.0), ("site.example".to_owned(), 5.0)]
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
