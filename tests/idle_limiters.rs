//! Limiters that went idle in process (every part expired) and what a call does with
//! them, through the attribute on an in-process default client with a manual clock:
//! a call refused before the backend (a cost above the rate) reads what its key has
//! left with a call of 0 permits, which must write nothing. Where it made an idle
//! limiter live without an expiry, two calls per key filled the table for good and
//! every new key was refused with `MemoryFull`. The default client is process-wide, so
//! this binary runs one test.

use std::time::Duration;

use redlimit::{rate_limit, Client, ManualClock, RateLimited};

#[rate_limit(key = "idle:{user}", rate = 5, interval = "1s", cost = n)]
async fn call(user: u64, n: u64) -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn reading_an_idle_key_leaves_room_for_new_keys() {
    const MAX: usize = 64;
    let clock = ManualClock::new(1_700_000_000_000);
    let client = Client::builder().max_limiters(MAX).clock(clock.clone()).memory();
    redlimit::set_default(client).unwrap();
    for user in 0..MAX as u64 {
        call(user, 1).await.unwrap();
    }
    // Each key idle, then read by a call no wait would let pass (6 of a rate of 5).
    clock.advance(Duration::from_millis(1_500));
    for user in 0..MAX as u64 {
        assert!(call(user, 6).await.is_err(), "user {user}: 6 of a rate of 5");
    }
    // An hour later the table has room for new keys, as Redis would.
    clock.advance(Duration::from_secs(3_600));
    let granted = granted_of(MAX as u64..MAX as u64 + 200).await;
    assert_eq!(granted, 200, "new keys granted after the idle keys were read");
}

async fn granted_of(users: std::ops::Range<u64>) -> usize {
    let mut granted = 0;
    for user in users {
        granted += usize::from(call(user, 1).await.is_ok());
    }
    granted
}
