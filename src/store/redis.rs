//! [`RedisStore`]: the shared facts of scopes in Redis, one script call per
//! admission.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::backend::{
    Answer, AutoThrottleSample, BackoffStep, FleetBackoff, Grant, Learnt, Lease, Reservation, ScopeStore,
    SharedFacts, StoreFuture, LEARNT_TTL, LINE_GRACE,
};
use super::memory::{DEFAULT_LEASE_TTL, MIN_RETRY};
use super::StoreError;
use crate::scope::Scope;

mod scripts;

use scripts::{AUTOTHROTTLE, HOLD, LEARNT, RELEASE, RENEW, RESERVE, STEP_BACKOFF, SWAP_LEARNT};

/// Default prefix of every key the store writes.
const DEFAULT_PREFIX: &str = "tower-throttle:";
/// The keys of a scope, in the order the reserve script takes them.
const FACTS: [&str; 11] = [
    "lanes",
    "next",
    "hold",
    "backoff",
    "quota",
    "first",
    "learnt",
    "line",
    "line_until",
    "auto",
    "level",
];
/// Default limit on each Redis call (connecting included).
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(500);

/// The shared facts of scopes in Redis, for a fleet of workers; see the
/// [module docs](super).
///
/// - **One round trip per admission**: a Lua script reserves a lane lease
///   and the send instant in every scope of a request at once (`EVALSHA`;
///   the script is loaded on a `NOSCRIPT` answer and asked again).
/// - **Redis's clock**: the script reads `TIME`, so workers on machines
///   whose clocks are skewed cannot jointly break a delay. A worker turns
///   the granted instant into a local deadline through its estimate of the
///   offset between Redis's clock and its own (the smallest difference an
///   answer showed), so an answer that reached its task late does not make
///   the send late.
/// - **Keys** `PREFIX + scope + {":lanes", ":next", ":hold", ":backoff",
///   ":quota", ":first", ":learnt", ":line", ":line_until", ":auto", ":level"}`,
///   each with a TTL, so idle scopes vanish from Redis by themselves.
/// - **A timeout on every call** (500 ms by default, connecting included);
///   a connection that broke is made again on the next call.
///
/// The connection is opened on first use, so building the store never
/// fails for an unreachable server: the registry's
/// [`StoreFailure`](super::StoreFailure) decides what such a request does.
///
/// # Clone
///
/// Clones share the connection (and the settings given before cloning).
#[derive(Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub struct RedisStore {
    client: redis::Client,
    connection: Arc<Mutex<Option<ConnectionManager>>>,
    prefix: Arc<str>,
    lease_ttl: Duration,
    call_timeout: Duration,
    scripts: Arc<Scripts>,
    clock: Arc<StdMutex<ClockOffset>>,
}

struct Scripts {
    reserve: Script,
    release: Script,
    hold: Script,
    renew: Script,
    learnt: Script,
    swap_learnt: Script,
    autothrottle: Script,
    step_backoff: Script,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("server", self.client.get_connection_info().addr())
            .field("prefix", &self.prefix)
            .field("lease_ttl", &self.lease_ttl)
            .field("call_timeout", &self.call_timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store on the Redis at `url` (`redis://host:port/db`), with the
    /// key prefix `tower-throttle:`, a lease TTL of 60 s and a call
    /// timeout of 500 ms. Nothing is connected yet.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when `url` is not a Redis URL.
    pub fn new(url: &str) -> Result<Self, StoreError> {
        let client =
            redis::Client::open(url).map_err(|error| StoreError::new(format!("redis url {url:?}"), error))?;
        Ok(RedisStore {
            client,
            connection: Arc::default(),
            prefix: DEFAULT_PREFIX.into(),
            lease_ttl: DEFAULT_LEASE_TTL,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            scripts: Arc::new(Scripts {
                reserve: Script::new(RESERVE),
                release: Script::new(RELEASE),
                hold: Script::new(HOLD),
                renew: Script::new(RENEW),
                learnt: Script::new(LEARNT),
                swap_learnt: Script::new(SWAP_LEARNT),
                autothrottle: Script::new(AUTOTHROTTLE),
                step_backoff: Script::new(STEP_BACKOFF),
            }),
            clock: Arc::new(StdMutex::new(ClockOffset::new(Instant::now()))),
        })
    }

    /// The prefix of every key (default `tower-throttle:`): workers share
    /// scopes exactly when they use the same Redis and prefix.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into().into();
        self
    }

