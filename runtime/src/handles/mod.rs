//! The handles a client gives out: a limiter with Redisson's API
//! ([`limiter`]), a token bucket ([`bucket`]).
//! Both wait as the client does (`client::waiting`).

/// The three ways a handle takes what it counts, on top of its `check`: now or not
/// at all, waiting up to a timeout, waiting as long as it takes. Written once for
/// both handles.
macro_rules! waiting_methods {
    ($what:literal, $now:literal) => {
        #[doc = $now]
        pub async fn try_acquire(&self, permits: u64) -> Result<bool, Error> {
            Ok(self.check(permits).await?.allowed)
        }

        #[doc = concat!(
                    "Takes `permits` ", $what, ", waiting up to `timeout` for them. Gives up as soon ",
                    "as the wait the backend reports cannot end before the deadline, and never ",
                    "sleeps past it."
                )]
        pub async fn try_acquire_for(&self, permits: u64, timeout: Duration) -> Result<bool, Error> {
            crate::client::waiting::within(timeout, || self.check(permits)).await
        }

        #[doc = concat!("Takes `permits` ", $what, ", waiting as long as it takes.")]
        pub async fn acquire(&self, permits: u64) -> Result<(), Error> {
            crate::client::waiting::until_allowed(None, || self.check(permits)).await?;
            Ok(())
        }
    };
}

pub(crate) mod bucket;
pub(crate) mod limiter;
