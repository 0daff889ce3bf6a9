//! A crate that reaches redlimit through a re-export names the path with `crate`.

mod facade {
    pub(crate) use redlimit as limits;
}

use facade::limits::rate_limit;

#[rate_limit(rate = 5, interval = "1s", crate = "facade::limits")]
async fn quoted() -> Result<(), facade::limits::RateLimited> {
    Ok(())
}

#[rate_limit(rate = 5, interval = "1s", crate = facade::limits)]
async fn bare() -> Result<(), facade::limits::RateLimited> {
    Ok(())
}

pub(crate) fn main() {
    let _ = (quoted(), bare());
}
