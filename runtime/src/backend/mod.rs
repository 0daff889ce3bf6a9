//! Where limiter state lives: Redis (the scripts in `lua/`) or this process.
//!
//! Both backends run the same algorithm (Redisson's, as docs/guide/redisson.md describes it) and
//! must give the same answers decision for decision; the differential test holds them
//! to it.

pub(crate) mod decisions;
mod either;
pub(crate) mod memory;
pub(crate) mod redis;

use smallvec::SmallVec;

use crate::keys::Keys;
use std::time::Duration;

use crate::{Decision, Error, LimiterKeys, RateLimiterConfig};

/// One rule of a decision.
#[derive(Clone)]
pub(crate) struct RuleCall<'a> {
    pub keys: Keys<'a>,
    /// Permits to take; 0 asks what is available and writes nothing.
    pub permits: u64,
    /// `Some`: the call owns the config (creates it, or overwrites it keeping the
    /// window). `None`: the stored config is used and must exist.
    pub rule: Option<&'a RateLimiterConfig>,
    /// `Some`: a token bucket (its rate and interval are `rule`'s).
    pub bucket: Option<crate::BucketShape>,
    /// A settled reservation's grant of a token bucket, by its id (15 digits,
    /// `algorithm::segments::LEAST_ID` to `MOST_ID`): the grant
    /// opens a segment of the bucket's pending reservations under it
    /// (`algorithm::segments`), which its settle reads.
    pub reserved: Option<u64>,
}

/// One grant of a reservation, settled with the amount actually used.
#[derive(Clone)]
pub(crate) struct SettleCall<'a> {
    pub keys: Keys<'a>,
    /// The rule's config as the grant decided it.
    pub rule: &'a RateLimiterConfig,
    /// `Some`: a token bucket.
    pub bucket: Option<crate::BucketShape>,
    /// The log member the grant was made under (Redis: found by it).
    pub member: &'a [u8; crate::member::MEMBER_LEN],
    /// The grant's time (in process: found by it and its permits); a token bucket's:
    /// its bucket's refill at the grant (a call across a cluster's slots decides each
    /// in turn: its own slot's time).
    pub at: u64,
    /// The permits the grant took.
    pub estimate: u64,
    /// The permits to count instead.
    pub actual: u64,
    /// A token bucket's: the most its settle may give back right after the grant, in
    /// units of the rule's interval ([`grant_room`](crate::algorithm::bucket::grant_room));
    /// the settle takes off what refilled since
    /// ([`room_at`](crate::algorithm::bucket::room_at)). 0 for a sliding window, whose
    /// log holds its grant.
    pub room: u64,
    /// A token bucket's: the id its grant opened a segment under (0: none, a grant
    /// of no settled rule).
    pub segment: u64,
    /// How long the settle mark is kept (ms): as long as the settle may be sent again.
    pub mark_ms: u64,
    /// The limiter's name hashed as its rule keeps it, when the caller has it (in
    /// process: the table is probed with it, the name not hashed again).
    pub name_hash: Option<u64>,
}

/// What a settle did to one grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SettleOutcome {
    /// Whether it was settled (false: nothing was left to settle).
    pub applied: bool,
    /// The permits the limiter has left after it, when known.
    pub left: Option<u64>,
}

/// The log members a reservation's grants were made under, one per call.
pub(crate) type Members = Vec<[u8; crate::member::MEMBER_LEN]>;

/// What happened to a rule's config during a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConfigChange {
    Kept,
    Created,
    /// Overwritten; the config it replaced.
    Changed(RateLimiterConfig),
}

/// What a decision left one rule with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RuleOutcome {
    /// Permits left after the decision.
    pub left: u64,
    /// What happened to the rule's config.
    pub config: ConfigChange,
}

/// The answer to a decision over one or more rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub granted: bool,
    /// Index of the first rule that refused.
    pub refused: Option<usize>,
    /// Milliseconds until every refusing rule would have enough permits.
    pub retry_ms: u64,
    /// The time the call was decided at: the caller's, or a slightly later grant's.
    pub at_ms: u64,
    /// Per rule, in the order of the calls.
    pub rules: RuleOutcomes,
}

