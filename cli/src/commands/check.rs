//! `check`: whether N permits would be granted now, read from the stored state
//! (`crate::inspect`'s peek), taking nothing; refused is exit code 1.

use serde_json::json;

use crate::args::Cli;
use crate::duration;
use crate::peek::peek;
use crate::shown::shown;
use crate::store::Store;
use crate::words::count;
use crate::{Failure, Outcome};

/// `check`: whether `permits` would be granted now, taking nothing.
pub async fn check(cli: &Cli, url: &str, name: &str, permits: u64) -> Outcome {
    let store = Store::open(url).await?;
    let peek = peek(&store, name, permits).await?.map_err(Failure::No)?;
    let asked = count(permits, "permit", "permits");
    if cli.json {
        println!(
            "{}",
            json!({"name": name, "permits": permits, "allowed": peek.allowed, "available": peek.available, "retry_after_ms": peek.retry_after_ms})
        );
    } else if peek.allowed {
        println!(
            "{}: {asked} would be granted; {} available",
            shown(name),
            peek.available
        );
    } else {
        let retry = peek.retry_after_ms.map_or(
            "never: more than the limiter ever grants at once".to_owned(),
            |ms| format!("in {}", duration::show_ms(ms.max(0) as u64)),
        );
        println!(
            "{}: {asked} would be refused; {} available; retry {retry}",
            shown(name),
            peek.available
        );
    }
    if peek.allowed {
        Ok(())
    } else {
        Err(Failure::No(String::new()))
    }
}
