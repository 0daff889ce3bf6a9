-- settle.lua: settle the grants of a reservation with the amounts actually used: what
-- was not used goes back, what was used beyond the estimate is charged, even past the
-- limit (a debt later calls wait out).
-- Recipe: lib/quote.lua, lib/clock.lua, lib/bucket.lua, lib/ttl_rule.lua, lib/stored_config.lua, settle.lua
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
-- ARGV, per rule: rule i's argument j is ARGV[1+5*(i-1)+j]:
--   1 kind: "w" a sliding window, "b" a token bucket
--   2 member: the log member the grant was made under (its id names the settle mark)
--   3 estimate: the permits the grant took
--   4 actual: the permits to count instead, from 0 to 4294967295
--   5 terms: "mark_ms:rate:interval:burst:warmup:type:keep_alive:at:room:segment", read only
--     on the paths that use them (each argument costs Redis as much before the script
--     runs): how long the settle mark is kept in ms (as long as the settle may be sent
--     again), the rule's rate and interval in ms (for a token bucket missing, so full,
--     or a window's config written again), a token bucket's burst and warm-up in ms (0
--     for a window), a window's mode and keepAliveTime in ms as the grant decided
--     them (type 0 overall, 1 per client; keep-alive 0: none), and a token bucket's
--     grant time (epoch ms) and room: the most its settle may give back right after
--     the grant, in units (0 for a window), and the id its grant opened a segment
--     under (lib/bucket.lua; 0: none)
-- Returns one integer per rule, alone for one rule (a table costs more than its
-- integers), else in a table: -2 when there was nothing to settle (a refund for a
-- grant out of its window or no longer in its log, a settle already made, a limiter
-- deleted); else it was settled (or the actual is the estimate), and the integer is
-- the permits the limiter has left after it (0 in debt), or -1 when not known (a
-- window without its value key, an actual equal to the estimate).
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
-- now, then gets back the tokens not used (up to its burst, and up to the room the
-- grant left less what refilled since, to the bucket's own refill time: tokens the
-- bucket would have refilled past its burst, had the grant taken only what it used,
-- do not come back; nothing comes back into a bucket whose config changed since; with
-- reservations pending, at most the least room of the grant's segment and every later
-- one, lib/bucket.lua's) or pays the excess as taking it would, below zero down to its rate (one interval's
-- refill, as a window's excess leaves it within one interval; a cold bucket's debt
-- already below that stays there); its settle mark makes a settle sent again a no-op.

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

-- The terms of the rule whose arguments start after a: mark_ms, rate, interval,
-- burst, warmup, type, keep_alive, at, room and segment, as text; with `mark_only`, mark_ms
-- alone (the rest not read: a pattern's captures cost).
local function terms(a, mark_only)
  local pattern = mark_only and '^(%d+):' or '^(%d+):(%d+):(%d+):(%d+):(%d+):([01]):(%d+):(%d+):(%d+):(%d+)$'
  local mark_ms, rate, interval, burst, warmup, mode, keep, at, room, segment = string.match(ARGV[a + 5], pattern)
  if mark_ms == nil then
    error('redlimit:bad_argument:' .. (a + 5) .. ' terms ' .. tostring(ARGV[a + 5]), 0)
  end
  return mark_ms, rate, interval, burst, warmup, mode, keep, at, room, segment
end

-- A grant still in its window (config: as read and checked): its member
-- rewritten, its value moved. Nothing (nil) when the grant has left its window or the
-- log.
-- Rule i's config key exists without rate, interval or type: another program's hash,
-- which a settle that would write there refuses.
local function not_limiter(i, config)
  local missing = {}
  for j, field in ipairs({ 'rate', 'interval', 'type' }) do
    if config[j] == false then missing[#missing + 1] = field end
  end
  error('redlimit:not_limiter:' .. i .. ' config holds a hash without ' .. table.concat(missing, ', '), 0)
end

-- Rule i's log `pkey` (mode 1: a client's) is a sorted set, or missing.
local function check_log(i, pkey, mode)
  local log_type = redis.call('type', pkey).ok
  if log_type ~= 'zset' and log_type ~= 'none' then
    error('redlimit:wrong_type:' .. i .. ' ' .. (mode == 1 and 'client_permits' or 'permits') .. ' holds a '
      .. log_type, 0)
  end
end

-- The count in rule i's value key `vkey` (mode 1: a client's), nil when missing, read
-- as the acquire scripts read it: anything but a decimal integer fails the script,
-- before the settle writes anything.
local function read_value(i, vkey, mode)
  local role = mode == 1 and 'client_value' or 'value'
  local raw = redis.pcall('get', vkey)
  if type(raw) == 'table' and raw.err then
    error('redlimit:wrong_type:' .. i .. ' ' .. role .. ' holds a ' .. redis.call('type', vkey).ok, 0)
  end
  if raw == false then
    return nil
  end
  local value = tonumber(raw)
  if value == nil or not string.find(raw, '^%-?%d+$') then
    error('redlimit:bad_value:' .. i .. ' ' .. role .. ' ' .. quoted(raw), 0)
  end
  -- (a count past 2^53, read as text before a double rounds it: above any rate, left
  -- for the next call to rebuild from the log)
  if #raw > 16 or (#raw == 16 and raw > '9007199254740992') then return math.huge end
  return value
