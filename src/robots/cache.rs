//! What is known about each origin's robots.txt, the fetch in progress, and
//! the requests waiting for it.
//!
//! Lock order: the origin map, then one origin's entry, then the registry.
//! The map lock is only held to find or insert an entry; an entry's lock is
//! held while its result is applied to the registry, so two results for one
//! scope can never be applied out of order.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use slab::Slab;
use tokio::time::Instant;

use super::Config;
use super::FIRST_RETRY_DELAY;
use crate::error::Error;
use crate::parse::robots_txt::RobotsRules;
use crate::registry::Registry;
use crate::scope::{lower_cased, Scope, Scopes};
use crate::time::saturating_add;

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// Below this many origins the map is never swept.
const MIN_SWEEP_AT: usize = 1024;

/// Where a robots.txt applies: scheme, host (lower-cased) and port, the
/// port filled in from the scheme when the URI has none.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Origin {
    https: bool,
    host: Box<str>,
    port: u16,
}

impl Origin {
    /// The origin of an absolute `http`/`https` URI; `None` for anything
    /// else (origin-form `/path`, other schemes), which has no robots.txt
    /// we could fetch.
    pub(crate) fn of(uri: &http::Uri) -> Option<Self> {
        let https = match uri.scheme_str()? {
            scheme if scheme.eq_ignore_ascii_case("https") => true,
            scheme if scheme.eq_ignore_ascii_case("http") => false,
            _ => return None,
        };
        let host = uri.host().filter(|host| !host.is_empty())?;
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        Some(Origin {
            https,
            host: lower_cased(host).into(),
            port,
        })
    }

    /// `{scheme}://{host}[:{port}]/robots.txt`, the port written only when
    /// it is not the scheme's default.
    pub(crate) fn robots_txt_uri(&self) -> http::Uri {
        format!("{self}/robots.txt")
            .parse()
            .expect("scheme, host and port taken from a valid URI make a valid URI")
    }

