-- lib/call_time.lua (after lib/clock.lua): the call's time and the constants of a
-- decision; every file after it starts from what it defines.
-- Part of: acquire, tokens
-- Twin in Rust: runtime/src/algorithm/call_time.rs (REORDER_MS, WALK, settle_time)

-- The call's time in epoch ms: the caller's (ARGV[1]), or Redis's clock when it is
-- empty. (The caller's read here rather than through `clock`: the call cost every
-- decision about 170 instructions.)
local caller_now = ARGV[1] ~= '' and ARGV[1] + 0 or clock(ARGV[1])

-- A call whose time was taken just before another's, but which reaches Redis after
-- it, is decided at the later time when that is at most REORDER ms later: each log
-- then stays in time order and no window of its scores holds more than the rate (and
-- a token bucket never refills backwards). Clocks further apart are skew, and left as
-- they are (see RELIABILITY.md). Twin: REORDER_MS in runtime/src/algorithm/call_time.rs
-- (its test the_scripts_constants_are_these reads this line).
local REORDER = 1000

-- A refusal's wait is exact when the permits it lacks leave the window within the
-- oldest WALK entries of the log; past them it is the time until the newest entry
-- leaves, an upper bound (the log then holds no permit, so the rate is free), never
-- shorter than the exact wait. A refusal reads at most WALK + 1 entries, whatever the
-- permits asked. Twin: WALK in runtime/src/algorithm/call_time.rs (held equal by
-- the same test).
local WALK = 64
