//! Two rules of [redlimit](https://docs.rs/redlimit), written once: the duration
//! grammar ([`duration`]) and Redis Cluster's hash-tag rule as it bears on a
//! limiter's name ([`hash_tag`]).
//!
//! The `#[rate_limit]` attribute checks both at compile time and may not depend on the
//! runtime; the runtime and the `redlimit` CLI check them at run time. This crate,
//! with no dependencies, is what they share, so that each rule has one text and its
//! messages one wording.

pub mod duration;
pub mod hash_tag;

/// The largest integer the scripts count exactly (rates, permits, durations in ms):
/// Redis scripts count in doubles, exact up to 2^53.
pub const MAX_EXACT: u64 = 1 << 53;
