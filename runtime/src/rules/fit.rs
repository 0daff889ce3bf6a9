//! A rule's numbers checked against what the algorithms count exactly: the permits a
//! call asks for against the rate, a token bucket's shape against its arithmetic.

use crate::{Error, RateLimiterConfig};

/// Permits asked for must not exceed the rate: Redisson's "cannot exceed defined rate".
/// The one place this is checked in Rust (acquire.lua checks it in Lua).
pub(crate) fn within_rate(name: &str, permits: u64, rate: u64) -> Result<(), Error> {
    if permits > rate {
        return Err(Error::PermitsExceedRate {
            name: name.to_owned(),
            permits,
            rate,
        });
    }
    Ok(())
}

/// A token bucket's capacity: from 1, and small enough that its tokens, counted in
/// units of 1/interval-in-ms, stay exact in Redis's doubles.
/// A token bucket's shape must fit its exact arithmetic: what is wrong, else `Ok`.
pub fn check_bucket(name: &str, shape: crate::BucketShape, config: &RateLimiterConfig) -> Result<(), Error> {
    let capacity = u128::from(shape.burst) * config.interval.as_millis();
    let problem = if shape.burst == 0 {
        "burst is 0; a token bucket holds at least 1 token"
    } else if capacity > u128::from(crate::MAX_RATE) {
        "burst times the interval in milliseconds is above 2^53: a bucket counts its tokens \
         exactly, in units of 1/(interval in ms) of a token, and they must fit; use a smaller burst or interval"
    } else if shape.warmup_ms > 0 && capacity > u128::from(crate::MAX_RATE / 4) {
        "with a warm-up, burst times the interval in milliseconds must be at most 2^51: a cold \
         bucket may owe up to twice its capacity, and it must count that exactly; use a smaller burst or interval"
    } else if u128::from(shape.warmup_ms) * u128::from(config.rate) > u128::from(MAX_COLD) {
        "warm-up in milliseconds times the rate is above 2^45: a bucket counts its coldness \
         exactly in units of 1/(interval in ms) of a token, and it must fit; use a shorter warm-up"
    } else {
        return Ok(());
    };
    Err(Error::InvalidConfig {
        name: name.to_owned(),
        problem,
    })
}

/// The most coldness a warming-up bucket counts (warm-up in ms times the rate): its
/// cost factor is computed exactly in doubles from 256 times it.
pub(crate) const MAX_COLD: u64 = 1 << 45;
