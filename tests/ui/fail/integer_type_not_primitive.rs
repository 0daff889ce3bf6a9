use redlimit::{rate_limit, RateLimited};

// A parameter of a primitive integer's name is written as digits, which tells
// `items:{id}` apart from `items:daily`. An alias of that name is not one...
mod aliased {
    use redlimit::{rate_limit, RateLimited};

    #[allow(non_camel_case_types)]
    type u64 = String;

    #[rate_limit(key = "items:{id}", rate = 10, interval = "60s")]
    #[rate_limit(key = "items:daily", rate = 1000, interval = "86400s")]
    pub async fn items(id: u64) -> Result<(), RateLimited> {
        let _ = id;
        Ok(())
    }

    // (the body `#[async_trait]` leaves, whose items are in scope where the key is
    // written: the primitive imported there changes nothing)
    #[rate_limit(key = "lists:{id}", rate = 10, interval = "60s")]
    #[rate_limit(key = "lists:daily", rate = 1000, interval = "86400s")]
    pub fn lists(
        id: u64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), RateLimited>> + Send>> {
        Box::pin(async move {
            #[allow(unused_imports)]
            use core::primitive::u64;
            let _ = id;
            Ok(())
        })
    }
}

// ...nor a generic parameter...
#[allow(non_camel_case_types)]
#[rate_limit(key = "carts:{id}", rate = 10, interval = "60s")]
#[rate_limit(key = "carts:daily", rate = 1000, interval = "86400s")]
async fn carts<i32: std::fmt::Display>(id: i32) -> Result<(), RateLimited> {
    let _ = id;
    Ok(())
}

// ...where the primitive is: fine.
#[rate_limit(key = "baskets:{id}", rate = 10, interval = "60s")]
#[rate_limit(key = "baskets:daily", rate = 1000, interval = "86400s")]
async fn baskets(id: u64) -> Result<(), RateLimited> {
    let _ = id;
    Ok(())
}

fn main() {}
