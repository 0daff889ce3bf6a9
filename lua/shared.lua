-- shared.lua: helpers put in front of configure.lua, release.lua and refund.lua when
-- the scripts are built (runtime/src/backend/redis.rs). acquire.lua, which runs on
-- every decision, makes its own copies only on the paths that need them.

-- The time in epoch ms: the caller's (a decimal), or Redis TIME when `arg` is empty.
local function clock(arg)
  if arg == '' then
    local t = redis.call('time')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return tonumber(arg)
end

-- The permits a log member holds (Redisson's struct.pack('Bc0I', len, id, permits)),
-- and its id length. `role` names the log in the error ("permits", "client_permits").
local function decode_member(member, role)
  local len = string.byte(member, 1)
  if len == nil or #member ~= len + 5 then
    error('redlimit:bad_member:1 ' .. role .. ' member of ' .. #member .. ' bytes does not decode', 0)
  end
  local a, b, c, d = string.byte(member, len + 2, len + 5)
  return a + b * 256 + c * 65536 + d * 16777216, len
end

-- Redisson's TTL rule, applied after an acquire: keepAliveTime (text, ms) on the
-- config, value and log keys when > 0, else the config's own TTL, if any, on the
-- value and log keys.
local function ttl_rule(name, vkey, pkey, keep)
  if tonumber(keep) > 0 then
    redis.call('pexpire', name, keep)
    redis.call('pexpire', vkey, keep)
    redis.call('pexpire', pkey, keep)
  else
    local ttl = redis.call('pttl', name)
    if ttl > 0 then
      redis.call('pexpire', vkey, ttl)
      redis.call('pexpire', pkey, ttl)
    end
  end
end

