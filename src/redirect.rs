//! Redirects followed through the throttle, one hop at a time.
//!
//! A client that follows redirects itself sends every hop inside one call,
//! where no scope admitted it: a hop to another host, or back to the same
//! one, skips the throttle. Follow them *outside* the throttle instead,
//! with tower-http's [`FollowRedirectLayer`] (re-exported here): each hop is
//! then a request of the stack, admitted in the scope of the host it goes
//! to, and `RobotsDelayLayer` checks each hop's origin.
//!
//! [`FailOnLoops`] is the policy to give it: a loop or a chain past its
//! limit fails with a [`RedirectError`] instead of handing the last `3xx`
//! back, and credentials never follow a hop to another origin.
//!
//! # Example
//!
//! ```
//! use http_body_util::Empty;
//! use hyper::body::Bytes;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower::{BoxError, ServiceBuilder, ServiceExt};
//! use tower_throttle::redirect::{FailOnLoops, FollowRedirectLayer};
//! use tower_throttle::{Registry, ThrottleLayer};
//!
//! # async fn crawl() -> Result<(), BoxError> {
//! let registry = Registry::default();
//! let http_client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
//! let client = ServiceBuilder::new()
//!     // Outside the throttle: every hop is admitted in its own host's scope.
//!     .layer(FollowRedirectLayer::with_policy(FailOnLoops::new(10)))
//!     .map_err(BoxError::from) // so the policy can fail with its own error
//!     .layer(ThrottleLayer::new(registry))
//!     .service(http_client);
//! let request = http::Request::get("http://example.com/old").body(Empty::new())?;
//! let response = client.oneshot(request).await?; // each hop waited its turn
//! println!("{}", response.status());
//! # Ok(())
//! # }
//! ```
//!
//! With reqwest, build the client with
//! `redirect(reqwest::redirect::Policy::none())` and put the layer between
//! `ReqwestLayer` and the throttle (see the `reqwest` module).

use std::fmt;

use http::header::{AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION};
use http::{Request, Uri};
use tower_http::follow_redirect::policy::{Action, Attempt, Policy};

pub use tower_http::follow_redirect::FollowRedirectLayer;

/// A redirect policy for [`FollowRedirectLayer`]: follows up to `max`
/// redirects; a location visited already in the chain, or one hop more,
/// fails with [`RedirectError`].
///
/// Credentials (`Authorization`, `Cookie`, `Proxy-Authorization`) do not
/// leave their origin: from the first hop to another origin (scheme, host
/// or port) on, every hop of the chain goes without them, also a hop back
/// to the first origin. (tower-http's `FilterCredentials` drops them on the
/// hop that changes origin only, so a later hop within the new origin gets
/// them again.)
///
/// ```
/// use tower_throttle::redirect::{FailOnLoops, FollowRedirectLayer};
///
/// let layer = FollowRedirectLayer::with_policy(FailOnLoops::new(10));
/// # drop(layer);
/// ```
#[derive(Debug, Clone)]
pub struct FailOnLoops {
    max: usize,
    // The request's URI, then every location followed, in order.
    visited: Vec<Uri>,
    // Whether the chain has left the request's origin.
    left_origin: bool,
}

impl FailOnLoops {
    /// A policy that follows at most `max` redirects per request (reqwest
    /// and browsers use 10 to 20). With `max` 0, every redirect fails.
    pub fn new(max: usize) -> Self {
        FailOnLoops {
            max,
            visited: Vec::new(),
            left_origin: false,
        }
    }
}

/// Why [`FailOnLoops`] did not follow a redirect.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedirectError {
    /// The location was visited already in this chain of redirects.
    Loop(Uri),
    /// The chain went past the policy's limit (the limit).
    TooMany(usize),
}

impl fmt::Display for RedirectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedirectError::Loop(uri) => write!(f, "redirect loop: {uri} was visited already"),
            RedirectError::TooMany(max) => write!(f, "more than {max} redirects"),
        }
    }
}

impl std::error::Error for RedirectError {}

impl<B, E: From<RedirectError>> Policy<B, E> for FailOnLoops {
    fn redirect(&mut self, attempt: &Attempt<'_>) -> Result<Action, E> {
        if self.visited.is_empty() {
            self.visited.push(attempt.previous().clone());
        }
        let next = attempt.location();
        if self.visited.contains(next) {
            return Err(RedirectError::Loop(next.clone()).into());
        }
        if self.visited.len() > self.max {
            return Err(RedirectError::TooMany(self.max).into());
        }
        self.left_origin |= !same_origin(&self.visited[0], next);
        self.visited.push(next.clone());
        Ok(Action::Follow)
    }

    fn on_request(&mut self, request: &mut Request<B>) {
        if self.left_origin {
            let headers = request.headers_mut();
            for credential in [AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION] {
                headers.remove(credential);
            }
        }
    }
}

/// Whether two URIs have the same origin: scheme, host and port (the
/// scheme's default port when none is written).
pub(crate) fn same_origin(a: &Uri, b: &Uri) -> bool {
    let port = |uri: &Uri| {
        uri.port_u16().or(match uri.scheme_str() {
            Some("https") => Some(443),
            Some("http") => Some(80),
            _ => None,
        })
    };
    a.scheme() == b.scheme()
        && a.host().map(str::to_ascii_lowercase) == b.host().map(str::to_ascii_lowercase)
        && port(a) == port(b)
}

#[cfg(test)]
mod tests {
    use super::same_origin;

    fn origin_of(a: &str, b: &str) -> bool {
        same_origin(&a.parse().unwrap(), &b.parse().unwrap())
    }

    #[test]
    fn origins_compare_scheme_host_and_port() {
        assert!(origin_of("http://a.test/x", "http://A.test:80/y"));
        assert!(origin_of("https://a.test/", "https://a.test:443/"));
        assert!(!origin_of("http://a.test/", "https://a.test/"));
        assert!(!origin_of("http://a.test/", "http://b.test/"));
        assert!(!origin_of("http://a.test/", "http://a.test:8080/"));
    }
}
