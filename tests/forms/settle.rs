//! `cost` and `settle`: the LLM completion's three rules, a cost known before the
//! call, a settle function returning another unsigned integer, a literal cost, a method,
//! `return` and `?` in a settled body, and `#[async_trait]`.

use redlimit::{rate_limit, RateLimited};

pub struct Request {
    pub max_tokens: u32,
}

pub struct Completion {
    pub tokens: u64,
}

#[derive(Debug)]
pub enum ApiError {
    Limited(RateLimited),
    Empty,
}

impl From<RateLimited> for ApiError {
    fn from(limited: RateLimited) -> Self {
        ApiError::Limited(limited)
    }
}

fn tokens_used(result: &Result<Completion, ApiError>) -> u64 {
    result.as_ref().map_or(0, |c| c.tokens)
}

fn small(result: &Result<Completion, ApiError>) -> u32 {
    result.as_ref().map_or(0, |c| c.tokens as u32)
}

fn check(prompt: &str) -> Result<(), ApiError> {
    if prompt.is_empty() {
        Err(ApiError::Empty)
    } else {
        Ok(())
    }
}

#[rate_limit(key = "llm:tokens:user:{user}", rate = 40_000, interval = "60s", cost = request.max_tokens, settle = tokens_used)]
#[rate_limit(key = "llm:tokens", rate = 2_000_000, interval = "60s", cost = request.max_tokens, settle = small, max_overdraft = 0)]
#[rate_limit(key = "llm:requests:user:{user}", rate = 20, interval = "60s")]
pub async fn complete(user: u64, request: &Request, prompt: &str) -> Result<Completion, ApiError> {
    check(prompt)?;
    if prompt == "short" {
        return Ok(Completion { tokens: 1 });
    }
    Ok(Completion {
        tokens: u64::from(request.max_tokens),
    })
}

#[rate_limit(key = "upload:{user}", rate = 1_000_000, interval = "60s", cost = body.len())]
pub async fn upload(user: u64, body: &[u8]) -> Result<usize, RateLimited> {
    Ok(body.len())
}

pub struct Model {
    pub name: String,
}

fn named(name: &Result<String, RateLimited>) -> usize {
    name.as_ref().map_or(0, String::len)
}

impl Model {
    #[rate_limit(key = "model:{self.name}", rate = 100, interval = "1s", cost = 10, settle = named)]
    pub async fn name(&self) -> Result<String, RateLimited> {
        Ok(self.name.clone())
    }
}

#[async_trait::async_trait]
pub trait Service {
    async fn call(&self, n: u64) -> Result<u64, RateLimited>;
}

fn used(r: &Result<u64, RateLimited>) -> u64 {
    *r.as_ref().unwrap_or(&0)
}

#[async_trait::async_trait]
impl Service for Model {
    #[rate_limit(key = "service", rate = 100, interval = "1s", cost = n, settle = used)]
    async fn call(&self, n: u64) -> Result<u64, RateLimited> {
        Ok(n)
    }
}

pub(crate) fn main() {}
