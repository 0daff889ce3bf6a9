-- set_rate.lua: overwrite the config and restart the window (Redisson's setRate).
--
-- KEYS: 1 NAME, 2 {NAME}:value, 3 {NAME}:value:ID, 4 {NAME}:permits, 5 {NAME}:permits:ID
-- ARGV: 1 rate, 2 interval in ms, 3 type ("0" overall, "1" per_client), 4 keepAliveTime in ms
-- Deletes the value and log of the new mode for the calling client. Returns 1.

local kind = redis.pcall('type', KEYS[1])
if kind.ok ~= 'hash' and kind.ok ~= 'none' then
  error({ err = 'redlimit:wrong_type:1 config holds a ' .. kind.ok })
end
redis.call('hset', KEYS[1], 'rate', ARGV[1], 'interval', ARGV[2], 'type', ARGV[3], 'keepAliveTime', ARGV[4])
if ARGV[3] == '1' then
  redis.call('del', KEYS[3], KEYS[5])
else
  redis.call('del', KEYS[2], KEYS[4])
end
return 1
