-- give_back.lua: give a batch's unused permits back to its limiter, keeping value +
-- permits in the log = rate.
-- Recipe: lib/member.lua, give_back.lua
-- Twin in Rust: runtime/src/backend/redis/layout.rs (its KEYS and ARGV: Redis only, as
--   batches are taken from Redis only)
--
-- KEYS:
--   1 config: NAME, the config hash (rate, interval, type, keepAliveTime)
--   2 value: {NAME}:value, available permits, mode overall
--   3 client_value: {NAME}:value:ID, available permits, mode per_client
--   4 permits: {NAME}:permits, grant log, mode overall
--   5 client_permits: {NAME}:permits:ID, grant log, mode per_client
-- ARGV:
--   1 member: the log member the batch was taken under (its id, and the permits taken)
--   2 used: the permits of the batch that were used, from 0 to the permits taken
-- Returns the permits given back: 0 when every permit was used, or when the member is
-- in neither log (its window is over, or the limiter was deleted or changed).
--
-- A client that takes a batch of permits in one grant (a rule's `batch`) serves them
-- itself for a short lease, then gives back here what it did not use. Only the batch's
-- own member changes: it is replaced by a member of the same id holding the permits
-- used, at the same score (or removed when none were), and the unused permits are
-- added to the value, never above the rate. release.lua takes permits out of the
-- newest grants instead, which belong to later calls that did use them: the windows
-- after would then count fewer grants than were made. The layout is Redisson's: a
-- member of the log still holds `struct.pack('Bc0I', len, id, permits)`.

local member = ARGV[1]
local taken, len = decode_member(member, 'permits')
local used = tonumber(ARGV[2])
if used == nil or used < 0 or used > taken or used ~= math.floor(used) then
  error('redlimit:bad_argument:1 used ' .. tostring(ARGV[2]) .. ' of ' .. taken, 0)
end
if used == taken then
  return 0
end
-- (a config or a count that is not one this library writes, or past 2^53 read as
-- text before a double rounds it, is left as it is: the next call refuses it, or
-- rebuilds a count from the log)
local function exact(text)
  return type(text) == 'string' and string.find(text, '^%-?%d+$') and #text <= 16
    and (#text < 16 or text <= '9007199254740992') and tonumber(text)
end
local rate = exact(redis.pcall('hget', KEYS[1], 'rate'))
if not rate or rate < 1 then
  return 0
end

for mode = 0, 1 do
  local vkey, pkey = KEYS[2 + mode], KEYS[4 + mode]
  local score = false
  if redis.call('type', pkey).ok == 'zset' then
    score = redis.call('zscore', pkey, member)
  end
  if score then
    -- The kept member first: removing the batch's own while it is the log's only one
    -- would delete the key, and the member added after would make it again without
    -- its expiry.
    if used > 0 then
      local kept = string.sub(member, 1, len + 1)
        .. string.char(used % 256, math.floor(used / 256) % 256, math.floor(used / 65536) % 256,
          math.floor(used / 16777216) % 256)
      redis.call('zadd', pkey, score, kept)
    end
    redis.call('zrem', pkey, member)
    local unused = taken - used
    if redis.call('type', vkey).ok == 'string' then
      local value = exact(redis.call('get', vkey))
      -- (above the rate, a value inflated by hand, left for the next call to rebuild)
      if value and value <= rate then
        value = value + unused
        if value > rate then
          value = rate
        end
        redis.call('set', vkey, string.format('%d', value), 'keepttl')
      end
    end
    return unused
  end
end
return 0