/// Each rule's outcome of a decision, inline for a few.
pub(crate) type RuleOutcomes = SmallVec<[RuleOutcome; 2]>;

/// How a config is written: Redisson 4.4's `keepState` and "require exist".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Configure {
    /// Keep the window (value = rate - permits still in it) instead of restarting it.
    pub keep_state: bool,
    /// Write nothing, and answer false, when the limiter has no config.
    pub require_exists: bool,
}

/// The backend of a [`Client`](crate::Client).
pub(crate) enum Backend {
    Memory(memory::MemoryBackend),
    Redis(std::sync::Arc<redis::RedisBackend>),
}

impl Backend {
    /// What holds this backend's limiters, as the process's registry of rule shapes
    /// tells sites apart: an in-process backend's own table (its address, stable while
    /// the client lives), or Redis, any server (two clients of one server share its
    /// limiters; of two servers, taken as one: the safe side).
    pub(crate) fn store(&self) -> String {
        match self {
            Backend::Memory(b) => format!("memory:{:p}", b as *const memory::MemoryBackend),
            Backend::Redis(_) => "redis".to_owned(),
        }
    }
}

/// Runs one operation on whichever backend it is; on Redis, timed as `operation`. (The
/// in-process one is called directly: wrapping its future would copy it for nothing.)
macro_rules! dispatch {
    ($self:ident, $operation:ident, $b:ident => $e:expr) => {
        match $self {
            Backend::Memory($b) => $e,
            Backend::Redis($b) => {
                crate::observe::redis(crate::observe::Operation::$operation, async { $e }).await
            }
        }
    };
}

/// The span of one decision's script call.
fn redis_span() -> tracing::Span {
    tracing::debug_span!(
        "redlimit.redis",
        db.system.name = "redis",
        db.operation.name = "EVALSHA"
    )
}

