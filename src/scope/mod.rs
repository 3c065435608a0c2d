//! Scope keys, per-request scope sets and the resolvers that map a request to
//! its scopes.
//!
//! A **scope** is the key requests are throttled by. By default it is the
//! request's host, lower-cased and without its port, so
//! `books.toscrape.com` and `toscrape.com` are two different scopes.
//!
//! A request has one or more scopes, each with an expected quota cost
//! (1.0 unless said otherwise). The registry's [`ScopeResolver`] decides them,
//! unless the request carries a [`Scopes`] extension, which replaces the
//! resolved scopes for that request:
//!
//! ```
//! use tower_throttle::Scopes;
//!
//! let mut request = http::Request::get("https://api.example/users").body(()).unwrap();
//! request.extensions_mut().insert(Scopes::from(["api", "users"]));
//! ```
//!
//! Layers inside a [`Throttle`](crate::Throttle) (backoff, rate-limit
//! headers) report their feedback to the scopes the throttle used: in their
//! `call`, [`Registry::scopes_of`](crate::Registry::scopes_of) returns the
//! scopes the throttle is handing the request over with, without the
//! request carrying them. The throttle writes them into the request's
//! extensions as a [`Scopes`] value only when asked to, with
//! [`ThrottleLayer::record_scopes`](crate::ThrottleLayer::record_scopes)
//! (off by default), for inner code that reads the extension itself.

pub(crate) mod handover;
mod key_check;
pub(crate) mod names;
mod ready_made;
mod resolver;

pub use ready_made::{EndpointResolver, ScrapingApiResolver};
#[cfg(feature = "public-suffix")]
#[cfg_attr(docsrs, doc(cfg(feature = "public-suffix")))]
pub use ready_made::{HostAndParentsResolver, RegistrableDomainResolver};
pub(crate) use resolver::host_scope_name;
#[cfg(feature = "robots")]
pub(crate) use resolver::lower_cased;
pub use resolver::{HostResolver, RequestHead, ScopeResolver};

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The key requests are throttled by: a host name such as
/// `books.toscrape.com`, or any name you choose (`"api"`, `"images"`).
/// Made from a name with `Scope::from` (or `.into()`); names are used as
/// given (case included); the host resolver lower-cases hosts before
/// making keys.
///
/// Cloning is cheap (a reference count).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope(Arc<str>);

impl Scope {
    /// Creates a scope key from a name.
    pub(crate) fn new(name: impl AsRef<str>) -> Self {
        Scope(Arc::from(name.as_ref()))
    }

    /// The scope's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Borrow<str> for Scope {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Scope {
    fn from(name: &str) -> Self {
        Scope::new(name)
    }
}

impl From<String> for Scope {
    fn from(name: String) -> Self {
        Scope(Arc::from(name))
    }
}

impl From<std::borrow::Cow<'_, str>> for Scope {
    fn from(name: std::borrow::Cow<'_, str>) -> Self {
        Scope::new(name)
    }
}

impl From<&String> for Scope {
    fn from(name: &String) -> Self {
        Scope::new(name)
    }
}

/// The expected quota cost of a request in one of its scopes, when none is
/// given.
pub const DEFAULT_COST: f64 = 1.0;

/// The scopes of one request, each with its expected quota cost.
///
/// Insert it as a request extension to choose a request's scopes yourself;
/// [`Throttle`](crate::Throttle) inserts the scopes it resolved, so inner
/// layers can read them.
///
/// A `Scopes` is never empty: building one from an empty list gives the
/// unnamed scope `""`, so a request is always throttled by something.
/// Listing a scope twice keeps its first cost.
///
/// ```
/// use tower_throttle::Scopes;
///
/// let one = Scopes::from("api");
/// let two = Scopes::from(["api", "users"]);
/// let with_costs = Scopes::with_costs([("api", 1.0), ("search", 5.0)]);
/// assert_eq!(two.len(), 2);
/// assert_eq!(with_costs.iter().nth(1).unwrap().1, 5.0);
/// # let _ = one;
/// ```
#[derive(Clone, PartialEq)]
pub struct Scopes(ScopeList);

#[derive(Clone, PartialEq)]
enum ScopeList {
    // One scope is by far the common case; keeping it inline avoids an
    // allocation per request.
    One(Scope, f64),
    Many(Vec<(Scope, f64)>),
}

impl Scopes {
    /// One scope with the default cost (what `Scopes::from` makes of one
    /// name).
    pub(crate) fn one(scope: impl Into<Scope>) -> Self {
        Scopes(ScopeList::One(scope.into(), DEFAULT_COST))
    }

    /// Scopes with explicit expected costs. Costs that are not finite or are
    /// negative are replaced by the default cost of 1.0.
    pub fn with_costs<K: Into<Scope>>(scopes: impl IntoIterator<Item = (K, f64)>) -> Self {
        let mut list: Vec<(Scope, f64)> = Vec::new();
        for (scope, cost) in scopes {
            let scope = scope.into();
            let cost = if cost.is_finite() && cost >= 0.0 {
                cost
            } else {
                DEFAULT_COST
            };
            if !list.iter().any(|(known, _)| *known == scope) {
                list.push((scope, cost));
            }
        }
        match list.len() {
            0 => Scopes::one(""),
            1 => {
                let (scope, cost) = list.pop().expect("length checked");
                Scopes(ScopeList::One(scope, cost))
            }
            _ => Scopes(ScopeList::Many(list)),
        }
    }

