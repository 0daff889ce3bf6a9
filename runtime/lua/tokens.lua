-- tokens.lua: decide a call whose rules are all token buckets, all or nothing. The
-- same decision acquire.lua makes for token-bucket rules, with lib/bucket.lua's helpers
-- (ahead of this file), without the sliding window's machinery. Its twin in Rust takes
-- the same phases under the same names (Phase 1 load_tokens, settle_time, Phase 2
-- plan_tokens and take, Phase 3 commit, Phase 4 reply).
--
-- Recipe: lib/clock.lua, lib/call_time.lua, tokens_one.lua, lib/quote.lua, lib/bucket.lua, tokens.lua
-- Twin in Rust: runtime/src/backend/memory/decide.rs (the phases decide token-bucket
--   rules too; the arithmetic: runtime/src/algorithm/bucket.rs)
-- tokens_one.lua decides the usual call (and may answer it with an integer).
--
-- KEYS, per rule: rule i's key j is KEYS[1*(i-1)+j]:
--   1 bucket: {NAME}:bucket, or {NAME}:bucket:ID per client (the layout is in
--     lib/bucket.lua)
-- ARGV:
--   1 now: epoch ms; empty for the server's clock
-- ARGV, per rule: rule i's argument j is ARGV[1+6*(i-1)+j]:
--   1 permits: 0 asks and writes nothing
--   2 rate: the rate
--   3 interval: in ms
--   4 burst: the bucket's size in tokens
--   5 warmup: warm-up in ms ("0": none)
--   6 type: "2" overall, "3" per_client (for the reply)
-- ARGV, after the rules': ARGV[1+6*r+j] for r rules:
--   1 tag: the call's number modulo 2^20, that its reply carries: three bytes, high
--     first, their low twenty bits (the call's time modulo 2^20 when it is missing)
--   2 reserved: each rule's grant id, comma separated, when its grant is a pending
--     reservation's, which opens a segment of its bucket under it (lib/bucket.lua),
--     else empty; missing when none is
-- Returns what acquire.lua returns: {granted, first refusing rule (1-based, 0),
--   wait in ms, the time decided at, then per rule tokens left and 0 (kept),
--   1 (created) or 2 (changed), then each changed rule's old rate, interval, type,
--   burst, then the call's tag}.

-- caller_now, the call's time, and REORDER are lib/call_time.lua's.
local now = caller_now
local n = #KEYS
local LIMIT = 9007199254740992

-- Phase 1, load_tokens: each bucket as stored (false: missing, so full and cold).
bucket_helpers()
local rules = {}
local newest = now
for i = 1, n do
  local a = 1 + 6 * (i - 1)
  local r = { permits = tonumber(ARGV[a + 1]), rate = tonumber(ARGV[a + 2]), interval = tonumber(ARGV[a + 3]),
    burst = tonumber(ARGV[a + 4]), warmup = tonumber(ARGV[a + 5]), stored = false }
  local raw = redis.call('get', KEYS[i])
  if raw then
    r.stored = read_bucket(raw)
    if not r.stored then
      local role = ARGV[a + 6] == '3' and 'client_bucket' or 'bucket'
      error('redlimit:bad_bucket:' .. i .. ' ' .. role .. ' ' .. quoted(raw), 0)
    end
    if r.stored.at > newest then newest = r.stored.at end
  end
  if r.permits > r.burst then
    error('redlimit:permits_exceed_rate:' .. i .. ' ' .. ARGV[a + 1] .. ' ' .. ARGV[a + 4]
      .. ' Requested permits amount cannot exceed the bucket', 0)
  end
  rules[i] = r
end
-- settle_time: a call overtaken by one that refilled a bucket slightly later is
-- decided then.
if newest - now <= REORDER then now = newest end

-- Phase 2, plan_tokens and take: the tokens at `now`, and whether each rule has enough.
local refused, retry, probe = 0, 0, true
for i = 1, n do
  local r = rules[i]
  plan_tokens(r, now)
  if r.permits > 0 then
    probe = false
    local need = r.permits * r.interval
    if r.units < need then
      local wait = cdiv(need - r.units, r.rate)
      if refused == 0 then refused = i end
      if wait > retry then retry = wait end
    end
  end
end

-- Phase 3, commit: each bucket refilled, less what a grant took, with a TTL that ends
-- when it is full and cold again (a missing bucket is a full, cold one); Phase 4,
-- reply, is built beside it (tokens left, then each changed rule's old config).
local granted = refused == 0
local reply = { granted and 1 or 0, refused, granted and 0 or retry, now }
local reserved = {}
check_reserved(ARGV[3 + 6 * n])
if ARGV[3 + 6 * n] then
  for id in string.gmatch(ARGV[3 + 6 * n] .. ',', '([^,]*),') do reserved[#reserved + 1] = id end
end
for i = 1, n do
  local a = 1 + 6 * (i - 1)
  local r = rules[i]
  if granted then
    take_tokens(r, r.permits)
    if reserved[i] and reserved[i] ~= '' and r.permits > 0 then open_segment(r, now, reserved[i]) end
  end
  -- (the refusal of a lone call without a warm-up on a bucket kept with its config
  -- writes nothing, as tokens_one.lua: a reservation's, or one on a bucket with
  -- reservations pending, comes here)
  if not probe and (granted or n > 1 or r.warmup > 0 or r.flag ~= 0) then
    store_tokens(r, KEYS[i], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], caller_now)
  end
  local left = idiv(r.units, r.interval)
  reply[#reply + 1] = left > 0 and left or 0
  reply[#reply + 1] = r.flag
end
for i = 1, n do
  local r = rules[i]
  if r.flag == 2 then
    local a = 1 + 6 * (i - 1)
    reply[#reply + 1] = r.stored.rate
    reply[#reply + 1] = r.stored.interval
    reply[#reply + 1] = tonumber(ARGV[a + 6])
    reply[#reply + 1] = r.stored.burst
  end
end
reply[#reply + 1] = tag
return reply