/// A decision on Redis, in its span and timed.
async fn redis_acquire(b: &redis::RedisBackend, calls: &[RuleCall<'_>], now: u64) -> Result<Outcome, Error> {
    let span = redis_span();
    let decided = async {
        if b.is_cluster() && !redis::cross_slot::one_slot(calls) {
            redis::cross_slot::acquire(b, calls, now).await
        } else {
            b.acquire(calls, now).await
        }
    };
    let timed = crate::observe::redis(crate::observe::Operation::Acquire, decided);
    tracing::Instrument::instrument(timed, span).await
}

impl Backend {
    /// Decides `calls`; on a cluster, rules in several slots are decided slot by
    /// slot (`cross_slot.rs`, which builds on the single-slot Redis backend).
    pub async fn acquire(&self, calls: &[RuleCall<'_>], now: u64) -> Result<Outcome, Error> {
        match self {
            Backend::Memory(b) => b.acquire(calls, now).await,
            // Boxed: the Redis path's state is kilobytes, and every caller's future
            // would otherwise carry (and move) it, in-process decisions included.
            Backend::Redis(b) => Box::pin(redis_acquire(b, calls, now)).await,
        }
    }

    /// [`acquire`](Backend::acquire) on Redis, not boxed: for a caller whose own future
    /// is boxed already (`Client::check_rules` on Redis).
    pub async fn acquire_unboxed(&self, calls: &[RuleCall<'_>], now: u64) -> Result<Outcome, Error> {
        match self {
            Backend::Memory(b) => b.acquire(calls, now).await,
            Backend::Redis(b) => redis_acquire(b, calls, now).await,
        }
    }

    /// Decides `calls` as [`acquire`](Backend::acquire) does, answering the log
    /// members their grants were made under, for a reservation to settle, and across a
    /// cluster's slots, each decided in turn, the time each call's slot was decided at
    /// (`None`: all at the decision's own time); in process,
    /// with the calls' names hashed as their rules keep them (`hashes`), a granted call
    /// whose `pinned` is true holds its limiter until the reservation lets it go.
    pub async fn reserve(
        &self,
        calls: &[RuleCall<'_>],
        (hashes, pinned): (&[u64], &[bool]),
        now: u64,
    ) -> Result<(Outcome, Members, Option<Vec<u64>>), Error> {
        match self {
            Backend::Memory(b) => {
                let (outcome, members) = b.reserve(calls, hashes, pinned, now)?;
                Ok((outcome, members, None))
            }
            Backend::Redis(b) => {
                let decided = async {
                    if b.is_cluster() && !redis::cross_slot::one_slot(calls) {
                        let (outcome, members, times) =
                            redis::cross_slot::acquire_members(b, calls, now).await?;
                        Ok((outcome, members, Some(times)))
                    } else {
                        let (outcome, members) = b.acquire_group(calls, now).await?;
                        Ok((outcome, members, None))
                    }
                };
                let timed = crate::observe::redis(crate::observe::Operation::Acquire, decided);
                Box::pin(tracing::Instrument::instrument(timed, redis_span())).await
            }
        }
    }

    /// Settles `calls` at `now`: one outcome per call.
    pub async fn settle(&self, calls: &[SettleCall<'_>], now: u64) -> Result<Vec<SettleOutcome>, Error> {
        match self {
            Backend::Memory(b) => b.settle(calls, now),
            Backend::Redis(b) => {
                crate::observe::redis(
                    crate::observe::Operation::Settle,
                    redis::cross_slot::settle(b, calls, now),
                )
                .await
            }
        }
    }

    /// The `backend` label of metrics and spans.
    pub fn label(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
            Backend::Redis(_) => "redis",
        }
    }

    pub async fn try_set_rate(
        &self,
        keys: &LimiterKeys,
        config: &RateLimiterConfig,
        now: u64,
    ) -> Result<bool, Error> {
        dispatch!(self, TrySetRate, b => b.try_set_rate(keys, config, now).await)
    }

    /// Writes `config` (see `lua/configure.lua`); false when `how.require_exists` and
    /// the limiter has no config (nothing is written).
    pub async fn configure(
        &self,
        keys: &LimiterKeys,
        config: &RateLimiterConfig,
        how: Configure,
        now: u64,
    ) -> Result<bool, Error> {
        dispatch!(self, Configure, b => b.configure(keys, config, how, now).await)
    }

    pub async fn release(&self, keys: &LimiterKeys, permits: u64, now: u64) -> Result<(), Error> {
        dispatch!(self, Release, b => b.release(keys, permits, now).await)
    }

    pub async fn config(&self, keys: &LimiterKeys, now: u64) -> Result<Option<RateLimiterConfig>, Error> {
        dispatch!(self, Config, b => b.config(keys, now).await)
    }

    pub async fn keep_alive(&self, keys: &LimiterKeys, keep_ms: u64, now: u64) -> Result<(), Error> {
        dispatch!(self, KeepAlive, b => b.keep_alive(keys, keep_ms, now).await)
    }

    pub async fn expire(&self, keys: &LimiterKeys, ttl_ms: u64, now: u64) -> Result<bool, Error> {
        dispatch!(self, Expire, b => b.expire(keys, ttl_ms, now).await)
    }

    pub async fn delete(&self, keys: &LimiterKeys, now: u64) -> Result<bool, Error> {
        dispatch!(self, Delete, b => b.delete(keys, now).await)
    }

    /// Deletes a token bucket of `mode`; true when it existed.
    pub async fn delete_bucket(
        &self,
        keys: &LimiterKeys,
        mode: crate::RateType,
        now: u64,
    ) -> Result<bool, Error> {
        dispatch!(self, Delete, b => b.delete_bucket(keys, mode, now).await)
    }

    pub async fn is_exists(&self, keys: &LimiterKeys, now: u64) -> Result<bool, Error> {
        dispatch!(self, IsExists, b => b.is_exists(keys, now).await)
    }
}

impl Outcome {
    /// The decision this outcome is, as a caller sees it.
    pub(crate) fn decision(&self) -> Decision {
        let outcome = self;
        Decision {
            allowed: outcome.granted,
            remaining: outcome.rules.iter().map(|r| r.left).min().unwrap_or(0),
            retry_after: (!outcome.granted).then(|| Duration::from_millis(outcome.retry_ms)),
            refused_by: outcome.refused,
            at_ms: outcome.at_ms,
            tightest: outcome
                .rules
                .iter()
                .enumerate()
                .min_by_key(|(_, r)| r.left)
                .map(|(i, _)| i),
        }
    }
}
