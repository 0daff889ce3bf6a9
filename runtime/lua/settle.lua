-- settle.lua: settle the grants of a reservation with the amounts actually used: what
-- was not used goes back, what was used beyond the estimate is charged, even past the
-- limit (a debt later calls wait out).
-- Recipe: lib/clock.lua, lib/member.lua, lib/bucket.lua, lib/ttl_rule.lua, settle.lua
-- Twin in Rust: runtime/src/backend/memory/settle.rs (settle_window, settle_tokens)
--
-- KEYS, per rule: rule i's key j is KEYS[6*(i-1)+j]:
--   1 config: NAME, the config hash (a sliding window's rate, interval and mode)
--   2 value: {NAME}:value, or a token bucket's key in the rule's mode
--   3 client_value: {NAME}:value:ID
--   4 permits: {NAME}:permits
--   5 client_permits: {NAME}:permits:ID
--   6 mark: {NAME}:settled:<grant id>, the settle mark
-- ARGV:
--   1 now: the settle's time, epoch ms (the caller's clock, as the grant's), or empty
--     for Redis TIME (a client deciding at the server's time)
-- ARGV, per rule: rule i's argument j is ARGV[1+11*(i-1)+j]:
--   1 kind: "w" a sliding window, "b" a token bucket
--   2 member: the log member the grant was made under (its id names the settle mark)
--   3 estimate: the permits the grant took
--   4 actual: the permits to count instead, from 0 to 4294967295
--   5 rate: the rule's rate (for a token bucket missing, so full, or a window's config
--     written again)
--   6 interval: the rule's interval in ms (as rate)
--   7 burst: a token bucket's burst
--   8 warmup: a token bucket's warm-up in ms (0: none)
--   9 mark_ms: how long the settle mark is kept: as long as the settle may be sent
--     again
--   10 type: a window's mode as the grant decided it, "0" overall, "1" per client
--   11 keep_alive: a window's keepAliveTime in ms as the grant decided it ("0": none)
-- Returns two integers per rule: 1 when it was settled (or the actual is the
-- estimate), 0 when there was nothing to settle (a refund for a grant out of its
-- window or no longer in its log, a settle already made, a limiter deleted); then the
-- permits the limiter has left after it (0 in debt), or -1 when not known (a window
-- without its value key, a settle that changed nothing).
--
-- A sliding window's grant keeps its score: its member is replaced by one of the same
-- id holding the actual permits (removed when none were used), and the value moves by
-- the difference, up to the rate, below zero while the excess is owed. So the excess
-- counts from the grant's time and leaves the window with it, value + permits in the
-- log stays the rate, and a Redisson client reads the debt as a value below what it
-- asks. A grant that has left its window (a settle made late: a response streamed for
-- longer than the interval) gets nothing back, and its excess is charged at the
-- settle's time instead, as a grant of its own in the rule's mode (a member of the
-- grant's id and an "L"), its config written again as the grant decided it when it
-- has expired meanwhile (a limiter idle for its keep-alive). An excess sets the mark, so that a settle sent again
-- after the window has passed charges nothing twice. A token bucket is refilled to
-- now, then gets back the tokens not used (up to its burst) or pays the excess as
-- taking it would, below zero down to its rate (one interval's refill, as a window's
-- excess leaves it within one interval); its settle mark makes a settle sent again a
-- no-op.

local now = clock(ARGV[1])

-- Every function below holds as few of the script's locals as it can, the time among
-- its arguments: a closure costs on every call that makes it, by each local it holds.

-- A log member of `id_len` bytes of id (those of `member`), then `suffix`, holding
-- `permits` (Redisson's struct.pack('Bc0I', len, id, permits)).
local function log_member(member, id_len, suffix, permits)
  return string.char(id_len + #suffix) .. string.sub(member, 2, id_len + 1) .. suffix
    .. string.char(permits % 256, math.floor(permits / 256) % 256,
      math.floor(permits / 65536) % 256, math.floor(permits / 16777216) % 256)
end

-- A grant still in its window (config: the rate and interval read): its member
-- rewritten, its value moved. Nothing (nil) when the grant has left its window or the
-- log.
local function settle_window(k, a, member, len, estimate, actual, config, now)
  local rate, interval = tonumber(config[1]), tonumber(config[2])
  if rate == nil or interval == nil then
    return nil
  end
  for mode = 0, 1 do
    local vkey, pkey = KEYS[k + 2 + mode], KEYS[k + 4 + mode]
    -- Read before anything is written: a key of another type fails the script here,
    -- with nothing changed.
    local score = redis.call('zscore', pkey, member)
    if score and tonumber(score) > now - interval then
      local value = tonumber(redis.call('get', vkey))
      if actual > estimate then
        redis.call('set', KEYS[k + 6], '1', 'px', ARGV[a + 9])
      end
      -- The settled member first: removing the grant's own while it is the log's
      -- only one would delete the key, and the member added after would make it
      -- again without its expiry.
      if actual > 0 then
        redis.call('zadd', pkey, score, log_member(member, len, '', actual))
      end
      redis.call('zrem', pkey, member)
      if value ~= nil then
        value = value + estimate - actual
        if value > rate then
          value = rate
        end
        redis.call('set', vkey, string.format('%d', value), 'keepttl')
      end
      return 1, value and math.max(value, 0) or -1
    elseif score then
      return nil
    end
  end
  return nil
end

-- Late: the grant has left its window (or the log, or its limiter expired). Nothing
-- goes back; an excess is charged now, once.
local function late_window(k, a, member, len, estimate, actual, config, now)
  if actual <= estimate or redis.call('set', KEYS[k + 6], '1', 'nx', 'px', ARGV[a + 9]) == false then
    return 0, -1
  end
  local mode_keep = redis.call('hmget', KEYS[k + 1], 'type', 'keepAliveTime')
  local mode, keep = mode_keep[1], mode_keep[2]
  if config[1] == false or config[2] == false then
    -- expired since the grant: written again as the grant decided it
    mode, keep = ARGV[a + 10], ARGV[a + 11]
    redis.call('hset', KEYS[k + 1], 'rate', ARGV[a + 5], 'interval', ARGV[a + 6], 'type', mode,
      'keepAliveTime', keep)
  end
  mode = mode == '1' and 1 or 0
  local vkey, pkey = KEYS[k + 2 + mode], KEYS[k + 4 + mode]
  local value = tonumber(redis.call('get', vkey))
  local excess = actual - estimate
  redis.call('zadd', pkey, string.format('%d', now), log_member(member, len, 'L', excess))
  if value ~= nil then
    value = value - excess
    redis.call('set', vkey, string.format('%d', value), 'keepttl')
  end
  ttl_rule(KEYS[k + 1], vkey, pkey, tonumber(keep) and keep or '0')
  return 1, value and math.max(value, 0) or -1
end

-- A token bucket's settle, made only for a call with a bucket rule: it holds the
-- bucket's helpers.
local settle_tokens
for j = 1, #KEYS / 6 do
  if ARGV[2 + 11 * (j - 1)] == 'b' then
    bucket_helpers()
    settle_tokens = function(i, k, a, estimate, actual, now)
      local r = { rate = tonumber(ARGV[a + 5]), interval = tonumber(ARGV[a + 6]), burst = tonumber(ARGV[a + 7]),
        warmup = tonumber(ARGV[a + 8]) }
      local key, mark = KEYS[k + 2], KEYS[k + 6]
      -- Read first: a bucket that is not one this code wrote fails the script before the
      -- mark is set, so a settle sent again once it is mended still applies.
      local raw = redis.call('get', key)
      local s = raw and read_bucket(raw)
      if raw and s == nil then
        local role = string.sub(key, -7) == ':bucket' and 'bucket' or 'client_bucket'
        error('redlimit:bad_bucket:' .. i .. ' ' .. role .. ' ' .. raw, 0)
      end
      if redis.call('set', mark, '1', 'nx', 'px', ARGV[a + 9]) == false then
        return 0, -1
      end
      if raw == false and actual <= estimate then
        return 1, r.burst -- a missing bucket is full: nothing to give back
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
        -- an excess whose plain tokens reach the floor, the rate below zero: the floor
        -- (its units may be past what a double holds exactly)
        local floor = math.max(DEBT_FLOOR, -r.rate * r.interval)
        local need = (actual - estimate) * r.interval
        if need >= r.units - floor then
          r.units, r.cold = floor, math.max(r.cold - need, 0)
        else
          take_tokens(r, actual - estimate)
          if r.units < floor then r.units = floor end
        end
      end
      store_tokens(r, key, string.format('%d', r.rate), string.format('%d', r.interval),
        string.format('%d', r.burst), now)
      return 1, math.max(idiv(r.units, r.interval), 0)
    end
    break
  end
end

local settled = {}
for i = 1, #KEYS / 6 do
  local k, a = 6 * (i - 1), 1 + 11 * (i - 1)
  local kind, member = ARGV[a + 1], ARGV[a + 2]
  local estimate, actual = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  if estimate == nil or estimate < 0 or estimate ~= math.floor(estimate) then
    error('redlimit:bad_argument:' .. (a + 3) .. ' estimate ' .. tostring(ARGV[a + 3]), 0)
  end
  if actual == nil or actual < 0 or actual > 4294967295 or actual ~= math.floor(actual) then
    error('redlimit:bad_argument:' .. (a + 4) .. ' actual ' .. tostring(ARGV[a + 4]), 0)
  end
  local done, left
  if actual == estimate then
    done, left = 1, -1
  elseif kind == 'w' then
    local _, len = decode_member(member, 'permits')
    -- (the mode and keep-alive read only when late: two fields fewer on the usual path)
    local config = redis.call('hmget', KEYS[k + 1], 'rate', 'interval')
    done, left = settle_window(k, a, member, len, estimate, actual, config, now)
    if done == nil then
      done, left = late_window(k, a, member, len, estimate, actual, config, now)
    end
  elseif kind == 'b' then
    done, left = settle_tokens(i, k, a, estimate, actual, now)
  else
    error('redlimit:bad_argument:' .. (a + 1) .. ' kind ' .. tostring(kind), 0)
  end
  settled[2 * i - 1], settled[2 * i] = done, left
end
return settled
