-- expire.lua: set one TTL on all five keys of a limiter (Redisson's expire).
-- Recipe: lib/limiter.lua, lib/guard.lua, expire.lua
-- Twin in Rust: runtime/src/backend/memory/manage.rs (expire)
--
-- KEYS:
--   1 config: NAME, the config hash (rate, interval, type, keepAliveTime)
--   2 value: {NAME}:value, available permits, mode overall
--   3 client_value: {NAME}:value:ID, available permits, mode per_client
--   4 permits: {NAME}:permits, grant log, mode overall
--   5 client_permits: {NAME}:permits:ID, grant log, mode per_client
-- ARGV:
--   1 ttl: the TTL in ms
-- Returns 1 when the config key exists and got the TTL, else 0.

local set = redis.call('pexpire', KEYS[1], ARGV[1])
for i = 2, 5 do
  redis.call('pexpire', KEYS[i], ARGV[1])
end
return set
