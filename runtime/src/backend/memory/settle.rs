//! The in-process twin of `lua/settle.lua`: a reservation's grants told the amount
//! actually used, step for step as the script does.

use super::state::{slot, Bucket, Tokens};
use super::{shard_of, MemoryBackend};
use crate::algorithm::bucket::Plan;
use crate::algorithm::segments::room_of;
use crate::backend::{SettleCall, SettleOutcome};
use crate::Error;

impl MemoryBackend {
    /// Lets go of the limiters `names`, each with its [`hash`](MemoryBackend::hash),
    /// which a reservation held as it was decided ([`reserve`](MemoryBackend::reserve)):
    /// a limiter held is never let go at the bound.
    pub fn let_go<'a>(&self, names: impl IntoIterator<Item = (&'a str, u64)>) {
        for (name, hash) in names {
            debug_assert_eq!(hash, self.hash(name));
            let mut store = self.lock_shard(shard_of(hash));
            if let Some(limiter) = store.limiters.get_hashed(hash, name) {
                limiter.pins = limiter.pins.saturating_sub(1);
            }
        }
    }

    /// Settles `calls` at `now`: one outcome per call.
    pub fn settle(&self, calls: &[SettleCall<'_>], now: u64) -> Result<Vec<SettleOutcome>, Error> {
        calls
            .iter()
            .map(|call| {
                if call.actual == call.estimate {
                    Ok(SettleOutcome {
                        applied: true,
                        left: None,
                    })
                } else if call.bucket.is_some() {
                    self.settle_tokens(call, now)
                } else {
                    self.settle_window(call, now)
                }
            })
            .collect()
    }

    /// settle_window: the grant of `call.estimate` permits at `call.at` now holds the
    /// actual permits, and the value moves by the difference (up to the rate, below
    /// zero for an excess); a grant that has left its window gets nothing back, and
    /// its excess is charged now, as a grant of its own in the rule's mode.
    fn settle_window(&self, call: &SettleCall<'_>, now: u64) -> Result<SettleOutcome, Error> {
        let name = call.keys.config();
        let hash = self.call_hash(call);
        let mut store = self.lock_shard(shard_of(hash));
        if let Some(limiter) = store.limiters.get_hashed(hash, name) {
            if let Some(config) = limiter.live_config(now) {
                if let Some(settled) = settle_in_window(limiter, &config, call, now) {
                    return Ok(settled);
                }
            }
        }
        // Late: nothing goes back; an excess is charged now (a settle in process is
        // made once: no mark is needed), the config made again as the grant decided it
        // when it expired meanwhile.
        if call.actual <= call.estimate {
            return Ok(SettleOutcome {
                applied: false,
                left: None,
            });
        }
        self.room_for(&mut store, hash, name, now, &[hash])?;
        let limiter = store.limiters.get_or_insert(hash, name);
        let config = match limiter.live_config(now) {
            Some(config) => config,
            None => {
                limiter.config = Some(*call.rule);
                limiter.by_rule = true;
                *call.rule
            }
        };
        let excess = call.actual - call.estimate;
        limiter.bucket(config.rate_type, now);
        let bucket = limiter.bucket_or_default(config.rate_type);
        bucket.push(now, excess as u32);
        if let Some(value) = bucket.value {
            bucket.value = Some(value - excess as i64);
        }
        let left = bucket.value.map(|value| value.max(0) as u64);
        super::commit::ttl_rule(limiter, config.rate_type, config.keep_alive_ms(), now, now);
        Ok(SettleOutcome { applied: true, left })
    }

    /// The hash of `call`'s limiter name: the one its rule keeps, else hashed now.
    fn call_hash(&self, call: &SettleCall<'_>) -> u64 {
        let hash = call.name_hash.unwrap_or_else(|| self.hash(call.keys.config()));
        debug_assert_eq!(hash, self.hash(call.keys.config()));
        hash
    }

    /// settle_tokens: the bucket refilled to now gets back the tokens not used, up to
    /// its burst, or pays the excess as taking it would. A missing bucket is full: a
    /// refund leaves it so, an excess makes it.
    fn settle_tokens(&self, call: &SettleCall<'_>, now: u64) -> Result<SettleOutcome, Error> {
        let name = call.keys.config();
        let shape = call.bucket.expect("a token bucket's settle");
        let hash = self.call_hash(call);
        let mut store = self.lock_shard(shard_of(hash));
        let held = store.limiters.get_hashed(hash, name).and_then(|l| {
            l.tokens_or_recalled(call.rule, shape.burst, shape.warmup_ms, now)
                .copied()
        });
        let kind = call.rule.rate_type;
        let (plan, room) = match held {
            Some(tokens) => {
                let plan = Plan::refilled(&tokens.state, now);
                // Given back only as far as what refilled since the grant, up to the
                // bucket's own refill time (`plan.at`: a clock behind it refilled
                // nothing), left it room; a config changed since (its tokens carried
                // over, its fraction dropped) gets nothing back, nor a bucket made again
                // since on a clock behind the grant's (its stored refill time before the
                // grant's, which a bucket's writes never move back: the one the grant
                // left was let go full, or deleted).
                let same = (plan.rate, plan.interval, plan.burst, plan.warmup)
                    == (
                        call.rule.rate,
                        call.rule.interval_ms(),
                        shape.burst,
                        shape.warmup_ms,
                    )
                    && tokens.state.at >= call.at;
                let room = if same {
                    crate::algorithm::bucket::room_at(call.room, plan.rate, call.at, plan.at)
                } else {
                    0
                };
                (plan, room)
            }
            None if call.actual <= call.estimate => {
                return Ok(SettleOutcome {
                    applied: true,
                    left: Some(shape.burst),
                })
            }
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
                (plan, 0)
            }
        };
        // With reservations pending, also at most the least room the bucket had at its
        // peaks from the grant on, less what their settles gave back (its segment and
        // every later one's): one's settle then never gives back what another's did.
        // A grant without a segment (the bucket made again, or its config changed, since)
        // gets nothing back.
        let capacity = plan.burst * plan.interval;
        let segment = match store.limiters.get_hashed(hash, name).map(|l| l.segments(kind)) {
            Some(Some(segments)) => segments.settle(call.segment, room_of(capacity, plan.units)),
            _ => None,
        };
        let room = room.min(segment.map_or(0, |(_, bound)| bound));
        let (units, cold) = plan.settle_tokens(call.estimate, call.actual, room);
        self.room_for(&mut store, hash, name, now, &[hash])?;
        let limiter = store.limiters.get_or_insert(hash, name);
        if let Some(segments) = limiter.segments(kind) {
            if let Some((k, _)) = segment {
                segments.close(k, call.segment, (units - plan.units).max(0) as u64);
            }
            segments.prune(plan.at, capacity.div_ceil(plan.rate));
            limiter.drop_empty_segments(slot(kind));
        }
        limiter.set_tokens(kind, Tokens::stored(&plan, units, cold));
        Ok(SettleOutcome {
            applied: true,
            left: Some(units.div_euclid(plan.interval as i64).max(0) as u64),
        })
    }
}

