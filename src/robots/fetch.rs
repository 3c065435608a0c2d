//! One robots.txt fetch: redirects, the bounded body read, the parse, and
//! the hand-over of the result to the origin's cache entry.

use std::future::poll_fn;
use std::pin::pin;
use std::sync::Arc;

use bytes::Buf;
use http::header::{HeaderValue, LOCATION, USER_AGENT};
use http_body::Body;
use tokio::time::Instant;
use tower_service::Service;

use super::cache::{FetchResult, OriginEntry};
use super::shared::RobotsShared;
use super::MAX_REDIRECTS;
use crate::error::BoxError;
use crate::ip::ServerAddr;
use crate::parse::robots_txt::RobotsRules;
use crate::scope::{Priority, Scopes};

/// What the request that triggered a fetch lends to it.
#[derive(Debug)]
pub(crate) struct FetchTemplate {
    /// Its `User-Agent`, or the configured one.
    pub(crate) user_agent: Option<HeaderValue>,
    /// Its `Scopes` extension, so the fetch is throttled with the same
    /// scopes as the pages.
    pub(crate) scopes: Option<Scopes>,
    /// Its server address (from [`IpScope`](crate::ip::IpScope)), so the
    /// fetch connects where the pages do.
    pub(crate) server: Option<ServerAddr>,
}

impl FetchTemplate {
    fn request<B: Default>(&self, uri: http::Uri) -> http::Request<B> {
        let mut request = http::Request::new(B::default());
        *request.uri_mut() = uri;
        if let Some(user_agent) = &self.user_agent {
            request.headers_mut().insert(USER_AGENT, user_agent.clone());
        }
        // Ahead of the pages already queued in the scope: they are waiting
        // for rules this fetch brings.
        request.extensions_mut().insert(Priority(i32::MAX));
        if let Some(scopes) = &self.scopes {
            request.extensions_mut().insert(scopes.clone());
        }
        if let Some(server) = self.server {
            request.extensions_mut().insert(server);
        }
        request
    }
}

/// Fetches the robots.txt of `entry`'s origin through `service` on a task of
/// its own, so it finishes (or times out) whatever happens to the requests
/// waiting for it, and records the result in `entry`.
///
/// # Panics
///
/// Outside a Tokio runtime.
pub(crate) fn spawn_fetch<S, ReqBody, ResBody>(
    service: S,
    shared: Arc<RobotsShared>,
    entry: Arc<OriginEntry>,
    template: FetchTemplate,
) where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ReqBody: Default + Send + 'static,
    ResBody: Body + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    let mut guard = Completion {
        shared,
        entry,
        done: false,
    };
    tokio::spawn(async move {
        let result = fetch(service, &guard, &template).await;
        guard.finish(result);
    });
}

/// Records the result in the cache entry, or, if the task ends without one
/// (the inner service panicked, the runtime shut down), an unreachable
/// robots.txt: the entry must never stay "fetching" with nobody fetching.
struct Completion {
    shared: Arc<RobotsShared>,
    entry: Arc<OriginEntry>,
    done: bool,
}

impl Completion {
    fn finish(&mut self, result: FetchResult) {
        self.done = true;
        self.entry
            .finish(result, &self.shared.config, &self.shared.registry, Instant::now());
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if !self.done {
            self.finish(FetchResult::Unreachable);
        }
    }
}

/// What the network said, before parsing.
enum Fetched {
    Body(Vec<u8>),
    Unavailable(String),
    Unreachable(String),
}

