-- acquire.lua: decide one or more rate-limit rules, all or nothing, in one call.
--
-- KEYS, five per rule (rule i uses KEYS[5*(i-1)+1 .. 5*(i-1)+5]), in Redisson's order:
--   1 NAME                config hash (rate, interval, type, keepAliveTime)
--   2 {NAME}:value        available permits, mode overall
--   3 {NAME}:value:ID     available permits, mode per_client
--   4 {NAME}:permits      grant log, mode overall
--   5 {NAME}:permits:ID   grant log, mode per_client
-- ARGV:
--   1 now, epoch milliseconds; empty for the server's clock
--   then seven per rule (rule i uses ARGV[1+7*(i-1)+1 .. 1+7*(i-1)+7]):
--   1 permits; 0 asks what is available and writes nothing
--   2 log member: 1 byte id length L, L id bytes, permits as 4-byte little-endian
--   3 "1": the rule owns the config (create it when missing, overwrite it when it
--      differs, keeping the window); "0": use the stored config as it is
--   4 rate, 5 interval in ms, 6 type ("0" overall, "1" per_client),
--   7 keepAliveTime in ms (4..7 are read only when 3 is "1")
-- Returns {granted (1|0), first refusing rule (1-based, 0 when granted),
--          wait in ms until that refusal would pass (0 when granted),
--          the time the call was decided at (now, or a slightly later grant's time),
--          then per rule: permits left, and 0 (config kept), 1 (created) or 2 (changed),
--          then for each changed rule in order, the config it replaced:
--          rate, interval, type, keepAliveTime}.
-- Errors start with "redlimit:<code>:<rule>"; the caller names the key.
--
-- All reads and checks come first and every write after them, so an error leaves
-- the state untouched, and a refusal by any rule spends no permit of any rule.

-- An empty time asks for the server's clock (Redis TIME) instead of the caller's.
local function clock(arg)
  if arg == '' then
    local t = redis.call('time')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return tonumber(arg)
end

local now = clock(ARGV[1])
local nrules = #KEYS / 5

local function fail(code, rule, text)
  error({ err = 'redlimit:' .. code .. ':' .. rule .. ' ' .. text })
end

-- Runs a read command; a key of the wrong type becomes an error naming its role.
local function read(rule, role, ...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then
    fail('wrong_type', rule, role .. ' ' .. reply.err)
  end
  return reply
end

-- A decimal integer as Redisson writes it, or nil.
local function integer(raw)
  if type(raw) ~= 'string' or not string.match(raw, '^%-?%d+$') then
    return nil
  end
  return tonumber(raw)
end

local LIMIT = 9007199254740992 -- 2^53: doubles count exactly up to here

-- A number as Redisson stores it: a decimal integer, stated rather than left to the
-- conversion of Lua numbers in redis.call.
local function int(n)
  return string.format('%d', n)
end

-- Roles name the key in errors: "permits" or "client_permits", and so on.
local prole, vrole = 'permits', 'value'

local function permits_of(rule, member)
  local len = string.byte(member, 1)
  if len == nil or #member ~= len + 5 then
    fail('bad_member', rule, prole .. ' member of ' .. #member .. ' bytes does not decode')
  end
  local a, b, c, d = string.byte(member, len + 2, len + 5)
  return a + b * 256 + c * 65536 + d * 16777216
end

-- Sum of the permits in the log after its first `skip` entries (the released ones).
local function live_sum(rule, key, skip)
  local total = 0
  for _, member in ipairs(redis.call('zrange', key, skip, -1)) do
    total = total + permits_of(rule, member)
  end
  return total
end

-- Time until `need` permits of the live log have left the window, or nil when the
-- live log holds fewer than `need` permits (plus the `pending` ones this call takes).
local function wait_for(rule, key, skip, need, interval, pending)
  local acc = 0
  local start = skip
  while true do
    local chunk = redis.call('zrange', key, start, start + need - 1, 'withscores')
    if #chunk == 0 then
      break
    end
    for j = 1, #chunk, 2 do
      acc = acc + permits_of(rule, chunk[j])
      if acc >= need then
        return tonumber(chunk[j + 1]) + interval - now
      end
    end
    start = start + #chunk / 2
  end
  if acc + pending >= need then
    return interval
  end
  return nil
end

local function parse_config(rule, raw)
  local rate, interval, kind = integer(raw[1]), integer(raw[2]), raw[3]
  local keep = raw[4] == false and 0 or integer(raw[4])
  if rate == nil or rate < 1 or rate > LIMIT then fail('bad_config', rule, 'rate=' .. tostring(raw[1])) end
  if interval == nil or interval < 1 or interval > LIMIT then fail('bad_config', rule, 'interval=' .. tostring(raw[2])) end
  if kind ~= '0' and kind ~= '1' then fail('bad_config', rule, 'type=' .. tostring(raw[3])) end
  if keep == nil or keep < 0 or keep > LIMIT then fail('bad_config', rule, 'keepAliveTime=' .. tostring(raw[4])) end
  return rate, interval, kind, keep
end

-- Phase 1: read and decide, writing nothing.
-- First each rule's config and keys, and the newest grant of its log.
local rules = {}
local newest = now
for i = 1, nrules do
  local k = 5 * (i - 1)
  local a = 1 + 7 * (i - 1)
  local r = { name = KEYS[k + 1], permits = tonumber(ARGV[a + 1]), member = ARGV[a + 2] }
  local stored = read(i, 'config', 'hmget', r.name, 'rate', 'interval', 'type', 'keepAliveTime')
  local initialized = stored[1] ~= false and stored[2] ~= false and stored[3] ~= false
  if initialized then
    r.rate, r.interval, r.old_kind, r.keep = parse_config(i, stored)
  end
  r.kind = r.old_kind
  if ARGV[a + 3] == '1' then
    local want = { ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], ARGV[a + 7] }
    if not initialized or stored[1] ~= want[1] or stored[2] ~= want[2] or stored[3] ~= want[3]
        or (stored[4] or '0') ~= want[4] then
      r.write_config = want
      r.changed = initialized
      r.replaced = stored
      r.rate, r.interval, r.kind, r.keep = tonumber(want[1]), tonumber(want[2]), want[3], tonumber(want[4])
    end
  elseif not initialized then
    fail('not_initialized', i, 'RateLimiter is not initialized')
  end
  if r.permits > r.rate then
    fail('permits_exceed_rate', i, string.format('%d %d ', r.permits, r.rate)
      .. 'Requested permits amount cannot exceed defined rate')
  end
  r.k = k
  if r.kind == '1' then
    r.vkey, r.pkey, r.vrole, r.prole = KEYS[k + 3], KEYS[k + 5], 'client_value', 'client_permits'
  else
    r.vkey, r.pkey, r.vrole, r.prole = KEYS[k + 2], KEYS[k + 4], 'value', 'permits'
  end
  local last = read(i, r.prole, 'zrange', r.pkey, -1, -1, 'withscores')
  if last[2] ~= nil and tonumber(last[2]) > newest then
    newest = tonumber(last[2])
  end
  rules[i] = r
end

-- A call whose time was taken just before another's, but which reaches Redis after
-- it, is decided at the later time: each log then stays in time order and no window
-- of its scores holds more than the rate. Clocks further apart than REORDER are skew,
-- and left as they are (see RELIABILITY.md).
local REORDER = 1000
if newest - now <= REORDER then
  now = newest
end

-- Then each bucket, once, and each rule's permits.
local buckets = {}
local refused, retry = 0, 0
for i = 1, nrules do
  local r = rules[i]
  prole, vrole = r.prole, r.vrole
  local b = buckets[r.vkey]
  if b == nil then
    b = { vkey = r.vkey, pkey = r.pkey, skip = 0, spent = 0, dirty = false }
    if r.changed and r.old_kind ~= r.kind then
      -- a change of mode starts afresh and deletes both modes' state (Redisson 4.4+)
      b.clear, b.value, b.dirty = true, r.rate, true
      b.old = { KEYS[r.k + 2], KEYS[r.k + 3], KEYS[r.k + 4], KEYS[r.k + 5] }
    else
      local raw = read(i, vrole, 'get', r.vkey)
      local stale = read(i, prole, 'zrangebyscore', r.pkey, '-inf', int(now - r.interval))
      local released = 0
      for _, member in ipairs(stale) do
        released = released + permits_of(i, member)
      end
      b.skip = #stale
      if raw == false then
        -- a missing value with a surviving log is rebuilt from the log
        b.value, b.dirty = r.rate - live_sum(i, r.pkey, b.skip), true
      else
        b.value = integer(raw)
        if b.value == nil then
          fail('bad_value', i, vrole .. ' ' .. tostring(raw))
        end
        if r.changed then
          b.value, b.dirty = r.rate - live_sum(i, r.pkey, b.skip), true
        elseif released > 0 then
          if b.value + released > r.rate then
            b.value = r.rate - live_sum(i, r.pkey, b.skip)
          else
            b.value = b.value + released
          end
          b.dirty = true
        end
      end
    end
    buckets[r.vkey] = b
  end
  r.bucket = b

  if r.permits > 0 then
    if b.value - b.spent < r.permits then
      local wait
      if not b.clear then
        wait = wait_for(i, r.pkey, b.skip, r.permits + b.spent - b.value, r.interval, b.spent)
        if wait == nil then
          -- value and log disagree (permits lost): the log is the authority
          b.value, b.dirty = r.rate - live_sum(i, r.pkey, b.skip), true
          if b.value - b.spent < r.permits then
            wait = wait_for(i, r.pkey, b.skip, r.permits + b.spent - b.value, r.interval, b.spent) or r.interval
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

local probe = true
for i = 1, nrules do
  if rules[i].permits > 0 then probe = false end
end

-- Phase 2: write (a call that only asks what is available writes nothing).
local granted = refused == 0
if not probe then
  for i = 1, nrules do
    local w = rules[i].write_config
    if w then
      redis.call('hset', rules[i].name, 'rate', w[1], 'interval', w[2], 'type', w[3], 'keepAliveTime', w[4])
    end
  end
  for _, b in pairs(buckets) do
    if b.clear then
      redis.call('del', b.old[1], b.old[2], b.old[3], b.old[4])
    elseif b.skip > 0 then
      redis.call('zremrangebyrank', b.pkey, 0, b.skip - 1)
    end
  end
  if granted then
    for i = 1, nrules do
      redis.call('zadd', rules[i].pkey, int(now), rules[i].member)
    end
  end
  for _, b in pairs(buckets) do
    if granted then
      redis.call('set', b.vkey, int(b.value - b.spent), 'keepttl')
    elseif b.dirty then
      redis.call('set', b.vkey, int(b.value), 'keepttl')
    end
  end
  -- Redisson's TTL rule: keepAliveTime on all three keys, else the config's own TTL
  for i = 1, nrules do
    local r = rules[i]
    if r.keep > 0 then
      redis.call('pexpire', r.name, r.keep)
      redis.call('pexpire', r.vkey, r.keep)
      redis.call('pexpire', r.pkey, r.keep)
    else
      local ttl = redis.call('pttl', r.name)
      if ttl > 0 then
        redis.call('pexpire', r.vkey, ttl)
        redis.call('pexpire', r.pkey, ttl)
      end
    end
  end
end

local reply = { granted and 1 or 0, refused, granted and 0 or retry, now }
for i = 1, nrules do
  local r = rules[i]
  local left = r.bucket.value
  if granted then
    left = left - r.bucket.spent
  end
  reply[#reply + 1] = math.max(0, left)
  reply[#reply + 1] = r.write_config and (r.changed and 2 or 1) or 0
end
for i = 1, nrules do
  local old = rules[i].replaced
  if rules[i].changed then
    reply[#reply + 1] = tonumber(old[1])
    reply[#reply + 1] = tonumber(old[2])
    reply[#reply + 1] = tonumber(old[3])
    reply[#reply + 1] = old[4] and tonumber(old[4]) or 0
  end
end
return reply
