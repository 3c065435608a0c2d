//! robots.txt middleware: fetches each site's robots.txt once, slows the
//! site's scopes down to its `Crawl-delay`, and optionally obeys its rules.
//!
//! # What you see
//!
//! The first request to an **origin** (scheme, host and port:
//! `https://example.com` and `http://example.com` are two origins) makes
//! [`RobotsDelay`] send one `GET {scheme}://{host}[:{port}]/robots.txt`
//! through its inner service. That request and every other one to the same
//! origin wait until the fetch is over; requests to other origins go on
//! meanwhile. Once the answer is known, it is cached for the origin and
//! requests go straight through (no waiting, no fetch) until it expires.
//! The requests that waited go on in the order they came (each holds a
//! turn, whatever order the runtime wakes them in), and one arriving while
//! some of them have not gone on yet goes after them: the throttle sees an
//! origin's requests in arrival order, so FIFO within a scope holds across
//! the wait. A waiting future that is dropped gives its turn up; one that
//! is kept but never polled again holds the requests behind it, as a
//! request the throttle admitted but that never leaves does.
//!
//! Place the layer **outside** [`ThrottleLayer`](crate::ThrottleLayer), as
//! in the example below: the fetch is then throttled like any request of its
//! scope, and goes ahead of the requests already queued there (it carries
//! [`Priority`](crate::Priority)`(i32::MAX)`). The fetch is built by the
//! layer: a `GET` with an empty body (`ReqBody::default()`, hence the
//! `ReqBody: Default` bound), the `User-Agent` header of the request that
//! triggered it (or the configured [user agent](RobotsDelayLayer::user_agent)),
//! and that request's [`Scopes`](crate::Scopes) extension if it has one, so
//! the fetch is throttled with the same scopes as the pages.
//!
//! What the answer means (RFC 9309 §2.3.1):
//!
//! | answer | rules | Crawl-delay | next fetch |
//! |---|---|---|---|
//! | 2xx | the body, read up to [`max_body_bytes`](RobotsDelayLayer::max_body_bytes) (512 KiB) and parsed for the [user agent](RobotsDelayLayer::user_agent) | the group's `Crawl-delay`, capped at [`max_delay`](RobotsDelayLayer::max_delay) (60 s) | after [`cache_ttl`](RobotsDelayLayer::cache_ttl) (24 h) |
//! | 3xx | followed (`Location`, absolute or relative) up to five redirects, even to another host; what the last answer says applies to the *original* origin | | |
//! | more than five redirects, or a 3xx without a usable `Location` | none: everything allowed (RFC 9309 says the file may then be taken as *unavailable*, and Google treats it as a 404) | none | after `cache_ttl` |
//! | 4xx | none: everything allowed | none | after `cache_ttl` |
//! | 5xx, no complete answer within [`fetch_timeout`](RobotsDelayLayer::fetch_timeout) (10 s), connection error | unknown: everything allowed, or, when [obeying](RobotsDelayLayer::obey), everything disallowed | none known | retried after 1 min, then 2, 4, 8, … up to `cache_ttl` |
//!
//! A Crawl-delay is reported with
//! [`Registry::set_robots_delay`](crate::Registry::set_robots_delay) to each
//! scope the origin's requests are throttled by (their `Scopes` extension,
//! or what the registry's resolver says). Such a scope sends one request at
//! a time, the Crawl-delay apart (or its own delay, if longer; jitter may
//! lengthen a gap but never shorten it below the Crawl-delay); a scope with
//! a config of its own keeps the `concurrency` and `delay` that config sets
//! explicitly, with a warning unless it sets
//! [`ignore_robots_txt`](crate::ScopeConfig::ignore_robots_txt).
//! [`ScopeStats`](crate::ScopeStats) shows it: `robots_delay`,
//! `robots_delay_applies`, and `LimitSource::Robots` as what limits the
//! delay and concurrency. `Crawl-delay: 0` is a delay of zero, which still
//! means one request at a time (as in Scrapy). When one scope gathers
//! several origins, the latest fetch among them sets its delay. A
//! [`fixed_scope`](crate::ThrottleLayer::fixed_scope) Throttle ignores the
//! request's scopes, so the Crawl-delay only reaches it when its key is the
//! one the registry resolves for the request (or the request's `Scopes`
//! extension names it).
//!
//! Retries of an unreachable robots.txt are not timed: the first request to
//! the origin after the backoff fetches again (and waits for it, as does a
//! request after the cache expired), so an origin you stopped crawling costs
//! nothing. When a later fetch finds robots.txt unreachable but an earlier
//! one had read it, the earlier rules and Crawl-delay stay in force while
//! retries go on (RFC 9309 §2.4 allows a cached copy beyond its expiry in
//! that case).
//!
//! With [`obey(true)`](RobotsDelayLayer::obey), a request whose path and
//! query robots.txt disallows fails with an [`Error`](crate::Error) for
//! which [`is_robots_disallowed`](crate::Error::is_robots_disallowed) is
//! true, without reaching the inner service (so without being throttled
//! or counted as sent). `/robots.txt` itself is always allowed.
//!
//! Requests without an `http`/`https` origin (an origin-form URI such as
//! `/path`, another scheme) have no robots.txt to ask and pass through.
//!
//! # Cancellation
//!
//! The fetch runs on a task of its own (`tokio::spawn`), bounded by
//! `fetch_timeout`: dropping the requests that wait for it does not stop
//! it, and the next request uses its result. A waiting request holds
//! nothing of the inner service: `call` gives up the readiness `poll_ready`
//! reserved (a throttle queue place, or with
//! [`fixed_scope`](crate::ThrottleLayer::fixed_scope) an admitted send, which
//! the fetch may need), and the request readies its own handle once the
//! rules are known. If the fetch task
//! ends without an answer (the inner service panicked, the runtime shut
//! down), the origin counts as unreachable, so no request waits for ever.
//!
//! The body of a 2xx answer is read up to the bound and then dropped, and
//! parsed on Tokio's blocking pool: a pathological file can take a second
//! or more to compile, which must not stall the async workers.
//!
//! # Errors
//!
//! [`RobotsDelay`] has a failure of its own (a disallowed request), so its
//! error is the crate's opaque [`Error`](crate::Error), which also carries
//! the inner service's errors (boxed; `S::Error: Into<BoxError>`, as for
//! most tower middleware that adds a failure). One concrete type, rather
//! than a generic `Error<E>`, keeps stacks of this crate's layers from
//! nesting error types, and lets future failure kinds join it without
//! breaking callers; [`Error::into_inner`](crate::Error::into_inner) gives
//! the inner error back for downcasting.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_throttle::{Registry, RobotsDelayLayer, ThrottleLayer};
//! use tower_throttle::registry::LimitSource;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let registry = Registry::default();
//!
//! // Any Service<http::Request<B>> with B: Default; here, a site whose
//! // robots.txt asks for 2 s between requests and keeps /private to itself.
//! let http_client = tower::service_fn(|request: http::Request<String>| async move {
//!     let body = match request.uri().path() {
//!         "/robots.txt" => "User-agent: *\nCrawl-delay: 2\nDisallow: /private\n",
//!         _ => "a page",
//!     };
//!     Ok::<_, std::convert::Infallible>(http::Response::new(body.to_owned()))
//! });
//! let client = ServiceBuilder::new()
//!     .layer(RobotsDelayLayer::new(registry.clone()).user_agent("mybot/1.0").obey(true))
//!     .layer(ThrottleLayer::new(registry.clone()))
//!     .service(http_client);
//!
//! let page = http::Request::get("https://example.com/").body(String::new())?;
//! let response = client.clone().oneshot(page).await?;
//! assert_eq!(response.into_body().into_inner(), "a page"); // the lane is free again
//!
//! let stats = registry.scope_stats("example.com").unwrap();
//! assert_eq!(stats.robots_delay, Some(Duration::from_secs(2)));
//! assert_eq!((stats.concurrency, stats.delay_limited_by), (1, LimitSource::Robots));
//!
//! let private = http::Request::get("https://example.com/private/x").body(String::new())?;
//! let err = client.oneshot(private).await.unwrap_err();
//! assert!(err.is_robots_disallowed());
//! # Ok(())
//! # }
//! ```

