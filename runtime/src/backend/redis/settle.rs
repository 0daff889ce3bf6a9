//! A reservation's grants settled (`lua/settle.lua`): each grant's log member, or its
//! token bucket, told the amount actually used, in one script call per slot.

use super::{layout, Arg, RedisBackend, SCRIPTS};
use crate::backend::{SettleCall, SettleOutcome};
use crate::keys::Keys;
use crate::{Error, RateType};

impl RedisBackend {
    /// Settles `calls`, whose keys share one slot, at `now`: one outcome per call.
    pub(crate) async fn settle(
        &self,
        calls: &[SettleCall<'_>],
        now: u64,
    ) -> Result<Vec<SettleOutcome>, Error> {
        let mut keys: Vec<String> = Vec::with_capacity(layout::settle::KEYS_PER_RULE * calls.len());
        let marks: Vec<String> = calls.iter().map(settle_mark).collect();
        let mut args: Vec<Arg<'_>> = Vec::with_capacity(1 + layout::settle::ARGS_PER_RULE * calls.len());
        args.push(self.now_arg(now));
        for (call, mark) in calls.iter().zip(&marks) {
            keys.extend(settle_keys(call, mark));
            args.extend(settle_args(call));
        }
        let all: Vec<Keys<'_>> = calls.iter().map(|c| c.keys).collect();
        let settled: Vec<i64> = self
            .run(&all, |mut conn| async move {
                let mut invocation = SCRIPTS.settle.prepare_invoke();
                invocation.key(&keys[..]).arg(&args[..]);
                invocation.invoke_async(&mut conn).await
            })
            .await?;
        let unexpected = || Error::UnexpectedReply {
            script: "settle.lua",
            reply: format!("{settled:?}"),
        };
        if settled.len() != 2 * calls.len() {
            return Err(unexpected());
        }
        settled
            .chunks(2)
            .map(|pair| match *pair {
                [done @ (0 | 1), left] if left >= -1 => Ok(SettleOutcome {
                    applied: done == 1,
                    left: u64::try_from(left).ok(),
                }),
                _ => Err(unexpected()),
            })
            .collect()
    }
}

/// `{NAME}:settled:<id in hex>`: the key that marks a grant settled (a token bucket's,
/// or a window's excess), for as long as the settle may be sent again, so that a
/// second one changes nothing.
fn settle_mark(call: &SettleCall<'_>) -> String {
    use std::fmt::Write;
    let mut mark = crate::keys::suffix(call.keys.config(), "settled:");
    for byte in &call.member[1..=crate::member::ID_LEN] {
        let _ = write!(mark, "{byte:02x}");
    }
    mark
}

/// settle.lua's keys for one call: the limiter's five (a token bucket's own key in the
/// value key's place), then the settle mark.
fn settle_keys(call: &SettleCall<'_>, mark: &str) -> [String; layout::settle::KEYS_PER_RULE] {
    let mut keys: [String; layout::settle::KEYS_PER_RULE] = Default::default();
    for (slot, key) in keys.iter_mut().zip(call.keys.all()) {
        *slot = key;
    }
    keys[layout::settle::MARK] = mark.to_owned();
    if call.bucket.is_some() {
        keys[layout::settle::BUCKET] = match call.rule.rate_type {
            RateType::Overall => call.keys.bucket(),
            RateType::PerClient => call.keys.client_bucket(),
        };
    }
    keys
}

/// settle.lua's arguments for one call.
fn settle_args<'a>(call: &SettleCall<'a>) -> [Arg<'a>; layout::settle::ARGS_PER_RULE] {
    use layout::settle::*;
    let mut args = [Arg::Text(""); ARGS_PER_RULE];
    args[KIND] = Arg::Text(if call.bucket.is_some() { "b" } else { "w" });
    args[MEMBER] = Arg::Bytes(&call.member[..]);
    args[ESTIMATE] = Arg::Int(call.estimate);
    args[ACTUAL] = Arg::Int(call.actual);
    let shape = call.bucket.unwrap_or(crate::BucketShape {
        burst: 0,
        warmup_ms: 0,
    });
    args[RATE] = Arg::Int(call.rule.rate);
    args[INTERVAL] = Arg::Int(call.rule.interval_ms());
    args[BURST] = Arg::Int(shape.burst);
    args[WARMUP] = Arg::Int(shape.warmup_ms);
    args[MARK_MS] = Arg::Int(call.mark_ms.max(1));
    args[TYPE] = Arg::Text(match call.rule.rate_type {
        RateType::Overall => "0",
        RateType::PerClient => "1",
    });
    args[KEEP_ALIVE] = Arg::Int(call.rule.keep_alive_ms());
    args
}
