//! `redlimit`: look at and tune the rate limiters in a Redis (single node or cluster),
//! written by redlimit or by Redisson.
//!
//! Exit codes: 0 ok; 1 refused (`check`, `acquire`), unhealthy (`inspect`) or not found;
//! 2 usage; 3 Redis failed or answered something unexpected.

mod duration;
mod inspect;
mod store;

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use redis::AsyncCommands;
use redlimit_runtime::keys::{library_key, suffix};
use redlimit_runtime::{delete_limiter_keys, Client, OverrideOf, RateLimiterArgs, RateOverride, RateType};
use serde_json::json;

use crate::inspect::{glob_escape, inspect, peek, read_config, server_now};
use crate::store::Store;

#[derive(Parser)]
#[command(
    name = "redlimit",
    version,
    about = "Inspect, list, tune and reset rate limiters in Redis"
)]
struct Cli {
    /// Redis URL: redis://[user:password@]host:port/[db], rediss:// for TLS,
    /// redis+cluster://host:port,host:port/ for a cluster.
    #[arg(long, env = "REDIS_URL", hide_env_values = true, global = true)]
    url: Option<String>,
    /// Machine-readable output (one JSON document; one per line for `watch`).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A limiter's config, keys and TTLs, value, grant log and health.
    Inspect {
        name: String,
        /// Per-client keys shown at most.
        #[arg(long, default_value_t = 20)]
        clients: usize,
    },
    /// Limiters found by SCAN on every primary: rate, usage and memory.
    Ls {
        /// A SCAN pattern for limiter names.
        #[arg(default_value = "*")]
        pattern: String,
        #[arg(long, value_enum, default_value_t = Sort::Name)]
        sort: Sort,
        /// Limiters listed at most (the scan stops there).
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
    /// Changes a limiter's rate, keeping its window (or restarting it with --reset).
    SetRate {
        name: String,
        #[arg(long)]
        rate: u64,
        /// The window: 60s, 1m30s, 500ms, 1h, ...
        #[arg(long, value_parser = duration::parse)]
        interval: Duration,
        #[arg(long, value_enum, default_value_t = Mode::Overall)]
        mode: Mode,
        /// Keys' keep-alive (at least the interval; default: the stored one, if any).
        #[arg(long, value_parser = duration::parse)]
        keep_alive: Option<Duration>,
        /// Restart the window (every permit available); creates a missing limiter.
        #[arg(long)]
        reset: bool,
        /// The key prefix of the processes' clients, whose own keys (override table,
        /// refusal reports) are never taken for limiters.
        #[arg(long, default_value = redlimit_runtime::DEFAULT_PREFIX)]
        prefix: String,
    },
    /// Deletes a limiter: its config, value, log, token bucket and every client's
    /// keys; refuses, deleting nothing, when one of them is not a limiter's.
    Reset {
        name: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
        /// The key prefix of the processes' clients, whose own keys (override table,
        /// refusal reports) are never taken for limiters.
        #[arg(long, default_value = redlimit_runtime::DEFAULT_PREFIX)]
        prefix: String,
    },
    /// Would N permits be granted now, and if not when? Reads the stored state and
    /// takes nothing (overall limiters).
    Check {
        name: String,
        #[arg(long, default_value_t = 1)]
        permits: u64,
    },
    /// Takes N permits now, if granted.
    Acquire {
        name: String,
        #[arg(long, default_value_t = 1)]
        permits: u64,
    },
    /// Rates changed at run time for every process: `set`, `ls`, `rm`.
    Override {
        #[command(subcommand)]
        action: OverrideAction,
        /// The key prefix of the processes' clients: a NAME starting with it is one
        /// limiter, any other NAME a rule (key template, function path or layer rule).
        #[arg(long, default_value = redlimit_runtime::DEFAULT_PREFIX, global = true)]
        prefix: String,
    },
    /// Every second: grants per second, refusals redlimit processes reported, available
    /// permits, permits in the window.
    Watch {
        name: String,
        /// Refresh period.
        #[arg(long, value_parser = duration::parse, default_value = "1s")]
        every: Duration,
        /// Stop after this many refreshes (default: until interrupted).
        #[arg(long)]
        count: Option<u64>,
        /// The key prefix of the processes' clients, under which they report refusals.
        #[arg(long, default_value = redlimit_runtime::DEFAULT_PREFIX)]
        prefix: String,
    },
}

#[derive(Subcommand)]
enum OverrideAction {
    /// Every limiter of rule NAME (or the limiter NAME) decides with this rate.
    Set {
        name: String,
        #[arg(long)]
        rate: u64,
        #[arg(long, value_parser = duration::parse)]
        interval: Duration,
    },
    /// The overrides set.
    Ls,
    /// Removes the override of NAME: its rule's own rate applies again.
    Rm { name: String },
}

#[derive(Clone, Copy, ValueEnum)]
enum Sort {
    Name,
    Usage,
    Memory,
}

#[derive(Clone, Copy, ValueEnum)]
enum Mode {
    Overall,
    PerClient,
}

/// A command's failure and its exit code.
enum Failure {
    /// Refused, unhealthy, not found: 1.
    No(String),
    /// Redis failed: 3.
    Backend(String),
}

type Outcome = Result<(), Failure>;

fn backend(error: impl ToString) -> Failure {
    Failure::Backend(error.to_string())
}

/// The URL with its passwords hidden, for messages.
fn shown(url: &str) -> String {
    redlimit_runtime::redact_url(url)
}

/// `message` with the URL's passwords, if any, replaced.
fn scrub(message: &str, url: &str) -> String {
    redlimit_runtime::scrub_url_secrets(message, url)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Some(url) = cli.url.clone() else {
        eprintln!("redlimit: no Redis to talk to: pass --url redis://host:port/ or set REDIS_URL");
        return ExitCode::from(2);
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    match runtime.block_on(run(&cli, &url)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::No(message)) => {
            if !message.is_empty() {
                eprintln!("redlimit: {}", scrub(&message, &url));
            }
            ExitCode::from(1)
        }
        Err(Failure::Backend(message)) => {
            eprintln!("redlimit: Redis at {}: {}", shown(&url), scrub(&message, &url));
            ExitCode::from(3)
        }
    }
}

async fn run(cli: &Cli, url: &str) -> Outcome {
    match &cli.command {
        Command::Inspect { name, clients } => {
            let store = Store::open(url).await.map_err(backend)?;
            let inspection = inspect(&store, name, *clients).await.map_err(backend)?;
            if inspection.config.is_none() && inspection.problems.is_empty() {
                return Err(Failure::No(format!("no limiter named `{name}`")));
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
        Command::Ls { pattern, sort, limit } => ls(cli, url, pattern, *sort, *limit).await,
        Command::SetRate {
            name,
            rate,
            interval,
            mode,
            keep_alive,
            reset,
            prefix,
        } => {
            let client = Client::builder()
                .prefix(prefix)
                .connect(url)
                .await
                .map_err(backend)?;
            let limiter = client.rate_limiter(name.clone());
            let mode = match mode {
                Mode::Overall => RateType::Overall,
                Mode::PerClient => RateType::PerClient,
            };
            let mut args = RateLimiterArgs::new(mode, *rate, *interval).keep_state(!reset);
            // The stored keep-alive stays unless another is given. A key of another
            // type is refused by the write, naming what it holds.
            let stored = match limiter.config().await {
                Ok(config) => config.and_then(|c| c.keep_alive),
                Err(redlimit_runtime::Error::WrongType { .. }) => None,
                Err(error) if error.is_backend_failure() => return Err(backend(error)),
                Err(_) => None,
            };
            if let Some(keep_alive) = keep_alive.or(stored) {
                args = args.keep_alive(keep_alive);
            }
            let written = if *reset {
                limiter.set_rate_with(&args).await.map(|()| true)
            } else {
                limiter.update_rate_with(&args).await
            };
            match written {
                Ok(true) => {
                    let how = if *reset { "window restarted" } else { "window kept" };
                    if cli.json {
                        println!(
                            "{}",
                            json!({"name": name, "rate": rate, "interval_ms": interval.as_millis() as u64, "reset": reset})
                        );
                    } else {
                        println!(
                            "{name}: {rate} per {} ({how})",
                            duration::show_ms(interval.as_millis() as u64)
                        );
                    }
                    Ok(())
                }
                Ok(false) => Err(Failure::No(format!(
                    "no limiter named `{name}`: `set-rate --reset` creates it"
                ))),
                Err(error) if error.is_backend_failure() => Err(backend(error)),
                Err(error) => Err(Failure::No(error.to_string())),
            }
        }
        Command::Reset { name, yes, prefix } => {
            if let Some(what) = library_key(prefix, name) {
                return Err(Failure::No(format!(
                    "`{name}` is {what} of the clients with the key prefix `{prefix}`, \
                     not a rate limiter: nothing deleted"
                )));
            }
            let store = Store::open(url).await.map_err(backend)?;
            let mut keys: Vec<(String, &'static str)> = vec![(name.clone(), "config")];
            for (key, role) in [
                (suffix(name, "value"), "value"),
                (suffix(name, "permits"), "permits"),
                (suffix(name, "bucket"), "bucket"),
            ] {
                let clients = store
                    .scan(&format!("{}:*", glob_escape(&key)), None, usize::MAX)
                    .await
                    .map_err(backend)?;
                keys.push((key, role));
                keys.extend(clients.into_iter().map(|client| (client, role)));
            }
            if !yes {
                eprint!("delete limiter `{name}` ({} keys at most)? [y/N] ", keys.len());
                let _ = std::io::stderr().flush();
                let mut answer = String::new();
                let _ = std::io::stdin().lock().read_line(&mut answer);
                if !matches!(answer.trim(), "y" | "Y" | "yes") {
                    return Err(Failure::No("not deleted".to_owned()));
                }
            }
            // One script: every key is checked to be a limiter's before any is
            // deleted (a limiter's keys share one cluster slot).
            let mut conn = store.conn.clone();
            let deleted = delete_limiter_keys(&mut conn, &keys)
                .await
                .map_err(backend)?
                .map_err(|error| Failure::No(error.to_string()))?;
            if cli.json {
                println!("{}", json!({"name": name, "deleted_keys": deleted}));
            } else {
                println!("{name}: {deleted} keys deleted");
            }
            if deleted == 0 {
                return Err(Failure::No(format!("no limiter named `{name}`")));
            }
            Ok(())
        }
        Command::Check { name, permits } => {
            let store = Store::open(url).await.map_err(backend)?;
            let peek = peek(&store, name, *permits)
                .await
                .map_err(backend)?
                .map_err(Failure::No)?;
            if cli.json {
                println!(
                    "{}",
                    json!({"name": name, "permits": permits, "allowed": peek.allowed, "available": peek.available, "retry_after_ms": peek.retry_after_ms})
                );
            } else if peek.allowed {
                println!(
                    "{name}: {permits} permits would be granted; {} available",
                    peek.available
                );
            } else {
                let retry = peek
                    .retry_after_ms
                    .map_or("never: more than the rate".to_owned(), |ms| {
                        format!("in {}", duration::show_ms(ms.max(0) as u64))
                    });
                println!(
                    "{name}: {permits} permits would be refused; {} available; retry {retry}",
                    peek.available
                );
            }
            if peek.allowed {
                Ok(())
            } else {
                Err(Failure::No(String::new()))
            }
        }
        Command::Acquire { name, permits } => {
            let client = Client::connect(url).await.map_err(backend)?;
            let limiter = client.rate_limiter(name.clone());
            let granted = match limiter.try_acquire(*permits).await {
                Ok(g) => g,
                Err(error) if error.is_backend_failure() => return Err(backend(error)),
                Err(error) => return Err(Failure::No(error.to_string())),
            };
            let available = limiter.available_permits().await.map_err(backend)?;
            if cli.json {
                println!(
                    "{}",
                    json!({"name": name, "permits": permits, "granted": granted, "available": available})
                );
            } else {
                let verb = if granted { "granted" } else { "refused" };
                println!("{name}: {permits} permits {verb}; {available} available");
            }
            if granted {
                Ok(())
            } else {
                Err(Failure::No(String::new()))
            }
        }
        Command::Watch {
            name,
            every,
            count,
            prefix,
        } => watch(cli, url, name, *every, *count, prefix).await,
        Command::Override { action, prefix } => overrides(cli, url, action, prefix).await,
    }
}

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

async fn overrides(cli: &Cli, url: &str, action: &OverrideAction, prefix: &str) -> Outcome {
    let client = Client::builder()
        .prefix(prefix)
        .connect(url)
        .await
        .map_err(backend)?;
    let fail = |error: redlimit_runtime::Error| {
        if error.is_backend_failure() {
            backend(error)
        } else {
            Failure::No(error.to_string())
        }
    };
    match action {
        OverrideAction::Set { name, rate, interval } => {
            let of = override_of(name, prefix);
            client
                .set_override(&RateOverride {
                    of: of.clone(),
                    rate: *rate,
                    interval: *interval,
                })
                .await
                .map_err(fail)?;
            let (kind, name) = describe(&of);
            if cli.json {
                println!(
                    "{}",
                    json!({"of": kind, "name": name, "rate": rate, "interval_ms": interval.as_millis() as u64})
                );
            } else {
                println!(
                    "{kind} {name}: {rate} per {} in every process within about a second",
                    duration::show_ms(interval.as_millis() as u64)
                );
            }
            Ok(())
        }
        OverrideAction::Ls => {
            let list = client.list_overrides().await.map_err(fail)?;
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
                .map(|o| describe(&o.of).1.len())
                .max()
                .unwrap_or(4)
                .max(4);
            println!(
                "{:<7}  {:<width$}  {:>10}  {:>8}",
                "OF", "NAME", "RATE", "INTERVAL"
            );
            for o in &list {
                let (kind, name) = describe(&o.of);
                println!(
                    "{kind:<7}  {name:<width$}  {:>10}  {:>8}",
                    o.rate,
                    duration::show_ms(o.interval.as_millis() as u64)
                );
            }
            Ok(())
        }
        OverrideAction::Rm { name } => {
            let of = override_of(name, prefix);
            let removed = client.remove_override(&of).await.map_err(fail)?;
            let (kind, name) = describe(&of);
            if cli.json {
                println!("{}", json!({"of": kind, "name": name, "removed": removed}));
            } else if removed {
                println!("{kind} {name}: override removed; its own rate applies again");
            }
            if removed {
                Ok(())
            } else {
                Err(Failure::No(format!("no override of {kind} `{name}`")))
            }
        }
    }
}

async fn ls(cli: &Cli, url: &str, pattern: &str, sort: Sort, limit: usize) -> Outcome {
    let store = Store::open(url).await.map_err(backend)?;
    let mut conn = store.conn.clone();
    // Hashes only; a hash is a limiter when it has a rate and an interval. The scan
    // reads at most ten times the limit of hashes, so a huge keyspace stays bounded.
    let hashes = store
        .scan(pattern, Some("hash"), limit.saturating_mul(10))
        .await
        .map_err(backend)?;
    let mut rows = Vec::new();
    for name in hashes {
        let Some(config) = read_config(&store, &name).await.map_err(backend)? else {
            continue;
        };
        let value_key = suffix(&name, "value");
        let log_key = suffix(&name, "permits");
        let value: Option<i64> = conn.get(&value_key).await.unwrap_or(None);
        let mut memory = 0u64;
        for key in [&name, &value_key, &log_key] {
            let bytes: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .query_async(&mut conn)
                .await
                .map_err(backend)?;
            memory += bytes.unwrap_or(0);
        }
        let used = match (config.mode, value) {
            (0, Some(v)) if config.rate > 0 => Some((config.rate - v) as f64 / config.rate as f64),
            _ => None,
        };
        rows.push((name, config, used, memory));
        if rows.len() >= limit {
            break;
        }
    }
    match sort {
        Sort::Name => rows.sort_by(|a, b| a.0.cmp(&b.0)),
        Sort::Usage => rows.sort_by(|a, b| b.2.unwrap_or(-1.0).total_cmp(&a.2.unwrap_or(-1.0))),
        Sort::Memory => rows.sort_by_key(|r| std::cmp::Reverse(r.3)),
    }
    if cli.json {
        let list: Vec<_> = rows
            .iter()
            .map(|(name, c, used, memory)| {
                json!({"name": name, "rate": c.rate, "interval_ms": c.interval_ms, "mode": c.mode_name(), "usage": used, "memory_bytes": memory})
            })
            .collect();
        println!("{}", json!(list));
        return Ok(());
    }
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(4).max(4);
    println!(
        "{:<width$}  {:>10}  {:>8}  {:<10}  {:>6}  {:>10}",
        "NAME", "RATE", "INTERVAL", "MODE", "USAGE", "MEMORY"
    );
    for (name, c, used, memory) in &rows {
        println!(
            "{:<width$}  {:>10}  {:>8}  {:<10}  {:>6}  {:>10}",
            name,
            c.rate,
            duration::show_ms(c.interval_ms.max(0) as u64),
            c.mode_name(),
            used.map_or("-".to_owned(), |u| format!("{:.0}%", u * 100.0)),
            memory
        );
    }
    Ok(())
}

/// Refusals of the limiter `name` that processes reported for the seconds in
/// `(after, through]`.
async fn reported_refusals(
    store: &Store,
    prefix: &str,
    name: &str,
    after: i64,
    through: i64,
) -> Result<u64, Failure> {
    let mut conn = store.conn.clone();
    let mut total = 0;
    for second in after + 1..=through {
        let count: Option<u64> = conn
            .hget(
                format!("{prefix}{}:refused:{second}", redlimit_runtime::LIBRARY_SEGMENT),
                name,
            )
            .await
            .map_err(backend)?;
        total += count.unwrap_or(0);
    }
    Ok(total)
}

/// Processes report each second's refusals within about a second: `watch` reads the
/// seconds that ended this long ago.
const REPORT_LAG_S: i64 = 2;

async fn watch(
    cli: &Cli,
    url: &str,
    name: &str,
    every: Duration,
    count: Option<u64>,
    prefix: &str,
) -> Outcome {
    let store = Store::open(url).await.map_err(backend)?;
    let mut conn = store.conn.clone();
    let Some(config) = read_config(&store, name).await.map_err(backend)? else {
        return Err(Failure::No(format!("no limiter named `{name}`")));
    };
    let value_key = suffix(name, "value");
    let log_key = suffix(name, "permits");
    let mut since = server_now(&store).await.map_err(backend)?;
    // Refusals from the second watching started on.
    let mut reported_through = since / 1000 - 1;
    if !cli.json {
        println!(
            "{:<24}  {:>10}  {:>10}  {:>10}  {:>10}",
            "TIME (server, ms)", "GRANTED/s", "REFUSED", "AVAILABLE", "IN WINDOW"
        );
    }
    let mut done = 0;
    while count.is_none_or(|c| done < c) {
        tokio::time::sleep(every).await;
        let now = server_now(&store).await.map_err(backend)?;
        let fresh: Vec<(Vec<u8>, f64)> = conn
            .zrangebyscore_withscores(&log_key, format!("({since}"), now)
            .await
            .map_err(backend)?;
        let window: Vec<Vec<u8>> = conn
            .zrangebyscore(&log_key, format!("({}", now - config.interval_ms), "+inf")
            .await
            .map_err(backend)?;
        let sum = |members: &mut dyn Iterator<Item = &Vec<u8>>| -> u64 {
            members
                .filter_map(|m| redlimit_runtime::member::decode_permits(m))
                .map(u64::from)
                .sum()
        };
        let granted = sum(&mut fresh.iter().map(|(m, _)| m));
        let in_window = sum(&mut window.iter());
        let value: Option<i64> = conn.get(&value_key).await.map_err(backend)?;
        let through = now / 1000 - REPORT_LAG_S;
        let refused = reported_refusals(&store, prefix, name, reported_through, through).await?;
        reported_through = reported_through.max(through);
        let elapsed = (now - since).max(1) as f64 / 1000.0;
        let per_second = granted as f64 / elapsed;
        if cli.json {
            println!(
                "{}",
                json!({"time_ms": now, "granted": granted, "granted_per_second": per_second, "refused": refused, "available": value, "permits_in_window": in_window})
            );
        } else {
            println!(
                "{:<24}  {:>10.1}  {:>10}  {:>10}  {:>10}",
                now,
                per_second,
                refused,
                value.map_or("-".to_owned(), |v| v.to_string()),
                in_window
            );
        }
        let _ = std::io::stdout().flush();
        since = now;
        done += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        let url = "redis://user:s3c,ret@host:6379/";
        assert_eq!(shown(url), "redis://***@host:6379/");
        assert_eq!(scrub("auth s3c,ret failed", url), "auth *** failed");
        assert_eq!(shown("redis://host/"), "redis://host/");
        assert_eq!(shown("unix:///r.sock?pass=s3cret"), "unix:///r.sock?pass=***");
    }
}
