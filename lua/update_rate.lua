-- update_rate.lua: overwrite the config but keep the window (Redisson 4.4 updateRate
-- with keepState).
--
-- KEYS: 1 NAME, 2 {NAME}:value, 3 {NAME}:value:ID, 4 {NAME}:permits, 5 {NAME}:permits:ID
-- ARGV: 1 rate, 2 interval in ms, 3 type ("0" overall, "1" per_client),
--       4 keepAliveTime in ms, 5 now in epoch ms (empty: the server's clock)
-- Same mode: entries older than the new interval leave the log and
-- value = rate - (permits still in the window). The value may go below zero when the
-- window already holds more than the new rate: that debt keeps
-- value + permits in the log = rate, so the new rate is never exceeded.
-- A change of mode clears the new mode's state. Returns 1.

local rate, interval, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[5])
if ARGV[5] == '' then
  local t = redis.call('time')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local kinds = {}
for i = 1, 5 do
  kinds[i] = redis.call('type', KEYS[i]).ok
end
local expected = { 'hash', 'string', 'string', 'zset', 'zset' }
local roles = { 'config', 'value', 'client_value', 'permits', 'client_permits' }
for i = 1, 5 do
  if kinds[i] ~= expected[i] and kinds[i] ~= 'none' then
    error({ err = 'redlimit:wrong_type:1 ' .. roles[i] .. ' holds a ' .. kinds[i] })
  end
end

local old_kind = redis.call('hget', KEYS[1], 'type')
redis.call('hset', KEYS[1], 'rate', ARGV[1], 'interval', ARGV[2], 'type', ARGV[3], 'keepAliveTime', ARGV[4])
local vkey, pkey, prole = KEYS[2], KEYS[4], 'permits'
if ARGV[3] == '1' then
  vkey, pkey, prole = KEYS[3], KEYS[5], 'client_permits'
end
if old_kind ~= ARGV[3] then
  redis.call('del', vkey, pkey)
  return 1
end

local live = redis.call('zrangebyscore', pkey, '(' .. string.format('%d', now - interval), '+inf')
local total = 0
for _, member in ipairs(live) do
  local len = string.byte(member, 1)
  if len == nil or #member ~= len + 5 then
    error({ err = 'redlimit:bad_member:1 ' .. prole .. ' member of ' .. #member .. ' bytes does not decode' })
  end
  local a, b, c, d = string.byte(member, len + 2, len + 5)
  total = total + a + b * 256 + c * 65536 + d * 16777216
end
redis.call('zremrangebyscore', pkey, '-inf', string.format('%d', now - interval))
if redis.call('exists', vkey) == 1 or total > 0 then
  redis.call('set', vkey, string.format('%d', rate - total), 'keepttl')
end
return 1
