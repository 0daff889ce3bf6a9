-- refund_tokens.lua: give token buckets back what a call took when a later slot of the
-- same call refused (a cluster decides a call slot by slot). Only for grants the
-- caller saw: a token given back twice would be a token too many.
-- Recipe: lib/bucket.lua, refund_tokens.lua
-- Twin in Rust: runtime/src/backend/redis/layout.rs (its KEYS and ARGV: Redis only, as
--   in process a call is never decided slot by slot)
--
-- KEYS, per rule: rule i's key j is KEYS[1*(i-1)+j]:
--   1 bucket: the rule's bucket key (layout in lib/bucket.lua)
-- ARGV, per rule: rule i's argument j is ARGV[1*(i-1)+j]:
--   1 tokens: the tokens to give back, in the bucket's units (permits times the
--     interval in ms)
-- A cold bucket took more than that; it gets back the plain tokens only, and keeps the
-- coldness the grant took off: never more than the call took. A bucket with
-- reservations pending (its segments after "|", lib/bucket.lua) has the tokens given
-- back taken off every segment's room: the bucket held them from the grant on, and
-- what it had of room since is that much less.
-- Returns how many buckets were given tokens; a missing bucket is full already.

bucket_helpers()

local given = 0
for i = 1, #KEYS do
  local raw = redis.call('get', KEYS[i])
  -- (a stored text read_bucket refuses, or whose segments hold more than digits and
  -- their separators, gets nothing: read_bucket reads numbers exactly, and the rooms
  -- below are found by a pattern)
  local s = raw and read_bucket(raw)
  local bar = s and string.find(raw, '|', 1, true)
  local segments = bar and string.sub(raw, bar) or ''
  if s and string.find(segments, '^[|%d.,]*$') then
    local body = bar and string.sub(raw, 1, bar - 1) or raw
    local rate, interval, burst, _, rest = string.match(body, '^(%d+):(%d+):(%d+):(%-?%d+)(:[%d:]+)$')
    local back = tonumber(ARGV[i])
    local units = math.min(s.burst * s.interval, s.units + back)
    -- (each segment's room, the number after its time)
    segments = string.gsub(segments, '([|,])(%d+)%.(%d+)', function(mark, at, room)
      return mark .. at .. '.' .. string.format('%d', math.max(tonumber(room) - back, 0))
    end)
    redis.call('set', KEYS[i], rate .. ':' .. interval .. ':' .. burst .. ':' .. string.format('%d', units)
      .. rest .. segments, 'keepttl')
    given = given + 1
  end
end
return given
