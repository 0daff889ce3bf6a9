//! The guide: what redlimit does beyond the first example, a chapter per subject. The
//! attribute has its own page, [`rate_limit`](crate::rate_limit): each argument,
//! the code it stands for and what each compile error means.
//!
//! - [`runtime`]: the runtime API by hand (Redisson's `RRateLimiter` in Rust names),
//!   clients, and the bound on limiters held in process.
//! - [`rules`]: several rules decided all or nothing in one call, and what a caller's
//!   value written into a limiter's name can reach.
//! - [`layer`]: at the HTTP edge: `ClientIp` behind trusted proxies, refusals as
//!   responses, the tower layer, rules from configuration files, the axum example, and
//!   actix-web.
//! - [`grpc`]: refusals as tonic statuses, the attribute on service methods.
//! - [`token_buckets`]: the other algorithm, with bursts and warm-up.
//! - [`batches`]: refusals answered in process, and hot limits served in batches.
//! - [`settle`]: costs known only after the call (a language model's tokens):
//!   reserve an estimate, then settle what was used.
//! - [`redis`]: the servers supported, TLS, Redis Cluster, failures and `on_error`,
//!   Redis behind Sentinel.
//! - [`redisson`]: the key layout shared with Redisson, where redlimit differs on
//!   purpose, and the tests against Redisson's own Java client.
//! - [`operations`]: metrics and spans, the `redlimit` CLI, rates changed at run time,
//!   incidents, what data loss in Redis does, ACL users.
//!
//! What holds under contention, restarts, hangs, clock skew and hostile input, with the
//! test that shows each, is in RELIABILITY.md; the measurements in BENCHMARKS.md.

#[doc = include_str!("../docs/guide/runtime.md")]
pub mod runtime {}

#[doc = include_str!("../docs/guide/rules.md")]
pub mod rules {}

#[doc = include_str!("../docs/guide/layer.md")]
pub mod layer {}

#[doc = include_str!("../docs/guide/grpc.md")]
pub mod grpc {}

#[doc = include_str!("../docs/guide/token_buckets.md")]
pub mod token_buckets {}

#[doc = include_str!("../docs/guide/batches.md")]
pub mod batches {}

#[doc = include_str!("../docs/guide/settle.md")]
pub mod settle {}

#[doc = include_str!("../docs/guide/redis.md")]
pub mod redis {}

#[doc = include_str!("../docs/guide/redisson.md")]
pub mod redisson {}

// The overview, then docs/operating.md, which stays where the error messages and
// the other documents name it.
#[doc = include_str!("../docs/guide/operations.md")]
#[doc = include_str!("../docs/operating.md")]
pub mod operations {}
