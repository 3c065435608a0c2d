//! What the robots layer's services share: the registry, the settings and
//! the cache of robots.txt answers. Apart from the layer, which makes the
//! services, so that the services, their futures and the fetch use it
//! without using the layer back.

use std::fmt;

use super::cache::Cache;
use super::Config;
use crate::registry::Registry;

/// What every service of one layer (and its clones) shares.
pub(crate) struct RobotsShared {
    pub(crate) registry: Registry,
    pub(crate) config: Config,
    pub(crate) cache: Cache,
}

impl RobotsShared {
    pub(crate) fn new(registry: Registry, config: Config) -> Self {
        RobotsShared {
            registry,
            config,
            cache: Cache::default(),
        }
    }
}

impl fmt::Debug for RobotsShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RobotsShared")
            .field("config", &self.config)
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}
