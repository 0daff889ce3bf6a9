-- lib/bucket.lua: a token bucket's arithmetic, and its pending reservations' segments.
-- Part of: acquire, tokens, reset, settle
-- Twin in Rust: runtime/src/algorithm/bucket.rs (function for function: read_bucket,
--   plan_tokens, token_cost, take_tokens, store_tokens; idiv and cdiv are Rust's
--   integer divisions there) and runtime/src/algorithm/segments.rs (read_segments,
--   peak, open_segment, settle_segment, close_segment, segments_text, and the prune in
--   store_tokens)
--
-- A bucket is one string, "rate:interval:burst:units:at" or, with a warm-up,
-- "rate:interval:burst:units:at:warmup:cold": interval and warmup in ms, units in
-- 1/interval of a token (so refilling adds `rate` per ms and every number stays an
-- exact integer), at the last refill in epoch ms, cold its coldness in the same units
-- (from 0, warm, up to warmup * rate). A missing bucket is a full, cold one. Refill a
-- full bucket cannot hold adds to its coldness; each permit taken takes its units off
-- it; above half the maximum a permit costs up to 3 tokens (linearly), and a grant
-- needs only the permits' plain tokens, so the extra cost may leave units below zero,
-- a debt later callers wait out. A settle charging what a call used beyond its estimate
-- (settle.lua) may leave a debt too, down to DEBT_FLOOR units.
--
-- While reservations of the bucket are pending, its text ends with "|" and their
-- segments, "at.room.id[.id...]" comma separated, oldest first (at most
-- MOST_SEGMENTS): each opened by a reservation's grant at `at`, holding the least room
-- (capacity less units, at most the capacity) the bucket had at its peaks from that
-- grant until the next segment opened, less what later settles gave back, and the
-- ids of its grants not settled yet (a merged segment's, several). A take updates the last segment with
-- the room just before it; a settle gives back at most the least room of its grant's
-- segment and every later one (settle.lua). Segments older than the time an empty
-- bucket takes to fill are dropped when the bucket is stored, and all of them when
-- its config changes or it goes. tokens_one.lua reads no bucket holding them.
--
-- The helpers are made by bucket_helpers() on the paths that use them: a closure
-- costs on every call that makes it.

local idiv, cdiv, read_bucket, plan_tokens, token_cost, take_tokens, store_tokens
local open_segment, settle_segment, close_segment
local COLD_STEPS = 65536 -- twin: COLD_STEPS in algorithm/bucket.rs (held equal by a test)
local DEBT_FLOOR = -4503599627370496 -- -2^52; twin: DEBT_FLOOR in algorithm/bucket.rs
local MOST_SEGMENTS = 16 -- twin: MOST_SEGMENTS in algorithm/segments.rs (held equal by a test)
local MOST_GRANTS = 128 -- twin: MOST_GRANTS in algorithm/segments.rs (held equal by a test)
local MOST_TEXT = 4096 -- twin: MOST_TEXT in algorithm/segments.rs (held equal by a test)

local function bucket_helpers()
  -- floor(a / b) and ceil(a / b) of integers below 2^53 in size (b > 0), exactly: the
  -- division of doubles can round across an integer.
  idiv = function(a, b)
    local q = math.floor(a / b)
    if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
    return q
  end
  cdiv = function(a, b)
    local q = idiv(a, b)
    if q * b < a then q = q + 1 end
    return q
  end

  -- The room of a bucket of `cap` units holding `units`, at most its capacity.
  local function room_of(cap, units)
    local room = cap - units
    if room < 0 then return 0 elseif room > cap then return cap end
    return room
  end

  -- The segments stored as `text` for a bucket of `cap` units; nil when they are not
  -- a list this code wrote (at most MOST_TEXT bytes, read only then; times in order,
  -- rooms up to `cap`, at most MOST_SEGMENTS and MOST_GRANTS grant ids).
  local function read_segments(text, cap)
    if #text > MOST_TEXT then return nil end
    local segs, last, ids = {}, -1, 0
    for part in string.gmatch(text .. ',', '([^,]*),') do
      local numbers = {}
      for digits in string.gmatch(part .. '.', '([^.]*)%.') do
        -- (compared as text past 15 digits: a double rounds 2^53 + 1 to 2^53)
        if not string.find(digits, '^%d+$') or #digits > 16 or (#digits == 16 and digits > '9007199254740992') then
          return nil
        end
        numbers[#numbers + 1] = tonumber(digits)
      end
      if #numbers < 3 or numbers[2] > cap or numbers[1] < last then return nil end
      local grants = {}
      for j = 3, #numbers do
        if numbers[j] == 0 then return nil end
        grants[#grants + 1] = numbers[j]
      end
      ids = ids + #grants
      last = numbers[1]
      segs[#segs + 1] = { at = numbers[1], room = numbers[2], grants = grants }
    end
    if #segs > MOST_SEGMENTS or ids > MOST_GRANTS then return nil end
    return segs
  end

  -- peak: the last segment's least room, at a peak of `room`.
  local function peak(segs, room)
    local last = segs[#segs]
    if last and room < last.room then last.room = room end
  end

  -- The pending reservation's grant `id` decided at `at`, on the planned bucket `r` it
  -- took from: a segment of its own, at `at` or the last one's time when later (a
  -- clock behind it); past MOST_SEGMENTS the two oldest merge; past MOST_GRANTS the
  -- oldest grant is forgotten (a segment left without one dropped).
  open_segment = function(r, at, id)
    local segs = r.segs or {}
    r.segs = segs
    local last = segs[#segs]
    if last and last.at > at then at = last.at end
    segs[#segs + 1] = { at = at, room = room_of(r.burst * r.interval, r.units), grants = { id } }
    if #segs > MOST_SEGMENTS then
      local second = table.remove(segs, 2)
      for _, g in ipairs(second.grants) do segs[1].grants[#segs[1].grants + 1] = g end
      if second.room < segs[1].room then segs[1].room = second.room end
    end
    local ids = 0
    for k = 1, #segs do ids = ids + #segs[k].grants end
    if ids > MOST_GRANTS then
      table.remove(segs[1].grants, 1)
      if #segs[1].grants == 0 then table.remove(segs, 1) end
    end
  end

  -- The settle of grant `id` on the planned bucket `r` (a peak now): its segment's
  -- index (the first holding it) and the least room of it and every later one; nil
  -- when it has none.
  settle_segment = function(r, id)
    local segs = r.segs
    if not segs then return nil end
    peak(segs, room_of(r.burst * r.interval, r.units))
    for k = 1, #segs do
      for _, g in ipairs(segs[k].grants) do
        if g == id then
          local bound = segs[k].room
          for j = k + 1, #segs do
            if segs[j].room < bound then bound = segs[j].room end
          end
          return k, bound
        end
      end
    end
    return nil
  end

  -- Grant `id` of segment k settled, giving back `back` units: off its room and every
  -- later one's; merged into the one before, or dropped when first, once none of its
  -- grants is pending.
  close_segment = function(r, k, id, back)
    local segs = r.segs
    for j = k, #segs do
      segs[j].room = math.max(segs[j].room - back, 0)
    end
    local segment = segs[k]
    for j, g in ipairs(segment.grants) do
      if g == id then table.remove(segment.grants, j) break end
    end
    if #segment.grants == 0 then
      table.remove(segs, k)
      if k > 1 and segment.room < segs[k - 1].room then segs[k - 1].room = segment.room end
    end
  end

  -- The bucket stored as `raw`, as numbers; nil when it is not one this code wrote.
  read_bucket = function(raw)
    local body, segments = raw, nil
    local bar = string.find(raw, '|', 1, true)
    if bar then body, segments = string.sub(raw, 1, bar - 1), string.sub(raw, bar + 1) end
    local r, i, b, u, at, w, c = string.match(body, '^(%d+):(%d+):(%d+):(%-?%d+):(%d+)$')
    if r == nil then
      r, i, b, u, at, w, c = string.match(body, '^(%d+):(%d+):(%d+):(%-?%d+):(%d+):(%d+):(%d+)$')
      if r == nil then return nil end
    end
    local s = { rate = tonumber(r), interval = tonumber(i), burst = tonumber(b), units = tonumber(u),
      at = tonumber(at), warmup = tonumber(w or '0'), cold = tonumber(c or '0'), text = raw }
    local cap = s.burst * s.interval
    if s.rate < 1 or s.interval < 1 or s.burst < 1 or cap > 9007199254740992
        or s.at > 9007199254740992 or s.warmup * s.rate > 35184372088832 or s.cold > s.warmup * s.rate
        or (s.warmup > 0 and 4 * cap > 9007199254740992)
        or s.units < DEBT_FLOOR or s.units > cap then
      return nil
    end
    if segments then
      s.segs = read_segments(segments, cap)
      if not s.segs then return nil end
    end
    return s
  end

  -- Rule `r`'s bucket at `now`: its stored state `r.stored` (false: missing, so full
  -- and cold) refilled at its own rate (units up to its capacity, the rest to its
  -- coldness, up to its maximum), then carried over when the config differs: whole
  -- tokens and whole tokens of coldness, each up to the new maximum (a debt
  -- forgiven); a bucket at rest (full and cold) stays at rest. Sets r.units, r.cold,
  -- r.at (the refill time to store) and r.flag (0 kept, 1 created, 2 changed).
  plan_tokens = function(r, now)
    local cap, coldest = r.burst * r.interval, r.warmup * r.rate
    r.at = now
    local s = r.stored
    if not s then
      r.units, r.cold, r.flag = cap, coldest, 1
      return
    end
    local units, cold = s.units, s.cold
    local ocap, ocoldest = s.burst * s.interval, s.warmup * s.rate
    if now > s.at then
      local added, room = (now - s.at) * s.rate, ocap - units
      if added <= room then
        units = units + added
      else
        if added - math.max(room, 0) >= ocoldest - cold then cold = ocoldest else cold = cold + added - math.max(room, 0) end
        units = math.max(ocap, units)
      end
    else
      r.at = s.at
    end
    if s.rate == r.rate and s.interval == r.interval and s.burst == r.burst and s.warmup == r.warmup then
      r.units, r.cold, r.flag, r.segs = units, cold, 0, s.segs
      return
    end
    r.flag = 2
    if units >= ocap and cold >= ocoldest then
      r.units, r.cold = cap, coldest
      return
    end
    local whole = idiv(units, s.interval)
    r.units = math.min(math.max(whole, 0) * r.interval, cap)
    r.cold = math.min(idiv(cold, s.interval) * r.interval, coldest)
  end

  -- The units `permits` cost at coldness r.cold: their tokens and, above half the
  -- maximum coldness, up to twice as many again (in COLD_STEPS steps, computed exactly
  -- by long division in doubles).
  token_cost = function(r, permits)
    local need = permits * r.interval
    local coldest = r.warmup * r.rate
    local half = idiv(coldest, 2)
    if r.cold <= half then return need end
    local span = coldest - half
    local rest = (r.cold - half) * 256
    local steps = idiv(rest, span)
    rest = (rest - steps * span) * 256
    steps = steps * 256 + idiv(rest, span)
    local whole = idiv(need, COLD_STEPS)
    return need + 2 * whole * steps + cdiv(2 * (need - whole * COLD_STEPS) * steps, COLD_STEPS)
  end

  -- Takes `permits` from a planned bucket: their cost off its units, their tokens off
  -- its coldness.
  take_tokens = function(r, permits)
    if permits == 0 then return end
    if r.segs then peak(r.segs, room_of(r.burst * r.interval, r.units)) end
    r.units = r.units - token_cost(r, permits)
    r.cold = math.max(r.cold - permits * r.interval, 0)
  end

  -- Writes a planned bucket under `key` (texts: the rule's own arguments), with a
  -- TTL ending when it is full and cold again (at least 1 ms on).
  store_tokens = function(r, key, rate, interval, burst, caller_now)
    local short = r.burst * r.interval - r.units + r.warmup * r.rate - r.cold
    local ttl = r.at + math.max(cdiv(short, r.rate), 1) - caller_now
    local text = rate .. ':' .. interval .. ':' .. burst .. ':' .. string.format('%d:%d', r.units, r.at)
    if r.warmup > 0 then text = text .. string.format(':%d:%d', r.warmup, r.cold) end
    local segs = r.segs
    if segs then
      -- those older than an empty bucket takes to fill dropped
      local horizon = cdiv(r.burst * r.interval, r.rate)
      while segs[1] and segs[1].at + horizon <= r.at do table.remove(segs, 1) end
      local parts = {}
      for k = 1, #segs do
        local numbers = { string.format('%d.%d', segs[k].at, segs[k].room) }
        for j, g in ipairs(segs[k].grants) do numbers[j + 1] = string.format('%d', g) end
        parts[k] = table.concat(numbers, '.')
      end
      if #parts > 0 then text = text .. '|' .. table.concat(parts, ',') end
    end
    redis.call('set', key, text, 'px', string.format('%d', math.max(ttl, 1)))
  end
end