    /// How long a lease nobody renews or releases keeps its lane (default
    /// 60 s). A worker renews its requests' leases every third of it, in
    /// one call, so a request may last longer; a crashed worker's lanes
    /// come back within one TTL of its last renewal.
    #[must_use]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// The limit on each call to Redis, connecting included (default
    /// 500 ms). A call past it is a store failure.
    #[must_use]
    pub fn call_timeout(mut self, limit: Duration) -> Self {
        self.call_timeout = limit;
        self
    }

    fn key(&self, scope: &Scope, fact: &str) -> String {
        format!("{}{}:{fact}", self.prefix, scope.as_str())
    }

    /// Runs `call` on the connection (opened first if need be) within the
    /// call timeout.
    fn call<T, F>(
        &self,
        what: &'static str,
        call: impl FnOnce(ConnectionManager, Arc<Scripts>) -> F + Send + 'static,
    ) -> StoreFuture<T>
    where
        F: Future<Output = redis::RedisResult<T>> + Send + 'static,
        T: Send + 'static,
    {
        let store = self.clone();
        let limit = self.call_timeout;
        Box::pin(async move {
            let work = async {
                let connection = store.connection().await?;
                call(connection, store.scripts.clone())
                    .await
                    .map_err(|error| StoreError::new(what, error))
            };
            tokio::time::timeout(limit, work)
                .await
                .unwrap_or_else(|_| Err(StoreError::timeout(what, limit)))
        })
    }

    async fn connection(&self) -> Result<ConnectionManager, StoreError> {
        let mut connection = self.connection.lock().await;
        if let Some(open) = &*connection {
            return Ok(open.clone());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.call_timeout))
            .set_response_timeout(Some(self.call_timeout))
            .set_number_of_retries(1);
        let open = ConnectionManager::new_with_config(self.client.clone(), config)
            .await
            .map_err(|error| StoreError::new("connecting to redis", error))?;
        *connection = Some(open.clone());
        Ok(open)
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

fn from_micros(micros: i64) -> Duration {
    Duration::from_micros(micros.max(0) as u64)
}

/// Reads the reserve script's answer.
/// Reads the reserve script's answer: the grant, and Redis's now (µs).
fn grant_of(answer: &[i64], scopes: usize) -> Result<(Grant, i64), StoreError> {
    if answer.len() != 3 + 6 * scopes {
        return Err(StoreError::unexpected(format!(
            "redis reservation answered {} numbers for {scopes} scopes",
            answer.len()
        )));
    }
    let time = from_micros(answer[1]);
    let answer_kind = match answer[0] {
        1 => Answer::Granted { wait: time },
        _ => Answer::Busy { retry_in: time },
    };
    let facts = answer[3..]
        .chunks_exact(6)
        .map(|facts| SharedFacts {
            hold: from_micros(facts[0]),
            backoff_delay: from_micros(facts[1]),
            backoff_remaining: from_micros(facts[2]),
            learnt_version: u64::try_from(facts[3]).unwrap_or(0),
            autothrottle_delay: (facts[4] >= 0).then(|| from_micros(facts[4])),
            backoff_level: u32::try_from(facts[5]).unwrap_or(0),
        })
        .collect();
    let grant = Grant {
        answer: answer_kind,
        facts,
    };
    Ok((grant, answer[2]))
}

/// Where Redis's clock stands against this process's, to turn a granted
/// instant of Redis time into a local deadline.
///
/// Counting a wait from when the answer is read makes a request late by
/// however long the answer took to reach its task (the connection's driver
/// and the request's own task each wait their turn on a busy runtime), and a
/// late send shortens the next worker's gap. Each answer gives a sample of
/// `local now − Redis now`: the true offset plus that answer's delay. The
/// smallest sample is the best estimate (delays only add); it is allowed to
/// creep up slowly for clock drift, and is replaced when a sample is far
/// above it (a step of Redis's wall clock, which `TIME` follows).
#[derive(Debug)]
struct ClockOffset {
    /// The local zero of the samples.
    base: Instant,
    /// The smallest recent sample (µs), and the local instant it was taken.
    best: Option<(i128, Instant)>,
}

/// How far a sample may sit above the estimate before the estimate is
/// taken to be stale (Redis's clock stepped) rather than the answer slow.
const CLOCK_STEP: i128 = 50_000;

impl ClockOffset {
    fn new(base: Instant) -> Self {
        ClockOffset { base, best: None }
    }

