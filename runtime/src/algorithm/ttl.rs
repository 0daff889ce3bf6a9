//! Redisson's TTL rule: the twin of `lua/lib/ttl_rule.lua` (and of its copy written
//! out in `lua/acquire_plain.lua`). A plain function on times: no I/O, no clock read.

/// ttl_rule, applied after a limiter's state is written at `now` (the decided time)
/// by a call whose clock read `clock_now`: keepAliveTime (`keep` ms, when above 0)
/// from `now` on the config and the state (the value and log keys), else the
/// config's own expiry, when it is still ahead of `clock_now`, on the state. (The
/// scripts also put a keepAliveTime shorter than the config's interval off to the
/// interval: a config Redisson wrote may hold one, an in-process config never does.)
///
/// Writes the config's new expiry into `config_expires` (it keeps its own without a
/// keepAliveTime) and answers the state's (`None`: it keeps its own). Counted from
/// the decided time: an overtaken call's clock read earlier than the moment it
/// commits, and a keep-alive counted from that reading would end before a grant at
/// `now` has left the window.
///
/// ```
/// use redlimit_runtime::algorithm::ttl::ttl_rule;
///
/// let mut config = None;
/// assert_eq!(ttl_rule(60_000, &mut config, 1_000, 1_000), Some(61_000));
/// assert_eq!(config, Some(61_000));
/// assert_eq!(ttl_rule(0, &mut config, 2_000, 2_000), Some(61_000));
/// assert_eq!(ttl_rule(0, &mut config, 70_000, 70_000), None, "the config's TTL is over");
/// ```
#[inline]
pub fn ttl_rule(keep: u64, config_expires: &mut Option<u64>, now: u64, clock_now: u64) -> Option<u64> {
    match keep {
        0 => config_expires.filter(|&t| t > clock_now),
        keep => {
            *config_expires = Some(now + keep);
            Some(now + keep)
        }
    }
}
