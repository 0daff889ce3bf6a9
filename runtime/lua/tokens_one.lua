-- tokens_one.lua: the usual call of token buckets, one rule without a warm-up whose
-- bucket is missing or holds the rule's own config, decided on locals. It comes after
-- lib/call_time.lua (caller_now, REORDER) and before tokens.lua (see the recipe
-- there), takes tokens.lua's KEYS and ARGV, and runs first so that the usual call
-- makes no closure and no table of its own.
-- Part of: tokens
-- Twin in Rust: runtime/src/backend/memory/usual.rs (decide_tokens_one)
-- The same decision as tokens.lua's phases, step for step (the differential
-- test runs both), under its Rust twin's step names: load_tokens, settle_time,
-- plan_tokens, take, commit, reply. Any other call leaves this block before writing
-- anything.
--
-- Replies: decided at the caller's time (ARGV[1]) on a stored bucket, a grant is the
-- integer tokens left plus one, times 2^20, plus the call's tag (>= 2^20) and a
-- refusal with no whole token left is minus the wait (in ms) times 2^20 plus the tag
-- (< 0), as in acquire_plain.lua; any other outcome is tokens.lua's reply for one rule, which ends
-- with the tag. Numbers are read as `s + 0` and written with string.format, as in
-- acquire_plain.lua.

-- The deepest debt a settle's excess leaves a bucket in, in units (lib/bucket.lua's
-- DEBT_FLOOR, which comes after this file; the_scripts_constants_are_these in
-- runtime/src/algorithm/mod.rs holds the two equal).
local LOWEST = -4503599627370496

-- The call's tag, 0 to 2^20 - 1 (tokens.lua's ARGV after the rules': three bytes,
-- their low twenty bits; the call's time modulo 2^20 when it is missing), as in
-- acquire_plain.lua.
local tag
do
  local high, mid, low = string.byte(ARGV[2 + 6 * #KEYS] or '', 1, 3)
  tag = low and high % 16 * 65536 + mid * 256 + low or caller_now % 1048576
end

do
  local caller_time, floor, max = ARGV[1] ~= '', math.floor, math.max
  -- (a reservation's grant, which opens a segment, and a bucket holding segments, whose
  -- text the pattern below does not read: tokens.lua)
  if #KEYS == 1 and ARGV[6] == '0' and ARGV[9] == nil then
    local raw = redis.call('get', KEYS[1])
    local rate_s, interval_s, burst_s = ARGV[3], ARGV[4], ARGV[5]
    -- load_tokens: the stored config is the rule's own when the text starts with it
    local config = rate_s .. ':' .. interval_s .. ':' .. burst_s .. ':'
    -- (each text read as a number once: a reading costs more than the arithmetic)
    local permits, rate, interval = ARGV[2] + 0, rate_s + 0, interval_s + 0
    local cap = burst_s * interval
    local u, last
    if raw and string.find(raw, config, 1, true) == 1 then
      -- (below zero: a debt a settle's excess left, down to lib/bucket.lua's DEBT_FLOOR)
      local tokens, at = string.match(raw, '^(%-?%d+):(%d+)$', #config + 1)
      -- (numbers of 16 digits and more, which a double may round: tokens.lua reads
      -- them as text; more tokens than the bucket holds or a debt below the floor,
      -- which tokens.lua refuses; a debt further than 2^53 below the capacity, whose
      -- room the differences below would round, which tokens.lua reads at that floor)
      if at and #at <= 15 and (#tokens <= 15 or string.byte(tokens) == 45) then
        tokens = tokens + 0
        if tokens <= cap and tokens >= LOWEST and tokens >= cap - 9007199254740992 then
          u, last = tokens, at + 0
        end
      end
    end
    if u or not raw then
      local now = caller_now
      if permits * interval > cap then
        error('redlimit:permits_exceed_rate:1 ' .. ARGV[2] .. ' ' .. burst_s
          .. ' Requested permits amount cannot exceed the bucket', 0)
      end
      local at, flag = now, 1
      if u then
        flag = 0
        -- settle_time: overtaken by a slightly later refill, decided at that time
        if last > now and last - now <= REORDER then now = last end
        -- plan_tokens: refilled to `now`
        if now > last then
          if (now - last) * rate >= cap - u then u = max(cap, u) else u = u + (now - last) * rate end
        else
          at = last
        end
      else
        u = cap
      end
      -- Three divisions below (the wait, the TTL, the tokens left) are lib/bucket.lua's
      -- idiv, floor(a / b) of integers below 2^53 exactly (the division of doubles can
      -- round across an integer), and the first two its cdiv, written out: a helper
      -- function cost this call 1.5k of its 49k instructions.
      -- take: enough tokens, or the exact wait until there are
      local need = permits * interval
      local granted = u >= need
      local wait = 0
      if not granted then
        local short = need - u
        wait = floor(short / rate)
        if wait * rate > short then wait = wait - 1 elseif (wait + 1) * rate <= short then wait = wait + 1 end
        if wait * rate < short then wait = wait + 1 end
      elseif permits > 0 then
        u = u - need
      end
      -- A refusal writes nothing: refilling from the stored time later gives what
      -- refilling now and again later would (the refill is linear, capped at `cap`),
      -- and the key's TTL (until full) still holds.
      -- commit: the time until full again, at least 1 ms, is the key's TTL
      if permits > 0 and granted then
        local short = cap - u
        local full = floor(short / rate)
        if full * rate > short then full = full - 1 elseif (full + 1) * rate <= short then full = full + 1 end
        if full * rate < short then full = full + 1 end
        local ttl = at + max(full, 1) - caller_now
        if ttl < 1 then ttl = 1 end
        local stamp = at == caller_now and caller_time and ARGV[1] or string.format('%d', at)
        redis.call('psetex', KEYS[1], string.format('%d', ttl), config .. string.format('%d', u) .. ':' .. stamp)
      end
      -- reply: the whole tokens left
      local left = floor(u / interval)
      if left * interval > u then left = left - 1 elseif (left + 1) * interval <= u then left = left + 1 end
      if left < 0 then left = 0 end
      local at_caller_time = caller_time and now == caller_now and flag == 0
      -- (below 2^33, an integer times 2^20 is exact in a Lua number)
      if granted then
        if at_caller_time and left < 8589934591 then return (left + 1) * 1048576 + tag end
        return { 1, 0, 0, now, left, flag, tag }
      end
      if at_caller_time and left == 0 and wait < 8589934592 then return -(wait * 1048576 + tag) end
      return { 0, 1, wait, now, left, flag, tag }
    end
  end
end