    fn default_port(&self) -> u16 {
        if self.https {
            443
        } else {
            80
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        write!(f, "{scheme}://{}", self.host)?;
        if self.port != self.default_port() {
            write!(f, ":{}", self.port)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Every origin seen, behind one lock held only to find or insert an entry.
pub(crate) struct Cache {
    origins: RwLock<Origins>,
}

struct Origins {
    map: HashMap<Origin, Arc<OriginEntry>>,
    /// The map is swept of expired entries when it reaches this size, then
    /// the bound doubles from what is left, so sweeping is amortised O(1)
    /// per new origin.
    sweep_at: usize,
}

impl Default for Cache {
    fn default() -> Self {
        Cache {
            origins: RwLock::new(Origins {
                map: HashMap::default(),
                sweep_at: MIN_SWEEP_AT,
            }),
        }
    }
}

impl fmt::Debug for Cache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let origins = self.origins.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Cache")
            .field("origins", &origins.map.len())
            .finish()
    }
}

impl Cache {
    /// The entry of `origin`, created empty (so the first request fetches)
    /// when the origin is new.
    ///
    /// A sweep may drop an expired entry just after a request found it;
    /// that request then fetches for itself, on the dropped entry, while
    /// later ones use a new entry: at worst one extra fetch, never a wrong
    /// answer.
    pub(crate) fn entry(&self, origin: &Origin, now: Instant) -> Arc<OriginEntry> {
        {
            let origins = self.origins.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(entry) = origins.map.get(origin) {
                return entry.clone();
            }
        }
        let mut origins = self.origins.write().unwrap_or_else(PoisonError::into_inner);
        if origins.map.len() >= origins.sweep_at {
            origins.map.retain(|_, entry| !entry.is_disposable(now));
            origins.sweep_at = (origins.map.len() * 2).max(MIN_SWEEP_AT);
        }
        origins
            .map
            .entry(origin.clone())
            .or_insert_with(|| Arc::new(OriginEntry::new(origin.clone())))
            .clone()
    }
}

/// What a finished fetch says, before it is cached.
#[derive(Debug)]
pub(crate) enum FetchResult {
    /// A 2xx robots.txt, parsed.
    Rules(RobotsRules),
    /// RFC 9309 "unavailable": a 4xx, or redirects that lead nowhere. No
    /// rules, cached like a robots.txt.
    Unavailable,
    /// RFC 9309 "unreachable": a 5xx, a timeout, a connection error. Retried
    /// after a backoff.
    Unreachable,
}

/// The rules in force for an origin.
#[derive(Debug, Clone)]
pub(crate) struct Known {
    /// The rules, when the layer obeys them (allow-all otherwise: compiled
    /// rules can be large and would only take memory).
    pub(crate) rules: RobotsRules,
    /// Crawl-delay, already capped at the layer's `max_delay`.
    pub(crate) crawl_delay: Option<Duration>,
    /// `false` when the site's robots.txt could not be reached and no
    /// earlier rules are known: then `rules` disallow everything, which
    /// only counts when the layer obeys rules.
    pub(crate) reachable: bool,
}

impl Known {
    /// Whether these rules let `request` go: always, unless they are
    /// obeyed.
    pub(crate) fn check<B>(
        &self,
        config: &Config,
        origin: &Origin,
        request: &http::Request<B>,
    ) -> Result<(), Error> {
        if !config.obey {
            return Ok(());
        }
        let path = request.uri().path_and_query().map_or("/", |path| path.as_str());
        if self.rules.is_allowed(path) {
            return Ok(());
        }
        tracing::debug!(target: "tower_throttle", %origin, path, "robots.txt disallows the request");
        Err(Error::robots_disallowed(
            origin.to_string(),
            path.to_owned(),
            !self.reachable,
        ))
    }
}

/// One origin's robots.txt state.
pub(crate) struct OriginEntry {
    origin: Origin,
    state: Mutex<EntryState>,
}

#[derive(Default)]
struct EntryState {
    /// The rules in force once a fetch has finished, and when the next
    /// fetch is due (cache TTL, or retry backoff after a failure).
    known: Option<(Known, Instant)>,
    fetching: bool,
    /// Fetches finished so far. A waiter remembers the value it saw and
    /// goes once it moved on, whatever the result's expiry (so a TTL of
    /// zero cannot make waiters fetch for ever).
    finished: u64,
    /// Wakers of the requests waiting for the fetch in progress; emptied
    /// when it finishes.
    waiters: Slab<Waker>,
    /// Consecutive unreachable results, for the retry backoff.
    failures: u32,
    /// The requests that waited for the rules and have not gone on yet, in
    /// arrival order.
    turnstile: Turnstile,
    /// Every scope this origin's requests were seen with: each is told the
    /// Crawl-delay on its first request, and again when a later result
    /// changes it.
    scopes: HashSet<Scope>,
}

/// What a request finds when it arrives.
#[derive(Debug)]
pub(crate) enum Arrival {
    /// Fresh rules, already applied to the request's scopes. With a turn,
    /// requests that came earlier have not gone on yet: it goes after them.
    Known(Known, Option<u64>),
    /// No fresh rules: wait until the fetch in progress finishes, then for
    /// `turn`. When `start_fetch` is set, this request is the one that must
    /// start the fetch.
    Wait {
        round: u64,
        start_fetch: bool,
        turn: u64,
    },
}

/// Keeps the requests that waited for an origin's rules in arrival order.
///
/// When a fetch finishes, every waiter is woken at once, and the runtime
/// runs them in an order of its own (tokio's multi-threaded scheduler runs
/// the most recently woken task first). Each waiter holds a numbered turn
/// taken on arrival and goes on (hands its request to the inner service)
/// only when every earlier turn is over; a request arriving while turns
/// are pending takes one too. So the throttle sees them in the order they
/// came, as rule 5 (FIFO within a scope) asks.
#[derive(Debug, Default)]
struct Turnstile {
    next: u64,
    /// Pending turns, with the waker of the request once it has polled.
    pending: BTreeMap<u64, Option<Waker>>,
}

impl Turnstile {
    fn take_turn(&mut self) -> u64 {
        let turn = self.next;
        self.next += 1;
        self.pending.insert(turn, None);
        turn
    }

    fn poll_turn(&mut self, cx: &mut Context<'_>, turn: u64) -> Poll<()> {
        if self.pending.keys().next() == Some(&turn) {
            return Poll::Ready(());
        }
        if let Some(waker) = self.pending.get_mut(&turn) {
            match waker {
                Some(known) if known.will_wake(cx.waker()) => {}
                _ => *waker = Some(cx.waker().clone()),
            }
        }
        Poll::Pending
    }

    /// Ends `turn`; returns the waker of the next one if it is now first.
    fn end_turn(&mut self, turn: u64) -> Option<Waker> {
        let was_first = self.pending.keys().next() == Some(&turn);
        self.pending.remove(&turn);
        if !was_first {
            return None;
        }
        self.pending.values_mut().next().and_then(Option::take)
    }
}

impl fmt::Debug for OriginEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OriginEntry")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl OriginEntry {
    fn new(origin: Origin) -> Self {
        OriginEntry {
            origin,
            state: Mutex::default(),
        }
    }

    pub(crate) fn origin(&self) -> &Origin {
        &self.origin
    }

    fn lock(&self) -> MutexGuard<'_, EntryState> {
        // Nothing panics while holding this lock but a tracing subscriber
        // or the registry; the state is consistent either way.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An expired entry with nothing in progress: dropping it loses nothing
    /// a fresh fetch would not rebuild.
    fn is_disposable(&self, now: Instant) -> bool {
        let state = self.lock();
        !state.fetching && state.known.as_ref().is_some_and(|(_, due)| now >= *due)
    }

    /// A request with `scopes` arrives at `now`.
    pub(crate) fn arrive(&self, scopes: &Scopes, registry: &Registry, now: Instant) -> Arrival {
        let mut state = self.lock();
        if !state.fetching {
            if let Some((known, due)) = &state.known {
                if now < *due {
                    let (known, due) = (known.clone(), *due);
                    state.apply_to(scopes, &known, due, registry);
                    let turn = (!state.turnstile.pending.is_empty()).then(|| state.turnstile.take_turn());
                    return Arrival::Known(known, turn);
                }
            }
            state.fetching = true;
            return Arrival::Wait {
                round: state.finished,
                start_fetch: true,
                turn: state.turnstile.take_turn(),
            };
        }
        Arrival::Wait {
            round: state.finished,
            start_fetch: false,
            turn: state.turnstile.take_turn(),
        }
    }

    /// Resolves when every turn taken before `turn` is over.
    pub(crate) fn poll_turn(&self, cx: &mut Context<'_>, turn: u64) -> Poll<()> {
        self.lock().turnstile.poll_turn(cx, turn)
    }

    /// The request holding `turn` went on (or away): the next one may go.
    pub(crate) fn end_turn(&self, turn: u64) {
        let next = self.lock().turnstile.end_turn(turn);
        if let Some(waker) = next {
            waker.wake();
        }
    }

    /// Resolves once the fetch that was in progress at `round` finished,
    /// with its rules applied to `scopes`. `waiter` keeps this request's
    /// place among the waiters between polls.
    pub(crate) fn poll_known(
        &self,
        cx: &mut Context<'_>,
        round: u64,
        waiter: &mut Option<usize>,
        scopes: &Scopes,
        registry: &Registry,
    ) -> Poll<Known> {
        let mut state = self.lock();
        if state.finished > round {
            *waiter = None;
            let (known, due) = state.known.clone().expect("a finished fetch always leaves rules");
            state.apply_to(scopes, &known, due, registry);
            return Poll::Ready(known);
        }
        match waiter.and_then(|key| state.waiters.get_mut(key)) {
            Some(waker) => {
                if !waker.will_wake(cx.waker()) {
                    *waker = cx.waker().clone();
                }
            }
            None => *waiter = Some(state.waiters.insert(cx.waker().clone())),
        }
        Poll::Pending
    }

    /// A waiting request went away before the fetch finished.
    pub(crate) fn leave(&self, round: u64, waiter: usize) {
        let mut state = self.lock();
        // Once the round is over the waiters were taken, and the key may
        // already name a waiter of the next round.
        if state.finished == round {
            state.waiters.try_remove(waiter);
        }
    }

    /// Records the result of the fetch in progress, applies its Crawl-delay
    /// to every scope seen for the origin, and wakes the waiters.
    pub(crate) fn finish(&self, result: FetchResult, config: &Config, registry: &Registry, now: Instant) {
        let mut state = self.lock();
        let previous = state.known.take().map(|(known, _)| known);
        let (known, due) = match result {
            FetchResult::Rules(rules) => {
                state.failures = 0;
                let crawl_delay = rules.crawl_delay().map(|delay| delay.min(config.max_delay));
                let known = Known {
                    // Compiled rules can be large; keep them only if used.
                    rules: if config.obey {
                        rules
                    } else {
                        RobotsRules::allow_all()
                    },
                    crawl_delay,
                    reachable: true,
                };
                (known, saturating_add(now, config.cache_ttl))
            }
            FetchResult::Unavailable => {
                state.failures = 0;
                let known = Known {
                    rules: RobotsRules::allow_all(),
                    crawl_delay: None,
                    reachable: true,
                };
                (known, saturating_add(now, config.cache_ttl))
            }
            FetchResult::Unreachable => {
                state.failures = state.failures.saturating_add(1);
                let retry_in = retry_delay(state.failures, config.cache_ttl);
                // RFC 9309 §2.4: a cached robots.txt may be used beyond its
                // expiry while the file is unreachable.
                let known = previous.clone().filter(|known| known.reachable).unwrap_or(Known {
                    rules: RobotsRules::disallow_all(),
                    crawl_delay: None,
                    reachable: false,
                });
                tracing::info!(
                    target: "tower_throttle",
                    origin = %self.origin,
                    failures = state.failures,
                    retry_in_ms = retry_in.as_millis() as u64,
                    keeps_earlier_rules = known.reachable,
                    "robots.txt unreachable; no Crawl-delay known until a retry succeeds"
                );
                (known, saturating_add(now, retry_in))
            }
        };
        // Told again at every refresh, changed or not: the registry keeps a
        // scope's Crawl-delay only until the entry it came from expires
        // (then an idle scope may be evicted, and come back without it).
        for scope in &state.scopes {
            registry.set_robots_delay_until(scope.clone(), known.crawl_delay, due);
        }
        state.known = Some((known, due));
        state.fetching = false;
        state.finished += 1;
        let waiters = std::mem::take(&mut state.waiters);
        drop(state);
        for waker in waiters {
            waker.1.wake();
        }
    }
}

impl EntryState {
    /// Tells the registry the origin's Crawl-delay, valid until `due`, for
    /// each of `scopes` not told yet.
    fn apply_to(&mut self, scopes: &Scopes, known: &Known, due: Instant, registry: &Registry) {
        for (scope, _cost) in scopes.iter() {
            if !self.scopes.contains(scope) {
                self.scopes.insert(scope.clone());
                registry.set_robots_delay_until(scope.clone(), known.crawl_delay, due);
            }
        }
    }
}

/// The wait before retrying an unreachable robots.txt: one minute after the
/// first failure, doubling with each further one, at most `cache_ttl`.
fn retry_delay(failures: u32, cache_ttl: Duration) -> Duration {
    let doublings = failures.saturating_sub(1).min(31);
    FIRST_RETRY_DELAY.saturating_mul(1 << doublings).min(cache_ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(uri: &str) -> Option<String> {
        Origin::of(&uri.parse().unwrap()).map(|origin| origin.to_string())
    }

    #[test]
    fn origin_is_scheme_host_and_port_with_defaults_filled_in() {
        assert_eq!(
            origin("https://Example.COM/a?b").as_deref(),
            Some("https://example.com")
        );
        assert_eq!(
            Origin::of(&"http://example.com/".parse().unwrap()),
            Origin::of(&"http://example.com:80/x".parse().unwrap())
        );
        assert_ne!(
            Origin::of(&"http://example.com/".parse().unwrap()),
            Origin::of(&"https://example.com/".parse().unwrap())
        );
        assert_eq!(
            origin("http://example.com:8080/").as_deref(),
            Some("http://example.com:8080")
        );
        assert_eq!(
            origin("https://user:pw@example.com:443/").as_deref(),
            Some("https://example.com")
        );
        assert_eq!(origin("http://[::1]:3000/").as_deref(), Some("http://[::1]:3000"));
    }

    #[test]
    fn origin_form_and_other_schemes_have_no_origin() {
        assert_eq!(origin("/path"), None);
        assert_eq!(origin("ftp://example.com/"), None);
        assert_eq!(origin("ws://example.com/"), None);
    }

    #[test]
    fn robots_txt_uri_keeps_only_a_non_default_port() {
        let uri = |s: &str| {
            Origin::of(&s.parse().unwrap())
                .unwrap()
                .robots_txt_uri()
                .to_string()
        };
        assert_eq!(uri("https://example.com:443/a"), "https://example.com/robots.txt");
        assert_eq!(
            uri("http://example.com:8080/a"),
            "http://example.com:8080/robots.txt"
        );
        assert_eq!(uri("http://[::1]:8080/a"), "http://[::1]:8080/robots.txt");
    }

    #[test]
    fn retry_delay_doubles_from_one_minute_up_to_the_ttl() {
        let ttl = Duration::from_secs(24 * 3600);
        let minutes: Vec<u64> = (1..=12).map(|n| retry_delay(n, ttl).as_secs() / 60).collect();
        assert_eq!(minutes, vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1440]);
        assert_eq!(retry_delay(u32::MAX, ttl), ttl);
        assert_eq!(retry_delay(1, Duration::from_secs(10)), Duration::from_secs(10));
    }
}
