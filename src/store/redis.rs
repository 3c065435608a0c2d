//! [`RedisStore`]: the shared facts of scopes in Redis, one script call per
//! admission.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;
use tokio::sync::Mutex;

use super::memory::{DEFAULT_LEASE_TTL, MIN_RETRY};
use super::{Answer, Grant, Lease, Reservation, ScopeStore, SharedFacts, StoreError, StoreFuture};
use crate::scope::Scope;

/// Default prefix of every key the store writes.
const DEFAULT_PREFIX: &str = "tower-throttle:";
/// Default limit on each Redis call (connecting included).
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(500);

/// One reservation over every scope of a request, atomic because Redis runs
/// a script alone. Times are microseconds of Redis's own clock (`TIME`), so
/// workers whose clocks disagree still agree on the gaps. Per scope, KEYS
/// are its lanes (a sorted set of leases scored by expiry), next send
/// instant, hold-until and backoff delay; ARGV is the lease, the lease TTL,
/// the shortest retry, then each scope's concurrency and delay. Answers
/// `{granted (0/1), wait or retry (µs), then per scope: hold left (µs),
/// backoff delay (µs), backoff left (µs)}`. Every key it writes expires,
/// so an idle scope leaves nothing behind.
const RESERVE: &str = r#"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local lease, ttl, min_retry = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local scopes = #KEYS / 4
local send_at, busy = now, false
local answer = {0, 0}
local backoff = {}
for i = 0, scopes - 1 do
  local lanes, next_key, hold_key, backoff_key = KEYS[4*i+1], KEYS[4*i+2], KEYS[4*i+3], KEYS[4*i+4]
  redis.call('ZREMRANGEBYSCORE', lanes, '-inf', now)
  redis.call('ZREM', lanes, lease)
  if redis.call('ZCARD', lanes) >= tonumber(ARGV[4 + 2*i]) then busy = true end
  local next_at = tonumber(redis.call('GET', next_key) or '0')
  local hold = tonumber(redis.call('GET', hold_key) or '0')
  if next_at > send_at then send_at = next_at end
  if hold > send_at then send_at = hold end
  backoff[i] = tonumber(redis.call('GET', backoff_key) or '0')
  local backoff_left = redis.call('PTTL', backoff_key)
  if backoff_left < 0 then backoff_left = 0 end
  table.insert(answer, math.max(hold - now, 0))
  table.insert(answer, backoff[i])
  table.insert(answer, backoff_left * 1000)
end
if busy then
  answer[2] = math.max(send_at - now, min_retry)
  return answer
end
for i = 0, scopes - 1 do
  local lanes, next_key = KEYS[4*i+1], KEYS[4*i+2]
  local next_at = send_at + math.max(tonumber(ARGV[5 + 2*i]), backoff[i])
  redis.call('SET', next_key, string.format('%.0f', next_at), 'PX', math.ceil((next_at - now) / 1000) + 1)
  redis.call('ZADD', lanes, send_at + ttl, lease)
  redis.call('PEXPIRE', lanes, math.ceil((send_at + ttl - now) / 1000) + 1)
end
answer[1] = 1
answer[2] = send_at - now
return answer
"#;

/// Holds a scope until `now + ARGV[1]` µs unless it is held longer already.
const HOLD: &str = r#"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local until_at = now + tonumber(ARGV[1])
local known = tonumber(redis.call('GET', KEYS[1]) or '0')
if until_at > known then
  redis.call('SET', KEYS[1], string.format('%.0f', until_at), 'PX', math.ceil(tonumber(ARGV[1]) / 1000) + 1)
end
return 1
"#;

