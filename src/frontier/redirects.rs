//! Redirects followed through the frontier: each hop goes back into the
//! frontier's queues and waits its turn in its own scope like any request
//! (see [`Frontier::follow_redirects`](super::Frontier::follow_redirects)).

use http::header::HeaderMap;
#[cfg(feature = "follow-redirect")]
use http::header::{
    AUTHORIZATION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, COOKIE, LOCATION, PROXY_AUTHORIZATION,
    TRANSFER_ENCODING,
};
#[cfg(feature = "follow-redirect")]
use http::StatusCode;
use http::{Method, Uri};

/// What a request followed through redirects keeps between its hops: the
/// URIs visited (the first request's, then each hop's) and the first
/// request's method and headers.
#[derive(Debug)]
#[cfg_attr(not(feature = "follow-redirect"), allow(dead_code))]
pub(crate) struct Chain {
    visited: Vec<Uri>,
    method: Method,
    headers: HeaderMap,
}

impl Chain {
    /// The chain of a request about to be sent for the first time.
    pub(crate) fn start<B>(request: &http::Request<B>) -> Box<Chain> {
        Box::new(Chain {
            visited: vec![request.uri().clone()],
            method: request.method().clone(),
            headers: request.headers().clone(),
        })
    }
}

#[cfg(feature = "follow-redirect")]
use crate::redirect::{same_origin, RedirectError};

/// The next hop of `chain` when `response` is a redirect (`None` when it
/// is not, or has no usable `Location`): a request for the location, with
/// the first request's headers (credentials dropped once the chain leaves
/// the first origin) and an empty body (`B::default()`; a body is not sent
/// again). 301 and 302 turn a `POST` into a `GET`, 303 anything but `HEAD`;
/// 307 and 308 keep the method.
///
/// # Errors
///
/// [`RedirectError::Loop`] when the location was visited already in this
/// chain, [`RedirectError::TooMany`] past `max` redirects.
#[cfg(feature = "follow-redirect")]
pub(crate) fn next_hop<B: Default, R>(
    response: &http::Response<R>,
    chain: &mut Chain,
    max: usize,
) -> Result<Option<http::Request<B>>, RedirectError> {
    let status = response.status();
    if !matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308) {
        return Ok(None);
    }
    let current = chain.visited.last().expect("a chain starts with its request");
    let Some(next) = response
        .headers()
        .get(LOCATION)
        .and_then(|location| location.to_str().ok())
        .and_then(|location| resolve(current, location))
    else {
        return Ok(None);
    };
    if chain.visited.contains(&next) {
        return Err(RedirectError::Loop(next));
    }
    if chain.visited.len() > max {
        return Err(RedirectError::TooMany(max));
    }
    chain.method = method_after(status, &chain.method);
    let mut headers = chain.headers.clone();
    for body_header in [CONTENT_LENGTH, CONTENT_TYPE, CONTENT_ENCODING, TRANSFER_ENCODING] {
        headers.remove(body_header);
    }
    if !same_origin(&chain.visited[0], &next) {
        for credential in [AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION] {
            headers.remove(credential);
        }
    }
    chain.visited.push(next.clone());
    let mut request = http::Request::new(B::default());
    *request.method_mut() = chain.method.clone();
    *request.uri_mut() = next;
    *request.headers_mut() = headers;
    Ok(Some(request))
}

#[cfg(feature = "follow-redirect")]
fn method_after(status: StatusCode, method: &Method) -> Method {
    match status.as_u16() {
        301 | 302 if method == Method::POST => Method::GET,
        303 if method != Method::HEAD => Method::GET,
        _ => method.clone(),
    }
}

/// `location` resolved against `base`: an absolute URI as it is, a
/// scheme-relative one (`//host/path`) with the base's scheme, an absolute
/// path with the base's authority, a relative path against the base's
/// directory (without removing dot segments). `None` when it cannot be
/// made a URI.
#[cfg(feature = "follow-redirect")]
fn resolve(base: &Uri, location: &str) -> Option<Uri> {
    let uri: Uri = location.parse().ok()?;
    if uri.scheme().is_some() {
        return Some(uri);
    }
    let scheme = base.scheme_str()?;
    if let Some(rest) = location.strip_prefix("//") {
        return format!("{scheme}://{rest}").parse().ok();
    }
    let authority = base.authority()?;
    let path = if location.starts_with('/') {
        location.to_owned()
    } else {
        let directory = base
            .path()
            .rsplit_once('/')
            .map_or("", |(directory, _)| directory);
        format!("{directory}/{location}")
    };
    format!("{scheme}://{authority}{path}").parse().ok()
}

#[cfg(all(test, feature = "follow-redirect"))]
mod tests {
    use super::*;

    fn moved(status: u16, location: &str) -> http::Response<()> {
        http::Response::builder()
            .status(status)
            .header(LOCATION, location)
            .body(())
            .unwrap()
    }

    fn chain(method: Method, uri: &str) -> Box<Chain> {
        let mut request = http::Request::builder()
            .method(method)
            .uri(uri)
            .header(AUTHORIZATION, "secret")
            .body(())
            .unwrap();
        request
            .headers_mut()
            .insert(CONTENT_TYPE, "text/plain".parse().unwrap());
        Chain::start(&request)
    }

    #[test]
    fn locations_resolve_against_the_current_uri() {
        let base: Uri = "https://a.example/dir/page?q=1".parse().unwrap();
        let cases = [
            ("https://b.example/x", "https://b.example/x"),
            ("//c.example/y", "https://c.example/y"),
            ("/z", "https://a.example/z"),
            ("next", "https://a.example/dir/next"),
        ];
        for (location, expected) in cases {
            assert_eq!(
                resolve(&base, location).unwrap(),
                expected.parse::<Uri>().unwrap()
            );
        }
    }

    #[test]
    fn a_hop_keeps_headers_within_the_origin_and_drops_credentials_outside() {
        let mut chain = chain(Method::POST, "https://a.example/form");
        let hop: http::Request<()> = next_hop(&moved(302, "/done"), &mut chain, 10).unwrap().unwrap();
        assert_eq!(hop.method(), Method::GET);
        assert_eq!(hop.uri(), "https://a.example/done");
        assert!(hop.headers().contains_key(AUTHORIZATION));
        assert!(!hop.headers().contains_key(CONTENT_TYPE));
        let hop: http::Request<()> = next_hop(&moved(307, "https://b.example/"), &mut chain, 10)
            .unwrap()
            .unwrap();
        assert_eq!(hop.method(), Method::GET);
        assert!(!hop.headers().contains_key(AUTHORIZATION));
    }

    #[test]
    fn loops_and_long_chains_are_errors_and_other_statuses_are_not_hops() {
        let mut chain = chain(Method::GET, "https://a.example/1");
        assert!(next_hop::<(), _>(&moved(200, "/2"), &mut chain, 3)
            .unwrap()
            .is_none());
        next_hop::<(), _>(&moved(301, "/2"), &mut chain, 3)
            .unwrap()
            .unwrap();
        assert_eq!(
            next_hop::<(), _>(&moved(301, "/1"), &mut chain, 3).unwrap_err(),
            RedirectError::Loop("https://a.example/1".parse().unwrap())
        );
        next_hop::<(), _>(&moved(301, "/3"), &mut chain, 3)
            .unwrap()
            .unwrap();
        next_hop::<(), _>(&moved(301, "/4"), &mut chain, 3)
            .unwrap()
            .unwrap();
        assert_eq!(
            next_hop::<(), _>(&moved(301, "/5"), &mut chain, 3).unwrap_err(),
            RedirectError::TooMany(3)
        );
    }
}
