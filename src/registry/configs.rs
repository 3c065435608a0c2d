//! The scope configs, readable without the scheduler's lock.
//!
//! A response is judged against its scopes' configs (which statuses back
//! off, for instance) before anything is applied. Reading them under the
//! scheduler's lock would cost a lock per feedback layer and response, so
//! the registry keeps this table beside the scheduler: the default config
//! and every scope's own one, the same `Arc`s the scheduler's scopes hold.
//! It is the one place the configs are kept: the scheduler reads a scope's
//! config here when it creates the scope, and only
//! [`Registry::set_scope`](super::Registry::set_scope) writes it (under the
//! scheduler's lock, so a scope's config and the table change together);
//! readers outside share a read lock that never waits for the scheduler.

use std::sync::{Arc, PoisonError, RwLock};

use smallvec::SmallVec;

use super::config::ScopeConfig;
use crate::ip::IP_SCOPE_PREFIX;
use crate::scope::{Scope, Scopes};

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// The configs of a request's scopes, in their order (one inline).
pub(crate) type ConfigsOf = SmallVec<[Arc<ScopeConfig>; 1]>;

/// The default scope config and the scopes' own configs.
#[derive(Debug)]
pub(crate) struct ConfigTable {
    table: RwLock<Table>,
}

#[derive(Debug)]
struct Table {
    default: Arc<ScopeConfig>,
    own: HashMap<Scope, Arc<ScopeConfig>>,
    /// The config of IP scopes (`ip:…`) without one of their own, if set
    /// (`RegistryBuilder::ip_scopes`).
    ip_scopes: Option<Arc<ScopeConfig>>,
}

impl Table {
    /// The config scope `name` runs with, and whether it was set for it
    /// (its own, or the IP scopes' for an IP scope) rather than the default.
    fn of(&self, name: &str) -> (&Arc<ScopeConfig>, bool) {
        if let Some(config) = self.own.get(name) {
            return (config, true);
        }
        match &self.ip_scopes {
            Some(config) if name.starts_with(IP_SCOPE_PREFIX) => (config, true),
            _ => (&self.default, false),
        }
    }
}

impl ConfigTable {
    /// A table of `default` and the scopes' `own` configs (already
    /// completed from the default).
    pub(crate) fn new(
        default: Arc<ScopeConfig>,
        own: impl IntoIterator<Item = (Scope, Arc<ScopeConfig>)>,
    ) -> Self {
        ConfigTable {
            table: RwLock::new(Table {
                default,
                own: own.into_iter().collect(),
                ip_scopes: None,
            }),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        self.table.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The default config.
    pub(crate) fn default_config(&self) -> Arc<ScopeConfig> {
        self.read().default.clone()
    }

    /// The config of scope `name`, and whether it is the scope's own.
    pub(crate) fn config_of(&self, name: &str) -> (Arc<ScopeConfig>, bool) {
        let table = self.read();
        let (config, own) = table.of(name);
        (config.clone(), own)
    }

    /// Sets the config of IP scopes without one of their own (completed
    /// from the default).
    pub(crate) fn set_ip_scopes(&self, config: Option<Arc<ScopeConfig>>) {
        self.table
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .ip_scopes = config;
    }

    /// The config of IP scopes without one of their own, if set.
    #[cfg(feature = "serde")]
    pub(crate) fn ip_scopes(&self) -> Option<ScopeConfig> {
        self.read().ip_scopes.as_deref().cloned()
    }

    /// The default config and every scope's own config.
    #[cfg(feature = "serde")]
    pub(crate) fn snapshot(&self) -> (ScopeConfig, Vec<(Scope, ScopeConfig)>) {
        let table = self.read();
        let own = table
            .own
            .iter()
            .map(|(key, config)| (key.clone(), ScopeConfig::clone(config)))
            .collect();
        (ScopeConfig::clone(&table.default), own)
    }

    /// Whether any config of the table (the default, a scope's own, the IP
    /// scopes') is one that `holds` for.
    pub(crate) fn any(&self, holds: impl Fn(&ScopeConfig) -> bool) -> bool {
        let table = self.read();
        holds(&table.default)
            || table.own.values().any(|config| holds(config))
            || table.ip_scopes.as_deref().is_some_and(&holds)
    }

    /// The config of each of `scopes`, in their order, under one read lock.
    pub(crate) fn configs_of(&self, scopes: &Scopes) -> ConfigsOf {
        let table = self.read();
        scopes
            .iter()
            .map(|(scope, _)| table.of(scope.as_str()).0.clone())
            .collect()
    }

    /// Gives scope `key` its own `config` (the one the scheduler now uses).
    pub(crate) fn set(&self, key: Scope, config: Arc<ScopeConfig>) {
        self.table
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .own
            .insert(key, config);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn an_ip_scope_without_its_own_reads_the_ip_scopes_config() {
        let default = Arc::new(ScopeConfig::default().delay(Duration::from_secs(1)));
        let ip = Arc::new(ScopeConfig::default().delay(Duration::from_secs(3)));
        let one = Arc::new(ScopeConfig::default().delay(Duration::from_secs(4)));
        let table = ConfigTable::new(default.clone(), [(Scope::new("ip:10.0.0.1"), one.clone())]);
        assert!(
            Arc::ptr_eq(&table.config_of("ip:10.0.0.2").0, &default),
            "none set yet"
        );
        table.set_ip_scopes(Some(ip.clone()));
        let configs = table.configs_of(&Scopes::from(["ip:10.0.0.2", "ip:10.0.0.1", "ipsum.example"]));
        assert!(Arc::ptr_eq(&configs[0], &ip));
        assert!(Arc::ptr_eq(&configs[1], &one), "an address's own config wins");
        assert!(
            Arc::ptr_eq(&configs[2], &default),
            "only names that begin with ip:"
        );
        assert!(
            table.config_of("ip:10.0.0.2").1,
            "set for it, as an own config is"
        );
    }

    #[test]
    fn a_scope_without_a_config_of_its_own_reads_the_default() {
        let default = Arc::new(ScopeConfig::default().delay(Duration::from_secs(1)));
        let api = Arc::new(ScopeConfig::default().delay(Duration::from_secs(2)));
        let table = ConfigTable::new(default.clone(), [(Scope::new("api"), api.clone())]);
        let configs = table.configs_of(&Scopes::from(["other", "api"]));
        assert!(Arc::ptr_eq(&configs[0], &default));
        assert!(Arc::ptr_eq(&configs[1], &api));

        let other = Arc::new(ScopeConfig::default().delay(Duration::from_secs(3)));
        table.set(Scope::new("other"), other.clone());
        assert!(Arc::ptr_eq(&table.configs_of(&Scopes::from("other"))[0], &other));
    }
}
