//! [`RegistryBuilder`]: every setting of a registry, checked when it is
//! built.

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::checks;
use super::config::{self, ScopeConfig};
use super::fast_path::{self, places};
use super::manager::{ManagerFactory, ScopeManager};
use super::metrics;
use super::report::BackoffStatuses;
use super::scheduler::{
    Scheduler, DEFAULT_DELAYED_WARN_THRESHOLD, DEFAULT_IDLE_TTL, DEFAULT_MAX_HOLD, DEFAULT_MAX_SCOPES,
    MAX_MAX_HOLD,
};
use super::{Registry, RegistryShared, DEFAULT_MAX_CONCURRENCY, DEFAULT_MAX_QUEUED};
use crate::error::ConfigError;
use crate::scope::{HostResolver, Scope, ScopeResolver};
use crate::store::{backend::ScopeStore, StoreFailure, StoreHandle};

/// The builder settings that are plain values (not scope configs, not the
/// resolver), as given: a registry keeps them so that its config can be
/// read back ([`Registry::config`] with the `serde` feature).
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(not(feature = "serde"), allow(dead_code))]
pub(crate) struct GlobalSettings {
    pub(crate) max_concurrency: u32,
    pub(crate) max_queued: usize,
    pub(crate) quota_window: Option<Duration>,
    pub(crate) idle_ttl: Duration,
    pub(crate) max_hold: Duration,
    pub(crate) max_scopes: usize,
    pub(crate) delayed_warn_threshold: usize,
    pub(crate) metrics_per_scope: bool,
    pub(crate) jitter_seed: Option<u64>,
}

impl Default for GlobalSettings {
    fn default() -> Self {
        RegistryBuilder::default().global_settings()
    }
}

/// Builds a [`Registry`]; see [`Registry::builder`].
pub struct RegistryBuilder {
    max_concurrency: u32,
    max_queued: usize,
    default_scope: ScopeConfig,
    scopes: Vec<(Scope, ScopeConfig)>,
    ip_scopes: Option<ScopeConfig>,
    resolver: Box<dyn ScopeResolver>,
    /// Whether `resolver` is the default [`HostResolver`].
    resolves_hosts: bool,
    seed: Option<u64>,
    metrics_per_scope: bool,
    quota_window: Option<Duration>,
    idle_ttl: Duration,
    max_hold: Duration,
    max_scopes: usize,
    delayed_warn_threshold: usize,
    store: Option<Arc<dyn ScopeStore>>,
    store_failure: StoreFailure,
    fleet_learning: bool,
    lock_free_plain_scopes: bool,
    scope_manager: Option<ManagerFactory>,
}

impl fmt::Debug for RegistryBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryBuilder")
            .field("max_concurrency", &self.max_concurrency)
            .field("max_queued", &self.max_queued)
            .field("default_scope", &self.default_scope)
            .field("scopes", &self.scopes)
            .field("store", &self.store)
            .field("store_failure", &self.store_failure)
            .finish_non_exhaustive()
    }
}

impl Default for RegistryBuilder {
    fn default() -> Self {
        RegistryBuilder {
            max_concurrency: DEFAULT_MAX_CONCURRENCY,
            max_queued: DEFAULT_MAX_QUEUED,
            default_scope: ScopeConfig::default(),
            scopes: Vec::new(),
            ip_scopes: None,
            resolver: Box::new(HostResolver),
            resolves_hosts: true,
            seed: None,
            metrics_per_scope: false,
            quota_window: None,
            idle_ttl: DEFAULT_IDLE_TTL,
            max_hold: DEFAULT_MAX_HOLD,
            max_scopes: DEFAULT_MAX_SCOPES,
            delayed_warn_threshold: DEFAULT_DELAYED_WARN_THRESHOLD,
            store: None,
            store_failure: StoreFailure::default(),
            fleet_learning: true,
            lock_free_plain_scopes: true,
            scope_manager: None,
        }
    }
}

impl RegistryBuilder {
    /// Total requests in flight over all scopes (default 16). Caps every
    /// scope's concurrency.
    #[must_use]
    pub fn max_concurrency(mut self, max: u32) -> Self {
        self.max_concurrency = max;
        self
    }

    /// Requests admitted by `poll_ready` but not yet sent (default 10 000).
    /// At the bound, `poll_ready` is `Pending` until a place frees.
    #[must_use]
    pub fn max_queued(mut self, max: usize) -> Self {
        self.max_queued = max;
        self
    }

    /// The config of every scope without its own.
    #[must_use]
    pub fn default_scope(mut self, config: ScopeConfig) -> Self {
        self.default_scope = config;
        self
    }

