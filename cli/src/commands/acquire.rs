//! `acquire`: N permits taken now, if granted, from an overall sliding window or token
//! bucket, deciding with its stored config; refused is exit code 1.

use std::time::Duration;

use serde_json::json;

use crate::args::Cli;
use crate::inspect::{read_config, token_keys};
use crate::shown::shown;
use crate::store::{self, server_now, Store};
use crate::words::{count, not_found, per_client};
use crate::{Failure, Outcome};

pub async fn acquire(cli: &Cli, url: &str, name: &str, permits: u64) -> Outcome {
    let store = Store::open(url).await?;
    let client = store::builder().connect(url).await?;
    let asked = count(permits, "permit", "permits");
    let (granted, available) = match read_config(&store, name).await? {
        // Every process is a client of its own: the CLI's keys would be a client's
        // that never comes back, left until the keep-alive ends, or for good.
        Some(config) if config.mode == 1 => return Err(Failure::No(per_client(name))),
        Some(_) => {
            let limiter = client.rate_limiter(name.to_owned());
            let granted = limiter.try_acquire(permits).await?;
            (granted, limiter.available_permits().await? as i64)
        }
        None => {
            let now = server_now(&store).await?;
            let (found, clients) = token_keys(&store, name, now, 0).await?;
            let Some(found) = found.first() else {
                return Err(Failure::No(if clients > 0 {
                    per_client(name)
                } else {
                    not_found(name)
                }));
            };
            let Some(state) = found.state else {
                return Err(Failure::No(format!(
                    "`{}` is not a token bucket's state: `inspect {name}` shows what it holds",
                    found.key.key
                )));
            };
            // The handle decides with the stored config, so the bucket keeps it.
            let mut bucket = client
                .token_bucket(
                    name,
                    state.rate as u64,
                    Duration::from_millis(state.interval_ms as u64),
                )
                .burst(state.burst as u64);
            if state.warmup_ms > 0 {
                bucket = bucket.warmup(Duration::from_millis(state.warmup_ms as u64));
            }
            let granted = bucket.try_acquire(permits).await?;
            (granted, bucket.available().await? as i64)
        }
    };
    if cli.json {
        println!(
            "{}",
            json!({"name": name, "permits": permits, "granted": granted, "available": available})
        );
    } else {
        let verb = if granted { "granted" } else { "refused" };
        println!("{}: {asked} {verb}; {available} available", shown(name));
    }
    if granted {
        Ok(())
    } else {
        Err(Failure::No(String::new()))
    }
}
