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

/// The host of an authority (`user@Host:port` → `Host`, `[::1]:80` →
/// `[::1]`), as [`http::uri::Authority::host`] gives it, and whether it has
/// an upper-case letter. That method searches the string three times, and
/// lower-casing looks at it a fourth: on every request the throttle
/// resolves, this reads the authority eight bytes at a time instead.
fn host_of_authority(authority: &str) -> (&str, bool) {
    match scan_plain_authority(authority.as_bytes()) {
        Some((end, upper)) => (authority.get(..end).unwrap_or(authority), upper),
        None => host_of_any_authority(authority),
    }
}

const ONES: u64 = u64::from_le_bytes([1; 8]);
const HIGH_BITS: u64 = u64::from_le_bytes([0x80; 8]);

/// The high bit of each byte of `word` equal to `byte` (exact for the
/// lowest such byte; bytes above it may be flagged falsely).
fn bytes_equal(word: u64, byte: u8) -> u64 {
    let diff = word ^ (ONES * u64::from(byte));
    diff.wrapping_sub(ONES) & !diff & HIGH_BITS
}

/// Whether a byte of `word`, all of whose bytes are ASCII, is in `A..=Z`.
fn has_upper_case(word: u64) -> bool {
    // No byte overflows into the next: each is at most 0x7f.
    let from_a = word + ONES * u64::from(0x80 - b'A');
    let past_z = word + ONES * u64::from(0x80 - b'Z' - 1);
    from_a & !past_z & HIGH_BITS != 0
}

/// For the common authority, ASCII with neither user info nor an IPv6
/// literal: where its host ends (its first `:`, or its end) and whether it
/// has an upper-case letter (a port never has one). `None` otherwise.
fn scan_plain_authority(bytes: &[u8]) -> Option<(usize, bool)> {
    if bytes.first() == Some(&b'[') {
        return None;
    }
    let mut colon = None;
    let mut special = 0;
    let mut upper = false;
    let mut visit = |offset: usize, word: u64| {
        special |= bytes_equal(word, b'@') | (word & HIGH_BITS);
        upper |= has_upper_case(word);
        let colons = bytes_equal(word, b':');
        if colon.is_none() && colons != 0 {
            colon = Some(offset + colons.trailing_zeros() as usize / 8);
        }
    };
    let word_at = |offset: usize| {
        let mut word = [0; 8];
        word.copy_from_slice(&bytes[offset..offset + 8]);
        u64::from_le_bytes(word)
    };
    if bytes.len() < 8 {
        // Zero bytes match none of the tests.
        let mut word = [0; 8];
        word[..bytes.len()].copy_from_slice(bytes);
        visit(0, u64::from_le_bytes(word));
    } else {
        for offset in (0..bytes.len() - 8).step_by(8) {
            visit(offset, word_at(offset));
        }
        // The last eight bytes, overlapping the word before: a colon
        // found there first is still the first one.
        visit(bytes.len() - 8, word_at(bytes.len() - 8));
    }
    (special == 0).then(|| (colon.unwrap_or(bytes.len()), upper))
}

/// [`host_of_authority`] for any authority, one byte at a time.
fn host_of_any_authority(authority: &str) -> (&str, bool) {
    let bytes = authority.as_bytes();
    let start = bytes
        .iter()
        .rposition(|&byte| byte == b'@')
        .map_or(0, |at| at + 1);
    let rest = &bytes[start..];
    let end = if rest.first() == Some(&b'[') {
        rest.iter()
            .position(|&byte| byte == b']')
            .map_or(rest.len(), |close| close + 1)
    } else {
        rest.iter().position(|&byte| byte == b':').unwrap_or(rest.len())
    };
    // `start` and `end` are at ASCII bytes (or the ends): char boundaries.
    let host = authority.get(start..start + end).unwrap_or(authority);
    (host, host.bytes().any(|byte| byte.is_ascii_uppercase()))
}

/// The scope the [`HostResolver`] gives a request with this authority: its
/// host, lower-cased, without a trailing dot (borrowed when it already is).
pub(crate) fn host_scope_name(authority: &http::uri::Authority) -> Cow<'_, str> {
    match host_of_authority(authority.as_str()) {
        (host, false) => Cow::Borrowed(without_trailing_dot(host)),
        (host, true) => Cow::Owned(without_trailing_dot(host).to_ascii_lowercase()),
    }
}

/// `example.com.` and `example.com` name one host (the dot makes the name
/// absolute for DNS): one scope.
fn without_trailing_dot(host: &str) -> &str {
    match host.strip_suffix('.') {
        Some(name) if !name.is_empty() => name,
        _ => host,
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

    /// The host the request goes to, lower-cased, without port and
    /// without a trailing dot: the URI's host, or for an origin-form URI
    /// (`/path`) the `Host` header's. `None` when neither names a host.
    pub fn host(&self) -> Option<Cow<'a, str>> {
        if let Some(host) = self.uri.host() {
            return Some(lower_cased(without_trailing_dot(host)));
        }
        let header = self.headers.get(http::header::HOST)?.to_str().ok()?;
        let authority: http::uri::Authority = header.trim().parse().ok()?;
        Some(Cow::Owned(
            without_trailing_dot(authority.host()).to_ascii_lowercase(),
        ))
    }
}