    /// The local wait until the instant `wait` after Redis's `redis_now`,
    /// for an answer read at `local_now`.
    fn local_wait(&mut self, redis_now: i64, wait: Duration, local_now: Instant) -> Duration {
        let local_us = local_now.saturating_duration_since(self.base).as_micros() as i128;
        let sample = local_us - i128::from(redis_now);
        let offset = match self.best {
            // Drift allowance: 100 µs per second since the best sample.
            Some((best, at)) => {
                let drift = (local_now.saturating_duration_since(at).as_micros() / 10_000) as i128;
                if sample <= best + drift || sample - best > CLOCK_STEP {
                    self.best = Some((sample, local_now));
                    sample
                } else {
                    best + drift
                }
            }
            None => {
                self.best = Some((sample, local_now));
                sample
            }
        };
        let deadline_us = i128::from(redis_now) + wait.as_micros() as i128 + offset;
        Duration::from_micros(u64::try_from(deadline_us - local_us).unwrap_or(0))
    }
}

impl ScopeStore for RedisStore {
    fn reserve(&self, reservation: Reservation) -> StoreFuture<Grant> {
        let keys: Vec<String> = reservation
            .scopes
            .iter()
            .flat_map(|terms| FACTS.map(|fact| self.key(&terms.scope, fact)))
            .collect();
        let lease = reservation.lease.to_string();
        let waiter = reservation.waiter.to_string();
        let (lease_ttl, scopes) = (micros(self.lease_ttl), reservation.scopes.len());
        let terms: Vec<(u32, u64, f64, u64, f64, u8)> = reservation
            .scopes
            .iter()
            .map(|terms| {
                let (quota, window, cost) = terms.quota.map_or((-1.0, 0, 0.0), |quota| {
                    (quota.quota, micros(quota.window), quota.cost)
                });
                let first = u8::from(terms.first);
                (terms.concurrency, micros(terms.delay), quota, window, cost, first)
            })
            .collect();
        let grant = self.call("redis reservation", move |mut connection, scripts| async move {
            let mut invocation = scripts.reserve.prepare_invoke();
            invocation
                .key(keys)
                .arg(lease)
                .arg(lease_ttl)
                .arg(micros(MIN_RETRY))
                .arg(waiter)
                .arg(micros(LINE_GRACE));
            for (concurrency, delay, quota, window, cost, first) in terms {
                invocation
                    .arg(concurrency)
                    .arg(delay)
                    .arg(quota)
                    .arg(window)
                    .arg(cost)
                    .arg(first);
            }
            invocation.invoke_async::<Vec<i64>>(&mut connection).await
        });
        let clock = self.clock.clone();
        Box::pin(async move {
            let answer = grant.await?;
            let local_now = Instant::now();
            let (mut grant, redis_now) = grant_of(&answer, scopes)?;
            if let Answer::Granted { wait } = &mut grant.answer {
                let mut clock = clock.lock().unwrap_or_else(PoisonError::into_inner);
                *wait = clock.local_wait(redis_now, *wait, local_now);
            }
            Ok(grant)
        })
    }