/// A reservation's log member in process: the epoch of the log its grant was written
/// to (see [`Bucket`]'s `epoch`) in its id's first four bytes, and the tag written on
/// the grant's entry in the next four (0 for neither: a member no log entry answers),
/// the rest as [`new_member`](crate::member::new_member) makes it.
pub(crate) fn epoch_member(epoch: u32, tag: u32) -> [u8; crate::member::MEMBER_LEN] {
    let mut member = crate::member::new_member(0);
    member[1..5].copy_from_slice(&epoch.to_le_bytes());
    member[5..9].copy_from_slice(&tag.to_le_bytes());
    member
}

/// The epoch and the tag [`epoch_member`] wrote into `member`.
fn member_marks(member: &[u8; crate::member::MEMBER_LEN]) -> (u32, u32) {
    let word = |at: usize| u32::from_le_bytes([member[at], member[at + 1], member[at + 2], member[at + 3]]);
    (word(1), word(5))
}

/// Where in `bucket`'s log the grant of `permits` at `at` tagged `tag` is: the entry
/// of that time, size and tag, none once a release took the grant or shrank it (as
/// Redis finds no member of its id and size then), nor for the tag 0 of grants no
/// reservation made.
fn grant_in(bucket: &Bucket, at: u64, permits: u64, tag: u32) -> Option<usize> {
    if tag == 0 {
        return None;
    }
    let first = bucket.log.partition_point(|&(score, _, _)| score < at);
    (first..bucket.log.len())
        .take_while(|&i| bucket.log[i].0 == at)
        .find(|&i| u64::from(bucket.log[i].1) == permits && bucket.log[i].2 == tag)
}

/// The in-window settle of `call` on `limiter` (its live `config`): `None` when its
/// grant is not in a log of it, or has left the window.
fn settle_in_window(
    limiter: &mut super::state::Limiter,
    config: &crate::RateLimiterConfig,
    call: &SettleCall<'_>,
    now: u64,
) -> Option<SettleOutcome> {
    let (rate, interval) = (config.rate as i64, config.interval_ms());
    if call.at as i64 <= now as i64 - interval as i64 {
        return None;
    }
    // The grant's own log, of whichever mode it was made in, unless made again or
    // emptied since (a change of mode or of rate, an expiry): another grant of its time
    // and size there is not it.
    let (epoch, tag) = member_marks(call.member);
    for kind in [crate::RateType::Overall, crate::RateType::PerClient] {
        let Some(bucket) = limiter.bucket(kind, now).filter(|b| b.epoch == epoch) else {
            continue;
        };
        let Some(at) = grant_in(bucket, call.at, call.estimate, tag) else {
            continue;
        };
        if call.actual == 0 {
            bucket.log.remove(at);
        } else {
            bucket.log[at].1 = call.actual as u32;
        }
        bucket.total = bucket.total - call.estimate + call.actual;
        if let Some(value) = bucket.value {
            bucket.value = Some((value + call.estimate as i64 - call.actual as i64).min(rate));
        }
        return Some(SettleOutcome {
            applied: true,
            left: bucket.value.map(|value| value.max(0) as u64),
        });
    }
    None
}
