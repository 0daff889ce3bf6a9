-- try_set_rate.lua: write the config fields that are missing (Redisson's trySetRate).
--
-- KEYS: 1 NAME (config hash)
-- ARGV: 1 rate, 2 interval in ms, 3 type ("0" overall, "1" per_client), 4 keepAliveTime in ms
-- Returns 1 when `type` was newly written (the config took effect), else 0. A config
-- that took effect with a keepAliveTime gets it as its TTL at once, so a limiter that
-- is configured but never used still expires (as Redisson 4.4+).

local kind = redis.pcall('type', KEYS[1])
if kind.ok ~= 'hash' and kind.ok ~= 'none' then
  error('redlimit:wrong_type:1 config holds a ' .. kind.ok, 0)
end
redis.call('hsetnx', KEYS[1], 'rate', ARGV[1])
redis.call('hsetnx', KEYS[1], 'interval', ARGV[2])
local written = redis.call('hsetnx', KEYS[1], 'type', ARGV[3])
redis.call('hsetnx', KEYS[1], 'keepAliveTime', ARGV[4])
if written == 1 and tonumber(ARGV[4]) > 0 then
  redis.call('pexpire', KEYS[1], ARGV[4])
end
return written
