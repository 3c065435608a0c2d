//! The bounded cache of lookups: one lookup per name at a time (the
//! requests that arrive meanwhile share it), answers kept for their TTL,
//! failures for a short while.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use tokio::time::Instant;

use super::resolve::Resolve;
use super::Server;
use crate::error::LookupFailure;
use crate::time::saturating_add;

/// What a lookup gives its requests: the server to throttle for and
/// connect to (the first address the resolver listed), or the failure.
pub(crate) type Answer = Result<Server, LookupFailure>;

/// A lookup shared by the requests that wait for it.
pub(crate) type SharedLookup = Shared<BoxFuture<'static, Answer>>;

/// How long answers are kept, and how many names.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CacheSettings {
    pub(crate) ttl: Duration,
    /// A lookup that takes longer fails (`TimedOut`).
    pub(crate) timeout: Duration,
    pub(crate) failure_ttl: Duration,
    pub(crate) max_names: usize,
    /// How IP scopes are cut (IPv4, IPv6 prefix lengths).
    pub(crate) prefixes: (u8, u8),
}

pub(crate) struct DnsCache {
    resolver: Arc<dyn Resolve>,
    settings: CacheSettings,
    names: Mutex<HashMap<String, Entry>>,
}

impl fmt::Debug for DnsCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DnsCache")
            .field("resolver", &self.resolver)
            .field("settings", &self.settings)
            .field("names", &self.lock().len())
            .finish()
    }
}

enum Entry {
    /// A lookup in flight; `flight` tells it from a later one.
    Pending { lookup: SharedLookup, flight: u64 },
    /// The answer, until `expires`.
    Known { answer: Answer, expires: Instant },
}

/// Where a request stands with its name.
pub(crate) enum Found {
    /// Known and fresh.
    Now(Answer),
    /// Being looked up; `started` by this request.
    Wait { lookup: SharedLookup, started: bool },
}

impl DnsCache {
    pub(crate) fn new(resolver: Arc<dyn Resolve>, settings: CacheSettings) -> Self {
        DnsCache {
            resolver,
            settings,
            names: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `host`'s answer if known and fresh at `now`; else the lookup in
    /// flight, started by this call if there was none.
    pub(crate) fn find(self: &Arc<Self>, host: &str, now: Instant) -> Found {
        let mut names = self.lock();
        match names.get(host) {
            Some(Entry::Known { answer, expires }) if *expires > now => return Found::Now(answer.clone()),
            Some(Entry::Pending { lookup, .. }) => {
                return Found::Wait {
                    lookup: lookup.clone(),
                    started: false,
                }
            }
            _ => {}
        }
        if names.len() >= self.settings.max_names && !names.contains_key(host) {
            make_room(&mut names, now);
        }
        let flight = fastrand::u64(..);
        let lookup = self.start_lookup(host.to_owned(), flight);
        names.insert(
            host.to_owned(),
            Entry::Pending {
                lookup: lookup.clone(),
                flight,
            },
        );
        Found::Wait {
            lookup,
            started: true,
        }
    }

    /// The lookup of `host`, which files its answer when it ends (whichever
    /// request polls it then).
    fn start_lookup(self: &Arc<Self>, host: String, flight: u64) -> SharedLookup {
        let cache = Arc::clone(self);
        let resolving = tokio::time::timeout(self.settings.timeout, self.resolver.resolve(&host));
        async move {
            let resolved = resolving.await.unwrap_or_else(|_| {
                let timeout = cache.settings.timeout;
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no answer within {timeout:?}"),
                ))
            });
            let (answer, ttl) = match resolved {
                Ok(resolved) => match resolved.addresses.first() {
                    Some(&address) => (
                        Ok(Server::new(
                            address,
                            cache.settings.prefixes.0,
                            cache.settings.prefixes.1,
                        )),
                        resolved.ttl.unwrap_or(cache.settings.ttl).min(cache.settings.ttl),
                    ),
                    None => (
                        Err(failure(&host, io::ErrorKind::NotFound, "no addresses")),
                        cache.settings.failure_ttl,
                    ),
                },
                Err(error) => (
                    Err(failure(&host, error.kind(), &error.to_string())),
                    cache.settings.failure_ttl,
                ),
            };
            cache.file(&host, flight, answer.clone(), ttl);
            answer
        }
        .boxed()
        .shared()
    }

