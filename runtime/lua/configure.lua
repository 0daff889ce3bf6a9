-- configure.lua: write a limiter's config (Redisson's setRate, and 4.4's setRate and
-- updateRate with RateLimiterArgs).
-- Recipe: lib/clock.lua, lib/member.lua, lib/ttl_rule.lua, lib/limiter.lua, configure.lua
-- Twin in Rust: runtime/src/backend/memory/manage.rs (configure)
--
-- KEYS:
--   1 config: NAME, the config hash (rate, interval, type, keepAliveTime)
--   2 value: {NAME}:value, available permits, mode overall
--   3 client_value: {NAME}:value:ID, available permits, mode per_client
--   4 permits: {NAME}:permits, grant log, mode overall
--   5 client_permits: {NAME}:permits:ID, grant log, mode per_client
-- ARGV:
--   1 rate: the rate
--   2 interval: in ms
--   3 type: "0" overall, "1" per_client
--   4 keep_alive: keepAliveTime in ms ("0": none)
--   5 now: epoch ms (empty: the server's clock)
--   6 keep_window: "1" keeps the window, "0" restarts it
--   7 require_exists: "1" requires an existing config
-- Returns 0 when ARGV[7] is "1" and NAME does not exist (nothing is written), else 1.
--
-- The config fields are overwritten, and NAME's TTL set to keepAliveTime when > 0. A
-- keepAliveTime removed takes its TTLs with it (NAME's, and the kept window's), as
-- keep_alive.lua's 0 does: left, they would expire a limiter that no longer has one,
-- and its window with it (Redisson leaves them).
-- A change of mode deletes both modes' value and log (KEYS 2 to 5). Otherwise a
-- restart deletes the mode's value and log; keeping the window drops the entries that
-- left the new window and sets value = rate - (permits still in the window). The value
-- goes below zero when the window holds more than a lowered rate: that debt keeps
-- value + permits in the log = rate, so the new rate is never exceeded while old
-- grants leave (Redisson clamps it at 0 instead, which lets the window exceed the new
-- rate). Then the TTL rule of an acquire applies to the three keys.
-- NAME must be missing or a limiter's config (lib/limiter.lua): any other key is another
-- program's, and nothing is written. Keys that are read must hold their type; so must
-- the state keys of a limiter that does not exist yet, while a restart of an existing
-- one deletes them whatever they hold (it repairs corrupted state).

local function check_type(key, expected, role)
  local kind = redis.call('type', key).ok
  if kind ~= expected and kind ~= 'none' then
    error('redlimit:wrong_type:1 ' .. role .. ' holds a ' .. kind, 0)
  end
  return kind
end

local exists = limiter_config(KEYS[1])
if not exists and ARGV[7] == '1' then
  return 0
end
-- A new limiter: the keys named after it are missing or of a limiter's types, else
-- they are another program's and nothing is written (a restart of an existing
-- limiter deletes them whatever they hold: that repairs it).
if not exists then
  for i, role in ipairs({ 'value', 'client_value', 'permits', 'client_permits' }) do
    local kind = redis.call('type', KEYS[i + 1]).ok
    local expected = i <= 2 and 'string' or 'zset'
    if kind ~= expected and kind ~= 'none' then
      error('redlimit:not_limiter:1 ' .. role .. ' holds a ' .. kind, 0)
    end
  end
end

local rate, interval, keep = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
local now = clock(ARGV[5])
local old_kind = redis.call('hget', KEYS[1], 'type')
local kept_alive = (tonumber(redis.call('hget', KEYS[1], 'keepAliveTime') or '0') or 0) > 0
local mode_changed = old_kind ~= false and old_kind ~= ARGV[3]
local vkey, pkey, prole = KEYS[2], KEYS[4], 'permits'
if ARGV[3] == '1' then
  vkey, pkey, prole = KEYS[3], KEYS[5], 'client_permits'
end
local keep_state = ARGV[6] == '1' and not mode_changed

-- Keeping the window reads it: every check before the first write, so an error
-- leaves the limiter as it was.
local total = 0
if keep_state then
  check_type(vkey, 'string', prole == 'permits' and 'value' or 'client_value')
  check_type(pkey, 'zset', prole)
  local live = redis.call('zrangebyscore', pkey, '(' .. string.format('%d', now - interval), '+inf')
  for _, member in ipairs(live) do
    total = total + decode_member(member, prole)
  end
end

redis.call('hset', KEYS[1], 'rate', ARGV[1], 'interval', ARGV[2], 'type', ARGV[3], 'keepAliveTime', ARGV[4])
if keep > 0 then
  redis.call('pexpire', KEYS[1], ARGV[4])
elseif kept_alive then
  redis.call('persist', KEYS[1])
end
if mode_changed then
  redis.call('del', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
  return 1
end
if not keep_state then
  redis.call('del', vkey, pkey)
  return 1
end
redis.call('zremrangebyscore', pkey, '-inf', string.format('%d', now - interval))
if redis.call('exists', vkey) == 1 or total > 0 then
  redis.call('set', vkey, string.format('%d', rate - total), 'keepttl')
end
ttl_rule(KEYS[1], vkey, pkey, ARGV[4], interval)
if keep == 0 and kept_alive then
  redis.call('persist', vkey)
  redis.call('persist', pkey)
end
return 1
