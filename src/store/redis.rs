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

/// The backoff in force `quiet` µs after a step left `level` and `delay`
/// (µs), with the window, factor and smallest delay: the level, the delay
/// and the time to the next step back, or nothing once stepped all the way
/// back. `BackoffStep::recovered` in Lua.
macro_rules! recovered_lua {
    () => {
        r#"
local function recovered(level, delay, quiet, window, factor, min_delay)
  local back = math.floor(quiet / window)
  if back >= level then return nil end
  local d = delay / (factor ^ back)
  if d < min_delay then return nil end
  return level - back, d, window * (back + 1) - quiet
end
"#
    };
}

/// One step up of a scope's fleet backoff (KEYS[1], a hash of the level
/// `l`, the delay `d` and the instant `t` (µs) its last step left, with the
/// window `w`, factor `f` and smallest delay `m`): from the backoff in force
/// now, one level more and the delay (or the base delay, ARGV[1]) times
/// the factor (ARGV[2]) within the smallest and largest delays (ARGV[3],
/// ARGV[4]), the window ARGV[5]. `BackoffStep::step` in Lua. Kept until it
/// would have stepped all the way back. Answers `{level, delay}`.
const STEP_BACKOFF: &str = concat!(
    recovered_lua!(),
    r#"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local base, factor = tonumber(ARGV[1]), tonumber(ARGV[2])
local min_delay, max_delay, window = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local level, delay = 0, base
local known = redis.call('HMGET', KEYS[1], 'l', 'd', 't')
if known[1] then
  local l, d = recovered(tonumber(known[1]), tonumber(known[2]), now - tonumber(known[3]), window, factor, min_delay)
  if l then level, delay = l, d end
end
level = level + 1
delay = math.min(math.max(delay * factor, min_delay), max_delay)
redis.call('HSET', KEYS[1], 'l', level, 'd', string.format('%.0f', delay), 't', string.format('%.0f', now),
  'w', string.format('%.0f', window), 'f', tostring(factor), 'm', string.format('%.0f', min_delay))
redis.call('PEXPIRE', KEYS[1], math.ceil(window * level / 1000) + 1)
return {level, math.floor(delay + 0.5)}
"#
);

