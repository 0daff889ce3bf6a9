//! A call's time: the twin of `lua/lib/call_time.lua`, which defines the constants
//! every decision starts from (`REORDER`, `WALK`), and of the scripts' `settle_time`
//! step. Held equal to the Lua by a test that reads its constants.

/// How far a call's time may lag the newest grant (or a token bucket's refill) and
/// still be decided at that later time, in ms (`REORDER` in `lua/lib/call_time.lua`).
/// Each log then stays in time order, no window of its scores holds more than the
/// rate, and a token bucket never refills backwards; clocks further apart are skew,
/// and left as they are.
pub const REORDER_MS: u64 = 1000;

/// The log entries a refusal's wait reads at most (`WALK` in `lua/lib/call_time.lua`):
/// a wait is exact when the permits it lacks leave the window within the oldest
/// `WALK` entries of the log; past them it is the time until the newest entry leaves,
/// an upper bound, never shorter than the exact wait.
pub const WALK: usize = 64;

/// settle_time: the time a call read at `clock_now` is decided at, given the `newest`
/// grant or refill among its rules (at least `clock_now`): the newest when at most
/// [`REORDER_MS`] later, else its own.
#[inline]
pub fn settle_time(newest: u64, clock_now: u64) -> u64 {
    if newest - clock_now <= REORDER_MS {
        newest
    } else {
        clock_now
    }
}