    /// The config of scope `key`. A later call for the same key wins.
    /// Every setting `config` does not set is the
    /// [default scope](Self::default_scope)'s (see [`ScopeConfig`]'s
    /// "What a scope's config leaves out").
    ///
    /// `key` is checked when the registry is built: a key the
    /// [resolver](Self::resolver) can never give a request (for the
    /// default host resolver: one with a scheme, a port, a path, upper case
    /// or a trailing dot) is a [`ConfigError`] naming it and the key it
    /// would match instead.
    #[must_use]
    pub fn scope(mut self, key: impl Into<Scope>, config: ScopeConfig) -> Self {
        self.scopes.push((key.into(), config));
        self
    }

    /// The config of every IP scope (`ip:203.0.113.7`, `ip:203.0.113.0/24`:
    /// see [`crate::ip`]) without one of its own, completed from the
    /// default scope as a config given to [`scope`](Self::scope) is. An
    /// address or network of its own still takes [`scope`](Self::scope),
    /// which wins.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::{Registry, ScopeConfig};
    ///
    /// # fn main() -> Result<(), tower_throttle::ConfigError> {
    /// let servers = ScopeConfig::default().concurrency(4).delay(Duration::from_millis(250));
    /// let one_server = ScopeConfig::default().concurrency(1);
    /// let registry = Registry::builder()
    ///     .ip_scopes(servers.clone())
    ///     .scope("ip:203.0.113.7", one_server.clone())
    ///     .build()?;
    /// assert_eq!(registry.scope_config("ip:198.51.100.1"), servers);
    /// assert_eq!(registry.scope_config("ip:203.0.113.7"), one_server);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn ip_scopes(mut self, config: ScopeConfig) -> Self {
        self.ip_scopes = Some(config);
        self
    }

    /// How requests map to scopes (default: [`HostResolver`]).
    #[must_use]
    pub fn resolver(mut self, resolver: impl ScopeResolver) -> Self {
        self.resolver = Box::new(resolver);
        self.resolves_hosts = false;
        self
    }

    /// The length of quota windows for every scope that does not set its
    /// own [`window`](ScopeConfig::window) (default 60 s, the seeds'
    /// `THROTTLING_WINDOW`).
    #[must_use]
    pub fn quota_window(mut self, window: Duration) -> Self {
        self.quota_window = Some(window);
        self
    }

    /// How long a scope with nothing in flight or queued is kept (default
    /// 1 h), counted from the head of its last response (a body that
    /// streams on after its head keeps the scope in flight until its end,
    /// but does not restart the count). An evicted scope comes back, on its next request, with its
    /// configured limits: only state that no longer limits it is ever
    /// dropped (an active backoff, hold, pacing, quota window, or a
    /// robots.txt Crawl-delay whose cache entry is still valid keeps a
    /// scope). Eviction work is spread over arriving requests: a few
    /// candidates per request, never a scan of every scope.
    #[must_use]
    pub fn idle_ttl(mut self, ttl: Duration) -> Self {
        self.idle_ttl = ttl;
        self
    }

    /// The longest a server may hold a scope (default 1 h, at most 24 h):
    /// a `Retry-After`, a RateLimit reset or [`Registry::hold`] asking for
    /// longer is capped here, with a warning naming the scope and the
    /// duration asked. An API that says "come back in an hour" is then
    /// asked again in an hour, not every five minutes. Backoff's own delay
    /// is still capped by its `max_delay`.
    #[must_use]
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.max_hold = max;
        self
    }

    /// Past this many scopes (default 100 000), idle scopes are evicted
    /// before their `idle_ttl`, least recently used first (rampup scopes
    /// are kept until their `idle_ttl`). A soft cap: scopes whose state
    /// still limits them are never evicted, so a registry where all of them
    /// are busy or held back grows past it.
    #[must_use]
    pub fn max_scopes(mut self, max: usize) -> Self {
        self.max_scopes = max;
        self
    }

    /// Logs a warning when more than this many requests wait for their
    /// scopes (default 500): the crawl produces requests faster than its
    /// scopes allow, and memory grows with the queue. Once per crossing:
    /// again only after the queue fell back below half of it.
    #[must_use]
    pub fn delayed_warn_threshold(mut self, threshold: usize) -> Self {
        self.delayed_warn_threshold = threshold;
        self
    }

    /// Every scope reacts to feedback through a [`ScopeManager`] made by
    /// `factory` (on the scope's first feedback, and again after the scope
    /// was evicted) instead of the built-in exponential backoff and rampup:
    /// the seeds' `THROTTLING_SCOPE_MANAGER`. A scope whose config sets its
    /// own with [`ScopeConfig::manager`] keeps that one. This sets the
    /// default scope's manager, replacing one its config set. See the
    /// [`manager`](crate::registry::manager) module for examples.
    #[must_use]
    pub fn scope_manager<F>(mut self, factory: F) -> Self
    where
        F: Fn(&Scope) -> Box<dyn ScopeManager> + Send + Sync + 'static,
    {
        self.scope_manager = Some(ManagerFactory::new(factory));
        self
    }

    /// With the `metrics` feature, labels the counters with the scope
    /// (default off: a broad crawl has millions of scopes, more label
    /// values than most metrics back ends hold). See [Metrics](super#metrics).
    #[must_use]
    pub fn metrics_per_scope(mut self, per_scope: bool) -> Self {
        self.metrics_per_scope = per_scope;
        self
    }

    /// Seeds the jitter's random numbers, for reproducible runs.
    #[must_use]
    pub fn jitter_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Shares the scopes' limits with other workers through `store` (a
    /// [`RedisStore`](crate::store) with the `redis` feature, or a
    /// [`MemoryStore`](crate::store::MemoryStore) shared by registries of
    /// one process): every request also takes a reservation there before
    /// it is sent. See the [`store`](crate::store) module. Without a store
    /// (the default) the registry's own state is the only state.
    #[must_use]
    pub fn store(mut self, store: impl ScopeStore) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// What requests do when the store cannot be reached (default
    /// [`StoreFailure::FailClosed`]).
    #[must_use]
    pub fn store_failure(mut self, failure: StoreFailure) -> Self {
        self.store_failure = failure;
        self
    }

    /// Whether the workers of a fleet learn together (default `true`):
    /// each rampup scope's search for the server's rate is one search for
    /// the whole fleet, kept in the store, which every worker's backoff
    /// feedback moves and every worker follows; each AutoThrottle scope's
    /// delay is one delay, which every worker's responses move; the built-in
    /// backoff has one level, which every worker's backoff feedback steps. With
    /// `false` (the behaviour before), each worker learns alone, and their
    /// paces drift apart.
    /// Needs a store that shares learning ([`ScopeStore::shares_learning`]:
    /// `MemoryStore` and `RedisStore` do); without a store it changes
    /// nothing. See the [`store`](crate::store#what-the-fleet-learns) module.
    #[must_use]
    pub fn fleet_learning(mut self, share: bool) -> Self {
        self.fleet_learning = share;
        self
    }

    /// A hook for the project's benches and tests, hidden from the docs:
    /// it may change or go in any release. Whether a busy *plain* scope
    /// (lanes its only limit) admits and ends its requests on a lock-free
    /// word (default `true`; no effect with a store). The limits, the order
    /// of waiters and every stat are the same either way.
    #[doc(hidden)]
    #[must_use]
    pub fn lock_free_plain_scopes(mut self, enabled: bool) -> Self {
        self.lock_free_plain_scopes = enabled;
        self
    }

    /// Checks every value and builds the registry.
    ///
    /// Settings that are valid but can never take effect (a scope's
    /// concurrency above `max_concurrency`, say) do not fail the build:
    /// they are logged through `tracing` and listed by
    /// [`Registry::config_warnings`].
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first invalid field and its value, or
    /// the first scope key the resolver can never give a request.
    pub fn build(self) -> Result<Registry, ConfigError> {
        self.check_global_settings()?;
        let mut default_scope = self.default_scope;
        if let Some(window) = self.quota_window {
            default_scope.window = default_scope.window.or(Some(window));
        }
        if let Some(factory) = &self.scope_manager {
            default_scope.manager = Some(factory.clone());
        }
        RegistryBuilder {
            default_scope,
            ..self
        }
        .build_checked()
    }

    /// Checks the settings that are not scope configs; their fields are
    /// named as the config file's keys are.
    pub(crate) fn check_global_settings(&self) -> Result<(), ConfigError> {
        if self.max_concurrency == 0 {
            return Err(ConfigError::new("max_concurrency", 0, "must be at least 1"));
        }
        if self.max_queued == 0 {
            return Err(ConfigError::new("max_queued", 0, "must be at least 1"));
        }
        if self.max_scopes == 0 {
            return Err(ConfigError::new("max_scopes", 0, "must be at least 1"));
        }
        config::validate_window("idle_ttl", self.idle_ttl)?;
        if self.max_hold.is_zero() || self.max_hold > MAX_MAX_HOLD {
            return Err(ConfigError::new(
                "max_hold",
                self.max_hold,
                "must be longer than zero and at most 24 h",
            ));
        }
        if let Some(window) = self.quota_window {
            config::validate_window("quota_window", window)?;
        }
        Ok(())
    }

    /// The settings that are plain values, kept by the registry so that its
    /// config can be read back.
    pub(crate) fn global_settings(&self) -> GlobalSettings {
        GlobalSettings {
            max_concurrency: self.max_concurrency,
            max_queued: self.max_queued,
            quota_window: self.quota_window,
            idle_ttl: self.idle_ttl,
            max_hold: self.max_hold,
            max_scopes: self.max_scopes,
            delayed_warn_threshold: self.delayed_warn_threshold,
            metrics_per_scope: self.metrics_per_scope,
            jitter_seed: self.seed,
        }
    }

    fn build_checked(self) -> Result<Registry, ConfigError> {
        self.default_scope.validate("default scope")?;
        let default = &self.default_scope;
        if let Some(config) = &self.ip_scopes {
            config.validate("ip scopes")?;
        }
        for (key, config) in &self.scopes {
            checks::check_key(&*self.resolver, key.as_str())?;
            config.validate(&checks::scope_config_name(key.as_str()))?;
        }
        // Checked as they will run: completed from the default scope's.
        let mut warnings = checks::warnings_of("default scope", default, self.max_concurrency);
        if let Some(config) = &self.ip_scopes {
            let config = config.inherit_from(default);
            warnings.extend(checks::warnings_of("ip scopes", &config, self.max_concurrency));
        }
        for (key, config) in &self.scopes {
            let name = checks::scope_config_name(key.as_str());
            let config = config.inherit_from(default);
            warnings.extend(checks::warnings_of(&name, &config, self.max_concurrency));
        }
        let settings = self.global_settings();
        let every_config = || {
            std::iter::once(&self.default_scope)
                .chain(self.ip_scopes.iter())
                .chain(self.scopes.iter().map(|(_, config)| config))
        };
        let backoff_statuses = BackoffStatuses::of(every_config());
        let managers_hear_successes = every_config().any(|config| config.manager_kind().hears_successes());
        let whole_transfers_somewhere = every_config().any(|config| config.count_whole_transfers);
        let rng = match self.seed {
            Some(seed) => fastrand::Rng::with_seed(seed),
            None => fastrand::Rng::new(),
        };
        // Whether rampup's searches are the fleet's: asked for, and a store
        // that shares them.
        let fleet_learns =
            self.fleet_learning && self.store.as_ref().is_some_and(|store| store.shares_learning());
        let scheduler = Scheduler::new(self.default_scope, self.scopes, self.max_concurrency, rng)
            .with_ip_scopes(self.ip_scopes)
            .with_eviction(self.idle_ttl, self.max_scopes)
            .with_max_hold(self.max_hold)
            .with_fleet_learning(fleet_learns)
            .with_delayed_warn_threshold(self.delayed_warn_threshold)
            .with_metrics(metrics::Metrics {
                per_scope: self.metrics_per_scope,
            });
        let fast_path = self.lock_free_plain_scopes && self.store.is_none();
        let scheduler = if fast_path {
            scheduler
        } else {
            scheduler.without_fast_path()
        };
        let shared = Arc::new_cyclic(|registry| {
            // Its words reach the registry weakly: they live in it.
            let uid = next_registry_uid();
            let words = Arc::new(fast_path::Directory::default());
            let scheduler = scheduler.with_word_owner(registry.clone(), uid, words.clone());
            let global = scheduler.global().clone();
            let configs = scheduler.config_table();
            let queue_places = places::QueuePlaces::new(self.max_queued);
            RegistryShared {
                uid,
                global,
                words,
                managers_hear_successes: AtomicBool::new(managers_hear_successes),
                whole_transfers_somewhere: AtomicBool::new(whole_transfers_somewhere),
                unread: Default::default(),
                #[cfg(debug_assertions)]
                locks: std::sync::atomic::AtomicU64::new(0),
                backoff_statuses,
                configs,
                scheduler: Box::new(super::Locked(Mutex::new(scheduler))),
                resolver: self.resolver,
                resolves_hosts: self.resolves_hosts,
                config_warnings: Mutex::new(warnings),
                max_queued: self.max_queued,
                settings,
                queue_places,
                fleet: self
                    .store
                    .map(|store| Arc::new(StoreHandle::new(store, self.store_failure, fleet_learns))),
            }
        });
        Ok(Registry { shared })
    }
}

/// A number no other registry of this process has (the thread caches of
/// open scopes tell registries apart by it; an address could be reused).
fn next_registry_uid() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
