-- acquire_plain.lua: the usual calls, decided on locals: one or more sliding-window
-- rules, each owning its stored config, on keys of their own. It comes after
-- lib/call_time.lua (caller_now, REORDER, WALK) and before acquire.lua (see the
-- recipe there), takes acquire.lua's KEYS and ARGV, and runs first so that the usual
-- call makes no table per rule and no helper closure.
-- Part of: acquire
-- Twin in Rust: runtime/src/backend/memory/usual.rs (decide_one, for one rule)
-- It takes the same steps as acquire.lua's phases, under their names and in their
-- order (read config, load_rule, settle_time, plan_bucket, take, commit, reply), rule
-- by rule: `decide(i)` reads rule i and plans it, decides the rules after it (a call
-- of its own), and commits rule i on the way back, when every rule has been planned
-- and the call is granted or refused as a whole. Any case it does not cover (a config
-- to create or change, a value that is missing or not as Redis counts it, a member
-- that does not decode, a log short of the wait, a grant newer than the call in any
-- rule's log but the first, two rules on one name, a rule asking for no permit beside
-- others) leaves this block before writing anything, and acquire.lua decides the call
-- from the start.
--
-- `decide` is one function of about 120 lines, not several: each function the block
-- makes is an object made on every call, and splitting it into plan_bucket, take and
-- commit functions cost the usual call 3 to 5% more instructions in Redis (measured
-- with scripts/script-instructions.sh). lib/member.lua's decode_member and
-- lib/ttl_rule.lua are written out here for the same reason; a member that does not
-- decode leaves the block (acquire.lua then raises the error) instead of raising. The differential tests run both.
--
-- Replies: for one rule decided at the caller's time (ARGV[1]), a grant is the integer
-- permits left plus one, times 2^20, plus the call's tag (>= 2^20: no small count
-- another command answers reads as a grant), and a refusal with no permit left is
-- minus the wait (in ms) times 2^20 plus the tag (< 0); any other outcome is
-- acquire.lua's reply, which ends with the tag. An integer costs Redis far less to
-- send than a table; the tag tells the call's reply from any other a connection out
-- of step would hand it (another command's count, another call's, made in the same
-- millisecond too).
--
-- Costs measured in Redis and kept here: a number given to redis.call is printed with
-- "%.17g" (pass text, or string.format('%d', n)); tonumber(s) converts its string twice
-- where s + 0 converts it once (only for strings known to be decimal).

