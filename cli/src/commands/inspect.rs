//! `inspect`: a limiter read whole (`crate::inspect`), printed for people or as JSON;
//! unhealthy is exit code 1.

use crate::args::Cli;
use crate::inspect::inspect;
use crate::store::Store;
use crate::words::not_found;
use crate::{Failure, Outcome};

/// `inspect`: every key of the limiter, its state, and what is wrong with it.
pub async fn inspect_one(cli: &Cli, url: &str, name: &str, clients: usize) -> Outcome {
    let store = Store::open(url).await?;
    let inspection = inspect(&store, name, clients).await?;
    if inspection.config.is_none()
        && inspection.token_buckets.is_empty()
        && inspection.client_keys == 0
        && inspection.problems.is_empty()
    {
        return Err(Failure::No(not_found(name)));
    }
    if cli.json {
        println!("{}", inspection.json());
    } else {
        print!("{}", inspection.human());
    }
    if !inspection.problems.is_empty() {
        return Err(Failure::No(String::new()));
    }
    Ok(())
}
