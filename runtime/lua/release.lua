-- release.lua: give permits back to a limiter (Redisson 3.52's release), keeping
-- value + permits in the log = rate.
-- Recipe: lib/quote.lua, lib/clock.lua, lib/member.lua, lib/ttl_rule.lua, lib/stored_config.lua, release.lua
-- Twin in Rust: runtime/src/backend/memory/manage.rs (release)
--
-- KEYS:
--   1 config: NAME, the config hash (rate, interval, type, keepAliveTime)
--   2 value: {NAME}:value, available permits, mode overall
--   3 client_value: {NAME}:value:ID, available permits, mode per_client
--   4 permits: {NAME}:permits, grant log, mode overall
--   5 client_permits: {NAME}:permits:ID, grant log, mode per_client
-- ARGV:
--   1 permits: the permits given back (>= 1)
--   2 now: epoch ms (empty: the server's clock)
-- Returns the permits available afterwards.
--
-- Redisson sets value = min(rate, value + permits) and leaves the log alone, so once
-- the log's grants leave the window they are counted back a second time: the limiter
-- then grants more than its rate for as long as its log stays busy. Here the permits
-- given back are taken out of the newest grants in the log (the ones a caller most
-- likely did not use) before they are added to the value: the window then holds what
-- it would have, had those grants not been made, and value + log = rate still holds.
-- With that sum intact the value is min(rate, value + permits), as Redisson's.

local cfg = redis.pcall('hmget', KEYS[1], 'rate', 'interval', 'type', 'keepAliveTime')
if type(cfg) == 'table' and cfg.err then
  error('redlimit:wrong_type:1 config ' .. cfg.err, 0)
end
if cfg[1] == false or cfg[2] == false or cfg[3] == false then
  error('redlimit:not_initialized:1 RateLimiter is not initialized', 0)
end
check_config(1, cfg)
local rate, interval = tonumber(cfg[1]), tonumber(cfg[2])
local now = clock(ARGV[2])
local vkey, pkey, vrole, prole = KEYS[2], KEYS[4], 'value', 'permits'
if cfg[3] == '1' then
  vkey, pkey, vrole, prole = KEYS[3], KEYS[5], 'client_value', 'client_permits'
end
for _, pair in ipairs({ { vkey, 'string', vrole }, { pkey, 'zset', prole } }) do
  local kind = redis.call('type', pair[1]).ok
  if kind ~= pair[2] and kind ~= 'none' then
    error('redlimit:wrong_type:1 ' .. pair[3] .. ' holds a ' .. kind, 0)
  end
end

local function permits_of(member)
  return decode_member(member, prole)
end

-- The window as an acquire would see it: released entries out, the value rebuilt
-- from the log when missing or inflated. What is read is checked before the first
-- write, so an error leaves the limiter as it was. The work is the entries that left
-- the window (each read once, when it leaves) and those the permits are taken from;
-- the whole log is read only to repair a missing or inflated value.
local cutoff = now - interval
local gone = redis.call('zrangebyscore', pkey, '-inf', string.format('%d', cutoff))
local released, stale = 0, #gone
for j = 1, #gone do
  released = released + permits_of(gone[j])
end
local function live_permits()
  local live = 0
  for _, member in ipairs(redis.call('zrange', pkey, stale, -1)) do
    live = live + permits_of(member)
  end
  return live
end
local raw = redis.call('get', vkey)
local value
if raw == false then
  value = rate - live_permits()
else
  value = tonumber(raw)
  if value == nil or not string.match(raw, '^%-?%d+$') then
    error('redlimit:bad_value:1 ' .. vrole .. ' ' .. quoted(tostring(raw)), 0)
  end
  -- (a count past 2^53, read as text before a double rounds it: above any rate)
  if #raw > 16 or (#raw == 16 and raw > '9007199254740992') then value = math.huge end
  value = value + released
  if value > rate then
    value = rate - live_permits()
  end
end
-- The newest grants the permits are taken from, read and checked before any write:
-- as many as may hold them, then more while they hold too few. A member of 0 permits
-- (Redisson's tryAcquire(0) logs one) holds none: it is passed, and removed with the
-- grants taken from, so that each is read once. A count past 2^53 reads as 2^53 (no
-- log holds as many entries; a range of more would reach Redis as a float's text).
if not string.find(ARGV[1], '^[1-9]%d*$') then
  error('redlimit:bad_argument:1 permits ' .. ARGV[1], 0)
end
local left = tonumber(ARGV[1])
if left > 9007199254740992 then left = 9007199254740992 end
local log, held, start = {}, 0, 0
while held < left do
  local want = left - held
  local page = redis.call('zrevrange', pkey, start, start + want - 1, 'withscores')
  for j = 1, #page, 2 do
    if tonumber(page[j + 1]) <= cutoff then
      page = {}
      break
    end
    local permits, len = permits_of(page[j])
    log[#log + 1] = { page[j], page[j + 1], permits, len }
    held = held + permits
  end
  if #page < 2 * want then break end
  start = start + want
end
if stale > 0 then
  redis.call('zremrangebyrank', pkey, 0, stale - 1)
end

local taken = 0
for _, entry in ipairs(log) do
  if left <= 0 then break end
  local member, score, permits, len = entry[1], entry[2], entry[3], entry[4]
  if permits > left then
    -- the shrunk member first: removing the log's only member first would delete the
    -- key, and the member added after would make it again without its expiry
    local rest = permits - left
    local shrunk = string.sub(member, 1, len + 1)
      .. string.char(rest % 256, math.floor(rest / 256) % 256, math.floor(rest / 65536) % 256,
        math.floor(rest / 16777216) % 256)
    redis.call('zadd', pkey, score, shrunk)
    permits = left
  end
  redis.call('zrem', pkey, member)
  taken = taken + permits
  left = left - permits
end
value = value + taken
if value > rate then
  value = rate
end
redis.call('set', vkey, string.format('%d', value), 'keepttl')

-- (the expiry written as Redis reads one: `060000` is not one)
ttl_rule(KEYS[1], vkey, pkey, string.format('%d', tonumber(cfg[4] or '0')), interval)
return value