/// One reservation over every scope of a request, atomic because Redis runs
/// a script alone. Times are microseconds of Redis's own clock (`TIME`), so
/// workers whose clocks disagree still agree on the gaps. Per scope, KEYS
/// are its lanes (a sorted set of leases scored by expiry), next send
/// instant, hold-until, backoff delay, quota spent (expiring with its
/// window), the lease of a worker's first request in flight (which the
/// other reservations wait for), what the fleet learnt, and the line of
/// waiters (a sorted set of waiters scored by ticket, and one scored by
/// when each place expires), the fleet's AutoThrottle delay and the
/// fleet's backoff level (a hash, see `STEP_BACKOFF`); ARGV is the lease, the lease TTL, the
/// shortest retry, the waiter, the line grace, then each scope's
/// concurrency, delay, quota (-1: none), window, cost and first-request
/// flag (1: this is one). A waiter's ticket is Redis's now when it first
/// joins a line, kept while it has a place. Answers `{granted (0/1), wait
/// or retry (µs), Redis's now (µs), then per scope: hold left (µs),
/// backoff delay (µs), backoff left (µs), learnt version, the fleet's
/// AutoThrottle delay (µs, -1: none), the fleet's backoff level}`; with a
/// level in force, the backoff delay and time left are the level's (its
/// delay stepped back by the quiet windows, and the time to the next step
/// back). Every key it writes expires, so an
/// idle scope leaves nothing behind.
const RESERVE: &str = concat!(
    recovered_lua!(),
    r#"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local lease, ttl, min_retry = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local waiter, grace = ARGV[4], tonumber(ARGV[5])
local scopes = #KEYS / 11
local send_at, busy, quota_wait, first_wait = now, false, 0, 0
local answer = {0, 0, now}
local backoff, refused = {}, {}
-- The lines: expired places go; a waiter in line keeps its ticket.
local ticket = false
for i = 0, scopes - 1 do
  local line, line_until = KEYS[11*i+8], KEYS[11*i+9]
  local gone = redis.call('ZRANGEBYSCORE', line_until, '-inf', now)
  if #gone > 0 then
    redis.call('ZREM', line, unpack(gone))
    redis.call('ZREM', line_until, unpack(gone))
  end
  local held = redis.call('ZSCORE', line, waiter)
  if held and (not ticket or tonumber(held) < ticket) then ticket = tonumber(held) end
end
for i = 0, scopes - 1 do
  local lanes, next_key, hold_key, backoff_key, quota_key, first_key, learnt_key, line =
    KEYS[11*i+1], KEYS[11*i+2], KEYS[11*i+3], KEYS[11*i+4], KEYS[11*i+5], KEYS[11*i+6], KEYS[11*i+7], KEYS[11*i+8]
  local base = 6 + 6*i
  redis.call('ZREMRANGEBYSCORE', lanes, '-inf', now)
  redis.call('ZREM', lanes, lease)
  local free = tonumber(ARGV[base]) - redis.call('ZCARD', lanes)
  local ahead
  if ticket then
    ahead = redis.call('ZCOUNT', line, '-inf', '(' .. string.format('%.0f', ticket))
  else
    ahead = redis.call('ZCARD', line)
  end
  if free <= ahead then
    busy = true
    refused[i] = true
  end
  local first = redis.call('GET', first_key)
  if first and first ~= lease then
    busy = true
    if tonumber(ARGV[base + 1]) > first_wait then first_wait = tonumber(ARGV[base + 1]) end
  end
  local quota, cost = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 4])
  if quota >= 0 then
    local spent = tonumber(redis.call('GET', quota_key) or '0')
    if spent > 0 and spent + cost > quota * (1 + 1e-9) then
      busy = true
      local left = redis.call('PTTL', quota_key)
      if left * 1000 > quota_wait then quota_wait = left * 1000 end
    end
  end
  local next_at = tonumber(redis.call('GET', next_key) or '0')
  local hold = tonumber(redis.call('GET', hold_key) or '0')
  if next_at > send_at then send_at = next_at end
  if hold > send_at then send_at = hold end
  backoff[i] = tonumber(redis.call('GET', backoff_key) or '0')
  local backoff_left = redis.call('PTTL', backoff_key)
  if backoff_left < 0 then backoff_left = 0 end
  backoff_left = backoff_left * 1000
  -- The fleet's backoff level, stepped back by the quiet windows since.
  local level = 0
  local stepped = redis.call('HMGET', KEYS[11*i+11], 'l', 'd', 't', 'w', 'f', 'm')
  if stepped[1] then
    local l, d, left = recovered(tonumber(stepped[1]), tonumber(stepped[2]), now - tonumber(stepped[3]),
      tonumber(stepped[4]), tonumber(stepped[5]), tonumber(stepped[6]))
    if l then level, backoff[i], backoff_left = l, d, left end
  end
  table.insert(answer, math.max(hold - now, 0))
  table.insert(answer, math.floor(backoff[i] + 0.5))
  table.insert(answer, math.floor(backoff_left + 0.5))
  table.insert(answer, tonumber(redis.call('HGET', learnt_key, 'v') or '0'))
  table.insert(answer, tonumber(redis.call('GET', KEYS[11*i+10]) or '-1'))
  table.insert(answer, level)
end
if busy then
  local retry = math.max(send_at - now, quota_wait, first_wait, min_retry)
  answer[2] = retry
  if not ticket then ticket = now end
  local keep = math.ceil((retry + grace) / 1000) + 1
  for i = 0, scopes - 1 do
    if refused[i] then
      local line, line_until = KEYS[11*i+8], KEYS[11*i+9]
      redis.call('ZADD', line, string.format('%.0f', ticket), waiter)
      redis.call('ZADD', line_until, string.format('%.0f', now + retry + grace), waiter)
      if redis.call('PTTL', line) < keep then
        redis.call('PEXPIRE', line, keep)
        redis.call('PEXPIRE', line_until, keep)
      end
    end
  end
  return answer
end
for i = 0, scopes - 1 do
  local lanes, next_key, quota_key, first_key = KEYS[11*i+1], KEYS[11*i+2], KEYS[11*i+5], KEYS[11*i+6]
  local base = 6 + 6*i
  redis.call('ZREM', KEYS[11*i+8], waiter)
  redis.call('ZREM', KEYS[11*i+9], waiter)
  local next_at = send_at + math.max(tonumber(ARGV[base + 1]), backoff[i])
  redis.call('SET', next_key, string.format('%.0f', next_at), 'PX', math.ceil((next_at - now) / 1000) + 1)
  redis.call('ZADD', lanes, send_at + ttl, lease)
  redis.call('PEXPIRE', lanes, math.ceil((send_at + ttl - now) / 1000) + 1)
  if tonumber(ARGV[base + 2]) >= 0 then
    local fresh = redis.call('EXISTS', quota_key) == 0
    redis.call('INCRBYFLOAT', quota_key, ARGV[base + 4])
    if fresh then redis.call('PEXPIRE', quota_key, math.max(math.ceil(tonumber(ARGV[base + 3]) / 1000), 1)) end
  end
  if ARGV[base + 5] == '1' then
    redis.call('SET', first_key, lease, 'PX', math.ceil((send_at + ttl - now) / 1000) + 1)
  end
