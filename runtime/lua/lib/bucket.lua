-- lib/bucket.lua: a token bucket's arithmetic, and its pending reservations' segments.
-- Part of: acquire, tokens, reset, settle, refund_tokens
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
-- (settle.lua) may leave a debt too, down to DEBT_FLOOR units and to the capacity less
-- 2^53 (so that the room, capacity less units, stays within 2^53).
--
-- While reservations of the bucket are pending, its text ends with "|" and their
-- segments, "at.room.id[.id...]" comma separated, oldest first (at most
-- MOST_SEGMENTS): each opened by a reservation's grant at `at`, holding the least room
-- (capacity less units, at most the capacity) the bucket had at its peaks from that
-- grant until the next segment opened, less what later settles gave back, and the
-- ids of its grants not settled yet (a merged segment's, several). The ids, of
-- ID_DIGITS digits each, are kept as the text they are stored in, counted by its
-- length, found by plain search and never read as numbers or matched by a pattern:
-- a call on a bucket naming 128 of them reads two numbers a segment, and no byte of
-- the ids through Lua's pattern matching (which costs about 150 instructions a byte). A take updates the last segment with
-- the room just before it; a settle gives back at most the least room of its grant's
-- segment and every later one (settle.lua). Segments older than the time an empty
-- bucket takes to fill are dropped when the bucket is stored, and all of them when
-- its config changes or it goes. tokens_one.lua reads no bucket holding them.
--
-- The helpers are made by bucket_helpers() on the paths that use them: a closure
-- costs on every call that makes it.

local idiv, cdiv, read_bucket, plan_tokens, token_cost, take_tokens, store_tokens
local check_reserved, open_segment, settle_segment, close_segment
local COLD_STEPS = 65536 -- twin: COLD_STEPS in algorithm/bucket.rs (held equal by a test)
local DEBT_FLOOR = -4503599627370496 -- -2^52; twin: DEBT_FLOOR in algorithm/bucket.rs
local MOST_SEGMENTS = 8 -- twin: MOST_SEGMENTS in algorithm/segments.rs (held equal by a test)
local MOST_GRANTS = 128 -- twin: MOST_GRANTS in algorithm/segments.rs (held equal by a test)
local MOST_TEXT = 4096 -- twin: MOST_TEXT in algorithm/segments.rs (held equal by a test)
local ID_DIGITS = 15 -- twin: the digits of LEAST_ID and MOST_ID in algorithm/segments.rs

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

  -- A time or a room as stored: digits, up to 2^53 (compared as text past 15
  -- digits: a double rounds 2^53 + 1 to 2^53); nil for any other text.
  local function exact(digits)
    if not string.find(digits, '^%d+$') or #digits > 16 or (#digits == 16 and digits > '9007199254740992') then
      return nil
    end
    return tonumber(digits)
  end

  -- The segments stored as `text` for a bucket of `cap` units, each { at, room, ids
  -- (their text), n (how many) }; nil when they are not a list this code wrote (at
  -- most MOST_TEXT bytes, read only then; times in order, rooms up to `cap`, ids of
  -- ID_DIGITS characters each, at most MOST_SEGMENTS and MOST_GRANTS ids). The ids'
  -- text is not read past its length: another program's junk there is carried as it
  -- is and never equals a settle's id.
  local function read_segments(text, cap)
    if #text > MOST_TEXT then return nil end
    local segs, last, count, from = {}, -1, 0, 1
    repeat
      local comma = string.find(text, ',', from, true) or #text + 1
      local dot = string.find(text, '.', from, true)
      local ids_at = dot and string.find(text, '.', dot + 1, true)
      -- "at.room." then n ids and the n - 1 dots between them: 16 n - 1 characters
      if not ids_at or ids_at >= comma or (comma - ids_at) % (ID_DIGITS + 1) ~= 0 then return nil end
      local at, room = exact(string.sub(text, from, dot - 1)), exact(string.sub(text, dot + 1, ids_at - 1))
      if at == nil or room == nil or room > cap or at < last then return nil end
      local n = (comma - ids_at) / (ID_DIGITS + 1)
      count = count + n
      last = at
      segs[#segs + 1] = { at = at, room = room, ids = string.sub(text, ids_at + 1, comma - 1), n = n }
      -- (past the bounds, refused before the rest is read: 4 KB of tiny segments)
      if #segs > MOST_SEGMENTS or count > MOST_GRANTS then return nil end
      from = comma + 1
    until from > #text + 1
    return segs
  end

  -- peak: the last segment's least room, at a peak of `room`.
  local function peak(segs, room)
    local last = segs[#segs]
    if last and room < last.room then last.room = room end
  end

  -- The reservations' grant ids as a call sends them (`text`: comma separated, one a
  -- rule, empty for a rule not reserved) checked before anything is written: each
  -- empty or ID_DIGITS digits, the first not 0.
  check_reserved = function(text)
    if not text then return end
    for id in string.gmatch(text .. ',', '([^,]*),') do
      if id ~= '' and (#id ~= ID_DIGITS or not string.find(id, '^[1-9]%d*$')) then
        error('redlimit:bad_argument:1 reservation ids of ' .. ID_DIGITS .. ' digits', 0)
      end
    end
  end

  -- The pending reservation's grant `id` (its text, as check_reserved checked it)
  -- decided at `at`, on the planned bucket `r` it took from: a
  -- segment of its own, at `at` or the last one's time when later (a clock behind
  -- it); past MOST_SEGMENTS the two oldest merge; past MOST_GRANTS the oldest grant
  -- is forgotten (a segment left without one dropped).
  open_segment = function(r, at, id)
    local segs = r.segs or {}
    r.segs = segs
    local last = segs[#segs]
    if last and last.at > at then at = last.at end
    segs[#segs + 1] = { at = at, room = room_of(r.burst * r.interval, r.units), ids = id, n = 1 }
    if #segs > MOST_SEGMENTS then
      local second = table.remove(segs, 2)
      segs[1].ids, segs[1].n = segs[1].ids .. '.' .. second.ids, segs[1].n + second.n
      if second.room < segs[1].room then segs[1].room = second.room end
    end
    local count = 0
    for k = 1, #segs do count = count + segs[k].n end
    if count > MOST_GRANTS then
      local first = segs[1]
      if first.n == 1 then
        table.remove(segs, 1)
      else
        first.ids, first.n = string.sub(first.ids, ID_DIGITS + 2), first.n - 1
      end
    end
  end

  -- Where id `id` is in segment `seg`'s ids, bounded by dots: the span in '.' .. ids
  -- .. '.' from the dot before it to the dot after; nil when it is not.
  local function find_id(seg, id)
    return string.find('.' .. seg.ids .. '.', '.' .. id .. '.', 1, true)
  end

  -- The settle of grant `id` on the planned bucket `r` (a peak now): its segment's
  -- index (the first holding it) and the least room of it and every later one; nil
  -- when it has none.
  settle_segment = function(r, id)
    local segs = r.segs
    if not segs then return nil end
    peak(segs, room_of(r.burst * r.interval, r.units))
    for k = 1, #segs do
      if find_id(segs[k], id) then
        local bound = segs[k].room
        for j = k + 1, #segs do
          if segs[j].room < bound then bound = segs[j].room end
        end
        return k, bound
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
    local from, to = find_id(segment, id)
    local padded = '.' .. segment.ids .. '.'
    segment.ids = string.sub(string.sub(padded, 1, from) .. string.sub(padded, to + 1), 2, -2)
    segment.n = segment.n - 1
    if segment.n == 0 then
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
    -- Each number up to 2^53, read as text before it is a double (which rounds
    -- 2^53 + 1 to 2^53); only when one is long (a table costs; a debt below
    -- DEBT_FLOOR is refused below, whatever its rounding).
    if #r > 15 or #i > 15 or #b > 15 or #u > 15 or #at > 15 or (w and (#w > 15 or #c > 15)) then
      for _, d in ipairs({ r, i, b, string.byte(u) == 45 and '0' or u, at, w or '0', c or '0' }) do
        if #d > 16 or (#d == 16 and d > '9007199254740992') then return nil end
      end
    end
    local s = { rate = tonumber(r), interval = tonumber(i), burst = tonumber(b), units = tonumber(u),
      at = tonumber(at), warmup = tonumber(w or '0'), cold = tonumber(c or '0'), text = raw }
    -- The capacity exact: a product past 2^53 is at least 2^53 as a double, and one
    -- of 2^53 exactly is an interval dividing 2^53 times the quotient.
    local cap = s.burst * s.interval
    if cap == 9007199254740992 and (math.fmod(cap, s.interval) ~= 0 or cap / s.interval ~= s.burst) then
      return nil
    end
    if s.rate < 1 or s.interval < 1 or s.burst < 1 or s.rate > 9007199254740992 or cap > 9007199254740992
        or s.at > 9007199254740992 or s.warmup * s.rate > 35184372088832 or s.cold > s.warmup * s.rate
        or (s.warmup > 0 and 4 * cap > 9007199254740992)
        or s.units < DEBT_FLOOR or s.units > cap then
      return nil
    end
    -- The room, capacity less units, up to 2^53, where the refill's arithmetic is
    -- exact: a deeper debt (an earlier build's settle left one, in a bucket of more than
    -- 2^52 units) is read at the floor a settle leaves now.
    if s.units < cap - 9007199254740992 then s.units = cap - 9007199254740992 end
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
        parts[k] = string.format('%d.%d.', segs[k].at, segs[k].room) .. segs[k].ids
      end
      if #parts > 0 then text = text .. '|' .. table.concat(parts, ',') end
    end
    redis.call('set', key, text, 'px', string.format('%d', math.max(ttl, 1)))
  end
end

