//! Every form the attribute accepts compiles: free functions, each receiver, generics,
//! opaque returns, doc comments with other attributes, native async fn in trait impls.

use std::fmt::Display;

use redlimit::{rate_limit, RateLimited};

/// A documented function.
#[rate_limit(
    key = "free:{id}",
    rate = 5,
    interval = "1s",
    mode = "per_client",
    permits = 2,
    timeout = "100ms",
    on_error = "deny",
    message = "too many"
)]
#[must_use]
#[allow(clippy::unused_async)]
pub async fn free(id: u64) -> Result<u64, RateLimited> {
    Ok(id)
}

/// A hot global limit served in batches.
#[rate_limit(key = "hot", rate = 1000, interval = "1s", batch = 10, batch_lease = "50ms")]
pub async fn batched() -> Result<(), RateLimited> {
    Ok(())
}

pub struct Service {
    name: String,
}

impl Service {
    #[rate_limit(key = "svc:{self.name}", rate = 5, interval = "1s")]
    pub async fn by_ref(&self) -> Result<usize, RateLimited> {
        Ok(self.name.len())
    }

    #[rate_limit(key = "svc:{self.name}:mut", rate = 5, interval = "1s")]
    pub async fn by_mut(&mut self, suffix: &str) -> Result<(), RateLimited> {
        self.name.push_str(suffix);
        Ok(())
    }

    #[rate_limit(key = "svc:{self.name}:owned", rate = 5, interval = "1s")]
    pub async fn by_value(self) -> Result<String, RateLimited> {
        Ok(self.name)
    }
}

#[rate_limit(key = "generic:{value}", rate = 5, interval = "1s")]
pub async fn generic<T: Display + Send + Sync, const N: usize>(
    value: T,
    _array: [u8; N],
) -> Result<String, RateLimited> {
    Ok(value.to_string())
}

#[rate_limit(rate = 5, interval = "1m30s", timeout = "1.5s")]
pub async fn opaque(n: u32) -> Result<impl Display, RateLimited> {
    Ok(n + 1)
}

#[rate_limit(key = "instrumented:{n}", rate = 5, interval = "1s")]
#[tracing::instrument]
pub async fn instrumented(n: u32) -> Result<u32, RateLimited> {
    Ok(n)
}

#[allow(async_fn_in_trait)]
pub trait Repository {
    async fn load(&self, id: u32) -> Result<u32, RateLimited>;
}

impl Repository for Service {
    #[rate_limit(key = "repo:{id}", rate = 5, interval = "1s")]
    async fn load(&self, id: u32) -> Result<u32, RateLimited> {
        Ok(id)
    }
}

#[async_trait::async_trait]
pub trait Boxed {
    async fn fetch(&self, id: u32) -> Result<u32, RateLimited>;
}

#[async_trait::async_trait]
impl Boxed for Service {
    #[rate_limit(key = "boxed:{self.name}:{id}", rate = 5, interval = "1s")]
    async fn fetch(&self, id: u32) -> Result<u32, RateLimited> {
        Ok(id)
    }
}

pub(crate) fn main() {}
