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
        let terms: Vec<String> = calls.iter().map(settle_terms).collect();
        let mut args: Vec<Arg<'_>> = Vec::with_capacity(1 + layout::settle::ARGS_PER_RULE * calls.len());
        args.push(self.now_arg(now));
        for ((call, mark), terms) in calls.iter().zip(&marks).zip(&terms) {
            keys.extend(settle_keys(call, mark));
            args.extend(settle_args(call, terms));
        }
        let all: Vec<Keys<'_>> = calls.iter().map(|c| c.keys).collect();
        let (keys, args) = (&keys, &args);
        let reply: redis::Value = self
            .run(&all, |mut conn| async move {
                let mut invocation = SCRIPTS.settle.prepare_invoke();
                invocation.key(&keys[..]).arg(&args[..]);
                invocation.invoke(&mut conn, self.slot_map()).await
            })
            .await?;
        self.noting_step(
            outcomes(&reply, calls.len()).ok_or_else(|| Error::UnexpectedReply {
                script: "settle.lua",
                reply: format!("{reply:?}"),
            }),
        )
    }
}

/// settle.lua's reply for `rules` rules: one integer per rule, alone for one rule (a
/// table costs Redis more than the settle's commands save), else in a table. -2:
/// nothing to settle; -1: settled, what the limiter has left not known; else settled,
/// with that many permits left. `None` for any other reply.
fn outcomes(reply: &redis::Value, rules: usize) -> Option<Vec<SettleOutcome>> {
    let one = |value: &redis::Value| match *value {
        redis::Value::Int(-2) => Some(SettleOutcome {
            applied: false,
            left: None,
        }),
        redis::Value::Int(left) if left >= -1 => Some(SettleOutcome {
            applied: true,
            left: u64::try_from(left).ok(),
        }),
        _ => None,
    };
    match reply {
        redis::Value::Array(values) if rules != 1 && values.len() == rules => {
            values.iter().map(one).collect()
        }
        value if rules == 1 => Some(vec![one(value)?]),
        _ => None,
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

/// settle.lua's arguments for one call (its terms in `terms`, which they borrow).
fn settle_args<'a>(call: &SettleCall<'a>, terms: &'a str) -> [Arg<'a>; layout::settle::ARGS_PER_RULE] {
    use layout::settle::*;
    let mut args = [Arg::Text(""); ARGS_PER_RULE];
    args[KIND] = Arg::Text(if call.bucket.is_some() { "b" } else { "w" });
    args[MEMBER] = Arg::Bytes(&call.member[..]);
    args[ESTIMATE] = Arg::Int(call.estimate);
    args[ACTUAL] = Arg::Int(call.actual);
    args[TERMS] = Arg::Bytes(terms.as_bytes());
    args
}

/// A rule's terms for settle.lua, in one argument the script reads only on the paths
/// that use them (each argument costs Redis as much before the script runs):
/// `mark_ms:rate:interval:burst:warmup:type:keep_alive:at:room`, the mark, interval,
/// warm-up and keep-alive in ms, type 0 overall or 1 per client, the grant's time and
/// a token bucket's room (see [`SettleCall::room`]), burst, warm-up and room 0 for a
/// sliding window (the mark first: an excess in its window reads it alone).
fn settle_terms(call: &SettleCall<'_>) -> String {
    let shape = call.bucket.unwrap_or(crate::BucketShape {
        burst: 0,
        warmup_ms: 0,
    });
    let mode = match call.rule.rate_type {
        RateType::Overall => 0,
        RateType::PerClient => 1,
    };
    format!(
        "{}:{}:{}:{}:{}:{mode}:{}:{}:{}:{}",
        call.mark_ms.max(1),
        call.rule.rate,
        call.rule.interval_ms(),
        shape.burst,
        shape.warmup_ms,
        call.rule.keep_alive_ms(),
        call.at,
        call.room,
        call.segment
    )
}

#[cfg(test)]
mod tests {
    use super::outcomes;
    use redis::Value;

    /// One rule's integer alone, several rules' in a table; anything else refused.
    #[test]
    fn a_reply_is_one_integer_per_rule() {
        let one = |v: i64| outcomes(&Value::Int(v), 1).map(|o| (o[0].applied, o[0].left));
        assert_eq!(one(-2), Some((false, None)));
        assert_eq!(one(-1), Some((true, None)));
        assert_eq!(one(0), Some((true, Some(0))));
        assert_eq!(one(7), Some((true, Some(7))));
        assert_eq!(one(-3), None);
        let two = Value::Array(vec![Value::Int(-2), Value::Int(5)]);
        let got = outcomes(&two, 2).unwrap();
        assert_eq!(
            (got[0].applied, got[1].applied, got[1].left),
            (false, true, Some(5))
        );
        assert!(outcomes(&two, 1).is_none(), "a table for one rule");
        assert!(outcomes(&two, 3).is_none(), "a rule missing");
        assert!(outcomes(&Value::Int(1), 2).is_none(), "one integer for two rules");
        assert!(outcomes(&Value::BulkString(b"1".to_vec()), 1).is_none());
        assert!(outcomes(&Value::Array(vec![Value::Int(1), Value::Nil]), 2).is_none());
    }
}
