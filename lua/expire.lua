-- expire.lua: set one TTL on all five keys of a limiter (Redisson's expire).
--
-- KEYS: 1 NAME, 2 {NAME}:value, 3 {NAME}:value:ID, 4 {NAME}:permits, 5 {NAME}:permits:ID
-- ARGV: 1 TTL in ms
-- Returns 1 when the config key exists and got the TTL, else 0.

local set = redis.call('pexpire', KEYS[1], ARGV[1])
for i = 2, 5 do
  redis.call('pexpire', KEYS[i], ARGV[1])
end
return set