async fn fetch<S, ReqBody, ResBody>(service: S, guard: &Completion, template: &FetchTemplate) -> FetchResult
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Error: Into<BoxError>,
    ReqBody: Default,
    ResBody: Body,
    ResBody::Error: Into<BoxError>,
{
    let config = &guard.shared.config;
    let origin = guard.entry.origin();
    let fetched = tokio::time::timeout(
        config.fetch_timeout,
        fetch_body(service, origin.robots_txt_uri(), template, config.max_body_bytes),
    )
    .await
    .unwrap_or_else(|_elapsed| {
        Fetched::Unreachable(format!("no complete answer within {:?}", config.fetch_timeout))
    });
    match fetched {
        Fetched::Body(body) => {
            let user_agent = config.user_agent.clone();
            let bytes = body.len();
            // A pathological file (tens of thousands of `$` patterns) takes
            // a second or more to compile; keep that off the async workers.
            let parsed = tokio::task::spawn_blocking(move || RobotsRules::parse(&body, &user_agent)).await;
            match parsed {
                Ok(rules) => {
                    tracing::debug!(
                        target: "tower_throttle",
                        %origin,
                        bytes,
                        crawl_delay_ms = rules.crawl_delay().map(|delay| delay.as_millis() as u64),
                        "robots.txt fetched"
                    );
                    FetchResult::Rules(rules)
                }
                Err(_) => FetchResult::Unreachable,
            }
        }
        Fetched::Unavailable(reason) => {
            tracing::debug!(
                target: "tower_throttle",
                %origin,
                %reason,
                "robots.txt unavailable: no rules, no Crawl-delay"
            );
            FetchResult::Unavailable
        }
        Fetched::Unreachable(reason) => {
            tracing::debug!(target: "tower_throttle", %origin, %reason, "robots.txt fetch failed");
            FetchResult::Unreachable
        }
    }
}

/// Sends the fetch, following redirects, and reads a 2xx body up to
/// `max_bytes`.
async fn fetch_body<S, ReqBody, ResBody>(
    mut service: S,
    mut uri: http::Uri,
    template: &FetchTemplate,
    max_bytes: usize,
) -> Fetched
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Error: Into<BoxError>,
    ReqBody: Default,
    ResBody: Body,
    ResBody::Error: Into<BoxError>,
{
    let mut redirects = 0;
    loop {
        if let Err(err) = poll_fn(|cx| service.poll_ready(cx)).await {
            return Fetched::Unreachable(err.into().to_string());
        }
        let response = match service.call(template.request(uri.clone())).await {
            Ok(response) => response,
            Err(err) => return Fetched::Unreachable(err.into().to_string()),
        };
        let status = response.status();
        if status.is_success() {
            return match read_bounded(response.into_body(), max_bytes).await {
                Ok(body) => Fetched::Body(body),
                Err(err) => Fetched::Unreachable(format!("body: {err}")),
            };
        }
        if status.is_redirection() {
            if redirects == MAX_REDIRECTS {
                return Fetched::Unavailable(format!("more than {MAX_REDIRECTS} redirects"));
            }
            let next = response
                .headers()
                .get(LOCATION)
                .and_then(|location| location.to_str().ok())
                .and_then(|location| resolve_location(&uri, location));
            match next {
                Some(next) => uri = next,
                None => return Fetched::Unavailable(format!("{status} without a usable Location")),
            }
            redirects += 1;
            continue;
        }
        return if status.is_client_error() {
            Fetched::Unavailable(status.to_string())
        } else {
            Fetched::Unreachable(status.to_string())
        };
    }
}

/// Reads `body` until its end or `max_bytes`, whichever comes first, then
/// stops (the rest is dropped unread). A body cut at the bound is also cut
/// after its last line break, so a rule straddling the bound is not read
/// half-written (`Disallow: /private` must not become `Disallow: /priv`).
async fn read_bounded<B>(body: B, max_bytes: usize) -> Result<Vec<u8>, BoxError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut body = pin!(body);
    let hint = body.size_hint().lower();
    let mut bytes = Vec::with_capacity(usize::try_from(hint).unwrap_or(usize::MAX).min(max_bytes));
    while bytes.len() < max_bytes {
        let Some(frame) = poll_fn(|cx| body.as_mut().poll_frame(cx)).await else {
            return Ok(bytes);
        };
        // Trailers say nothing about the rules.
        let Ok(mut data) = frame.map_err(Into::into)?.into_data() else {
            continue;
        };
        while data.has_remaining() && bytes.len() < max_bytes {
            let chunk = data.chunk();
            let take = chunk.len().min(max_bytes - bytes.len());
            bytes.extend_from_slice(&chunk[..take]);
            data.advance(take);
        }
    }
    if !body.is_end_stream() {
        if let Some(last_break) = bytes.iter().rposition(|&byte| byte == b'\n' || byte == b'\r') {
            bytes.truncate(last_break + 1);
        }
    }
    Ok(bytes)
}

