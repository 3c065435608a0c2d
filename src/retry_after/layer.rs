use std::time::Duration;

use tower_layer::Layer;

use super::observe::Settings;
use super::RetryAfter;
use crate::registry::Registry;

/// Applies [`RetryAfter`] to a service: holds and paces scopes as the
/// servers' rate-limit headers ask. See the [module docs](crate::retry_after).
///
/// # Clone
///
/// Cloning this layer shares the registry.
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_throttle::{Registry, RetryAfterLayer, ThrottleLayer};
///
/// let registry = Registry::default();
/// let service = ServiceBuilder::new()
///     .layer(ThrottleLayer::new(registry.clone()))
///     .layer(
///         RetryAfterLayer::new(registry)
///             .redirect_max_delay(Duration::from_secs(5))
///             .pace_to_policy(true),
///     )
///     .service(tower::service_fn(|_request: http::Request<()>| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(()))
///     }));
/// # drop(service);
/// ```
#[derive(Debug, Clone)]
pub struct RetryAfterLayer {
    registry: Registry,
    settings: Settings,
}

impl RetryAfterLayer {
    /// A layer that reports what responses say to `registry`, with the
    /// defaults: redirects held at most
    /// [`DEFAULT_REDIRECT_MAX_DELAY`](super::DEFAULT_REDIRECT_MAX_DELAY)
    /// (10 s), no pacing to announced policies.
    pub fn new(registry: Registry) -> Self {
        RetryAfterLayer {
            registry,
            settings: Settings::default(),
        }
    }

    /// The longest a `Retry-After` on a redirect (3xx) holds the request's
    /// scopes (default 10 s). `Duration::ZERO` ignores `Retry-After` on
    /// redirects. The scope's backoff `max_delay` caps it too.
    #[must_use]
    pub fn redirect_max_delay(mut self, max: Duration) -> Self {
        self.settings.redirect_max_delay = max;
        self
    }

    /// Spreads an announced remaining quota evenly until its reset instead
    /// of sending it in a burst (default off): a response announcing `r`
    /// units left and a reset in `t` paces the scope at `t / max(r, 1)`
    /// between sends until the reset. See the [module
    /// docs](crate::retry_after#pacing-to-an-announced-policy).
    #[must_use]
    pub fn pace_to_policy(mut self, pace: bool) -> Self {
        self.settings.pace_to_policy = pace;
        self
    }

    /// Feeds the remaining quota a response announces (`RateLimit` `r=`,
    /// `RateLimit-Remaining`, `X-RateLimit-Remaining`) to the request's
    /// scopes that have a [quota](crate::ScopeConfig::quota) of their own
    /// (default off): their current window's spending becomes
    /// `quota − remaining`. Turn it on when the scope's quota is the
    /// server's, in the server's units.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::ServiceBuilder;
    /// use tower_throttle::{Registry, RetryAfterLayer, ScopeConfig, ThrottleLayer};
    ///
    /// let registry = Registry::builder()
    ///     .scope("api.example", ScopeConfig::default().quota(5000.0).window(Duration::from_secs(3600)))
    ///     .build()?;
    /// let client = ServiceBuilder::new()
    ///     .layer(ThrottleLayer::new(registry.clone()))
    ///     .layer(RetryAfterLayer::new(registry).remaining_quota(true))
    ///     .service(tower::service_fn(|_request: http::Request<()>| async {
    ///         Ok::<_, std::convert::Infallible>(http::Response::new(()))
    ///     }));
    /// # drop(client);
    /// # Ok::<(), tower_throttle::ConfigError>(())
    /// ```
    #[must_use]
    pub fn remaining_quota(mut self, feed: bool) -> Self {
        self.settings.remaining_quota = feed;
        self
    }
}

impl<S> Layer<S> for RetryAfterLayer {
    type Service = RetryAfter<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RetryAfter::with_settings(inner, self.registry.clone(), self.settings)
    }
}
