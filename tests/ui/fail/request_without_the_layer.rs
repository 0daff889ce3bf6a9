// A key naming the request, through a facade whose `__private::Request` has no request
// scope: what a build of redlimit without the `tower` feature reports.
mod facade {
    pub use redlimit::*;
    pub mod __private {
        pub use redlimit::__private::*;
        pub struct Request;
    }
}

#[facade::rate_limit(key = "llm:user:{request.identity}", rate = 5, interval = "1s", crate = facade)]
async fn ask(prompt: &str) -> Result<usize, facade::RateLimited> {
    Ok(prompt.len())
}

fn main() {}
