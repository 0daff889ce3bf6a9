-- lib/ttl_rule.lua: Redisson's TTL rule, applied after a limiter's state is written.
-- Part of: acquire, configure, release, settle
-- Twin in Rust: runtime/src/algorithm/ttl.rs

-- keepAliveTime (`keep`, text in ms) on the config, value and log keys when it is a
-- number > 0, else the config's own TTL, if any, on the value and log keys.
local function ttl_rule(name, vkey, pkey, keep)
  if tonumber(keep) > 0 then
    redis.call('pexpire', name, keep)
    redis.call('pexpire', vkey, keep)
    redis.call('pexpire', pkey, keep)
  else
    local ttl = redis.call('pttl', name)
    if ttl > 0 then
      ttl = string.format('%d', ttl)
      redis.call('pexpire', vkey, ttl)
      redis.call('pexpire', pkey, ttl)
    end
  end
end