    /// How many scopes the request has (at least one).
    pub fn len(&self) -> usize {
        match &self.0 {
            ScopeList::One(..) => 1,
            ScopeList::Many(list) => list.len(),
        }
    }

    /// The first scope given (a `Scopes` holds at least one).
    pub(crate) fn first(&self) -> &Scope {
        match &self.0 {
            ScopeList::One(scope, _) => scope,
            ScopeList::Many(list) => &list[0].0,
        }
    }

    /// Always false: a `Scopes` holds at least one scope.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The scopes and their expected costs, in the order given.
    pub fn iter(&self) -> Iter<'_> {
        match &self.0 {
            ScopeList::One(scope, cost) => Iter {
                one: Some((scope, *cost)),
                rest: [].iter(),
            },
            ScopeList::Many(list) => Iter {
                one: None,
                rest: list.iter(),
            },
        }
    }

    /// Whether `scope` is one of these scopes.
    pub fn contains(&self, scope: &str) -> bool {
        self.iter().any(|(known, _)| known.as_str() == scope)
    }
}

impl fmt::Debug for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl From<Scope> for Scopes {
    fn from(scope: Scope) -> Self {
        Scopes::one(scope)
    }
}

impl From<&str> for Scopes {
    fn from(scope: &str) -> Self {
        Scopes::one(scope)
    }
}

impl From<String> for Scopes {
    fn from(scope: String) -> Self {
        Scopes::one(scope)
    }
}

impl From<std::borrow::Cow<'_, str>> for Scopes {
    fn from(scope: std::borrow::Cow<'_, str>) -> Self {
        Scopes::one(scope)
    }
}

impl<K: Into<Scope>, const N: usize> From<[K; N]> for Scopes {
    fn from(scopes: [K; N]) -> Self {
        Scopes::with_costs(scopes.into_iter().map(|scope| (scope, DEFAULT_COST)))
    }
}

impl<K: Into<Scope>> From<Vec<K>> for Scopes {
    fn from(scopes: Vec<K>) -> Self {
        Scopes::with_costs(scopes.into_iter().map(|scope| (scope, DEFAULT_COST)))
    }
}

/// Iterator over the scopes of a [`Scopes`] and their expected costs.
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    one: Option<(&'a Scope, f64)>,
    rest: std::slice::Iter<'a, (Scope, f64)>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a Scope, f64);

    fn next(&mut self) -> Option<Self::Item> {
        self.one
            .take()
            .or_else(|| self.rest.next().map(|(scope, cost)| (scope, *cost)))
    }
}

/// A request extension that orders waiting requests within a scope: higher
/// first, first-come first-served among equals. Requests without it have
/// priority 0.
///
/// ```
/// use tower_throttle::Priority;
///
/// let mut request = http::Request::get("https://example.com/urgent").body(()).unwrap();
/// request.extensions_mut().insert(Priority(10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Priority(pub i32);

/// A request extension that bounds how long the request may wait for its
/// scopes: when the registry predicts it would wait longer, it fails at
/// once (see [`Error::is_would_wait`](crate::Error::is_would_wait)), and
/// so it does when the bound passes while it waits. With a scope's own
/// [`max_wait`](crate::ScopeConfig::max_wait) too, the tighter bound
/// wins. It needs a throttle that returns the crate's
/// [`Error`](crate::Error) ([`ThrottleLayer::crate_errors`](crate::ThrottleLayer::crate_errors)).
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::scope::MaxWait;
///
/// let mut request = http::Request::get("https://api.example/users").body(()).unwrap();
/// request.extensions_mut().insert(MaxWait(Duration::from_secs(2)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MaxWait(pub Duration);

/// A request extension: this request's latency does not adjust
/// AutoThrottle's delay (Scrapy's `autothrottle_dont_adjust_delay`).
///
/// ```
/// use tower_throttle::scope::AutoThrottleExempt;
///
/// let mut request = http::Request::get("https://example.com/huge-export").body(()).unwrap();
/// request.extensions_mut().insert(AutoThrottleExempt);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AutoThrottleExempt;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_scope_list_becomes_the_unnamed_scope() {
        let scopes = Scopes::from(Vec::<&str>::new());
        assert_eq!(scopes.len(), 1);
        assert!(scopes.contains(""));
    }

    #[test]
    fn duplicate_scopes_keep_their_first_cost() {
        let scopes = Scopes::with_costs([("a", 2.0), ("a", 5.0), ("b", 1.0)]);
        let listed: Vec<_> = scopes.iter().map(|(s, c)| (s.as_str(), c)).collect();
        assert_eq!(listed, vec![("a", 2.0), ("b", 1.0)]);
    }

    #[test]
    fn invalid_costs_fall_back_to_the_default() {
        let scopes = Scopes::with_costs([("a", f64::NAN), ("b", -1.0), ("c", f64::INFINITY)]);
        assert!(scopes.iter().all(|(_, cost)| cost == DEFAULT_COST));
    }
}
