//! Redisson's TTL rule: the twin of `lua/lib/ttl_rule.lua` (and of its copy written
//! out in `lua/acquire_plain.lua`). A plain function on times: no I/O, no clock read.

/// ttl_rule, applied after a limiter's state is written at `now` (the decided time)
/// by a call whose clock read `clock_now`: keepAliveTime (`keep` ms, when above 0)
/// from `now` on the config and the state (the value and log keys), else the
/// config's own expiry, when it is still ahead of `clock_now`, on the state; never
/// ending less than the config's `interval` (ms) after `now`, so that no expiry set
/// before a longer interval takes the window while grants are still in it.
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
/// assert_eq!(ttl_rule(60_000, &mut config, 1_000, 1_000, 1_000), Some(61_000));
/// assert_eq!(config, Some(61_000));
/// assert_eq!(ttl_rule(0, &mut config, 2_000, 2_000, 1_000), Some(61_000));
/// assert_eq!(ttl_rule(0, &mut config, 70_000, 70_000, 1_000), None, "the config's TTL is over");
/// // An expiry closer than the interval is put off to it.
/// let mut config = Some(3_000);
/// assert_eq!(ttl_rule(0, &mut config, 2_000, 2_000, 60_000), Some(62_000));
/// assert_eq!(config, Some(62_000));
/// ```
#[inline]
pub fn ttl_rule(
    keep: u64,
    config_expires: &mut Option<u64>,
    now: u64,
    clock_now: u64,
    interval: u64,
) -> Option<u64> {
    match keep {
        0 => {
            let expires = config_expires.filter(|&t| t > clock_now)?;
            let expires = expires.max(now.saturating_add(interval));
            *config_expires = Some(expires);
            Some(expires)
        }
        keep => {
            let expires = now.saturating_add(keep.max(interval));
            *config_expires = Some(expires);
            Some(expires)
        }
    }
}
