-- reset.lua: delete a limiter's keys (RateLimiter::delete, TokenBucket::delete,
-- `redlimit reset`), only when each one holds what a limiter keeps there.
-- Recipe: lib/limiter.lua, lib/bucket.lua, reset.lua
-- Twin in Rust: runtime/src/backend/memory/manage.rs (delete, delete_bucket)
--
-- KEYS, per rule: rule i's key j is KEYS[1*(i-1)+j]:
--   1 key: a key to delete (a limiter's keys share one cluster slot)
-- ARGV, per rule: rule i's argument j is ARGV[1*(i-1)+j]:
--   1 role: the key's: 'config' (a hash with rate, interval and type), 'value' (a
--       string holding an integer), 'permits' (a sorted set), 'bucket' (a string
--       holding a token bucket's state)
-- Returns the number of keys deleted or, when a key holds something else, { its
-- index, what it holds }, having deleted nothing. Each key is looked at once; a
-- log's members are not read.

bucket_helpers()
for i, key in ipairs(KEYS) do
  local role = ARGV[i]
  local found
  if role == 'config' then
    found = config_problem(key)
  else
    local kind = redis.call('type', key).ok
    if kind == 'none' then
      found = nil
    elseif role == 'permits' then
      if kind ~= 'zset' then found = 'holds a ' .. kind end
    elseif kind ~= 'string' then
      found = 'holds a ' .. kind
    elseif role == 'value' then
      if not string.match(redis.call('get', key), '^%-?%d+$') then
        found = 'holds a string that is not an integer'
      end
    elseif read_bucket(redis.call('get', key)) == nil then
      found = "holds a string that is not a token bucket's state"
    end
  end
  if found then
    return { i, found }
  end
end
local deleted = 0
for first = 1, #KEYS, 1000 do
  deleted = deleted + redis.call('del', unpack(KEYS, first, math.min(first + 999, #KEYS)))
end
return deleted