end
answer[1] = 1
answer[2] = send_at - now
return answer
"#
);

/// Gives a lease back. Per scope, KEYS are its lanes, next send instant and
/// first-request lease; ARGV is the lease, then per scope the shortest time
/// (µs) from Redis's now to the scope's next send (0: nothing to add).
const RELEASE: &str = r#"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local lease = ARGV[1]
for i = 0, #KEYS / 3 - 1 do
  local lanes, next_key, first_key = KEYS[3*i+1], KEYS[3*i+2], KEYS[3*i+3]
  redis.call('ZREM', lanes, lease)
  if redis.call('GET', first_key) == lease then redis.call('DEL', first_key) end
  local after = tonumber(ARGV[i + 2])
  if after > 0 then
    local next_at = now + after
    if next_at > tonumber(redis.call('GET', next_key) or '0') then
      redis.call('SET', next_key, string.format('%.0f', next_at), 'PX', math.ceil(after / 1000) + 1)
    end
  end
end
return 1
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

/// Renews leases: per (lease, scope) pair, KEYS are the scope's lanes and
/// first-request lease, ARGV the lease TTL (µs) then each pair's lease. A
/// lease still in the lanes gets the expiry now + TTL (never earlier than
/// it had); one given back or expired is not added again (`XX`).
/// What the fleet learnt of a scope: its version, state and age (µs), or
/// nothing.
const LEARNT: &str = r#"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local known = redis.call('HMGET', KEYS[1], 'v', 's', 't')
if not known[1] then return false end
return {tonumber(known[1]), known[2], math.max(now - tonumber(known[3]), 0)}
"#;

/// Replaces what the fleet learnt of a scope if its version is still
/// ARGV[1]: the new version, or 0 when another worker wrote first.
const SWAP_LEARNT: &str = r#"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local current = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if current ~= tonumber(ARGV[1]) then return 0 end
local next_version = current + 1
redis.call('HSET', KEYS[1], 'v', next_version, 's', ARGV[2], 't', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3]) / 1000) + 1)
return next_version
"#;

/// Scrapy's AutoThrottle rule applied to the fleet's delay of a scope
/// (KEYS[1], µs), as `AutoThrottleSample::next_delay` applies it: ARGV is
/// the latency, the status, the configured delay, the start delay, the
/// largest delay (µs), the target concurrency and the key's TTL (µs).
/// Answers the new delay.
const AUTOTHROTTLE: &str = r#"
local latency, status = tonumber(ARGV[1]), tonumber(ARGV[2])
local configured, start, largest = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local target_concurrency, keep = tonumber(ARGV[6]), tonumber(ARGV[7])
local old = tonumber(redis.call('GET', KEYS[1]) or ARGV[4])
local target = latency / target_concurrency
local new = math.max(target, (old + target) / 2)
local ceiling = math.max(largest, configured)
new = math.min(math.max(new, configured), ceiling)
if status ~= 200 and new <= old then new = old end
new = math.floor(new + 0.5)
redis.call('SET', KEYS[1], string.format('%.0f', new), 'PX', math.ceil(keep / 1000))
return new
"#;

const RENEW: &str = r#"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local ttl = tonumber(ARGV[1])
local expiry = now + ttl
for i = 0, #KEYS / 2 - 1 do
  local lanes, first_key, lease = KEYS[2*i+1], KEYS[2*i+2], ARGV[i + 2]
  local known = redis.call('ZSCORE', lanes, lease)
  if known and tonumber(known) > now and tonumber(known) < expiry then
    redis.call('ZADD', lanes, 'XX', expiry, lease)
    if redis.call('PTTL', lanes) < math.ceil(ttl / 1000) + 1 then
      redis.call('PEXPIRE', lanes, math.ceil(ttl / 1000) + 1)
    end
  end
  if redis.call('GET', first_key) == lease then
    redis.call('PEXPIRE', first_key, math.ceil(ttl / 1000) + 1)
  end
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
