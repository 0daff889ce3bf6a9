//! The in-process twin of `lua/settle.lua`: a reservation's grants told the amount
//! actually used, step for step as the script does.

use super::state::{Bucket, Tokens};
use super::{shard_of, MemoryBackend};
use crate::algorithm::bucket::Plan;
use crate::backend::SettleCall;
use crate::Error;

impl MemoryBackend {
    /// Holds the limiters `names` while a reservation of their grants is not settled
    /// (`by` 1), or lets them go (`by` -1): a limiter held is never let go at the bound.
    pub fn pin(&self, names: &[&str], by: i32) {
        for name in names {
            let mut store = self.lock(name);
            if let Some(limiter) = store.limiters.get_mut(name) {
                limiter.pins = limiter.pins.saturating_add_signed(by);
            }
        }
    }

    /// Settles `calls` at `now`: one flag per call, true when it was settled (false:
    /// its grant had left the window, or its limiter was deleted).
    pub fn settle(&self, calls: &[SettleCall<'_>], now: u64) -> Result<Vec<bool>, Error> {
        calls
            .iter()
            .map(|call| {
                if call.actual == call.estimate {
                    Ok(true)
                } else if call.bucket.is_some() {
                    self.settle_tokens(call, now)
                } else {
                    Ok(self.settle_window(call, now))
                }
            })
            .collect()
    }

    /// settle_window: the grant of `call.estimate` permits at `call.at` now holds the
    /// actual permits, and the value moves by the difference (up to the rate, below
    /// zero for an excess).
    fn settle_window(&self, call: &SettleCall<'_>, now: u64) -> bool {
        let name = call.keys.config();
        let mut store = self.lock(name);
        let Some(limiter) = store.limiters.get_mut(name) else {
            return false;
        };
        let Some(config) = limiter.live_config(now) else {
            return false;
        };
        let (rate, interval) = (config.rate as i64, config.interval_ms());
        // The grant's own log, of whichever mode it was made in.
        for kind in [crate::RateType::Overall, crate::RateType::PerClient] {
            let Some(bucket) = limiter.bucket(kind, now) else {
                continue;
            };
            let Some(at) = grant_in(bucket, call.at, call.estimate) else {
                continue;
            };
            if call.at as i64 <= now as i64 - interval as i64 {
                return false;
            }
            if call.actual == 0 {
                bucket.log.remove(at);
            } else {
                bucket.log[at].1 = call.actual as u32;
            }
            bucket.total = bucket.total - call.estimate + call.actual;
            if let Some(value) = bucket.value {
                bucket.value = Some((value + call.estimate as i64 - call.actual as i64).min(rate));
            }
            return true;
        }
        false
    }

    /// settle_tokens: the bucket refilled to now gets back the tokens not used, up to
    /// its burst, or pays the excess as taking it would. A missing bucket is full: a
    /// refund leaves it so, an excess makes it.
    fn settle_tokens(&self, call: &SettleCall<'_>, now: u64) -> Result<bool, Error> {
        let name = call.keys.config();
        let shape = call.bucket.expect("a token bucket's settle");
        let hash = self.hash(name);
        let mut store = self.lock_shard(shard_of(hash));
        let held = store.limiters.get_hashed(hash, name).and_then(|l| {
            l.tokens_or_recalled(call.rule, shape.burst, shape.warmup_ms, now)
                .copied()
        });
        let plan = match held {
            Some(tokens) => Plan::refilled(&tokens.state, now),
            None if call.actual <= call.estimate => return Ok(true),
            None => {
                let rule = call.rule;
                let (plan, _) = crate::algorithm::bucket::plan_tokens(
                    rule.rate,
                    rule.interval_ms(),
                    shape.burst,
                    shape.warmup_ms,
                    None,
                    now,
                );
                plan
            }
        };
        let (units, cold) = plan.settle_tokens(call.estimate, call.actual);
        self.room_for(&mut store, hash, name, now, &[hash])?;
        let limiter = store.limiters.get_or_insert(hash, name);
        limiter.set_tokens(call.rule.rate_type, Tokens::stored(&plan, units, cold));
        Ok(true)
    }
}

/// Where in `bucket`'s log the grant of `permits` at `at` is: any of the entries of
/// that time and size (they are alike).
fn grant_in(bucket: &Bucket, at: u64, permits: u64) -> Option<usize> {
    let first = bucket.log.partition_point(|&(score, _)| score < at);
    (first..bucket.log.len())
        .take_while(|&i| bucket.log[i].0 == at)
        .find(|&i| u64::from(bucket.log[i].1) == permits)
}
