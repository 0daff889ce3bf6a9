//! The handles a client gives out: a limiter with Redisson's API
//! ([`limiter`]), a token bucket ([`bucket`]).
//! Both wait as the client does (`client::waiting`).

pub(crate) mod bucket;
pub(crate) mod limiter;