/// Maps a request to the scopes it is throttled by.
///
/// Closures of the right shape implement it:
///
/// ```
/// use tower_throttle::{Registry, Scopes};
/// use tower_throttle::scope::RequestHead;
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
///
/// # Keys given a config
///
/// A registry asks its resolver's [`check_key`](Self::check_key) about
/// every scope key given a config of its own (with
/// [`RegistryBuilder::scope`](crate::registry::RegistryBuilder::scope),
/// in a config file or with [`Registry::set_scope`](crate::Registry::set_scope)),
/// so that a config that could never apply is an error where it is given.
/// The default accepts every key; a resolver whose keys have a form of
/// their own says which keys it can never give:
///
/// ```
/// use tower_throttle::scope::{RequestHead, ScopeResolver};
/// use tower_throttle::{Registry, ScopeConfig, Scopes};
///
/// /// One scope per HTTP method.
/// struct ByMethod;
///
/// impl ScopeResolver for ByMethod {
///     fn resolve(&self, head: &RequestHead<'_>) -> Scopes {
///         Scopes::from(head.method.as_str())
///     }
///
///     fn check_key(&self, key: &str) -> Result<(), String> {
///         // Methods are case-sensitive; every request of this crawler uses a standard one.
///         let upper = key.to_ascii_uppercase();
///         match key.parse::<http::Method>() {
///             Ok(_) if key == upper => Ok(()),
///             _ => Err(format!("requests are scoped by method, such as {upper:?}")),
///         }
///     }
/// }
///
/// let err = Registry::builder().resolver(ByMethod).scope("get", ScopeConfig::default()).build().unwrap_err();
/// assert_eq!(err.value(), r#""get""#);
/// assert!(err.to_string().ends_with(r#"requests are scoped by method, such as "GET""#));
/// ```
pub trait ScopeResolver: Send + Sync + 'static {
    /// The scopes of the request whose head is `head`.
    fn resolve(&self, head: &RequestHead<'_>) -> Scopes;

    /// Whether this resolver can ever give a request the scope `key`:
    /// `Err` says why not and, where it can tell, which key would match
    /// instead; the registry rejects the config with a
    /// [`ConfigError`](crate::ConfigError) that names the key and gives
    /// this reason. IP scopes (`ip:…`, which the [`ip`](crate::ip) layer
    /// adds whatever the resolver) are not asked about.
    ///
    /// The default accepts every key (closures, for instance, cannot
    /// tell). A key that only [`Scopes`] extensions give requests is asked
    /// about too: a resolver that refuses keys refuses those.
    fn check_key(&self, key: &str) -> Result<(), String> {
        let _ = key;
        Ok(())
    }
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
/// and without a trailing dot (`https://Books.toscrape.com:8443/x` →
/// `books.toscrape.com`).
///
/// A request that names no host (neither in its URI nor in a `Host` header)
/// gets the unnamed scope `""`, so it is still throttled.
///
/// Its [`check_key`](ScopeResolver::check_key) refuses a key it can never
/// give (one with a scheme, a port, a path, upper case or a trailing dot)
/// and names the key it would give instead:
///
/// ```
/// use tower_throttle::{Registry, ScopeConfig};
///
/// let err = Registry::builder()
///     .scope("http://Example.com/", ScopeConfig::default())
///     .build()
///     .unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     r#"invalid scope key = "http://Example.com/": the host resolver never gives a request this key (it has a scheme, a path and upper case); it would match "example.com""#
/// );
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct HostResolver;

impl ScopeResolver for HostResolver {
    fn resolve(&self, head: &RequestHead<'_>) -> Scopes {
        if let Some(authority) = head.uri.authority() {
            return Scopes::one(scope_of_authority(authority));
        }
        Scopes::one(head.host().map_or_else(|| Scope::new(""), Scope::new))
    }

    fn check_key(&self, key: &str) -> Result<(), String> {
        super::key_check::check_host_key(key, "the host resolver")
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
        let scope = Scope::new(host_scope_name(authority));
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
    fn the_host_of_an_authority_is_the_one_http_gives() {
        let authorities = [
            "example.com",
            "example.com:8080",
            "Example.COM:1",
            "user@example.com",
            "user:pass@example.com:443",
            "a@b@example.com:1",
            "[::1]",
            "[::1]:8080",
            "[::FFFF:1]:8080",
            "User@Host.Example",
            "user@[2001:db8::7]:80",
            "127.0.0.1:3000",
            "xn--bcher-kva.example",
            "h",
            "h:1",
            "ABCDEFGH",
            "abcdefgh:8080",
            "abcdefgZ",
            "a.b.c.d.e.f.g.h.example.com:65535",
            "ZZZZZZZZZZZZZZZZ",
            "exactly16bytes.x",
            "exactly16bytes.x:1",
            "user@exactly16bytes.X:1",
        ];
        for text in authorities {
            let authority: http::uri::Authority = text.parse().unwrap();
            let (host, upper) = host_of_authority(authority.as_str());
            assert_eq!(host, authority.host(), "{text}");
            assert_eq!(
                upper,
                host.bytes().any(|byte| byte.is_ascii_uppercase()),
                "{text}"
            );
            assert_eq!(
                host_scope_name(&authority),
                authority.host().to_ascii_lowercase(),
                "{text}"
            );
        }
    }

    #[test]
    fn odd_strings_http_would_refuse_give_some_host_and_no_panic() {
        for text in [
            "",
            "@",
            "[",
            "a@",
            "[::1",
            ":::",
            "@@@@@@@@@",
            "é",
            "ééééé:1",
            "x@é",
        ] {
            let (host, _) = host_of_authority(text);
            assert!(text.contains(host), "{text}: {host}");
        }
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
