-- lib/clock.lua: the time a script decides at.
-- Part of: acquire, tokens, configure, release, settle
-- Twin in Rust: runtime/src/client/clock.rs (in process, the client's clock decides)

-- The time in epoch ms: the caller's (`arg`, a decimal the caller wrote), or Redis
-- TIME when `arg` is empty.
local function clock(arg)
  if arg ~= '' then
    return arg + 0
  end
  local t = redis.call('time')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end
