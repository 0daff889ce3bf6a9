-- lib/limiter.lua: whether a key is a limiter's config, for the scripts that write
-- to a limiter's keys.
-- Part of: configure, try_set_rate, keep_alive, expire, reset
-- Twin in Rust: runtime/src/backend/memory/state.rs (a limiter held in process is
--   always one: nothing to check)
-- A limiter's config is a hash with the fields rate, interval and type (Redisson's
-- layout); any other key under a limiter's name is another program's, and those
-- scripts write nothing to it.

-- What the config key `key` holds when it is not a limiter's config: nil when it is
-- one, false when it does not exist, else a text naming what it holds.
local function config_problem(key)
  local kind = redis.call('type', key).ok
  if kind == 'none' then
    return false
  end
  if kind ~= 'hash' then
    return 'holds a ' .. kind
  end
  local fields = redis.call('hmget', key, 'rate', 'interval', 'type')
  local missing = {}
  for i, name in ipairs({ 'rate', 'interval', 'type' }) do
    if fields[i] == false then
      missing[#missing + 1] = name
    end
  end
  if #missing > 0 then
    return 'holds a hash without ' .. table.concat(missing, ', ')
  end
  return nil
end

-- Whether the config key `key` exists; raises not_limiter naming what it holds when
-- it is not a limiter's config.
local function limiter_config(key)
  local problem = config_problem(key)
  if problem then
    error('redlimit:not_limiter:1 config ' .. problem, 0)
  end
  return problem == nil
end
