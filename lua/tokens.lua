-- tokens.lua: decide a call whose rules are all token buckets, all or nothing. The
-- same decision acquire.lua makes for token-bucket rules (its load_tokens and
-- plan_tokens), without the sliding window's machinery; twin in Rust:
-- runtime/src/backend/memory/tokens.rs.
--
-- KEYS, one per rule: {NAME}:bucket, or {NAME}:bucket:ID per client; a string
--   "rate:interval:burst:tokens:at" (interval in ms, tokens in 1/interval of a token,
--   at the last refill in epoch ms).
-- ARGV: 1 now, epoch ms; empty for the server's clock; then five per rule
--   (rule i uses ARGV[1+5*(i-1)+1 .. +5]): permits (0 asks and writes nothing), rate,
--   interval in ms, burst, type ("2" overall, "3" per_client: for the reply).
-- Returns what acquire.lua returns: {granted, first refusing rule (1-based, 0),
--   wait in ms, the time decided at, then per rule tokens left and 0 (kept),
--   1 (created) or 2 (changed), then each changed rule's old rate, interval, type,
--   burst}.

local now = tonumber(ARGV[1])
if ARGV[1] == '' then
  local t = redis.call('time')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local caller_now = now
local n = #KEYS
local LIMIT = 9007199254740992

