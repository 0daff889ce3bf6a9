-- acquire_one.lua: the usual call, one sliding-window rule whose stored config is its
-- own, decided on locals. It is put in front of bucket.lua and acquire.lua when the
-- acquire script is built (runtime/src/backend/redis.rs), with acquire.lua's KEYS and
-- ARGV, and runs first so that the usual call makes no closure and no table of its own.
-- It takes the same steps as acquire.lua's phases (load_rule, plan_bucket, take,
-- commit), without their tables and helpers. Any case it does not cover (a config to
-- create or change, a value that is missing or not as Redis counts it, a member that
-- does not decode, a log short of the wait) leaves this block before writing anything,
-- and acquire.lua decides the call from the start. The differential tests run both.
--
-- Replies: decided at the caller's time (ARGV[1]), a grant is the integer permits left
-- (>= 0) and a refusal with no permit left is the integer -wait (< 0, in ms); any other
-- outcome is acquire.lua's reply for one rule. An integer costs Redis far less to send
-- than a table.
--
-- Costs measured in Redis and kept here: a number given to redis.call is printed with
-- "%.17g" (pass text, or string.format('%d', n)); tonumber(s) converts its string twice
-- where s + 0 converts it once (only for strings known to be decimal).

-- The call's time in epoch ms: the caller's (ARGV[1]), or Redis's clock when it is
-- empty. acquire.lua, after this file, starts from the same.
local caller_now
if ARGV[1] ~= '' then
  caller_now = ARGV[1] + 0
else
  local t = redis.call('time')
  caller_now = t[1] * 1000 + math.floor(t[2] / 1000)
end

do
  local now, caller_time = caller_now, ARGV[1] ~= ''
  if #KEYS == 5 and ARGV[4] == '1' and (ARGV[7] == '0' or ARGV[7] == '1') then
    repeat
      local stored = redis.call('hmget', KEYS[1], 'rate', 'interval', 'type', 'keepAliveTime')
      if stored[1] ~= ARGV[5] or stored[2] ~= ARGV[6] or stored[3] ~= ARGV[7] or (stored[4] or '0') ~= ARGV[8] then
        break
      end
      -- ARGV 2, 5 and 6 are decimals the caller wrote
      local permits, rate, interval, keep = ARGV[2] + 0, ARGV[5] + 0, ARGV[6] + 0, ARGV[8]
      if permits > rate then break end
      local vkey, pkey = KEYS[2], KEYS[4]
      if ARGV[7] == '1' then vkey, pkey = KEYS[3], KEYS[5] end
      -- load_rule: the newest grant, when newer than this call's time (REORDER: 1000 ms)
      local after = caller_time and '(' .. ARGV[1] or string.format('(%d', now)
      if redis.call('zcount', pkey, after, '+inf') > 0 then
        local later = redis.call('zrevrangebyscore', pkey, '+inf', after, 'withscores', 'limit', '0', '1')
        if later[2] - now <= 1000 then now = later[2] + 0 end
      end
      -- plan_bucket: the value, as Redis counts (so a grant can be a DECRBY) and exact
      -- as a double, plus what left the window
      local raw = redis.call('get', vkey)
      if raw == false or #raw > 15 or not (raw == '0' or string.find(raw, '^%-?[1-9]%d*$')) then break end
      local value = raw + 0
      local stale = redis.call('zrangebyscore', pkey, '-inf', string.format('%d', now - interval))
      local released, broken = 0, false
      for j = 1, #stale do
        local member = stale[j]
        local len = string.byte(member, 1)
        if len == nil or #member ~= len + 5 then broken = true break end
        local a, b, c, d = string.byte(member, len + 2, len + 5)
        released = released + a + b * 256 + c * 65536 + d * 16777216
      end
      if broken or (released > 0 and value + released > rate) then break end
      local dirty = released > 0
      if dirty then value = value + released end
      -- take: enough permits, or the exact wait until the log releases them
      local wait = 0
      if permits > 0 and value < permits then
        local need, acc, start = permits - value, 0, #stale
        wait = nil
        while wait == nil do
          local chunk
          if start == 0 and need == 1 then
            -- the usual refusal: the oldest grant (string.format costs more than the query)
            chunk = redis.call('zrange', pkey, '0', '0', 'withscores')
          else
            chunk = redis.call('zrange', pkey, string.format('%d', start), string.format('%d', start + need - 1),
              'withscores')
          end
          if #chunk == 0 then break end
          for j = 1, #chunk, 2 do
            local member = chunk[j]
            local len = string.byte(member, 1)
            if len == nil or #member ~= len + 5 then broken = true break end
            local a, b, c, d = string.byte(member, len + 2, len + 5)
            acc = acc + a + b * 256 + c * 65536 + d * 16777216
            if acc >= need then
              wait = chunk[j + 1] + interval - now
              break
            end
          end
          if broken then break end
          start = start + #chunk / 2
        end
        if wait == nil then break end
      end
      local granted = wait == 0
      -- commit (a call asking what is available writes nothing)
      if permits > 0 then
        if #stale > 0 then redis.call('zremrangebyrank', pkey, '0', string.format('%d', #stale - 1)) end
        if granted then
          redis.call('zadd', pkey, now == caller_now and caller_time and ARGV[1] or string.format('%d', now), ARGV[3])
          if not dirty then
            redis.call('decrby', vkey, ARGV[2])
          else
            redis.call('set', vkey, string.format('%d', value - permits), 'keepttl')
          end
        elseif dirty then
          redis.call('set', vkey, string.format('%d', value), 'keepttl')
        end
        -- Redisson's TTL rule: keepAliveTime on all three keys, else the config's own TTL
        if keep ~= '0' then
          redis.call('pexpire', KEYS[1], keep)
          redis.call('pexpire', vkey, keep)
          redis.call('pexpire', pkey, keep)
        else
          local ttl = redis.call('pttl', KEYS[1])
          if ttl > 0 then
            ttl = string.format('%d', ttl)
            redis.call('pexpire', vkey, ttl)
            redis.call('pexpire', pkey, ttl)
          end
        end
      end
      local at_caller_time = caller_time and now == caller_now
      if granted then
        local left = value - permits
        if left < 0 then left = 0 end
        if at_caller_time then return left end
        return { 1, 0, 0, now, left, 0 }
      end
      if at_caller_time and value <= 0 then return -wait end
      return { 0, 1, wait, now, value > 0 and value or 0, 0 }
    until true
  end
end