    /// Keeps `answer` for `ttl`, unless another lookup took the name's
    /// place meanwhile.
    fn file(&self, host: &str, flight: u64, answer: Answer, ttl: Duration) {
        let mut names = self.lock();
        if let Some(entry @ Entry::Pending { .. }) = names.get_mut(host) {
            if matches!(entry, Entry::Pending { flight: current, .. } if *current == flight) {
                *entry = Entry::Known {
                    answer,
                    expires: saturating_add(Instant::now(), ttl),
                };
            }
        }
    }

    /// The server at `address`, its scope cut as the cache cuts them (for
    /// a request to an IP literal, which needs no lookup).
    pub(crate) fn server_at(&self, address: IpAddr) -> Server {
        let (ipv4, ipv6) = self.settings.prefixes;
        Server::new(address, ipv4, ipv6)
    }

    /// Names kept (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

fn failure(host: &str, kind: io::ErrorKind, message: &str) -> LookupFailure {
    LookupFailure {
        host: host.to_owned(),
        kind,
        message: message.to_owned(),
    }
}

/// Drops the expired answers; if none was, the answer that expires first.
/// Lookups in flight stay (their requests wait on them).
fn make_room(names: &mut HashMap<String, Entry>, now: Instant) {
    let before = names.len();
    names.retain(|_, entry| !matches!(entry, Entry::Known { expires, .. } if *expires <= now));
    if names.len() < before {
        return;
    }
    let soonest = names
        .iter()
        .filter_map(|(name, entry)| match entry {
            Entry::Known { expires, .. } => Some((*expires, name.clone())),
            Entry::Pending { .. } => None,
        })
        .min();
    if let Some((_, name)) = soonest {
        names.remove(&name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ip::FixedResolver;

    fn cache(max_names: usize) -> Arc<DnsCache> {
        let resolver = FixedResolver::new();
        resolver.set("a.test", [[127, 0, 0, 1]]);
        resolver.set("b.test", [[127, 0, 0, 2]]);
        let settings = CacheSettings {
            ttl: Duration::from_secs(60),
            timeout: Duration::from_secs(10),
            failure_ttl: Duration::from_secs(5),
            max_names,
            prefixes: (32, 128),
        };
        Arc::new(DnsCache::new(Arc::new(resolver), settings))
    }

    async fn answer(cache: &Arc<DnsCache>, host: &str) -> Answer {
        match cache.find(host, Instant::now()) {
            Found::Now(answer) => answer,
            Found::Wait { lookup, .. } => lookup.await,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_cache_keeps_at_most_max_names_dropping_the_answer_that_expires_first() {
        let cache = cache(2);
        let server = answer(&cache, "a.test").await.unwrap();
        assert_eq!(server, Server::new(IpAddr::from([127, 0, 0, 1]), 32, 128));
        assert_eq!(server.scope.as_str(), "ip:127.0.0.1", "named once, in the answer");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(answer(&cache, "b.test").await.is_ok());
        assert!(answer(&cache, "c.test").await.is_err());
        assert_eq!(cache.len(), 2);
        // a.test expired first: it is the one asked again.
        assert!(matches!(cache.find("b.test", Instant::now()), Found::Now(Ok(_))));
        assert!(matches!(
            cache.find("a.test", Instant::now()),
            Found::Wait { started: true, .. }
        ));
    }

    /// Never answers.
    #[derive(Debug)]
    struct Silent;

    impl Resolve for Silent {
        fn resolve(&self, _host: &str) -> crate::ip::Lookup {
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lookup_that_takes_too_long_fails_as_timed_out() {
        let settings = CacheSettings {
            ttl: Duration::from_secs(60),
            timeout: Duration::from_secs(10),
            failure_ttl: Duration::from_secs(5),
            max_names: 10,
            prefixes: (32, 128),
        };
        let cache = Arc::new(DnsCache::new(Arc::new(Silent), settings));
        let start = Instant::now();
        let failure = answer(&cache, "slow.test").await.unwrap_err();
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        assert_eq!(failure.kind, io::ErrorKind::TimedOut);
        assert!(failure.to_string().contains("no answer within 10s"), "{failure}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_is_asked_again_once_expired_and_a_failure_after_its_own_ttl() {
        let cache = cache(10);
        assert!(answer(&cache, "a.test").await.is_ok());
        assert!(answer(&cache, "nowhere.test").await.is_err());
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(matches!(cache.find("a.test", Instant::now()), Found::Now(Ok(_))));
        assert!(matches!(
            cache.find("nowhere.test", Instant::now()),
            Found::Wait { started: true, .. }
        ));
        tokio::time::sleep(Duration::from_secs(55)).await;
        assert!(matches!(
            cache.find("a.test", Instant::now()),
            Found::Wait { started: true, .. }
        ));
    }
}
