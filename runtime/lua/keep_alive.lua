-- keep_alive.lua: set keepAliveTime on an initialized limiter and apply it now.
-- Recipe: lib/limiter.lua, lib/guard.lua, lib/quote.lua, lib/stored_config.lua, keep_alive.lua
-- Twin in Rust: runtime/src/backend/memory/manage.rs (keep_alive)
--
-- KEYS:
--   1 config: NAME, the config hash (rate, interval, type, keepAliveTime)
--   2 value: {NAME}:value, available permits, mode overall
--   3 client_value: {NAME}:value:ID, available permits, mode per_client
--   4 permits: {NAME}:permits, grant log, mode overall
--   5 client_permits: {NAME}:permits:ID, grant log, mode per_client
-- ARGV:
--   1 keep_alive: keepAliveTime in ms (0 removes it and the TTLs it set)
-- Returns 1. A keepAliveTime shorter than the interval is refused, as Redisson does:
-- the keys could expire while grants are still in the window. A stored config that
-- does not pass lib/stored_config.lua's check is refused before anything is written.

local cfg = redis.pcall('hmget', KEYS[1], 'rate', 'interval', 'type', 'keepAliveTime')
if type(cfg) == 'table' and cfg.err then
  error('redlimit:wrong_type:1 config ' .. cfg.err, 0)
end
local kind = cfg[3]
if kind == false then
  error('redlimit:not_initialized:1 RateLimiter is not initialized', 0)
end
check_config(1, cfg)
local keep_ms = tonumber(ARGV[1])
if keep_ms > 0 and keep_ms < (tonumber(cfg[2]) or 0) then
  error('redlimit:keep_alive_short:1 ' .. cfg[2], 0)
end
local vkey, pkey = KEYS[2], KEYS[4]
if kind == '1' then
  vkey, pkey = KEYS[3], KEYS[5]
end
redis.call('hset', KEYS[1], 'keepAliveTime', ARGV[1])
local keep = tonumber(ARGV[1])
for _, key in ipairs({ KEYS[1], vkey, pkey }) do
  if keep > 0 then
    redis.call('pexpire', key, keep)
  else
    redis.call('persist', key)
  end
end
return 1
