-- settle.lua: settle the grants of a reservation with the amounts actually used: what
-- was not used goes back, what was used beyond the estimate is charged, even past the
-- limit (a debt later calls wait out).
-- Recipe: lib/clock.lua, lib/member.lua, lib/bucket.lua, settle.lua
-- Twin in Rust: runtime/src/backend/memory/settle.rs (settle_window, settle_tokens)
--
-- KEYS, per rule: rule i's key j is KEYS[5*(i-1)+j]:
--   1 config: NAME, the config hash (a sliding window's rate and interval)
--   2 value: {NAME}:value, or a token bucket's key in the rule's mode
--   3 client_value: {NAME}:value:ID, or a token bucket's settle mark
--   4 permits: {NAME}:permits
--   5 client_permits: {NAME}:permits:ID
-- ARGV:
--   1 now: the settle's time, epoch ms (the caller's clock, as the grant's), or empty
--     for Redis TIME (a client deciding at the server's time)
-- ARGV, per rule: rule i's argument j is ARGV[1+9*(i-1)+j]:
--   1 kind: "w" a sliding window, "b" a token bucket
--   2 member: the log member the grant was made under (a bucket's: its id names the
--     settle mark)
--   3 estimate: the permits the grant took
--   4 actual: the permits to count instead, from 0 to 4294967295
--   5 rate: a token bucket's rate (for a bucket missing, so full)
--   6 interval: a token bucket's interval in ms
--   7 burst: a token bucket's burst
--   8 warmup: a token bucket's warm-up in ms (0: none)
--   9 mark_ms: how long a token bucket's settle mark is kept: as long as the settle
--     may be sent again
-- Returns one integer per rule: 1 when it was settled (or the actual is the estimate),
-- 0 when there was nothing to settle (a window's grant no longer in its log or already
-- out of the window, a bucket's settle already made).
--
-- A sliding window's grant keeps its score: its member is replaced by one of the same
-- id holding the actual permits (removed when none were used), and the value moves by
-- the difference, up to the rate, below zero while the excess is owed. So the excess
-- counts from the grant's time and leaves the window with it, value + permits in the
-- log stays the rate, and a Redisson client reads the debt as a value below what it
-- asks. A token bucket is refilled to now, then gets back the tokens not used (up to
-- its burst) or pays the excess as taking it would (below zero, down to -2^52 units);
-- its settle mark, kept as long as the settle may be sent again, makes a settle sent
-- again a no-op.

local now = clock(ARGV[1])

local function bad(i, what)
  error('redlimit:bad_argument:' .. i .. ' ' .. what, 0)
end

local function settle_window(k, member, estimate, actual)
  local config = redis.call('hmget', KEYS[k + 1], 'rate', 'interval')
  local rate, interval = tonumber(config[1]), tonumber(config[2])
  if rate == nil or interval == nil then
    return 0
  end
  local _, len = decode_member(member, 'permits')
  for mode = 0, 1 do
    local vkey, pkey = KEYS[k + 2 + mode], KEYS[k + 4 + mode]
    -- Read before anything is written: a key of another type fails the script here,
    -- with nothing changed.
    local score = redis.call('zscore', pkey, member)
    if score then
      if tonumber(score) <= now - interval then
        return 0
      end
      local value = tonumber(redis.call('get', vkey))
      -- The settled member first: removing the grant's own while it is the log's
      -- only one would delete the key, and the member added after would make it
      -- again without its expiry.
      if actual > 0 then
        local settled = string.sub(member, 1, len + 1)
          .. string.char(actual % 256, math.floor(actual / 256) % 256,
            math.floor(actual / 65536) % 256, math.floor(actual / 16777216) % 256)
        redis.call('zadd', pkey, score, settled)
      end
      redis.call('zrem', pkey, member)
      if value ~= nil then
        value = value + estimate - actual
        if value > rate then
          value = rate
        end
        redis.call('set', vkey, string.format('%d', value), 'keepttl')
      end
      return 1
    end
  end
  return 0
end

local helpers = false

local function settle_tokens(i, k, a, estimate, actual)
  -- made on the paths that use them only: a closure costs on every call that makes it
  if not helpers then
    bucket_helpers()
    helpers = true
  end
  local r = { rate = tonumber(ARGV[a + 5]), interval = tonumber(ARGV[a + 6]), burst = tonumber(ARGV[a + 7]),
    warmup = tonumber(ARGV[a + 8]) }
  local key, mark = KEYS[k + 2], KEYS[k + 3]
  -- Read first: a bucket that is not one this code wrote fails the script before the
  -- mark is set, so a settle sent again once it is mended still applies.
  local raw = redis.call('get', key)
  local s = raw and read_bucket(raw)
  if raw and s == nil then
    local role = string.sub(key, -7) == ':bucket' and 'bucket' or 'client_bucket'
    error('redlimit:bad_bucket:' .. i .. ' ' .. role .. ' ' .. raw, 0)
  end
  if redis.call('set', mark, '1', 'nx', 'px', ARGV[a + 9]) == false then
    return 0
  end
  if raw == false and actual <= estimate then
    return 1 -- a missing bucket is full: nothing to give back
  end
  if raw then
    -- refilled on its own config, and stored with it
    r.rate, r.interval, r.burst, r.warmup = s.rate, s.interval, s.burst, s.warmup
    r.stored = s
  else
    r.stored = false
  end
  plan_tokens(r, now)
  if actual < estimate then
    r.units = math.min(r.units + (estimate - actual) * r.interval, r.burst * r.interval)
  else
    -- an excess whose plain tokens reach the floor: the floor (its units may be past
    -- what a double holds exactly)
    local need = (actual - estimate) * r.interval
    if need >= r.units - DEBT_FLOOR then
      r.units, r.cold = DEBT_FLOOR, math.max(r.cold - need, 0)
    else
      take_tokens(r, actual - estimate)
      if r.units < DEBT_FLOOR then r.units = DEBT_FLOOR end
    end
  end
  store_tokens(r, key, string.format('%d', r.rate), string.format('%d', r.interval),
    string.format('%d', r.burst), now)
  return 1
end

local settled = {}
for i = 1, #KEYS / 5 do
  local k, a = 5 * (i - 1), 1 + 9 * (i - 1)
  local kind, member = ARGV[a + 1], ARGV[a + 2]
  local estimate, actual = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  if estimate == nil or estimate < 0 or estimate ~= math.floor(estimate) then
    bad(a + 3, 'estimate ' .. tostring(ARGV[a + 3]))
  end
  if actual == nil or actual < 0 or actual > 4294967295 or actual ~= math.floor(actual) then
    bad(a + 4, 'actual ' .. tostring(ARGV[a + 4]))
  end
  if actual == estimate then
    settled[i] = 1
  elseif kind == 'w' then
    settled[i] = settle_window(k, member, estimate, actual)
  elseif kind == 'b' then
    settled[i] = settle_tokens(i, k, a, estimate, actual)
  else
    bad(a + 1, 'kind ' .. tostring(kind))
  end
end
return settled
