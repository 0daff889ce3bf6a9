//! A decision's script call: acquire.lua, or tokens.lua when every rule is a token
//! bucket, its command written straight into one buffer, its reply read back.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::lua::{eval_sha, Lua};

use super::give_back::{may_have_run, RefundIfDropped};
use super::replicas::Waited;
use super::replies::{parse_acquire_reply, CHECK};
use super::{layout, Arg, RedisBackend, SCRIPTS};
use crate::backend::{Outcome, RuleCall};
use crate::keys::Keys;
use crate::{member, Error, RateLimiterConfig, RateType};

impl RedisBackend {
    /// Decides rules whose keys share one slot, in one script call.
    pub async fn acquire(&self, calls: &[RuleCall<'_>], now: u64) -> Result<Outcome, Error> {
        Ok(self.acquire_group(calls, now).await?.0)
    }

    /// Decides rules whose keys share one slot in one script call; answers the log
    /// members it sent, for compensation.
    pub(crate) async fn acquire_group(
        &self,
        calls: &[RuleCall<'_>],
        now: u64,
    ) -> Result<(Outcome, Vec<[u8; member::MEMBER_LEN]>), Error> {
        self.maybe_check(now);
        // A call that fails before it is sent has nothing to refund.
        let keys: Vec<Keys<'_>> = calls.iter().map(|c| c.keys).collect();
        let (failed_before, pace) = self.sendable(&keys)?;
        let mut members: Vec<[u8; member::MEMBER_LEN]> = calls
            .iter()
            .map(|call| member::new_member(u32::try_from(call.permits).unwrap_or(u32::MAX)))
            .collect();
        let only_buckets = calls.iter().all(|c| c.bucket.is_some() && c.rule.is_some());
        // Numbered in turn: the replies of the calls sent before and after it do not
        // carry its tag. acquire.lua reads it in the first member; tokens.lua, which
        // takes no member, after the rules' arguments.
        let number = self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = number % CHECK;
        if let Some(first) = members.first_mut().filter(|_| !only_buckets) {
            member::tag(first, tag);
        }
        let script = if only_buckets {
            &SCRIPTS.tokens
        } else {
            &SCRIPTS.acquire
        };
        let cmd = self.acquire_command(script, calls, &members, only_buckets, now, tag);
        let probe = calls.iter().all(|c| c.permits == 0);
        // A token bucket's grant is not in any log: nothing to take back.
        let refundable = !(probe || only_buckets);
        let cancelled = RefundIfDropped {
            backend: self,
            calls,
            members: &members,
            armed: refundable,
        };
        if let Some(waits) = self.waits.as_ref().filter(|_| !probe) {
            let waited = Waited {
                script,
                cmd,
                calls,
                members: &members,
                only_buckets,
                refundable,
                now,
                number,
            };
            let outcome = self.acquire_replicated(waits, waited, failed_before, &pace).await;
            cancelled.disarm();
            return Ok((outcome?, members));
        }
        // A try sent again (its slot being moved, `moves.rs`) is written at the time it
        // is sent: no try before it ran, and the first's time would date its grant
        // back by the waits between, letting a later call's window miss it.
        let (cmd, tries, sent_at) = (&cmd, AtomicBool::new(false), AtomicU64::new(now));
        let (tries, sent_at, members_sent) = (&tries, &sent_at, &members);
        let reply: Result<redis::Value, Error> = self
            .send(failed_before, &pace, &keys, true, |mut conn| async move {
                if tries.swap(true, Ordering::Relaxed) {
                    let at = now.max(self.now_ms());
                    sent_at.store(at, Ordering::Relaxed);
                    let cmd = self.acquire_command(script, calls, members_sent, only_buckets, at, tag);
                    eval_sha(script, &cmd, &mut conn, self.slot_map()).await
                } else {
                    eval_sha(script, cmd, &mut conn, self.slot_map()).await
                }
            })
            .await;
        let now = sent_at.load(Ordering::Relaxed);
        cancelled.disarm();
        let reply = match reply {
            Ok(reply) => reply,
            Err(guess @ Error::WrongType { .. }) => return Err(self.wrong_type(calls, guess).await),
            Err(err) => {
                if refundable && may_have_run(&err) {
                    self.spawn_refund(calls, members);
                }
                return Err(err);
            }
        };
        let outcome = self.noting_step(self.read_outcome(&reply, calls.len(), now, number, only_buckets))?;
        Ok((outcome, members))
    }

    /// The EVALSHA of the acquire script (`layout::acquire`) or, when every rule is a
    /// token bucket, of the tokens script (`layout::tokens`), written straight into
    /// one command: every key, then every argument (tokens.lua's last, the call's
    /// `tag`), into buffers allocated once (growing them argument by argument cost
    /// more than building the rest).
    fn acquire_command(
        &self,
        script: &Lua,
        calls: &[RuleCall<'_>],
        members: &[[u8; member::MEMBER_LEN]],
        only_buckets: bool,
        now: u64,
        tag: u64,
    ) -> redis::Cmd {
        let mut cmd = redis::Cmd::with_capacity(
            5 + 12 * calls.len(),
            64 + calls.iter().map(|c| c.keys.all_len() + 112).sum::<usize>(),
        );
        cmd.arg("EVALSHA");
        cmd.arg(script.hash()).arg(if only_buckets {
            layout::tokens::KEYS_PER_RULE * calls.len()
        } else {
            layout::acquire::KEYS_PER_RULE * calls.len()
        });
        for call in calls {
            match (call.bucket, call.rule) {
                (_, Some(rule)) if only_buckets => cmd.arg(bucket_key(call, rule)),
                // A token bucket in acquire.lua: its two bucket keys in the value keys' places.
                (Some(_), Some(_)) => cmd.arg(&bucket_keys(call)[..]),
                _ => cmd.arg(call.keys),
            };
        }
        cmd.arg(self.now_arg(now));
        for (call, member) in calls.iter().zip(members) {
            match (call.bucket, call.rule) {
                (Some(shape), Some(rule)) if only_buckets => cmd.arg(&tokens_args(call, rule, shape)[..]),
                _ => cmd.arg(&acquire_args(call, member)[..]),
            };
        }
        if only_buckets {
            cmd.arg(&[(tag >> 16) as u8, (tag >> 8) as u8, tag as u8][..]);
        }
        // A pending reservation's grants of token buckets open their segments: each
        // rule's id, comma separated (empty for a rule of none), sent only when one is.
        if calls.iter().any(|c| c.reserved.is_some()) {
            let mut reserved = String::new();
            for (i, call) in calls.iter().enumerate() {
                if i > 0 {
                    reserved.push(',');
                }
                if let Some(id) = call.reserved {
                    reserved.push_str(&id.to_string());
                }
            }
            cmd.arg(reserved);
        }
        cmd
    }

    /// The acquire or tokens script's reply as an outcome (`calls` rules decided at
    /// `now`, the caller's clock, the call numbered `number`). A reply that comes once
    /// the call numbered `number` + [`CHECK`], of the same tag, may have been sent is
    /// not told from that call's, and does not fit either.
    pub(super) fn read_outcome(
        &self,
        reply: &redis::Value,
        calls: usize,
        now: u64,
        number: u64,
        only_buckets: bool,
    ) -> Result<Outcome, Error> {
        let caller_now = (!self.server_time).then_some(now);
        let numbered = self.calls.load(std::sync::atomic::Ordering::Relaxed);
        let outcome = told_apart(number, numbered)
            .then(|| parse_acquire_reply(reply, calls, caller_now, Some(number % CHECK)))
            .flatten();
        outcome.ok_or_else(|| Error::UnexpectedReply {
            script: if only_buckets { "tokens.lua" } else { "acquire.lua" },
            reply: super::replies::abbreviated(format!("{reply:?}"), 200),
        })
    }

    /// acquire.lua reads with plain commands, so a key of the wrong type fails with
    /// Redis's WRONGTYPE, which does not say which key: look at each (an error path
    /// only) and name the first that holds the wrong type, else keep `guess`. The
    /// search takes at most one command timeout in all, however many keys it reads.
    pub(super) async fn wrong_type(&self, calls: &[RuleCall<'_>], guess: Error) -> Error {
        match tokio::time::timeout(self.timeout, self.key_of_wrong_type(calls)).await {
            Ok(Some(found)) => found,
            Ok(None) | Err(_) => guess,
        }
    }

    /// The first of the calls' keys that holds the wrong type, as an error; `None`
    /// when none does or a read fails.
    async fn key_of_wrong_type(&self, calls: &[RuleCall<'_>]) -> Option<Error> {
        for call in calls {
            let k = call.keys;
            let expected: Vec<(String, &str, &'static str)> = if call.bucket.is_some() {
                vec![
                    (k.bucket(), "string", "bucket"),
                    (k.client_bucket(), "string", "bucket"),
                ]
            } else {
                vec![
                    (k.config().to_owned(), "hash", "config"),
                    (k.value(), "string", "value"),
                    (k.client_value(), "string", "value"),
                    (k.permits(), "zset", "permits"),
                    (k.client_permits(), "zset", "permits"),
                ]
            };
            for (key, kind, role) in expected {
                let found: Result<String, Error> = self
                    .run(&[k], |mut conn| {
                        let key = key.clone();
                        async move { redis::cmd("TYPE").arg(key).query_async(&mut conn).await }
                    })
                    .await;
                match found {
                    Ok(found) if found != kind && found != "none" => {
                        return Some(Error::WrongType {
                            key,
                            role,
                            detail: format!("holds a {found}"),
                        })
                    }
                    Ok(_) => {}
                    Err(_) => return None,
                }
            }
        }
        None
    }
}

/// Whether the reply to the call numbered `number` can be told from another call's
/// by its tag, `numbered` calls numbered so far: fewer than [`CHECK`] were numbered
/// since, so no call after it has its tag (a connection that lost replies hands a
/// call the reply of a call after it).
fn told_apart(number: u64, numbered: u64) -> bool {
    numbered.wrapping_sub(number) <= CHECK
}

/// tokens.lua's key for one rule: its bucket, overall or per client.
fn bucket_key(call: &RuleCall<'_>, rule: &RateLimiterConfig) -> String {
    match rule.rate_type {
        RateType::Overall => call.keys.bucket(),
        RateType::PerClient => call.keys.client_bucket(),
    }
}

/// acquire.lua's keys for a token-bucket rule: the limiter's, with its buckets in the
/// value keys' places.
fn bucket_keys(call: &RuleCall<'_>) -> [String; layout::acquire::KEYS_PER_RULE] {
    use layout::acquire::{BUCKET, CLIENT_BUCKET, CLIENT_PERMITS_KEY, CONFIG, PERMITS_KEY};
    let k = call.keys;
    let mut keys: [String; layout::acquire::KEYS_PER_RULE] = Default::default();
    keys[CONFIG] = k.config().to_owned();
    keys[BUCKET] = k.bucket();
    keys[CLIENT_BUCKET] = k.client_bucket();
    keys[PERMITS_KEY] = k.permits();
    keys[CLIENT_PERMITS_KEY] = k.client_permits();
    keys
}

/// acquire.lua's arguments for one rule.
fn acquire_args<'a>(call: &RuleCall<'_>, member: &'a [u8]) -> [Arg<'a>; layout::acquire::ARGS_PER_RULE] {
    use layout::acquire::*;
    let mut args = [Arg::Text(""); ARGS_PER_RULE];
    args[PERMITS] = Arg::Int(call.permits);
    args[MEMBER] = Arg::Bytes(member);
    match (call.bucket, call.rule) {
        (Some(shape), Some(rule)) => {
            args[WARMUP] = Arg::Int(shape.warmup_ms);
            args[RATE] = Arg::Int(rule.rate);
            args[INTERVAL] = Arg::Int(rule.interval_ms());
            args[TYPE] = Arg::Text(bucket_kind(rule.rate_type));
            args[BURST] = Arg::Int(shape.burst);
        }
        (None, Some(rule)) => {
            args[OWNS] = Arg::Text("1");
            args[RATE] = Arg::Int(rule.rate);
            args[INTERVAL] = Arg::Int(rule.interval_ms());
            args[TYPE] = Arg::Text(rule.rate_type.as_redis());
            args[KEEP_ALIVE] = Arg::Int(rule.keep_alive_ms());
        }
        // the stored config, used as it is: the config's arguments are not read
        (_, None) => args[OWNS] = Arg::Text("0"),
    }
    args
}

/// tokens.lua's arguments for one rule.
fn tokens_args(
    call: &RuleCall<'_>,
    rule: &RateLimiterConfig,
    shape: crate::BucketShape,
) -> [Arg<'static>; layout::tokens::ARGS_PER_RULE] {
    use layout::tokens::*;
    let mut args = [Arg::Text(""); ARGS_PER_RULE];
    args[PERMITS] = Arg::Int(call.permits);
    args[RATE] = Arg::Int(rule.rate);
    args[INTERVAL] = Arg::Int(rule.interval_ms());
    args[BURST] = Arg::Int(shape.burst);
    args[WARMUP] = Arg::Int(shape.warmup_ms);
    args[TYPE] = Arg::Text(bucket_kind(rule.rate_type));
    args
}

/// A token bucket's type in the scripts' arguments: "2" overall, "3" per client.
fn bucket_kind(mode: RateType) -> &'static str {
    match mode {
        RateType::Overall => "2",
        RateType::PerClient => "3",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The call numbered n + 2^20 has n's tag: once it is numbered, n's reply does
    /// not fit.
    #[test]
    fn a_reply_is_told_apart_until_its_tag_comes_round_again() {
        let n = 5;
        assert!(told_apart(n, n + 1), "the call itself numbered");
        assert!(
            told_apart(n, n + CHECK),
            "the last call with another tag numbered"
        );
        assert!(!told_apart(n, n + CHECK + 1), "the call with n's tag numbered");
        assert!(!told_apart(n, n + 3 * CHECK));
        assert!(told_apart(u64::MAX, 3), "across the counter's wrap");
    }
}