-- floor(a / b) of non-negative integers below 2^53, exactly.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- The tokens of a bucket stored as `raw` (false: missing, so full), refilled at `now`
-- and carried over to the rule's config; then the refill time to store, and what
-- happened to the config (0 kept, 1 created, 2 changed).
local function plan(raw, rate, interval, burst, now)
  local cap = burst * interval
  if not raw then return cap, now, 1 end
  local orate, ointerval, oburst, u, last = string.match(raw, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
  orate, ointerval, oburst, u, last = tonumber(orate), tonumber(ointerval), tonumber(oburst), tonumber(u), tonumber(last)
  local ocap = oburst * ointerval
  local at = now
  if now > last then
    if (now - last) * orate >= ocap - u then u = math.max(ocap, u) else u = u + (now - last) * orate end
  else
    at = last
  end
  if orate == rate and ointerval == interval and oburst == burst then return u, at, 0 end
  if u >= ocap then return cap, at, 2 end
  u = idiv(u, ointerval) * interval
  return u > cap and cap or u, at, 2
end

-- One rule whose bucket is missing or holds the rule's own config (the usual call):
-- decided on locals, without the tables the general path below keeps per rule. The
-- same decision as that path, step for step (the differential test runs both).
if n == 1 then
  local raw = redis.call('get', KEYS[1])
  local rate_s, interval_s, burst_s = ARGV[3], ARGV[4], ARGV[5]
  local u, last
  if raw then
    local r, i, b, tokens, at = string.match(raw, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
    if r == rate_s and i == interval_s and b == burst_s and tonumber(at) <= LIMIT then
      u, last = tonumber(tokens), tonumber(at)
    end
  end
  if u or not raw then
    local permits, rate, interval = tonumber(ARGV[2]), tonumber(rate_s), tonumber(interval_s)
    local cap = tonumber(burst_s) * interval
    if permits * interval > cap then
      error({ err = 'redlimit:permits_exceed_rate:1 ' .. ARGV[2] .. ' ' .. burst_s
        .. ' Requested permits amount cannot exceed the bucket' })
    end
    local at, flag = now, 1
    if u then
      flag = 0
      -- overtaken by a slightly later refill: decided at that time
      if last > now and last - now <= 1000 then now = last end
      if now > last then
        if (now - last) * rate >= cap - u then u = math.max(cap, u) else u = u + (now - last) * rate end
      else
        at = last
      end
    else
      u = cap
    end
    local need = permits * interval
    local granted = u >= need
    local wait = 0
    if not granted then
      local short = need - u
      wait = idiv(short, rate)
      if wait * rate < short then wait = wait + 1 end
    elseif permits > 0 then
      u = u - need
    end
    if permits > 0 then
      local short = cap - u
      local full = idiv(short, rate)
      if full * rate < short then full = full + 1 end
      redis.call('set', KEYS[1], rate_s .. ':' .. interval_s .. ':' .. burst_s .. ':'
        .. string.format('%d:%d', u, at), 'px', string.format('%d', math.max(at + math.max(full, 1) - caller_now, 1)))
    end
    if granted then return { 1, 0, 0, now, idiv(u, interval), flag } end
    return { 0, 1, wait, now, idiv(u, interval), flag }
  end
end

-- Phase 1, load: each bucket as stored (false: missing, so full).
local stored = {}
local newest = now
for i = 1, n do
  local a = 1 + 5 * (i - 1)
  local raw = redis.call('get', KEYS[i])
  if raw then
    local rate, interval, burst, _, at = string.match(raw, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
    if at == nil or tonumber(rate) < 1 or tonumber(interval) < 1 or tonumber(burst) < 1
        or tonumber(burst) * tonumber(interval) > LIMIT or tonumber(at) > LIMIT then
      local role = ARGV[a + 5] == '3' and 'client_bucket' or 'bucket'
      error({ err = 'redlimit:bad_bucket:' .. i .. ' ' .. role .. ' ' .. raw })
    end
    if tonumber(at) > newest then newest = tonumber(at) end
  end
  stored[i] = raw
  if tonumber(ARGV[a + 1]) > tonumber(ARGV[a + 4]) then
    error({ err = 'redlimit:permits_exceed_rate:' .. i .. ' ' .. ARGV[a + 1] .. ' ' .. ARGV[a + 4]
      .. ' Requested permits amount cannot exceed the bucket' })
  end
end
-- A call overtaken by one that refilled a bucket slightly later is decided then.
if newest - now <= 1000 then now = newest end

-- Phase 2, plan and take: the tokens at `now`, and whether each rule has enough.
local units, ats, flags, replaced = {}, {}, {}, false
local refused, retry, probe = 0, 0, true
for i = 1, n do
  local a = 1 + 5 * (i - 1)
  local permits, rate, interval, burst = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]),
    tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local u, at, flag = plan(stored[i], rate, interval, burst, now)
  if flag == 2 then
    local orate, ointerval, oburst = string.match(stored[i], '^(%d+):(%d+):(%d+):')
    replaced = replaced or {}
    replaced[#replaced + 1] = { tonumber(orate), tonumber(ointerval), tonumber(ARGV[a + 5]), tonumber(oburst) }
  end
  units[i], ats[i], flags[i] = u, at, flag
  if permits > 0 then
    probe = false
    local need = permits * interval
    if u < need then
      local short = need - u
      local wait = idiv(short, rate)
      if wait * rate < short then wait = wait + 1 end
      if refused == 0 then refused = i end
      if wait > retry then retry = wait end
    end
  end
end

-- Phase 3, commit: each bucket refilled, less what a grant took, with a TTL that ends
-- when it is full again (a missing bucket is a full one).
local granted = refused == 0
local reply = { granted and 1 or 0, refused, granted and 0 or retry, now }
for i = 1, n do
  local a = 1 + 5 * (i - 1)
  local interval, rate = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 2])
  local u = units[i] - (granted and tonumber(ARGV[a + 1]) * interval or 0)
  if not probe then
    local short = tonumber(ARGV[a + 4]) * interval - u
    local full = idiv(short, rate)
    if full * rate < short then full = full + 1 end
    redis.call('set', KEYS[i], ARGV[a + 2] .. ':' .. ARGV[a + 3] .. ':' .. ARGV[a + 4] .. ':'
      .. string.format('%d:%d', u, ats[i]), 'px', string.format('%d', math.max(ats[i] + math.max(full, 1) - caller_now, 1)))
  end
  reply[#reply + 1] = idiv(u, interval)
  reply[#reply + 1] = flags[i]
end
if replaced then
  for _, old in ipairs(replaced) do
    for f = 1, 4 do reply[#reply + 1] = old[f] end
  end
end
return reply
