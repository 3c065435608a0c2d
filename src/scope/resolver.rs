use std::borrow::Cow;

use super::{Scope, Scopes};

/// Host names are almost always lower-case already; only copy when not.
pub(crate) fn lower_cased(host: &str) -> Cow<'_, str> {
    if host.bytes().any(|byte| byte.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    }
}

/// The parts of a request a [`ScopeResolver`] may look at (the body is never
/// needed to pick a scope).
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    /// The request method.
    pub method: &'a http::Method,
    /// The request URI.
    pub uri: &'a http::Uri,
    /// The request headers.
    pub headers: &'a http::HeaderMap,
    /// The request extensions.
    pub extensions: &'a http::Extensions,
}

impl<'a> RequestHead<'a> {
    /// Borrows the head of `request`.
    pub fn of<B>(request: &'a http::Request<B>) -> Self {
        RequestHead {
            method: request.method(),
            uri: request.uri(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }

    /// The host the request goes to, lower-cased, without port: the URI's
    /// host, or for an origin-form URI (`/path`) the `Host` header's.
    /// `None` when neither names a host.
    pub fn host(&self) -> Option<Cow<'a, str>> {
        if let Some(host) = self.uri.host() {
            return Some(lower_cased(host));
        }
        let header = self.headers.get(http::header::HOST)?.to_str().ok()?;
        let authority: http::uri::Authority = header.trim().parse().ok()?;
        Some(Cow::Owned(authority.host().to_ascii_lowercase()))
    }
}

/// Maps a request to the scopes it is throttled by.
///
/// Closures of the right shape implement it:
///
/// ```
/// use tower_throttle::{Registry, RequestHead, Scopes};
///
/// // Throttle API calls and page loads of every host separately.
/// let registry = Registry::builder()
///     .resolver(|head: &RequestHead<'_>| {
///         let host = head.host().unwrap_or_default();
///         if head.uri.path().starts_with("/api/") {
///             Scopes::from(format!("{host}/api"))
///         } else {
///             Scopes::from(host)
///         }
///     })
///     .build()
///     .unwrap();
/// # drop(registry);
/// ```
///
/// A [`Scopes`] request extension takes precedence over the resolver.
pub trait ScopeResolver: Send + Sync + 'static {
    /// The scopes of the request whose head is `head`.
    fn resolve(&self, head: &RequestHead<'_>) -> Scopes;
}

impl<F> ScopeResolver for F
where
    F: Fn(&RequestHead<'_>) -> Scopes + Send + Sync + 'static,
{
    fn resolve(&self, head: &RequestHead<'_>) -> Scopes {
        self(head)
    }
}

/// The default resolver: one scope per host, lower-cased, without port
/// (`https://Books.toscrape.com:8443/x` → `books.toscrape.com`).
///
/// A request that names no host (neither in its URI nor in a `Host` header)
/// gets the unnamed scope `""`, so it is still throttled.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostResolver;

impl ScopeResolver for HostResolver {
    fn resolve(&self, head: &RequestHead<'_>) -> Scopes {
        if let Some(authority) = head.uri.authority() {
            return Scopes::one(scope_of_authority(authority));
        }
        Scopes::one(head.host().map_or_else(|| Scope::new(""), Scope::new))
    }
}

thread_local! {
    /// The last authority resolved on this thread and its scope. Crawls
    /// send runs of requests to the same site; reusing the scope skips
    /// parsing the host out of the authority and allocating its key.
    static LAST_AUTHORITY: std::cell::RefCell<Option<(http::uri::Authority, Scope)>> =
        const { std::cell::RefCell::new(None) };
}

fn scope_of_authority(authority: &http::uri::Authority) -> Scope {
    LAST_AUTHORITY.with(|last| {
        let mut last = last.borrow_mut();
        if let Some((known, scope)) = last.as_ref() {
            if known.as_str() == authority.as_str() {
                return scope.clone();
            }
        }
        let scope = Scope::new(lower_cased(authority.host()));
        *last = Some((authority.clone(), scope.clone()));
        scope
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_scope(request: http::Request<()>) -> String {
        let scopes = HostResolver.resolve(&RequestHead::of(&request));
        scopes.iter().next().unwrap().0.as_str().to_owned()
    }

    #[test]
    fn host_resolver_lower_cases_and_drops_the_port() {
        let request = http::Request::get("https://Books.ToScrape.com:8443/x")
            .body(())
            .unwrap();
        assert_eq!(host_scope(request), "books.toscrape.com");
    }

    #[test]
    fn host_resolver_gives_each_authority_its_own_scope_in_any_order() {
        let uris = [
            ("https://a.example/", "a.example"),
            ("https://b.example:8080/", "b.example"),
            ("https://a.example/x", "a.example"),
            ("https://user@A.Example:1/", "a.example"),
            ("https://a.example/", "a.example"),
        ];
        for (uri, expected) in uris {
            assert_eq!(
                host_scope(http::Request::get(uri).body(()).unwrap()),
                expected,
                "{uri}"
            );
        }
    }

    #[test]
    fn host_resolver_reads_the_host_header_of_origin_form_requests() {
        let request = http::Request::get("/page")
            .header("host", "Quotes.toscrape.com:80")
            .body(())
            .unwrap();
        assert_eq!(host_scope(request), "quotes.toscrape.com");
    }

    #[test]
    fn host_resolver_gives_the_unnamed_scope_without_a_host() {
        let request = http::Request::get("/page").body(()).unwrap();
        assert_eq!(host_scope(request), "");
        let bad_header = http::Request::get("/page")
            .header("host", "a b")
            .body(())
            .unwrap();
        assert_eq!(host_scope(bad_header), "");
    }
}