/// The shared facts of scopes in Redis, for a fleet of workers; see the
/// [module docs](super).
///
/// - **One round trip per admission**: a Lua script reserves a lane lease
///   and the send instant in every scope of a request at once (`EVALSHA`;
///   the script is loaded on a `NOSCRIPT` answer and asked again).
/// - **Redis's clock**: the script reads `TIME`, so workers on machines
///   whose clocks are skewed cannot jointly break a delay. A worker sleeps
///   the wait the answer gives, from when the answer arrives.
/// - **Keys** `PREFIX + scope + {":lanes", ":next", ":hold", ":backoff"}`,
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
pub struct RedisStore {
    client: redis::Client,
    connection: Arc<Mutex<Option<ConnectionManager>>>,
    prefix: Arc<str>,
    lease_ttl: Duration,
    call_timeout: Duration,
    scripts: Arc<Scripts>,
}

struct Scripts {
    reserve: Script,
    hold: Script,
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
                hold: Script::new(HOLD),
            }),
        })
    }

    /// The prefix of every key (default `tower-throttle:`): workers share
    /// scopes exactly when they use the same Redis and prefix.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into().into();
        self
    }

    /// How long a lease nobody releases keeps its lane (default 60 s). It
    /// must exceed the longest request: a lease that expires while its
    /// request is still in flight lets another request take the lane.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// The limit on each call to Redis, connecting included (default
    /// 500 ms). A call past it is a store failure.
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
fn grant_of(answer: &[i64], scopes: usize) -> Result<Grant, StoreError> {
    if answer.len() != 2 + 3 * scopes {
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
    let facts = answer[2..]
        .chunks_exact(3)
        .map(|facts| SharedFacts {
            hold: from_micros(facts[0]),
            backoff_delay: from_micros(facts[1]),
            backoff_remaining: from_micros(facts[2]),
        })
        .collect();
    Ok(Grant {
        answer: answer_kind,
        facts,
    })
}

impl ScopeStore for RedisStore {
    fn reserve(&self, reservation: Reservation) -> StoreFuture<Grant> {
        let keys: Vec<String> = reservation
            .scopes
            .iter()
            .flat_map(|terms| ["lanes", "next", "hold", "backoff"].map(|fact| self.key(&terms.scope, fact)))
            .collect();
        let lease = reservation.lease.to_string();
        let (lease_ttl, scopes) = (micros(self.lease_ttl), reservation.scopes.len());
        let terms: Vec<(u32, u64)> = reservation
            .scopes
            .iter()
            .map(|terms| (terms.concurrency, micros(terms.delay)))
            .collect();
        let grant = self.call("redis reservation", move |mut connection, scripts| async move {
            let mut invocation = scripts.reserve.prepare_invoke();
            invocation
                .key(keys)
                .arg(lease)
                .arg(lease_ttl)
                .arg(micros(MIN_RETRY));
            for (concurrency, delay) in terms {
                invocation.arg(concurrency).arg(delay);
            }
            invocation.invoke_async::<Vec<i64>>(&mut connection).await
        });
        Box::pin(async move { grant_of(&grant.await?, scopes) })
    }

    fn release(&self, lease: Lease) -> StoreFuture<()> {
        let keys: Vec<String> = lease
            .scopes
            .iter()
            .map(|scope| self.key(scope, "lanes"))
            .collect();
        let member = lease.id.to_string();
        self.call("redis release", move |mut connection, _| async move {
            let mut pipe = redis::pipe();
            for key in keys {
                pipe.zrem(key, &member).ignore();
            }
            pipe.query_async::<()>(&mut connection).await
        })
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
        let error = grant_of(&[1, 0, 0], 1).unwrap_err();
        assert_eq!(
            error.to_string(),
            "redis reservation answered 3 numbers for 1 scopes"
        );
    }

    #[test]
    fn answers_are_read_per_scope_in_order() {
        let grant = grant_of(&[0, 7_000, 1_000, 2_000, 3_000, 0, 0, 0], 2).unwrap();
        assert_eq!(
            grant.answer,
            Answer::Busy {
                retry_in: Duration::from_millis(7)
            }
        );
        assert_eq!(grant.facts[0].backoff_delay, Duration::from_millis(2));
        assert_eq!(grant.facts[1], SharedFacts::default());
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
