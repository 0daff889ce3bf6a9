//! `override set`, `override ls` and `override rm`: the rates changed at run time for
//! every process, of a rule or of one limiter.

use std::time::Duration;

use redlimit_runtime::{Client, OverrideOf, RateOverride};
use serde_json::json;

use crate::args::{Cli, OverrideAction};
use crate::duration;
use crate::shown::{shown, shown_width};
use crate::store;
use crate::{Failure, Outcome};

/// NAME as a rule or, when it starts with the prefix, as one limiter.
fn override_of(name: &str, prefix: &str) -> OverrideOf {
    if !prefix.is_empty() && name.starts_with(prefix) {
        OverrideOf::Key(name.to_owned())
    } else {
        OverrideOf::Rule(name.to_owned())
    }
}

fn describe(of: &OverrideOf) -> (&'static str, &str) {
    match of {
        OverrideOf::Rule(name) => ("rule", name),
        OverrideOf::Key(name) => ("limiter", name),
    }
}

pub async fn overrides(cli: &Cli, url: &str, action: &OverrideAction, prefix: &str) -> Outcome {
    let client = store::builder().prefix(prefix).connect(url).await?;
    match action {
        OverrideAction::Set { name, rate, interval } => {
            let of = override_of(name, prefix);
            override_set(cli, &client, of, *rate, *interval).await
        }
        OverrideAction::Ls => override_ls(cli, &client).await,
        OverrideAction::Rm { name } => override_rm(cli, &client, override_of(name, prefix)).await,
    }
}

/// `override set`: every process decides `of` with this rate.
async fn override_set(cli: &Cli, client: &Client, of: OverrideOf, rate: u64, interval: Duration) -> Outcome {
    client
        .set_override(&RateOverride {
            of: of.clone(),
            rate,
            interval,
        })
        .await?;
    let (kind, name) = describe(&of);
    if cli.json {
        println!(
            "{}",
            json!({"of": kind, "name": name, "rate": rate, "interval_ms": interval.as_millis() as u64})
        );
    } else {
        println!(
            "{kind} {}: {rate} per {} in every process within about a second",
            shown(name),
            duration::show_ms(interval.as_millis() as u64)
        );
    }
    Ok(())
}

/// `override ls`: the overrides set, as a table or JSON.
async fn override_ls(cli: &Cli, client: &Client) -> Outcome {
    let list = client.list_overrides().await?;
    if cli.json {
        let list: Vec<_> = list
            .iter()
            .map(|o| {
                let (kind, name) = describe(&o.of);
                json!({"of": kind, "name": name, "rate": o.rate, "interval_ms": o.interval.as_millis() as u64})
            })
            .collect();
        println!("{}", json!(list));
        return Ok(());
    }
    let width = list
        .iter()
        .map(|o| shown_width(describe(&o.of).1))
        .max()
        .unwrap_or(4)
        .max(4);
    println!(
        "{:<7}  {:<width$}  {:>10}  {:>8}",
        "OF", "NAME", "RATE", "INTERVAL"
    );
    for o in &list {
        let (kind, name) = describe(&o.of);
        let name = shown(name);
        println!(
            "{kind:<7}  {name:<width$}  {:>10}  {:>8}",
            o.rate,
            duration::show_ms(o.interval.as_millis() as u64)
        );
    }
    Ok(())
}

/// `override rm`: `of`'s own rate applies again.
async fn override_rm(cli: &Cli, client: &Client, of: OverrideOf) -> Outcome {
    let removed = client.remove_override(&of).await?;
    let (kind, name) = describe(&of);
    if cli.json {
        println!("{}", json!({"of": kind, "name": name, "removed": removed}));
    } else if removed {
        println!(
            "{kind} {}: override removed; its own rate applies again",
            shown(name)
        );
    }
    if removed {
        Ok(())
    } else {
        Err(Failure::No(format!("no override of {kind} `{name}`")))
    }
}