end

local function settle_window(i, k, a, member, len, estimate, actual, config, now)
  local rate_text, interval_text, mode_text = config[1], config[2], config[3]
  if rate_text == false or interval_text == false or mode_text == false then
    return nil
  end
  -- The config checked as lib/stored_config.lua checks one, written out: the usual
  -- settle makes no table for it and reads each number once.
  local rate = string.find(rate_text, '^%d+$') and tonumber(rate_text)
  if not rate or rate < 1 or #rate_text > 16 or (#rate_text == 16 and rate_text > '9007199254740992') then
    error('redlimit:bad_config:' .. i .. ' rate=' .. quoted(rate_text), 0)
  end
  local interval = string.find(interval_text, '^%d+$') and tonumber(interval_text)
  if not interval or interval < 1 or #interval_text > 16
      or (#interval_text == 16 and interval_text > '9007199254740992') then
    error('redlimit:bad_config:' .. i .. ' interval=' .. quoted(interval_text), 0)
  end
  if mode_text ~= '0' and mode_text ~= '1' then
    error('redlimit:bad_config:' .. i .. ' type=' .. quoted(mode_text), 0)
  end
  -- The log of the limiter's mode only, as a call reads it (the other mode's keys are
  -- not the limiter's now, whatever they hold).
  local mode = mode_text == '1' and 1 or 0
  do
    local vkey, pkey = KEYS[k + 2 + mode], KEYS[k + 4 + mode]
    -- Read before anything is written: a key of another type fails the script here,
    -- with nothing changed.
    local score = redis.pcall('zscore', pkey, member)
    if type(score) == 'table' and score.err then
      error('redlimit:wrong_type:' .. i .. ' ' .. (mode == 1 and 'client_permits' or 'permits') .. ' holds a '
        .. redis.call('type', pkey).ok, 0)
    end
    if score and tonumber(score) > now - interval then
      local value = read_value(i, vkey, mode)
      -- An excess is charged once: a settle already made (late, at a clock that then
      -- stepped back) leaves its mark.
      if actual > estimate and redis.call('set', KEYS[k + 6], '1', 'nx', 'px', (terms(a, true))) == false then
        return -2
      end
      -- The settled member first: removing the grant's own while it is the log's
      -- only one would delete the key, and the member added after would make it
      -- again without its expiry.
      if actual > 0 then
        redis.call('zadd', pkey, score, log_member(member, len, '', actual))
      end
      redis.call('zrem', pkey, member)
      -- A value above the rate (inflated by hand) is left as it is: the next call
      -- rebuilds it from the log, which holds the settled grant.
      if value ~= nil and value <= rate then
        value = value + estimate - actual
        if value > rate then
          value = rate
        end
        redis.call('set', vkey, string.format('%d', value), 'keepttl')
      else
        value = nil
      end
      return value and math.max(value, 0) or -1
    end
  end
  return nil
end

-- Late: the grant has left its window (or the log, or its limiter expired). Nothing
-- goes back; an excess is charged now, once.
local function late_window(i, k, a, member, len, estimate, actual, config, now)
  if actual <= estimate then
    return -2
  end
  local mark_ms, rate, interval, _, _, granted_mode, granted_keep = terms(a)
  -- Read before anything is written (the mark included, so that a settle sent again
  -- once it is mended applies): a name that exists must hold a limiter's config, as the
  -- acquire scripts read one (another program's hash is refused, never written into),
  -- and the value and log must be what a limiter keeps there.
  local stored = config
  local expired = redis.call('exists', KEYS[k + 1]) == 0
  if not expired and (stored[1] == false or stored[2] == false or stored[3] == false) then
    not_limiter(i, stored)
  end
  local mode, keep = stored[3], nil
  if not expired then
    -- (read only when late: one field fewer on the usual settle)
    keep = redis.call('hget', KEYS[k + 1], 'keepAliveTime') or nil
    local keep_ms = keep and string.find(keep, '^%d+$') and tonumber(keep)
    if keep and not (keep_ms and (#keep < 16 or (#keep == 16 and keep <= '9007199254740992'))) then
      error('redlimit:bad_config:' .. i .. ' keepAliveTime=' .. quoted(keep), 0)
    end
  end
  if expired then
    mode, keep = granted_mode, granted_keep
  end
  mode = mode == '1' and 1 or 0
  local vkey, pkey = KEYS[k + 2 + mode], KEYS[k + 4 + mode]
  local value = read_value(i, vkey, mode)
  check_log(i, pkey, mode)
  if redis.call('set', KEYS[k + 6], '1', 'nx', 'px', mark_ms) == false then
    return -2
  end
  if expired then
    -- expired since the grant: written again as the grant decided it
    redis.call('hset', KEYS[k + 1], 'rate', rate, 'interval', interval, 'type', granted_mode,
      'keepAliveTime', keep)
  end
  local excess = actual - estimate
  redis.call('zadd', pkey, string.format('%d', now), log_member(member, len, 'L', excess))
  -- (a value above the rate, inflated by hand, left for the next call to rebuild from
  -- the log, the excess's entry in it)
  if value ~= nil and value <= tonumber(stored[1] or rate) then
    value = value - excess
    redis.call('set', vkey, string.format('%d', value), 'keepttl')
  else
    value = nil
  end
  -- (written as Redis reads an expiry: `060000` is not one)
  -- (the stored config's interval, as its keep-alive: the grant's when it expired)
  local config_interval = (not expired and tonumber(stored[2])) or tonumber(interval)
  ttl_rule(KEYS[k + 1], vkey, pkey, keep and string.format('%d', tonumber(keep)) or '0', config_interval)
  return value and math.max(value, 0) or -1
end

-- A token bucket's settle, made only for a call with a bucket rule: it holds the
-- bucket's helpers.
local settle_tokens
for j = 1, #KEYS / 6 do
  if ARGV[2 + 5 * (j - 1)] == 'b' then
    bucket_helpers()
    settle_tokens = function(i, k, a, estimate, actual, now)
      local mark_ms, rate, interval, burst, warmup, _, _, at, room, segment = terms(a)
      local r = { rate = tonumber(rate), interval = tonumber(interval), burst = tonumber(burst),
        warmup = tonumber(warmup) }
      local key, mark = KEYS[k + 2], KEYS[k + 6]
      -- Read first: a bucket that is not one this code wrote fails the script before the
      -- mark is set, so a settle sent again once it is mended still applies.
      local raw = redis.call('get', key)
      local s = raw and read_bucket(raw)
      if raw and s == nil then
        local role = string.sub(key, -7) == ':bucket' and 'bucket' or 'client_bucket'
        error('redlimit:bad_bucket:' .. i .. ' ' .. role .. ' ' .. quoted(raw), 0)
      end
      if redis.call('set', mark, '1', 'nx', 'px', mark_ms) == false then
        return -2
      end
      if raw == false and actual <= estimate then
        return r.burst -- a missing bucket is full: nothing to give back
      end
      local same = false
      if raw then
        -- refilled on its own config, and stored with it
        same = s.rate == r.rate and s.interval == r.interval and s.burst == r.burst and s.warmup == r.warmup
        r.rate, r.interval, r.burst, r.warmup = s.rate, s.interval, s.burst, s.warmup
        r.stored = s
      else
        r.stored = false
      end
      plan_tokens(r, now)
      -- Given back only as far as what refilled since the grant, up to the bucket's
      -- own refill time (r.at: a clock behind it refilled nothing), left it room, and
      -- nothing into a config changed since (its tokens carried over, its fraction
      -- dropped) nor into a bucket made again since on a clock behind the grant's (its
      -- stored refill time before the grant's, which a bucket's writes never move
      -- back: the one the grant left expired full, or was deleted).
      if same and s.at >= tonumber(at) then
        room = math.max(tonumber(room) - r.rate * math.max(r.at - tonumber(at), 0), 0)
      else
        room = 0
      end
      -- With reservations pending, also at most the least room the bucket had at its
      -- peaks from the grant on, less what their settles gave back (its segment and
      -- every later one's; lib/bucket.lua): one's settle never gives back what
      -- another's did. A grant without a segment gets nothing back.
      -- (the id as text, compared as the segments keep it: 0 is no segment's)
      local in_segment, bound = settle_segment(r, segment)
      if in_segment == nil then room = 0 elseif bound < room then room = bound end
      local before = r.units
      if actual < estimate then
        local back = math.min((estimate - actual) * r.interval, room)
        r.units = math.min(r.units + back, r.burst * r.interval)
        -- and to a warm-up, the coldness the permits not used took off it, and the
        -- extra cost a cold grant may have charged for them (up to two tokens a permit)
        -- less what came back: had the grant taken only what it used, those tokens
        -- would have refilled the bucket sooner and its refill past the burst made it
        -- colder (lib twin: Plan::settle_tokens in runtime/src/algorithm/bucket.rs)
        local unused = (estimate - actual) * r.interval
        r.cold = math.min(r.cold + math.max(4 * unused - back, 0), r.warmup * r.rate)
      else
        -- an excess whose plain tokens reach the floor, the rate below zero (not past
        -- the capacity less 2^53: the room within 2^53): the floor (its units may be past
        -- what a double holds exactly)
        local floor = math.max(DEBT_FLOOR, -r.rate * r.interval, r.burst * r.interval - 9007199254740992)
        local excess = actual - estimate
        local above = r.units - floor
        -- To a warm-up, only the tokens of the permits a grant could take now (their
        -- tokens held) whose cost the units above the floor pay: the part charged
        -- into debt, or past the floor, warms nothing (lib twin: Plan::settle_tokens).
        local held = r.units > 0 and idiv(r.units, r.interval) or 0
        local cold = r.cold
        if excess * r.interval < above and token_cost(r, excess) <= above then
          take_tokens(r, excess)
          r.cold = math.max(cold - math.min(excess, held) * r.interval, 0)
        else
          -- The floor (a warm-up's extra cost may have left it below: kept there),
          -- warmed by at most the permits whose cost the units above it paid
          -- (Plan::permits_costing_at_most): the quotient of doubles, then corrected a
          -- permit at a time with the exact cost.
          local paid = 0
          local most = above > 0 and idiv(above, r.interval) or 0
          if most > 0 then
            paid = math.floor(above * most / token_cost(r, most))
            while paid > 0 and token_cost(r, paid) > above do paid = paid - 1 end
            while token_cost(r, paid + 1) <= above do paid = paid + 1 end
          end
          r.units, r.cold = math.min(floor, r.units), math.max(cold - math.min(paid, held) * r.interval, 0)
        end
      end
      if in_segment then close_segment(r, in_segment, segment, math.max(r.units - before, 0)) end
      store_tokens(r, key, string.format('%d', r.rate), string.format('%d', r.interval),
        string.format('%d', r.burst), now)
      return math.max(idiv(r.units, r.interval), 0)
    end
    break
  end
end

local n = #KEYS / 6

-- Rule i's arguments (they start after a), checked: its kind, its member and the
-- member's id length (checked as lib/member.lua's decode_member checks it when the
-- settle changes anything: its permits are not needed here, nor that file's function
-- made on every call; an id of 255 bytes would leave no room for a late settle's
-- suffix), its estimate and its actual.
local function rule_arguments(i, a)
  local kind, member = ARGV[a + 1], ARGV[a + 2]
  local estimate, actual = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  if estimate == nil or estimate < 0 or estimate ~= math.floor(estimate) then
    error('redlimit:bad_argument:' .. (a + 3) .. ' estimate ' .. tostring(ARGV[a + 3]), 0)
  end
  if actual == nil or actual < 0 or actual > 4294967295 or actual ~= math.floor(actual) then
    error('redlimit:bad_argument:' .. (a + 4) .. ' actual ' .. tostring(ARGV[a + 4]), 0)
  end
  if kind ~= 'w' and kind ~= 'b' then
    error('redlimit:bad_argument:' .. (a + 1) .. ' kind ' .. tostring(kind), 0)
  end
  local len = string.byte(member, 1)
  if kind == 'w' and actual ~= estimate and (len == nil or len > 254 or #member ~= len + 5) then
    error('redlimit:bad_member:' .. i .. ' permits member of ' .. #member .. ' bytes does not decode', 0)
  end
  return kind, member, len, estimate, actual
end

-- With several rules, every rule's arguments and state read and checked as a call
-- reads them (its config, and the value, log or bucket the settle would write) before
-- anything is written: a later rule failing after an earlier one was settled would
-- answer an error for a settle half made. (One rule's own path reads before it
-- writes.)
for i = 1, n > 1 and n or 0 do
  local k, a = 6 * (i - 1), 1 + 5 * (i - 1)
  local kind, _, _, estimate, actual = rule_arguments(i, a)
  if kind == 'w' and actual ~= estimate then
    local config = redis.call('hmget', KEYS[k + 1], 'rate', 'interval', 'type', 'keepAliveTime')
    if config[1] and config[2] and config[3] then check_config(i, config) end
    local _, _, _, _, _, granted_mode = terms(a)
    local mode = config[3]
    if config[1] == false or config[2] == false or config[3] == false then
      mode = granted_mode
      if redis.call('exists', KEYS[k + 1]) == 1 then
        -- (a refund writes nothing there: nothing goes back late)
        if actual > estimate then not_limiter(i, config) end
        mode = nil
      end
    end
    if mode then
      mode = mode == '1' and 1 or 0
      read_value(i, KEYS[k + 2 + mode], mode)
      check_log(i, KEYS[k + 4 + mode], mode)
    end
  elseif kind == 'b' and actual ~= estimate then
    terms(a)
    local raw = redis.call('get', KEYS[k + 2])
    if raw and read_bucket(raw) == nil then
      local role = string.sub(KEYS[k + 2], -7) == ':bucket' and 'bucket' or 'client_bucket'
      error('redlimit:bad_bucket:' .. i .. ' ' .. role .. ' ' .. quoted(raw), 0)
    end
  end
end

local settled = {}
for i = 1, n do
  local k, a = 6 * (i - 1), 1 + 5 * (i - 1)
  local kind, member, len, estimate, actual = rule_arguments(i, a)
  local outcome
  if actual == estimate then
    outcome = -1
  elseif kind == 'w' then
    local config = redis.call('hmget', KEYS[k + 1], 'rate', 'interval', 'type')
    outcome = settle_window(i, k, a, member, len, estimate, actual, config, now)
      or late_window(i, k, a, member, len, estimate, actual, config, now)
  else
    outcome = settle_tokens(i, k, a, estimate, actual, now)
  end
  if n == 1 then
    return outcome
  end
  settled[i] = outcome
end
return settled