-- The call's tag, 0 to 2^20 - 1: the low twenty bits of the first three id bytes of
-- rule 1's member (ARGV[3]; see acquire.lua). The caller numbers its calls, so that
-- no call's reply carries the tag of a call sent within 2^20 of it (far more than a
-- connection has in flight). A member too short to hold one gives the call's time
-- modulo 2^20. (In the member, not an argument of its own: a ninth argument has Redis
-- grow the one-rule call's ARGV table once more.)
local tag
do
  local high, mid, low = string.byte(ARGV[3] or '', 2, 4)
  tag = low and high % 16 * 65536 + mid * 256 + low or caller_now % 1048576
end

do
  local nrules = #KEYS / 5
  -- what can be checked without a command: owned configs of sliding windows, distinct names
  local plain
  if nrules == 1 then
    plain = ARGV[4] == '1' and (ARGV[7] == '0' or ARGV[7] == '1')
  else
    plain = nrules > 1 and nrules % 1 == 0
  end
  for i = 1, nrules > 1 and plain and nrules or 0 do
    local a = 1 + 7 * (i - 1)
    if ARGV[a + 3] ~= '1' or (ARGV[a + 6] ~= '0' and ARGV[a + 6] ~= '1') or ARGV[a + 1] == '0' then
      plain = false
      break
    end
    for j = 1, i - 1 do
      if KEYS[5 * (j - 1) + 1] == KEYS[5 * (i - 1) + 1] then plain = false end
    end
  end
  if plain then
    local caller_time = ARGV[1] ~= ''
    -- `decide(decide, i, now, after, score, refused, retry, reply, reorder)` decides
    -- rule i and those after it. It takes the call's time, `(` and the caller's time
    -- (for ZCOUNT), the grants' score (text; the first rule sets it), the first
    -- refusing rule and the longest wait so far (acquire.lua's `refused`, `retry`),
    -- for several rules acquire.lua's reply (filled in rule by rule), and REORDER. It
    -- returns false to leave, else true, the final refused, retry and time, and rule
    -- i's permits and wait. Everything comes in as an argument: each local of the
    -- script a function shares would cost every call an object.
    local decide = function(decide, i, now, after, score, refused, retry, reply, reorder, walk_max)
      -- globals read once (each read of a global is a lookup by name)
      local keys, argv, call = KEYS, ARGV, redis.call
      local byte, format, find = string.byte, string.format, string.find
      local k, a = 5 * (i - 1), 1 + 7 * (i - 1)
      -- read config: the stored one must be the rule's own
      local stored = call('hmget', keys[k + 1], 'rate', 'interval', 'type', 'keepAliveTime')
      if stored[1] ~= argv[a + 4] or stored[2] ~= argv[a + 5] or stored[3] ~= argv[a + 6]
          or (stored[4] or '0') ~= argv[a + 7] then
        return false
      end
      -- ARGV a+1, a+4 and a+5 are decimals the caller wrote
      local permits, rate, interval, keep = argv[a + 1] + 0, argv[a + 4] + 0, argv[a + 5] + 0, argv[a + 7]
      if permits > rate then return false end
      local vkey, pkey = keys[k + 2], keys[k + 4]
      if argv[a + 6] == '1' then vkey, pkey = keys[k + 3], keys[k + 5] end
      -- load_rule and settle_time: the newest grant, when newer than this call's time
      -- (by at most REORDER). Only the first rule may move the call's time: the rules
      -- before any other were planned at the earlier one, so acquire.lua decides such
      -- a call.
      local moved = false
      if call('zcount', pkey, after, '+inf') > 0 then
        if i > 1 then return false end
        local later = call('zrevrangebyscore', pkey, '+inf', after, 'withscores', 'limit', '0', '1')
        if later[2] - now <= reorder then now, moved = later[2] + 0, true end
      end
      if i == 1 then
        score = argv[1] ~= '' and not moved and argv[1] or format('%d', now)
      end
      -- plan_bucket: the value, as Redis counts (so a grant can be a DECRBY) and exact
      -- as a double, plus what left the window
      local raw = call('get', vkey)
      if raw == false or #raw > 15 or not (raw == '0' or find(raw, '^%-?[1-9]%d*$')) then return false end
      local value = raw + 0
      local stale = call('zrangebyscore', pkey, '-inf', format('%d', now - interval))
      local released = 0
      for j = 1, #stale do
        local member = stale[j]
        local len = byte(member, 1)
        if len == nil or #member ~= len + 5 then return false end
        local b1, b2, b3, b4 = byte(member, len + 2, len + 5)
        released = released + b1 + b2 * 256 + b3 * 65536 + b4 * 16777216
      end
      -- (above the rate, a value inflated by hand: acquire.lua rebuilds it from the log)
      if value + released > rate then return false end
      local dirty = released > 0
      if dirty then value = value + released end
      -- take: enough permits, or the exact wait until the log releases them
      local wait = 0
      if permits > 0 and value < permits then
        -- at most `walk` entries are read: permits lacking past them get an upper bound
        local need, acc = permits - value, 0
        local walk = need < walk_max and need or walk_max
        local from = #stale
        for pass = 1, 2 do
          local chunk
          if pass == 1 and from == 0 and need == 1 then
            -- the usual refusal: the oldest grant (string.format costs more than the query)
            chunk = call('zrange', pkey, '0', '0', 'withscores')
          else
            chunk = call('zrange', pkey, format('%d', from), format('%d', from + walk - 1), 'withscores')
          end
          for j = 1, #chunk, 2 do
            local member = chunk[j]
            local len = byte(member, 1)
            if len == nil or #member ~= len + 5 then return false end
            local b1, b2, b3, b4 = byte(member, len + 2, len + 5)
            acc = acc + b1 + b2 * 256 + b3 * 65536 + b4 * 16777216
            if acc >= need then
              wait = chunk[j + 1] + interval - now
              break
            end
          end
          if acc >= need then break end
          -- a log short of the wait is acquire.lua's case
          if #chunk < 2 * walk then return false end
          from = from + walk
          if pass == 1 and from - #stale < walk_max then
            -- entries of no permits among the oldest (Redisson's tryAcquire(0) logs
            -- them): the rest of the walk_max entries read
            walk = walk_max - walk
          else
            if call('zcard', pkey) <= from then return false end
            local newest = call('zrange', pkey, '-1', '-1', 'withscores')
            wait = newest[2] + interval - now
            break
          end
        end
        if refused == 0 then refused = i end
        if wait > retry then retry = wait end
      end
      if reply then
        reply[3 + 2 * i] = value
        reply[4 + 2 * i] = 0
      end
      -- the rules after this one; nothing is written until all are planned
      if i < #keys / 5 then
        local ok
        ok, refused, retry = decide(decide, i + 1, now, after, score, refused, retry, reply, reorder, walk_max)
        if not ok then return false end
      end

      -- commit (a call asking what is available writes nothing)
      local granted = refused == 0
      if permits > 0 then
        if #stale > 0 then call('zremrangebyrank', pkey, '0', format('%d', #stale - 1)) end
        if granted then
          call('zadd', pkey, score, argv[a + 2])
          if not dirty then
            call('decrby', vkey, argv[a + 1])
          else
            call('set', vkey, format('%d', value - permits), 'keepttl')
          end
        elseif dirty then
          call('set', vkey, format('%d', value), 'keepttl')
        end
        -- Redisson's TTL rule (lib/ttl_rule.lua, written out, without its floor: this
        -- path runs only on a stored config that is the rule's own, whose keep-alive
        -- is never shorter than its interval)
        if keep ~= '0' then
          call('pexpire', keys[k + 1], keep)
          call('pexpire', vkey, keep)
          call('pexpire', pkey, keep)
        else
          local ttl = call('pttl', keys[k + 1])
          if ttl > 0 then
            ttl = format('%d', ttl)
            call('pexpire', vkey, ttl)
            call('pexpire', pkey, ttl)
          end
        end
      end
      -- reply
      if reply then
        local left = granted and value - permits or value
        reply[3 + 2 * i] = left > 0 and left or 0
      end
      return true, refused, retry, now, value, wait
    end

    local reply = nrules > 1 and { 1, 0, 0, 0 } or false
    local after = caller_time and '(' .. ARGV[1] or string.format('(%d', caller_now)
    local ok, refused, retry, now, one_value, one_wait = decide(decide, 1, caller_now, after, false, 0, 0, reply, REORDER, WALK)
    if ok then
      local granted = refused == 0
      if reply then
        if not granted then reply[1], reply[2], reply[3] = 0, refused, retry end
        reply[4] = now
        reply[#reply + 1] = tag
        return reply
      end
      local at_caller_time = caller_time and now == caller_now
      local permits = ARGV[2] + 0
      -- (below 2^33, an integer times 2^20 is exact in a Lua number)
      if granted then
        local left = one_value - permits
        if left < 0 then left = 0 end
        if at_caller_time and left < 8589934591 then return (left + 1) * 1048576 + tag end
        return { 1, 0, 0, now, left, 0, tag }
      end
      if at_caller_time and one_value <= 0 and one_wait < 8589934592 then
        return -(one_wait * 1048576 + tag)
      end
      return { 0, 1, one_wait, now, one_value > 0 and one_value or 0, 0, tag }
    end
  end
end
