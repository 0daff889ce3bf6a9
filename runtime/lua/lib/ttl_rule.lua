-- lib/ttl_rule.lua: Redisson's TTL rule, applied after a limiter's state is written.
-- Part of: acquire, configure, release, settle
-- Twin in Rust: runtime/src/algorithm/ttl.rs

-- keepAliveTime (`keep`, text in ms) on the config, value and log keys when it is a
-- number > 0, at least the config's `interval` (ms, a number): a keepAliveTime shorter
-- than the interval, which Redisson 3.x's `setRate` to a longer interval leaves (it
-- knows no such field) and 3.38 to 4.3 accept, would have the keys go, and the window
-- with them, while grants are still in it. Else the config's own TTL, if any, on the
-- value and log keys: an `expire` is a deadline, kept as Redisson keeps it.
local function ttl_rule(name, vkey, pkey, keep, interval)
  if tonumber(keep) > 0 then
    if tonumber(keep) < interval then keep = string.format('%d', interval) end
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
