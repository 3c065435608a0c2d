//! The Lua scripts [`RedisStore`](super::RedisStore) runs: each reads and
//! writes a request's scopes' keys in one call, on Redis's clock.

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

/// One step up of a scope's fleet backoff (`KEYS[1]`, a hash of the level
/// `l`, the delay `d` and the instant `t` (µs) its last step left, with the
/// window `w`, factor `f` and smallest delay `m`): from the backoff in force
/// now, one level more and the delay (or the base delay, `ARGV[1]`) times
/// the factor (`ARGV[2]`) within the smallest and largest delays (`ARGV[3]`,
/// `ARGV[4]`), the window `ARGV[5]`. `BackoffStep::step` in Lua. Kept until it
/// would have stepped all the way back. Answers `{level, delay}`.
pub(super) const STEP_BACKOFF: &str = concat!(
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
pub(super) const RESERVE: &str = concat!(
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
pub(super) const RELEASE: &str = r#"
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
pub(super) const HOLD: &str = r#"
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
pub(super) const LEARNT: &str = r#"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local known = redis.call('HMGET', KEYS[1], 'v', 's', 't')
if not known[1] then return false end
return {tonumber(known[1]), known[2], math.max(now - tonumber(known[3]), 0)}
"#;

/// Replaces what the fleet learnt of a scope if its version is still
/// `ARGV[1]`: the new version, or 0 when another worker wrote first.
pub(super) const SWAP_LEARNT: &str = r#"
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
/// (`KEYS[1]`, µs), as `AutoThrottleSample::next_delay` applies it: ARGV is
/// the latency, the status, the configured delay, the start delay, the
/// largest delay (µs), the target concurrency and the key's TTL (µs).
/// Answers the new delay.
pub(super) const AUTOTHROTTLE: &str = r#"
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

pub(super) const RENEW: &str = r#"
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