mod cache;
mod fetch;
pub mod future;
mod layer;
mod service;
mod shared;

use std::time::Duration;

pub use crate::parse::robots_txt::MAX_ROBOTS_TXT_BYTES;
pub use layer::RobotsDelayLayer;
pub use service::RobotsDelay;

/// The layer's settings (here, where the layer, the service and the
/// cache all read them).
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) user_agent: String,
    pub(crate) max_delay: Duration,
    pub(crate) cache_ttl: Duration,
    pub(crate) max_body_bytes: usize,
    pub(crate) fetch_timeout: Duration,
    pub(crate) obey: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            user_agent: String::new(),
            max_delay: DEFAULT_MAX_DELAY,
            cache_ttl: DEFAULT_CACHE_TTL,
            max_body_bytes: MAX_ROBOTS_TXT_BYTES,
            fetch_timeout: DEFAULT_FETCH_TIMEOUT,
            obey: false,
        }
    }
}

/// Default cap on the Crawl-delay applied: 60 s.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(60);
/// Default time a fetched robots.txt is used: 24 h (RFC 9309 §2.4).
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(24 * 3600);
/// Default time one robots.txt fetch may take, redirects and body included.
pub const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Redirects followed when fetching robots.txt (RFC 9309 §2.3.1.2: at
/// least five); one more makes the file unavailable.
pub const MAX_REDIRECTS: u32 = 5;
/// The wait before the first retry of an unreachable robots.txt; it
/// doubles with each further failure, up to the cache TTL.
pub const FIRST_RETRY_DELAY: Duration = Duration::from_secs(60);