    fn release(&self, lease: Lease) -> StoreFuture<()> {
        let keys: Vec<String> = lease
            .scopes
            .iter()
            .flat_map(|scope| ["lanes", "next", "first"].map(|fact| self.key(scope, fact)))
            .collect();
        let member = lease.id.to_string();
        let after: Vec<u64> = (0..lease.scopes.len())
            .map(|index| micros(lease.next_send_after.get(index).copied().unwrap_or_default()))
            .collect();
        self.call("redis release", move |mut connection, scripts| async move {
            let mut invocation = scripts.release.prepare_invoke();
            invocation.key(keys).arg(member).arg(after);
            invocation.invoke_async::<()>(&mut connection).await
        })
    }

    fn renew(&self, leases: Vec<Lease>) -> StoreFuture<()> {
        let mut keys = Vec::new();
        let mut members = Vec::new();
        for lease in &leases {
            for scope in &lease.scopes {
                keys.push(self.key(scope, "lanes"));
                keys.push(self.key(scope, "first"));
                members.push(lease.id.to_string());
            }
        }
        let ttl = micros(self.lease_ttl);
        self.call("redis renew", move |mut connection, scripts| async move {
            let mut invocation = scripts.renew.prepare_invoke();
            invocation.key(keys).arg(ttl).arg(members);
            invocation.invoke_async::<()>(&mut connection).await
        })
    }

    fn lease_ttl(&self) -> Option<Duration> {
        Some(self.lease_ttl)
    }

    fn learnt(&self, scope: Scope) -> StoreFuture<Option<Learnt>> {
        let key = self.key(&scope, "learnt");
        let read = self.call("redis learnt state", move |mut connection, scripts| async move {
            scripts
                .learnt
                .key(key)
                .invoke_async::<Option<(u64, String, i64)>>(&mut connection)
                .await
        });
        Box::pin(async move {
            let read = read.await?;
            Ok(read.map(|(version, state, age)| Learnt::new(version, state, from_micros(age))))
        })
    }

    fn swap_learnt(
        &self,
        scope: Scope,
        version: u64,
        state: String,
        ttl: Duration,
    ) -> StoreFuture<Option<u64>> {
        let key = self.key(&scope, "learnt");
        let swapped = self.call(
            "redis learnt state write",
            move |mut connection, scripts| async move {
                scripts
                    .swap_learnt
                    .key(key)
                    .arg(version)
                    .arg(state)
                    .arg(micros(ttl))
                    .invoke_async::<u64>(&mut connection)
                    .await
            },
        );
        Box::pin(async move { Ok(Some(swapped.await?).filter(|&version| version != 0)) })
    }

    fn step_backoff(&self, scope: Scope, step: BackoffStep) -> StoreFuture<Option<FleetBackoff>> {
        let key = self.key(&scope, "level");
        let stepped = self.call("redis backoff step", move |mut connection, scripts| async move {
            scripts
                .step_backoff
                .key(key)
                .arg(micros(step.base_delay))
                .arg(step.delay_factor)
                .arg(micros(step.min_delay))
                .arg(micros(step.max_delay))
                .arg(micros(step.window))
                .invoke_async::<(u32, i64)>(&mut connection)
                .await
        });
        Box::pin(async move {
            let (level, delay) = stepped.await?;
            Ok(Some(FleetBackoff::new(level, from_micros(delay), step.window)))
        })
    }

