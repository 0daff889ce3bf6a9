-- try_set_rate.lua: write the config fields that are missing (Redisson's trySetRate).
-- Recipe: lib/limiter.lua, try_set_rate.lua
-- Twin in Rust: runtime/src/backend/memory/manage.rs (try_set_rate)
--
-- KEYS:
--   1 config: NAME, the config hash
--   2 value: {NAME}:value
--   3 client_value: {NAME}:value:ID
--   4 permits: {NAME}:permits
--   5 client_permits: {NAME}:permits:ID
-- Only the config is read: the other keys are there as every script on a limiter
-- takes them.
-- ARGV:
--   1 rate: the rate
--   2 interval: in ms
--   3 type: "0" overall, "1" per_client
--   4 keep_alive: keepAliveTime in ms
-- Returns 1 when `type` was newly written (the config took effect), else 0. A config
-- that took effect with a keepAliveTime gets it as its TTL at once, so a limiter that
-- is configured but never used still expires (as Redisson 4.4+). NAME must be missing
-- or a limiter's config: any other key is another program's, and nothing is written.

limiter_config(KEYS[1])
redis.call('hsetnx', KEYS[1], 'rate', ARGV[1])
redis.call('hsetnx', KEYS[1], 'interval', ARGV[2])
local written = redis.call('hsetnx', KEYS[1], 'type', ARGV[3])
redis.call('hsetnx', KEYS[1], 'keepAliveTime', ARGV[4])
if written == 1 and tonumber(ARGV[4]) > 0 then
  redis.call('pexpire', KEYS[1], ARGV[4])
end
return written
