use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::shared::RobotsShared;
use super::{Config, RobotsDelay};
use crate::parse::robots_txt::MAX_ROBOTS_TXT_BYTES;
use crate::registry::Registry;

/// Applies [`RobotsDelay`] to a service: fetches each origin's robots.txt
/// once, applies its Crawl-delay to the registry, and optionally obeys its
/// rules. See the [module docs](crate::robots).
///
/// # Clone
///
/// Cloning this layer shares the registry and the robots cache: every
/// service built from this layer or its clones fetches each origin's
/// robots.txt once between them. Each setter starts a new, empty cache
/// (the cached answers depend on the settings), so configure first and
/// clone after.
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_throttle::{Registry, RobotsDelayLayer, ThrottleLayer};
///
/// let registry = Registry::default();
/// let service = ServiceBuilder::new()
///     .layer(
///         RobotsDelayLayer::new(registry.clone())
///             .user_agent("mybot/1.0")
///             .max_delay(Duration::from_secs(30)),
///     )
///     .layer(ThrottleLayer::new(registry))
///     .service(tower::service_fn(|_request: http::Request<String>| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
///     }));
/// # drop(service);
/// ```
#[derive(Clone)]
pub struct RobotsDelayLayer {
    shared: Arc<RobotsShared>,
}

impl fmt::Debug for RobotsDelayLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RobotsDelayLayer")
            .field("registry", &self.shared.registry)
            .field("config", &self.shared.config)
            .field("cache", &self.shared.cache)
            .finish()
    }
}

impl RobotsDelayLayer {
    /// A layer that reports Crawl-delays to `registry`, with every default:
    /// no user agent name (only `User-agent: *` groups apply), `max_delay`
    /// 60 s, `cache_ttl` 24 h, `max_body_bytes` 512 KiB, `fetch_timeout`
    /// 10 s, rules not obeyed.
    pub fn new(registry: Registry) -> Self {
        RobotsDelayLayer {
            shared: Arc::new(RobotsShared::new(registry, Config::default())),
        }
    }

    fn with(self, change: impl FnOnce(&mut Config)) -> Self {
        let mut config = self.shared.config.clone();
        change(&mut config);
        RobotsDelayLayer {
            shared: Arc::new(RobotsShared::new(self.shared.registry.clone(), config)),
        }
    }

    /// The crawler's name, matched against robots.txt `User-agent` lines
    /// (case-insensitively, by its product token: `mybot/1.0` matches
    /// `User-agent: mybot`, as RFC 9309 says).
    /// When no group names it, the `*` group applies.
    ///
    /// It is also sent as the `User-Agent` header of the robots.txt fetch
    /// when the request that triggered the fetch has none (and the name is
    /// a valid header value).
    #[must_use]
    pub fn user_agent(self, user_agent: impl Into<String>) -> Self {
        let user_agent = user_agent.into();
        self.with(|config| config.user_agent = user_agent)
    }

    /// The largest Crawl-delay applied (default 60 s): a longer one is
    /// capped to this.
    #[must_use]
    pub fn max_delay(self, max_delay: Duration) -> Self {
        self.with(|config| config.max_delay = max_delay)
    }

    /// How long a fetched robots.txt is used (default 24 h, the most
    /// RFC 9309 recommends). The first request to an origin after that
    /// fetches it again and waits for it, like the first request ever.
    /// It also caps the retry backoff of an unreachable robots.txt. A TTL
    /// too large to add to an instant (`Duration::MAX`) counts as 7 days.
    #[must_use]
    pub fn cache_ttl(self, ttl: Duration) -> Self {
        self.with(|config| config.cache_ttl = ttl)
    }

    /// The most bytes of a robots.txt body read (default and maximum
    /// [`MAX_ROBOTS_TXT_BYTES`], 512 KiB; RFC 9309 asks crawlers to read at
    /// least 500 KiB). The body is read up to the bound and then dropped
    /// unread, never buffered whole; the rules are taken from what was read,
    /// cut at its last line break so no rule is read half-written. Larger
    /// values are lowered to [`MAX_ROBOTS_TXT_BYTES`], as the parser reads
    /// no further; smaller ones serve clients with little memory (or
    /// tests).
    #[must_use]
    pub fn max_body_bytes(self, max: usize) -> Self {
        self.with(|config| config.max_body_bytes = max.min(MAX_ROBOTS_TXT_BYTES))
    }

    /// How long one robots.txt fetch may take, redirects and body included
    /// (default 10 s). A fetch that takes longer counts as unreachable.
    /// When this layer sits outside [`Throttle`](crate::Throttle), the time
    /// the fetch waits for its scope's turn counts too (the fetch does go
    /// ahead of the scope's queued requests), so allow for the scope's
    /// delay.
    #[must_use]
    pub fn fetch_timeout(self, timeout: Duration) -> Self {
        self.with(|config| config.fetch_timeout = timeout)
    }

    /// Whether to obey `Allow`/`Disallow` rules (default `false`: only the
    /// Crawl-delay is used). When obeying, a request robots.txt disallows
    /// fails with an [`Error`](crate::Error) for which
    /// [`is_robots_disallowed`](crate::Error::is_robots_disallowed) is true,
    /// without reaching the inner service; so does every request to an
    /// origin whose robots.txt is unreachable (a 5xx, a timeout) until a
    /// retry reaches it, as RFC 9309 prescribes.
    #[must_use]
    pub fn obey(self, obey: bool) -> Self {
        self.with(|config| config.obey = obey)
    }
}

impl<S> Layer<S> for RobotsDelayLayer {
    type Service = RobotsDelay<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RobotsDelay::from_shared(inner, self.shared.clone())
    }
}