/// The URI a redirect's `Location` points to, resolved against the URI that
/// answered (RFC 9110 §10.2.2 allows relative references). `None` for
/// anything that is not an `http`/`https` URL.
fn resolve_location(base: &http::Uri, location: &str) -> Option<http::Uri> {
    let location = location.trim();
    let scheme = base.scheme_str()?;
    let authority = base.authority()?.as_str();
    let absolute = if location.starts_with("//") {
        format!("{scheme}:{location}")
    } else if location.starts_with('/') {
        format!("{scheme}://{authority}{location}")
    } else if let Some(query) = location.strip_prefix('?') {
        format!("{scheme}://{authority}{}?{query}", base.path())
    } else if location.contains("://") {
        location.to_owned()
    } else {
        let path = base.path();
        let directory = &path[..path.rfind('/').map_or(0, |slash| slash + 1)];
        let directory = if directory.is_empty() { "/" } else { directory };
        format!("{scheme}://{authority}{directory}{location}")
    };
    let uri: http::Uri = absolute.parse().ok()?;
    let supported = matches!(uri.scheme_str(), Some(scheme) if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https"));
    (supported && uri.host().is_some()).then_some(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(base: &str, location: &str) -> Option<String> {
        resolve_location(&base.parse().unwrap(), location).map(|uri| uri.to_string())
    }

    #[test]
    fn location_resolves_absolute_and_relative_references() {
        let base = "https://example.com/robots.txt";
        assert_eq!(
            resolve(base, "https://www.example.com/robots.txt").as_deref(),
            Some("https://www.example.com/robots.txt")
        );
        assert_eq!(
            resolve(base, "//cdn.example.com/r.txt").as_deref(),
            Some("https://cdn.example.com/r.txt")
        );
        assert_eq!(
            resolve(base, "/real-robots.txt").as_deref(),
            Some("https://example.com/real-robots.txt")
        );
        assert_eq!(
            resolve(base, "real-robots.txt").as_deref(),
            Some("https://example.com/real-robots.txt")
        );
        assert_eq!(
            resolve("http://example.com:8080/a/b/robots.txt", "c.txt").as_deref(),
            Some("http://example.com:8080/a/b/c.txt")
        );
        assert_eq!(
            resolve(base, "?v=2").as_deref(),
            Some("https://example.com/robots.txt?v=2")
        );
    }

    #[test]
    fn location_to_another_scheme_or_garbage_is_not_followed() {
        let base = "https://example.com/robots.txt";
        assert_eq!(resolve(base, "ftp://example.com/robots.txt"), None);
        assert_eq!(resolve(base, "https://"), None);
        assert_eq!(resolve(base, "/a b"), None);
    }

    fn read(chunks: Vec<&'static str>, max: usize) -> String {
        let frames = chunks.into_iter().map(|chunk| {
            Ok::<_, std::convert::Infallible>(http_body::Frame::data(bytes::Bytes::from(chunk)))
        });
        let body = http_body_util::StreamBody::new(futures::stream::iter(frames));
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let bytes = runtime.block_on(read_bounded(body, max)).unwrap();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn body_is_read_whole_below_the_bound() {
        assert_eq!(
            read(vec!["User-agent: *\n", "Crawl-delay: 3"], 100),
            "User-agent: *\nCrawl-delay: 3"
        );
    }

    #[test]
    fn body_beyond_the_bound_is_cut_at_its_last_line_break() {
        let body = vec!["User-agent: *\n", "Disallow: /private\n"];
        assert_eq!(read(body.clone(), 25), "User-agent: *\n");
        assert_eq!(read(body, 33), "User-agent: *\nDisallow: /private\n");
        // No line break at all: the bound itself.
        assert_eq!(read(vec!["abcdef"], 4), "abcd");
    }
}