    fn autothrottle(&self, scope: Scope, sample: AutoThrottleSample) -> StoreFuture<Option<Duration>> {
        let key = self.key(&scope, "auto");
        let delay = self.call("redis autothrottle", move |mut connection, scripts| async move {
            scripts
                .autothrottle
                .key(key)
                .arg(micros(sample.latency))
                .arg(sample.status)
                .arg(micros(sample.configured_delay))
                .arg(micros(sample.start_delay))
                .arg(micros(sample.max_delay))
                .arg(sample.target_concurrency)
                .arg(micros(LEARNT_TTL))
                .invoke_async::<i64>(&mut connection)
                .await
        });
        Box::pin(async move { Ok(Some(from_micros(delay.await?))) })
    }

    fn shares_learning(&self) -> bool {
        true
    }

    fn hold(&self, scope: Scope, duration: Duration) -> StoreFuture<()> {
        let key = self.key(&scope, "hold");
        self.call("redis hold", move |mut connection, scripts| async move {
            scripts
                .hold
                .key(key)
                .arg(micros(duration))
                .invoke_async::<()>(&mut connection)
                .await
        })
    }

    fn backoff(&self, scope: Scope, delay: Duration, ttl: Duration) -> StoreFuture<()> {
        let key = self.key(&scope, "backoff");
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        self.call("redis backoff", move |mut connection, _| async move {
            redis::cmd("SET")
                .arg(key)
                .arg(micros(delay))
                .arg("PX")
                .arg(ttl_ms)
                .query_async::<()>(&mut connection)
                .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_of_the_wrong_length_are_store_errors_not_panics() {
        let error = grant_of(&[1, 0, 0, 0], 1).unwrap_err();
        assert_eq!(
            error.to_string(),
            "redis reservation answered 4 numbers for 1 scopes"
        );
    }

    #[test]
    fn answers_are_read_per_scope_in_order() {
        let answer = [
            0, 7_000, 42, 1_000, 2_000, 3_000, 5, 250_000, 2, 0, 0, 0, 0, -1, 0,
        ];
        let (grant, redis_now) = grant_of(&answer, 2).unwrap();
        assert_eq!(redis_now, 42);
        assert_eq!(
            grant.answer,
            Answer::Busy {
                retry_in: Duration::from_millis(7)
            }
        );
        assert_eq!(grant.facts[0].backoff_delay, Duration::from_millis(2));
        assert_eq!(grant.facts[0].learnt_version, 5);
        assert_eq!(
            grant.facts[0].autothrottle_delay,
            Some(Duration::from_millis(250))
        );
        assert_eq!(grant.facts[1], SharedFacts::default());
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_answer_waits_less_so_the_send_keeps_to_redis_time() {
        let base = Instant::now();
        let mut clock = ClockOffset::new(base);
        let ms = Duration::from_millis;
        // A quick answer sets the offset: Redis's 1 000 000 µs is local 0.
        assert_eq!(clock.local_wait(1_000_000, ms(50), base), ms(50));
        // An answer read 5 ms late (Redis said 1 100 000, it is local 105
        // ms): the granted instant is still local 150 ms (and 10 µs of
        // drift allowance for the 105 ms since the best sample).
        assert_eq!(
            clock.local_wait(1_100_000, ms(50), base + ms(105)),
            ms(45) + Duration::from_micros(10)
        );
        // Later than the wait itself: go at once.
        assert_eq!(clock.local_wait(1_200_000, ms(3), base + ms(210)), Duration::ZERO);
        // Redis's clock stepped back 1 s: the estimate follows at once.
        assert_eq!(clock.local_wait(300_000, ms(50), base + ms(300)), ms(50));
    }

    /// A store on `REDIS_URL` (default `redis://127.0.0.1:6379`) under a
    /// prefix of its own.
    fn test_store() -> RedisStore {
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
        RedisStore::new(&url)
            .unwrap()
            .prefix(format!("tower-throttle-test:{:016x}:", fastrand::u64(..)))
    }

    /// A store call's answer, or `None` (the test is skipped, saying why)
    /// when no Redis answers; under `CI=true` that fails the test.
    fn answered_or_skip<T>(answer: Result<Option<T>, StoreError>) -> Option<T> {
        match answer {
            Ok(answer) => Some(answer.expect("a store that shares learning answers")),
            Err(error) => {
                assert!(
                    std::env::var("CI").as_deref() != Ok("true"),
                    "no Redis answers: {error}"
                );
                eprintln!("skipped: no Redis answers ({error})");
                None
            }
        }
    }

    /// Scrapy's AutoThrottle table through the Lua script, against the
    /// Rust rule it mirrors. Needs a Redis (`REDIS_URL`): skipped without
    /// one, except under `CI=true`, where it fails.
    #[tokio::test]
    async fn the_autothrottle_script_applies_the_rule_as_rust_does() {
        let store = test_store();
        let secs = Duration::from_secs_f64;
        // (latency, target concurrency, old, status, configured, max): the
        // rows of `registry::autothrottle`'s Scrapy table.
        let rows = [
            (2.0, 2.0, 1.0, 200, 0.0, 60.0),
            (1.0, 2.0, 1.0, 200, 0.0, 60.0),
            (4.0, 2.0, 1.0, 200, 0.0, 60.0),
            (2.0, 4.0, 1.0, 200, 0.0, 60.0),
            (2.0, 2.0, 2.0, 200, 0.0, 60.0),
            (2.0, 2.0, 1.0, 200, 0.25, 0.5),
            (1.0, 2.0, 1.0, 400, 0.0, 60.0),
            (4.0, 2.0, 1.0, 400, 0.0, 60.0),
            (0.3, 1.0, 0.2, 503, 0.1, 60.0),
        ];
        for (row, (latency, target, old, status, configured, max)) in rows.into_iter().enumerate() {
            let sample = AutoThrottleSample {
                latency: secs(latency),
                status,
                configured_delay: secs(configured),
                start_delay: secs(old),
                max_delay: secs(max),
                target_concurrency: target,
            };
            let scope = Scope::new(format!("row{row}"));
            let Some(shared) = answered_or_skip(store.autothrottle(scope, sample).await) else {
                return;
            };
            let rust = sample.next_delay(None);
            assert!(
                shared.abs_diff(rust) <= Duration::from_micros(1),
                "row {row}: Lua {shared:?}, Rust {rust:?}"
            );
        }
    }

    /// The backoff step script against `BackoffStep` in Rust: three steps
    /// (1, 2, 4 s), a quiet window (one step back, to 2 s), and a step from
    /// there (4 s at level 3). Needs a Redis, as the test above.
    #[tokio::test]
    async fn the_backoff_step_script_steps_and_steps_back_as_rust_does() {
        let store = test_store();
        let step = BackoffStep {
            base_delay: Duration::from_millis(100),
            delay_factor: 2.0,
            min_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(300),
            window: Duration::from_millis(300),
        };
        let scope = Scope::new("stepped");
        let mut expected = None;
        for round in 0..4 {
            if round == 3 {
                tokio::time::sleep(Duration::from_millis(350)).await;
                let (level, delay) = expected.unwrap();
                let back = step.recovered(level, delay, Duration::from_millis(350)).unwrap();
                expected = Some((back.level, back.delay));
            }
            let rust = step.step(expected);
            let Some(shared) = answered_or_skip(store.step_backoff(scope.clone(), step).await) else {
                return;
            };
            assert_eq!((shared.level, shared.delay), rust, "round {round}");
            expected = Some(rust);
        }
        assert_eq!(expected, Some((3, Duration::from_secs(4))));
    }

    #[test]
    fn a_url_that_is_not_redis_is_refused_by_name() {
        let error = RedisStore::new("http://example.com").unwrap_err();
        assert!(
            error.to_string().starts_with("redis url \"http://example.com\""),
            "{error}"
        );
    }
}
