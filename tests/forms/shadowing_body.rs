//! A body that defines the names the prologue could use does not disturb it.

use redlimit::{rate_limit, RateLimited};

#[rate_limit(key = "shadow:{id}", rate = 5, interval = "1s")]
async fn shadowing(id: u32) -> Result<u32, RateLimited> {
    #[allow(non_snake_case, unused)]
    mod core {}
    #[allow(unused)]
    struct Result;
    #[allow(unused)]
    fn decide() {}
    let __redlimit_keys = 1;
    let __redlimit_refused = 2;
    let __redlimit_key = 3;
    #[allow(non_upper_case_globals, unused)]
    static __REDLIMIT_SITE: u8 = 0;
    let redlimit = id + __redlimit_keys + __redlimit_refused + __redlimit_key;
    ::core::result::Result::Ok(redlimit)
}

#[allow(unused)]
#[allow(non_snake_case)]
mod Option {}

pub(crate) fn main() {
    drop(shadowing(1));
}
