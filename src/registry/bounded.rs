//! Bounded waits, as a scope config sets them: how long a request of the
//! scope may wait, and how many may wait at once. The scheduler's side is
//! `scheduler/bounds.rs`.

use std::time::Duration;

use super::config::ScopeConfig;
use super::Registry;
use crate::error::ConfigError;
use crate::scope::Scopes;
use crate::time::validate_delay;

impl ScopeConfig {
    /// The longest a request of this scope may wait for its turn (default:
    /// no bound). A request the registry predicts would wait longer (a
    /// hold, the requests ahead of it, the scope's delay) fails at once,
    /// before anything reaches the inner service, with an
    /// [`Error`](crate::Error) that says how long it would have waited
    /// ([`retry_after`](crate::Error::retry_after)) and why. One that is
    /// queued fails as soon as its prediction moves past the bound (a hold
    /// arrives, backoff lengthens the delay, the scope is reconfigured), or
    /// when the bound passes while it still waits. A request's own
    /// [`MaxWait`](crate::scope::MaxWait) bounds it too: the tighter one
    /// wins. The throttle must return the crate's `Error`
    /// ([`ThrottleLayer::crate_errors`](crate::ThrottleLayer::crate_errors));
    /// see `docs/bounded-waits.md`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::{Registry, ScopeConfig};
    ///
    /// let registry = Registry::builder()
    ///     .scope("api.example", ScopeConfig::default().max_wait(Duration::from_secs(2)))
    ///     .build()?;
    /// # Ok::<(), tower_throttle::ConfigError>(())
    /// ```
    #[must_use]
    pub fn max_wait(mut self, bound: Duration) -> Self {
        self.max_wait = Some(bound);
        self
    }

    /// How many requests of this scope may wait at once (default: no bound
    /// but the registry's `max_queued`). A request that comes when that
    /// many wait already fails at once
    /// ([`Error::is_queue_full`](crate::Error::is_queue_full)), so a
    /// flooded scope never takes every queue place from the others. `0`:
    /// a request that cannot go at once fails. Needs a throttle that
    /// returns the crate's `Error`, as [`max_wait`](Self::max_wait) does.
    #[must_use]
    pub fn max_waiting(mut self, waiting: usize) -> Self {
        self.max_waiting = Some(waiting);
        self
    }

    /// The bound on a request's wait, if the scope sets one.
    pub fn get_max_wait(&self) -> Option<Duration> {
        self.max_wait
    }

    /// The bound on the requests waiting, if the scope sets one.
    pub fn get_max_waiting(&self) -> Option<usize> {
        self.max_waiting
    }

    /// Checks the bounds (`name`: which scope config, for the error).
    pub(crate) fn validate_bounds(&self, name: &str) -> Result<(), ConfigError> {
        if let Some(bound) = self.max_wait {
            validate_delay(&format!("{name} max_wait"), bound)?;
        }
        Ok(())
    }
}

/// A request's own bound, as the throttle asks the registry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestBound {
    /// Its [`MaxWait`](crate::scope::MaxWait), if it has one.
    pub(crate) max_wait: Option<Duration>,
    /// Whether the throttle can fail the request (it returns the crate's
    /// `Error`): otherwise no bound applies, and a bound set is warned
    /// about.
    pub(crate) enforced: bool,
}

impl RequestBound {
    /// For a throttle that cannot fail requests, or a request that is
    /// never bounded.
    pub(crate) const NONE: RequestBound = RequestBound {
        max_wait: None,
        enforced: false,
    };

    /// The bound of `request`, for a throttle that can fail it when
    /// `enforced`.
    #[inline]
    pub(crate) fn of<B>(request: &http::Request<B>, enforced: bool) -> Self {
        RequestBound {
            max_wait: request
                .extensions()
                .get::<crate::scope::MaxWait>()
                .map(|bound| bound.0),
            enforced,
        }
    }
}

impl Registry {
    /// The bound a request of `scopes` waits with: its own (`bound`) or
    /// its scopes' `max_wait`, the tighter; `None` when it has none or its
    /// throttle cannot fail it. Read from the configs, without the
    /// scheduler's lock: for the steps after the scheduler's admission
    /// (the registry's store), which the scheduler does not bound.
    pub(crate) fn bound_of(&self, scopes: &Scopes, bound: RequestBound) -> Option<Duration> {
        if !bound.enforced {
            return None;
        }
        self.shared
            .configs
            .configs_of(scopes)
            .iter()
            .filter_map(|config| config.max_wait)
            .chain(bound.max_wait)
            .min()
    }
}
