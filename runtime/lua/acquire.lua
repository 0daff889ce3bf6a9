-- acquire.lua: decide one or more rate-limit rules, all or nothing, in one call.
-- Its twin in Rust takes the same phases, under the same names, in the same order
-- (Phase 1 load_rule, settle_time, Phase 2 plan_bucket and take, Phase 3 commit,
-- Phase 4 reply).
-- Recipe: lib/clock.lua, lib/call_time.lua, acquire_plain.lua, lib/quote.lua, lib/member.lua, lib/ttl_rule.lua, lib/bucket.lua, acquire.lua
-- Twin in Rust: runtime/src/backend/memory/decide.rs (its phases: load.rs, plan.rs,
--   commit.rs; the sliding window's arithmetic: runtime/src/algorithm/window.rs)
-- acquire_plain.lua decides the usual calls (sliding-window rules that own their
-- stored configs) and may answer one rule with an integer (see there); every other
-- call reaches this file.
--
-- KEYS, per rule: rule i's key j is KEYS[5*(i-1)+j]:
--   1 config: NAME, the config hash (rate, interval, type, keepAliveTime)
--   2 value: {NAME}:value, available permits, mode overall
--   3 client_value: {NAME}:value:ID, available permits, mode per_client
--   4 permits: {NAME}:permits, grant log, mode overall
--   5 client_permits: {NAME}:permits:ID, grant log, mode per_client
-- ARGV:
--   1 now: epoch milliseconds; empty for the server's clock
-- ARGV, per rule: rule i's argument j is ARGV[1+7*(i-1)+j]:
--   1 permits: 0 asks what is available and writes nothing
--   2 member: the log member, 1 byte id length L, L id bytes, permits as 4-byte
--     little-endian; rule 1's first three id bytes hold in their low twenty bits
--     the call's tag, which the reply carries (the call's time modulo 2^20 when the
--     member is shorter)
--   3 owns: "1", the rule owns the config (create it when missing, overwrite it when
--     it differs, keeping the window); "0": use the stored config as it is (a token
--     bucket always owns its config: 3 is its warm-up in ms, "0" for none)
--   4 rate: the rate
--   5 interval: in ms
--   6 type: "0" overall, "1" per_client; "2" and "3": a token bucket, overall or
--     per_client
--   7 keep_alive: keepAliveTime in ms, or a token bucket's burst (4..7 are read only
--     when 3 is "1" or the rule is a token bucket)
-- ARGV, after the rules': ARGV[1+7*r+j] for r rules:
--   1 reserved: each rule's grant id, comma separated, when it is a token bucket whose
--     grant is a pending reservation's, which opens a segment of its bucket under it
--     (lib/bucket.lua), else empty; missing when none is
-- A token-bucket rule uses its KEYS 2 ({NAME}:bucket) or 3 ({NAME}:bucket:ID) in
-- place of the value keys, and touches no other: one string (its layout is in
-- lib/bucket.lua); a missing bucket is a full, cold one, and each write sets its TTL to
-- the time until it is full and cold (tokens.lua decides calls of token buckets alone).
-- Returns {granted (1|0), first refusing rule (1-based, 0 when granted),
--          wait in ms until that refusal would pass (0 when granted),
--          the time the call was decided at (now, or a slightly later grant's time),
--          then per rule: permits left, and 0 (config kept), 1 (created) or 2 (changed),
--          then for each changed rule in order, the config it replaced:
--          rate, interval, type, keepAliveTime (a token bucket's: rate, interval,
--          type, burst),
--          then the call's tag}.
-- Errors start with "redlimit:<code>:<rule>"; the caller names the key. A key of the
-- wrong type fails the read with Redis's WRONGTYPE, and the caller finds which.
--
-- All reads and checks come first and every write after them, so an error leaves
-- the state untouched, and a refusal by any rule spends no permit of any rule.
--
-- Every call that reaches here runs this whole body, so it creates as little as it
-- can: one table per rule (which also holds the plan of the bucket it is the first to
-- name), built whole by its constructor, and helpers only on the paths that need them
-- (but lib/member.lua's and lib/ttl_rule.lua's, one closure each).

-- Numbers are read as `s + 0` where s is a decimal the caller wrote or this script
-- checked (one conversion; tonumber converts twice), and given to redis.call as text
-- (a number is printed with "%.17g"): see acquire_plain.lua.
-- caller_now, the call's time, and REORDER are lib/call_time.lua's.
local now = caller_now
local nrules = #KEYS / 5
local LIMIT = 9007199254740992 -- 2^53: doubles count exactly up to here
-- LIMIT as text: a stored number of digits is compared with it before it is a double
-- (which rounds 2^53 + 1 to 2^53), past 16 characters by its length
local LIMIT_TEXT = '9007199254740992'

-- Helpers are made when first needed: a closure costs on every call that makes it.
local fail, rebuild_from_log, wait_for
local function helpers()
  fail = function(code, rule, text)
    error('redlimit:' .. code .. ':' .. rule .. ' ' .. text, 0)
  end
  -- The permits in the log after its first `skip` entries (the released ones).
  rebuild_from_log = function(rule, kind, key, skip)
    local total = 0
    for _, member in ipairs(redis.call('zrange', key, string.format('%d', skip), '-1')) do
      total = total + decode_member(member, kind == '1' and 'client_permits' or 'permits', rule)
    end
    return total
  end
  -- Time until `need` permits of the live log have left the window, or nil when the
  -- live log holds fewer (plus the `pending` ones this call takes). It reads at most
  -- WALK entries: permits lacking past them get the time until the newest entry leaves.
  wait_for = function(rule, kind, key, skip, need, interval, pending)
    local acc = 0
    local walk = need < WALK and need or WALK
    local from = skip
    for pass = 1, 2 do
      local chunk = redis.call('zrange', key, string.format('%d', from), string.format('%d', from + walk - 1),
        'withscores')
      for j = 1, #chunk, 2 do
        acc = acc + decode_member(chunk[j], kind == '1' and 'client_permits' or 'permits', rule)
        if acc >= need then
          return chunk[j + 1] + interval - now
        end
      end
      if #chunk < 2 * walk then break end
      from = from + walk
      if pass == 1 and from - skip < WALK then
        -- entries of no permits among the oldest (Redisson's tryAcquire(0) logs them):
        -- the rest of the WALK entries read
        walk = WALK - walk
      else
        if redis.call('zcard', key) > from then
          local newest = redis.call('zrange', key, '-1', '-1', 'withscores')
          local wait = newest[2] + interval - now
          if pending > 0 and wait < interval then wait = interval end
          return wait
        end
        break
      end
    end
    if acc + pending >= need then return interval end
    return nil
  end
end

-- Token-bucket rules: load_tokens reads one, with lib/bucket.lua's helpers (ahead
-- of this file), made when a call has a token-bucket rule.
local load_tokens
local function token_helpers()
  if fail == nil then helpers() end
  bucket_helpers()
  load_tokens = function(i, k, a)
    local client = ARGV[a + 6] == '3'
    local r = {
      tb = true, name = KEYS[k + 1], k = k, permits = ARGV[a + 1] + 0,
      rate = ARGV[a + 4] + 0, interval = ARGV[a + 5] + 0, burst = ARGV[a + 7] + 0,
      warmup = ARGV[a + 3] + 0,
      bkey = client and KEYS[k + 3] or KEYS[k + 2], role = client and 'client_bucket' or 'bucket',
      kind = ARGV[a + 6], stored = false, units = 0, cold = 0, at = 0, flag = 0,
      write = false, changed = false, created = false, vkey = false,
    }
    local raw = redis.call('get', r.bkey)
    if raw then
      r.stored = read_bucket(raw)
      if not r.stored then fail('bad_bucket', i, r.role .. ' ' .. quoted(raw)) end
    end
    if r.permits > r.burst then
      fail('permits_exceed_rate', i, string.format('%d %d ', r.permits, r.burst)
        .. 'Requested permits amount cannot exceed the bucket')
    end
    return r
  end
end

-- Phase 1, load_rule: each rule's config and keys, and the newest grant of its log.
local rules = {}
local newest = now
local after = ARGV[1] ~= '' and '(' .. ARGV[1] or string.format('(%d', now)
for i = 1, nrules do
  local k = 5 * (i - 1)
  local a = 1 + 7 * (i - 1)
  if ARGV[a + 6] == '2' or ARGV[a + 6] == '3' then
    if load_tokens == nil then token_helpers() end
    local r = load_tokens(i, k, a)
    -- a bucket refilled later than this call's time: the call is decided then (below)
    if r.stored and r.stored.at > newest then newest = r.stored.at end
    rules[i] = r
  else
    local stored = redis.call('hmget', KEYS[k + 1], 'rate', 'interval', 'type', 'keepAliveTime')
    local r = {
      name = KEYS[k + 1], k = k, permits = ARGV[a + 1] + 0, member = ARGV[a + 2],
      rate = 0, interval = 0, kind = false, old_kind = false, keep = 0, keep_text = '0',
      write = false, changed = false, vkey = false, pkey = false,
      -- the bucket (value and log) this rule decides on: the first rule naming it owns
      -- the plan (skip ... clear); later rules on it point to that owner
      bucket = false, skip = 0, spent = 0, value = 0, dirty = true, counted = false, clear = false,
    }
    local initialized = stored[1] ~= false and stored[2] ~= false and stored[3] ~= false
    local owns = ARGV[a + 3] == '1'
    if owns and initialized and stored[1] == ARGV[a + 4] and stored[2] == ARGV[a + 5]
        and stored[3] == ARGV[a + 6] and (stored[4] or '0') == ARGV[a + 7] then
      -- the stored config is the rule's own, valid as sent: nothing to check or write
      r.rate, r.interval, r.kind, r.keep = ARGV[a + 4] + 0, ARGV[a + 5] + 0, ARGV[a + 6], ARGV[a + 7] + 0
      r.old_kind, r.keep_text = r.kind, ARGV[a + 7]
    else
      if initialized then
        local rate, interval, kind = stored[1], stored[2], stored[3]
        local keep = stored[4] or '0'
        r.rate, r.interval, r.keep = tonumber(rate), tonumber(interval), tonumber(keep)
        if not string.find(rate, '^%d+$') or r.rate < 1 or #rate > 16 or (#rate == 16 and rate > LIMIT_TEXT) then
          helpers() fail('bad_config', i, 'rate=' .. quoted(rate))
        end
        if not string.find(interval, '^%d+$') or r.interval < 1 or #interval > 16
            or (#interval == 16 and interval > LIMIT_TEXT) then
          helpers() fail('bad_config', i, 'interval=' .. quoted(interval))
        end
        if kind ~= '0' and kind ~= '1' then helpers() fail('bad_config', i, 'type=' .. quoted(kind)) end
        if not string.find(keep, '^%d+$') or #keep > 16 or (#keep == 16 and keep > LIMIT_TEXT) then
          helpers() fail('bad_config', i, 'keepAliveTime=' .. quoted(keep))
        end
        -- (the expiry written as Redis reads one: `060000` is not one)
        r.kind, r.old_kind, r.keep_text = kind, kind, string.format('%d', r.keep)
      end
      if owns and not initialized and redis.call('exists', r.name) == 1 then
        -- another program's hash under the limiter's name: the rule writes nothing to it
        local missing = {}
        for j, field in ipairs({ 'rate', 'interval', 'type' }) do
          if stored[j] == false then missing[#missing + 1] = field end
        end
        helpers()
        fail('not_limiter', i, 'config holds a hash without ' .. table.concat(missing, ', '))
      end
      if owns then
        r.write, r.changed = true, initialized
        if initialized then r.replaced = stored end -- rare: the table grows only then
        r.rate, r.interval, r.kind, r.keep = ARGV[a + 4] + 0, ARGV[a + 5] + 0, ARGV[a + 6], ARGV[a + 7] + 0
        r.keep_text = ARGV[a + 7]
      elseif not initialized then
        helpers()
        fail('not_initialized', i, 'RateLimiter is not initialized')
      end
    end
    if r.permits > r.rate then
      helpers()
      fail('permits_exceed_rate', i, string.format('%d %d ', r.permits, r.rate)
        .. 'Requested permits amount cannot exceed defined rate')
    end
    if r.kind == '1' then
      r.vkey, r.pkey = KEYS[k + 3], KEYS[k + 5]
    else
      r.vkey, r.pkey = KEYS[k + 2], KEYS[k + 4]
    end
    -- The newest grant, when it is newer than this call's time (usually none is, and
    -- counting none costs least).
    if redis.call('zcount', r.pkey, after, '+inf') > 0 then
      local later = redis.call('zrevrangebyscore', r.pkey, '+inf', after, 'withscores', 'limit', '0', '1')
      local score = later[2] + 0
      if score > newest then newest = score end
    end
    rules[i] = r
  end
end

-- settle_time: an overtaken call is decided at the later time (REORDER:
-- lib/call_time.lua).
if newest - now <= REORDER then
  now = newest
end

-- Phase 2, plan_bucket and take: each bucket once, then each rule's permits.
local refused, retry = 0, 0
for i = 1, nrules do
  local r = rules[i]
  if r.tb then
    plan_tokens(r, now)
    if r.flag == 2 then r.replaced = { r.stored.rate, r.stored.interval, r.kind, r.stored.burst } end
    local need = r.permits * r.interval
    if r.permits > 0 and r.units < need then
      local wait = cdiv(need - r.units, r.rate)
      if refused == 0 then refused = i end
      if wait > retry then retry = wait end
    end
  else
    local b = false
    for j = 1, i - 1 do
      if rules[j].vkey == r.vkey then
        b = rules[j].bucket
        break
      end
    end
    if not b then
      b = r
      b.value = r.rate
      if r.changed and r.old_kind ~= r.kind then
        -- a change of mode starts afresh and deletes both modes' state (Redisson 4.4+)
        b.clear = true
      else
        local raw = redis.call('get', r.vkey)
        local stale = redis.call('zrangebyscore', r.pkey, '-inf', string.format('%d', now - r.interval))
        local released = 0
        for j = 1, #stale do
          released = released + decode_member(stale[j], r.kind == '1' and 'client_permits' or 'permits', i)
        end
        b.skip = #stale
        if raw == false then
          -- a missing value with a surviving log is rebuilt from the log
          if rebuild_from_log == nil then helpers() end
          b.value = r.rate - rebuild_from_log(i, r.kind, r.pkey, b.skip)
        else
          local value = tonumber(raw)
          if value == nil or not string.find(raw, '^%-?%d+$') then
            helpers()
            fail('bad_value', i, (r.kind == '1' and 'client_value' or 'value') .. ' ' .. quoted(raw))
          end
          -- (a count past 2^53, read as text before a double rounds it, is above any
          -- rate; one of 17 characters and a sign, rebuilt too, is the log's anyway)
          if #raw > 16 or (#raw == 16 and raw > LIMIT_TEXT) then value = math.huge end
          if r.changed or value + released > r.rate then
            -- a changed config, or a value inflated by hand (above the rate, which no
            -- grant, give-back or settle leaves): the log is the authority
            if rebuild_from_log == nil then helpers() end
            b.value = r.rate - rebuild_from_log(i, r.kind, r.pkey, b.skip)
          elseif released > 0 then
            b.value = value + released
          else
            b.value, b.dirty = value, false
            -- written as Redis counts, so the grant can be a DECRBY
            b.counted = #raw <= 15 and (raw == '0' or string.find(raw, '^%-?[1-9]%d*$') ~= nil)
          end
        end
      end
    end
    r.bucket = b

    if r.permits > 0 then
      if b.value - b.spent < r.permits then
        local wait
        if not b.clear then
          if wait_for == nil then helpers() end
          wait = wait_for(i, r.kind, r.pkey, b.skip, r.permits + b.spent - b.value, r.interval, b.spent)
          if wait == nil then
            -- value and log disagree (permits lost): the log is the authority, and the
            -- rebuilt value is written whole (a DECRBY would spend from the stale one)
            if rebuild_from_log == nil then helpers() end
            b.value, b.dirty, b.counted = r.rate - rebuild_from_log(i, r.kind, r.pkey, b.skip), true, false
            if b.value - b.spent < r.permits then
              wait = wait_for(i, r.kind, r.pkey, b.skip, r.permits + b.spent - b.value, r.interval, b.spent)
                or r.interval
            end
          end
        end
        if wait ~= nil then
          if refused == 0 then refused = i end
          if wait > retry then retry = wait end
        end
      end
      b.spent = b.spent + r.permits
    end
  end
end

local probe = true
for i = 1, nrules do
  if rules[i].permits > 0 then probe = false end
end

-- Phase 3, commit (a call that only asks what is available writes nothing).
local granted = refused == 0
if check_reserved then check_reserved(ARGV[2 + 7 * nrules]) end
if not probe then
  local score = now == caller_now and ARGV[1] ~= '' and ARGV[1] or string.format('%d', now)
  for i = 1, nrules do
    local r = rules[i]
    if r.tb then
      -- the refilled state, less what a grant took; gone when full and cold again
      if granted then
        take_tokens(r, r.permits)
        local reserved = ARGV[2 + 7 * nrules]
        if reserved and r.permits > 0 then
          local j, id = 0, nil
          for each in string.gmatch(reserved .. ',', '([^,]*),') do
            j = j + 1
            if j == i then id = each break end
          end
          if id and id ~= '' then open_segment(r, now, id) end
        end
      end
      local a = 1 + 7 * (i - 1)
      store_tokens(r, r.bkey, ARGV[a + 4], ARGV[a + 5], ARGV[a + 7], caller_now)
    elseif r.write then
      local a = 1 + 7 * (i - 1)
      redis.call('hset', r.name, 'rate', ARGV[a + 4], 'interval', ARGV[a + 5], 'type', ARGV[a + 6],
        'keepAliveTime', ARGV[a + 7])
    end
    local b = r.bucket
    if b == r then
      if b.clear then
        redis.call('del', KEYS[r.k + 2], KEYS[r.k + 3], KEYS[r.k + 4], KEYS[r.k + 5])
      elseif b.skip > 0 then
        redis.call('zremrangebyrank', r.pkey, '0', string.format('%d', b.skip - 1))
      end
    end
  end
  for i = 1, nrules do
    local r = rules[i]
    if not r.tb then
      local b = r.bucket
      if granted then
        redis.call('zadd', r.pkey, score, r.member)
      end
      if b == r then
        if granted and b.counted then
          -- numbers given to redis.call are printed as floats: pass text where there is
          redis.call('decrby', r.vkey, b.spent == r.permits and ARGV[1 + 7 * (i - 1) + 1] or string.format('%d', b.spent))
        elseif granted then
          redis.call('set', r.vkey, string.format('%d', b.value - b.spent), 'keepttl')
        elseif b.dirty then
          redis.call('set', r.vkey, string.format('%d', b.value), 'keepttl')
        end
      end
      ttl_rule(r.name, r.vkey, r.pkey, r.keep_text, r.interval)
    end
  end
end

-- Phase 4, reply.
local reply
if nrules == 1 and not rules[1].replaced and not rules[1].tb then
  -- one rule: the reply built whole
  local b = rules[1].bucket
  local left = granted and b.value - b.spent or b.value
  reply = { 1, 0, 0, now, left > 0 and left or 0, rules[1].write and 1 or 0, tag }
  if not granted then
    reply[1], reply[2], reply[3] = 0, refused, retry
  end
  return reply
end
reply = { granted and 1 or 0, refused, granted and 0 or retry, now }
for i = 1, nrules do
  local r = rules[i]
  local left
  if r.tb then
    left = idiv(r.units, r.interval) -- taken in phase 3
    reply[#reply + 1] = left > 0 and left or 0
    reply[#reply + 1] = r.flag
  else
    left = r.bucket.value
    if granted then
      left = left - r.bucket.spent
    end
    reply[#reply + 1] = left > 0 and left or 0
    reply[#reply + 1] = r.write and (r.changed and 2 or 1) or 0
  end
end
for i = 1, nrules do
  local old = rules[i].replaced
  if old then
    reply[#reply + 1] = tonumber(old[1])
    reply[#reply + 1] = tonumber(old[2])
    reply[#reply + 1] = tonumber(old[3])
    reply[#reply + 1] = old[4] and tonumber(old[4]) or 0
  end
end
reply[#reply + 1] = tag
return reply
