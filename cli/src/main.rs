//! `redlimit`: look at and tune the rate limiters in a Redis (single node or cluster),
//! written by redlimit or by Redisson.
//!
//! Exit codes, the same for every command: 0 ok; 1 refused (`check`, `acquire`),
//! unhealthy (`inspect`), not found, not deleted, or a key that is not a limiter's;
//! 2 usage (a bad argument, a URL that cannot name a Redis, a rate, interval or
//! keep-alive out of range); 3 Redis failed: unreachable, refusing the credentials, not
//! a Redis server, timing out, or answering something unexpected.

mod args;
mod duration;
mod inspect;
mod shown;
mod store;
mod tokens;

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use redis::AsyncCommands;
use redlimit_runtime::keys::{library_key, suffix};
use redlimit_runtime::{
    delete_limiter_keys, Client, Error, OverrideOf, RateLimiterArgs, RateOverride, RateType,
};
use serde_json::json;

use crate::args::{Cli, Command, Mode, OverrideAction, Sort};
use crate::inspect::{
    count, glob_escape, inspect, not_found, peek, per_client, read_config, server_now, token_keys,
};
use crate::shown::{shown, shown_width};
use crate::store::Store;

/// A command's failure and its exit code.
enum Failure {
    /// Refused, unhealthy, not found: 1.
    No(String),
    /// Usage: 2.
    Usage(String),
    /// Redis failed: 3.
    Backend(String),
}

type Outcome = Result<(), Failure>;

/// The failure, and exit code, for an error of the runtime: one message per cause,
/// whichever command met it.
impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        match error {
            Error::InvalidUrl { .. }
            | Error::InvalidConfig { .. }
            | Error::ZeroPermits { .. }
            | Error::CrossSlotName { .. } => Failure::Usage(error.to_string()),
            _ if error.is_backend_failure() => Failure::Backend(error.to_string()),
            _ => Failure::No(error.to_string()),
        }
    }
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
    let (message, code) = match runtime.block_on(run(&cli, &url)) {
        Ok(()) => return ExitCode::SUCCESS,
        Err(Failure::No(message)) => (message, 1),
        Err(Failure::Usage(message)) => (message, 2),
        Err(Failure::Backend(message)) => (message, 3),
    };
    if !message.is_empty() {
        // The URL's passwords, if any, replaced as the runtime hides them everywhere.
        // (and whatever it quotes of names and stored values, escaped)
        let message = redlimit_runtime::scrub_url_secrets(&message, &url);
        eprintln!("redlimit: {}", shown(&message));
    }
    ExitCode::from(code)
}

async fn run(cli: &Cli, url: &str) -> Outcome {
    match &cli.command {
        Command::Inspect { name, clients } => inspect_one(cli, url, name, *clients).await,
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
            let args = SetRate {
                name,
                rate: *rate,
                interval: *interval,
                mode: *mode,
                keep_alive: *keep_alive,
                reset: *reset,
                prefix,
            };
            set_rate(cli, url, &args).await
        }
        Command::Reset { name, yes, prefix } => reset(cli, url, name, *yes, prefix).await,
        Command::Check { name, permits } => check(cli, url, name, *permits).await,
        Command::Acquire { name, permits } => acquire(cli, url, name, *permits).await,
        Command::Watch {
            name,
            every,
            count,
            prefix,
        } => watch(cli, url, name, *every, *count, prefix).await,
        Command::Override { action, prefix } => overrides(cli, url, action, prefix).await,
    }
}

/// `inspect`: every key of the limiter, its state, and what is wrong with it.
async fn inspect_one(cli: &Cli, url: &str, name: &str, clients: usize) -> Outcome {
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

/// `reset`: every key of the limiter deleted, after asking, when all are a limiter's.
async fn reset(cli: &Cli, url: &str, name: &str, yes: bool, prefix: &str) -> Outcome {
    if let Some(what) = library_key(prefix, name) {
        return Err(Failure::No(format!(
            "`{name}` is {what} of the clients with the key prefix `{prefix}`, \
             not a rate limiter: nothing deleted"
        )));
    }
    let store = Store::open(url).await?;
    let keys = limiter_keys(&store, name).await?;
    if !yes && !confirmed(name, keys.len()) {
        return Err(Failure::No("not deleted".to_owned()));
    }
    // One script: every key is checked to be a limiter's before any is
    // deleted (a limiter's keys share one cluster slot).
    let mut conn = store.conn.clone();
    let deleted = delete_limiter_keys(&mut conn, &keys)
        .await
        .map_err(|e| store.fail(e))??;
    if deleted == 0 {
        return Err(Failure::No(format!("{}: nothing deleted", not_found(name))));
    }
    let client = store::builder().prefix(prefix).connect(url).await?;
    let announced = announce(&client, name, prefix).await?;
    if cli.json {
        println!(
            "{}",
            json!({"name": name, "deleted_keys": deleted, "announced_to_prefix": prefix})
        );
    } else {
        println!("{}: {} deleted", shown(name), count(deleted, "key", "keys"));
        println!("note: {}", shown(&announced));
    }
    Ok(())
}

/// Announces that `name` was reset to the processes whose clients have the key prefix
/// `prefix`: each drops the refusal it kept of it within about a second. What to tell
/// the operator about it; a failure says the change was made all the same.
async fn announce(client: &Client, name: &str, prefix: &str) -> Result<String, Failure> {
    match client.announce_reset(name).await {
        Ok(()) => Ok(format!(
            "redlimit processes with the key prefix `{prefix}` stop refusing from what they kept \
             of this limiter within about a second (--prefix names another); a refusal kept \
             before a reset made outside redlimit (a Java service's setRate or delete) lasts \
             until its wait ends"
        )),
        Err(error) => Err(Failure::Backend(format!(
            "the limiter was changed, but announcing it to the processes failed (they may keep \
             refusing it until the waits Redis gave them end; run the command again): {error}"
        ))),
    }
}

/// The limiter's keys and their roles: config, value, permits, bucket, and each
/// client's.
async fn limiter_keys(store: &Store, name: &str) -> Result<Vec<(String, &'static str)>, Error> {
    let mut keys: Vec<(String, &'static str)> = vec![(name.to_owned(), "config")];
    for (key, role) in [
        (suffix(name, "value"), "value"),
        (suffix(name, "permits"), "permits"),
        (suffix(name, "bucket"), "bucket"),
    ] {
        let clients = store
            .scan(&format!("{}:*", glob_escape(&key)), None, usize::MAX)
            .await?;
        keys.push((key, role));
        keys.extend(clients.into_iter().map(|client| (client, role)));
    }
    Ok(keys)
}

/// Asks on the terminal whether to delete `name`'s `keys` keys.
fn confirmed(name: &str, keys: usize) -> bool {
    eprint!(
        "delete limiter `{}` ({} at most)? [y/N] ",
        shown(name),
        count(keys as u64, "key", "keys")
    );
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().lock().read_line(&mut answer);
    matches!(answer.trim(), "y" | "Y" | "yes")
}

/// `check`: whether `permits` would be granted now, taking nothing.
async fn check(cli: &Cli, url: &str, name: &str, permits: u64) -> Outcome {
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

/// `set-rate`'s arguments.
struct SetRate<'a> {
    name: &'a str,
    rate: u64,
    interval: Duration,
    mode: Mode,
    keep_alive: Option<Duration>,
    reset: bool,
    prefix: &'a str,
}

/// A rule decides with its own config and writes it back over any other it finds, on
/// its next call: what `set-rate` wrote on a rule's limiter does not last. The CLI
/// cannot know which limiters rules decide; rules write keep-alive = interval, so a
/// config with that keep-alive is most likely a rule's, and any other may be.
fn lasting_note(args: &SetRate<'_>, rule_wrote: bool) -> String {
    let how = override_how(args);
    if rule_wrote {
        format!(
            "this change will not last: a rule wrote this limiter's config (its keep-alive is its \
             interval), and a rule writes its own config back on its next call, keeping the window. \
             To change a rule's rate in every process until the override is removed: {how}"
        )
    } else {
        format!(
            "if a rule (#[rate_limit], a layer rule, Client::check_rules) decides this limiter, \
             its next call writes the rule's config back, keeping the window; to change a rule's \
             rate in every process: {how}"
        )
    }
}

/// `word` as a shell reads it back: as it is when plain, else in single quotes.
fn shell_word(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '_' | '-' | '.' | '/' | '@'))
    {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// The `override set` that changes what `set-rate` was asked for, for good.
fn override_how(args: &SetRate<'_>) -> String {
    if args.name.starts_with(args.prefix) && !args.prefix.is_empty() {
        format!(
            "`redlimit override set {} --rate {} --interval {}` (this limiter), or the same with the \
             rule's key template (all of its limiters)",
            shell_word(args.name),
            args.rate,
            duration::show_ms(args.interval.as_millis() as u64)
        )
    } else {
        format!(
            "`redlimit override set RULE --rate {} --interval {}`, RULE the rule's key template",
            args.rate,
            duration::show_ms(args.interval.as_millis() as u64)
        )
    }
}

async fn set_rate(cli: &Cli, url: &str, args: &SetRate<'_>) -> Outcome {
    let name = args.name;
    let store = Store::open(url).await?;
    let stored = if library_key(args.prefix, name).is_none() {
        read_config(&store, name).await.unwrap_or(None)
    } else {
        None
    };
    if stored.is_none() {
        refuse_a_token_bucket(&store, args).await?;
    }
    let client = store::builder().prefix(args.prefix).connect(url).await?;
    let limiter = client.rate_limiter(name.to_owned());
    let mode = match args.mode {
        Mode::Overall => RateType::Overall,
        Mode::PerClient => RateType::PerClient,
    };
    let mut limiter_args = RateLimiterArgs::new(mode, args.rate, args.interval).keep_state(!args.reset);
    if let Some(keep_alive) = args.keep_alive.or(stored_keep_alive(&limiter).await?) {
        limiter_args = limiter_args.keep_alive(keep_alive);
    }
    let written = if args.reset {
        limiter.set_rate_with(&limiter_args).await.map(|()| true)
    } else {
        limiter.update_rate_with(&limiter_args).await
    };
    if !written? {
        return Err(Failure::No(format!(
            "{}: `set-rate --reset` creates a sliding window",
            not_found(name)
        )));
    }
    // (the change announced itself; again here, to say whether that worked)
    let announced = announce(&client, name, args.prefix).await?;
    print_set_rate(cli, args, stored.as_ref().is_some_and(|c| c.rule_wrote()));
    if !cli.json {
        println!("note: {}", shown(&announced));
    }
    Ok(())
}

/// A token bucket under `args.name` refused: its rule writes its own config into the
/// bucket on every call.
async fn refuse_a_token_bucket(store: &Store, args: &SetRate<'_>) -> Outcome {
    let now = server_now(store).await?;
    let (buckets, _) = token_keys(store, args.name, now, 1).await?;
    if buckets.iter().any(|b| b.state.is_some()) {
        return Err(Failure::No(format!(
            "`{}` is a token bucket: the rule or handle that decides it writes its own \
             config into the bucket on every call, so a rate set here would not last; nothing \
             written. To change its rule's rate in every process: {}",
            args.name,
            override_how(args)
        )));
    }
    Ok(())
}

/// The stored keep-alive, which stays unless another is given. A key of another type
/// is refused by the write, naming what it holds.
async fn stored_keep_alive(limiter: &redlimit_runtime::RateLimiter) -> Result<Option<Duration>, Failure> {
    match limiter.config().await {
        Ok(config) => Ok(config.and_then(|c| c.keep_alive)),
        Err(Error::WrongType { .. }) => Ok(None),
        Err(error) if error.is_backend_failure() => Err(error.into()),
        Err(_) => Ok(None),
    }
}

/// What `set-rate` wrote, and whether it will last.
fn print_set_rate(cli: &Cli, args: &SetRate<'_>, rule_wrote: bool) {
    let note = lasting_note(args, rule_wrote);
    let interval_ms = args.interval.as_millis() as u64;
    if cli.json {
        println!(
            "{}",
            json!({"name": args.name, "rate": args.rate, "interval_ms": interval_ms, "reset": args.reset,
                   "rule_wrote_config": rule_wrote, "note": note})
        );
    } else {
        let how = if args.reset {
            "window restarted"
        } else {
            "window kept"
        };
        println!(
            "{}: {} per {} ({how})",
            shown(args.name),
            args.rate,
            duration::show_ms(interval_ms)
        );
        println!("note: {}", shown(&note));
    }
}

async fn acquire(cli: &Cli, url: &str, name: &str, permits: u64) -> Outcome {
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

/// One row of `ls`.
struct Row {
    name: String,
    algorithm: &'static str,
    rate: i64,
    interval_ms: i64,
    mode: &'static str,
    /// Share of the rate (window) or burst (bucket) in use, overall limiters only.
    used: Option<f64>,
    memory: u64,
}

async fn memory_usage(store: &Store, keys: &[&str]) -> Result<u64, Error> {
    let mut conn = store.conn.clone();
    let mut memory = 0;
    for key in keys {
        let bytes: Option<u64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(|e| store.fail(e))?;
        memory += bytes.unwrap_or(0);
    }
    Ok(memory)
}

async fn ls(cli: &Cli, url: &str, pattern: &str, sort: Sort, limit: usize) -> Outcome {
    let store = Store::open(url).await?;
    let mut rows = window_rows(&store, pattern, limit).await?;
    bucket_rows(&store, pattern, limit, &mut rows).await?;
    match sort {
        Sort::Name => rows.sort_by(|a, b| a.name.cmp(&b.name)),
        Sort::Usage => rows.sort_by(|a, b| b.used.unwrap_or(-1.0).total_cmp(&a.used.unwrap_or(-1.0))),
        Sort::Memory => rows.sort_by_key(|r| std::cmp::Reverse(r.memory)),
    }
    if cli.json {
        let list: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({"name": r.name, "algorithm": r.algorithm, "rate": r.rate, "interval_ms": r.interval_ms, "mode": r.mode, "usage": r.used, "memory_bytes": r.memory})
            })
            .collect();
        println!("{}", json!(list));
    } else {
        print_rows(&rows);
    }
    Ok(())
}

/// The sliding windows matching `pattern`, at most `limit`. Hashes only; a hash is a
/// limiter when it has a rate and an interval. The scan reads at most ten times the
/// limit of hashes, so a huge keyspace stays bounded.
async fn window_rows(store: &Store, pattern: &str, limit: usize) -> Result<Vec<Row>, Error> {
    let mut conn = store.conn.clone();
    let hashes = store
        .scan(pattern, Some("hash"), limit.saturating_mul(10))
        .await?;
    let mut rows = Vec::new();
    for name in hashes {
        if rows.len() >= limit {
            break;
        }
        let Some(config) = read_config(store, &name).await? else {
            continue;
        };
        let value_key = suffix(&name, "value");
        let log_key = suffix(&name, "permits");
        let value: Option<i64> = conn.get(&value_key).await.unwrap_or(None);
        let memory = memory_usage(store, &[&name, &value_key, &log_key]).await?;
        let used = match (config.mode, value) {
            (0, Some(v)) if config.rate > 0 => Some((config.rate - v) as f64 / config.rate as f64),
            _ => None,
        };
        rows.push(Row {
            name,
            algorithm: "window",
            rate: config.rate,
            interval_ms: config.interval_ms,
            mode: config.mode_name(),
            used,
            memory,
        });
    }
    Ok(rows)
}

/// A token bucket of `ls`: its state (the overall key's, or a client's), whether it
/// is per client, and all its keys.
type Bucket = (Option<tokens::State>, bool, Vec<String>);

/// The token buckets matching `pattern` added to `rows`, until `limit` rows.
async fn bucket_rows(store: &Store, pattern: &str, limit: usize, rows: &mut Vec<Row>) -> Result<(), Error> {
    for (name, (state, per_client, keys)) in buckets_matching(store, pattern, limit).await? {
        if rows.len() >= limit {
            break;
        }
        let Some(state) = state else {
            continue;
        };
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let memory = memory_usage(store, &keys).await?;
        rows.push(Row {
            name,
            algorithm: "bucket",
            rate: state.rate,
            interval_ms: state.interval_ms,
            mode: if per_client { "per_client" } else { "overall" },
            used: (!per_client).then(|| 1.0 - state.tokens() as f64 / state.burst as f64),
            memory,
        });
    }
    Ok(())
}

/// Token buckets by limiter name: strings `{NAME}:bucket` (`NAME:bucket` for a NAME
/// with braces), `...:CLIENT_ID` per client; NAME matching the pattern. At most ten
/// times `limit` keys are read.
async fn buckets_matching(
    store: &Store,
    pattern: &str,
    limit: usize,
) -> Result<std::collections::BTreeMap<String, Bucket>, Error> {
    let mut conn = store.conn.clone();
    let mut bucket_keys = Vec::new();
    for form in [format!("{{{pattern}}}:bucket*"), format!("{pattern}:bucket*")] {
        if bucket_keys.len() >= limit.saturating_mul(10) {
            break;
        }
        let budget = limit.saturating_mul(10) - bucket_keys.len();
        bucket_keys.extend(store.scan(&form, Some("string"), budget).await?);
    }
    bucket_keys.sort();
    bucket_keys.dedup();
    let now = server_now(store).await?;
    let mut buckets: std::collections::BTreeMap<String, Bucket> = Default::default();
    for key in bucket_keys {
        let Some((name, client)) = tokens::limiter_of(&key) else {
            continue;
        };
        if !tokens::glob_match(pattern, &name) {
            continue;
        }
        let entry = buckets.entry(name).or_default();
        if entry.0.is_none() {
            let raw: Option<String> = conn.get(&key).await.map_err(|e| store.fail(e))?;
            entry.0 = raw.as_deref().and_then(tokens::State::parse).map(|s| s.at(now));
        }
        entry.1 |= client.is_some();
        entry.2.push(key);
    }
    Ok(buckets)
}

/// `ls`'s table. (Formatted here: one header and one row format, with the name column
/// as wide as the longest name, is what a table crate would be asked for.)
fn print_rows(rows: &[Row]) {
    let width = rows
        .iter()
        .map(|r| shown_width(&r.name))
        .max()
        .unwrap_or(4)
        .max(4);
    println!(
        "{:<width$}  {:<6}  {:>10}  {:>8}  {:<10}  {:>6}  {:>10}",
        "NAME", "KIND", "RATE", "INTERVAL", "MODE", "USAGE", "MEMORY"
    );
    for r in rows {
        println!(
            "{:<width$}  {:<6}  {:>10}  {:>8}  {:<10}  {:>6}  {:>10}",
            shown(&r.name),
            r.algorithm,
            r.rate,
            duration::show_ms(r.interval_ms.max(0) as u64),
            r.mode,
            r.used.map_or("-".to_owned(), |u| format!("{:.0}%", u * 100.0)),
            r.memory
        );
    }
}

/// Refusals of a limiter that processes reported for some seconds, and whether that
/// count is complete.
#[derive(Debug, Clone, Copy)]
struct Refused {
    count: u64,
    /// False when a second's reports went past a process's budget of limiters (its
    /// other refusals counted under their rule, `rule:<name>` fields): some of this
    /// limiter's may be among those.
    complete: bool,
}

impl Refused {
    /// The count as `watch` shows it: `12+` when incomplete.
    fn shown(&self) -> String {
        match self.complete {
            true => self.count.to_string(),
            false => format!("{}+", self.count),
        }
    }
}

/// Refusals of the limiter `name` that processes reported for the seconds in
/// `(after, through]`.
async fn reported_refusals(
    store: &Store,
    prefix: &str,
    name: &str,
    after: i64,
    through: i64,
) -> Result<Refused, Error> {
    let mut conn = store.conn.clone();
    let mut refused = Refused {
        count: 0,
        complete: true,
    };
    for second in after + 1..=through {
        let key = format!("{prefix}{}:refused:{second}", redlimit_runtime::LIBRARY_SEGMENT);
        let (count, fields): (Option<u64>, Vec<String>) = redis::pipe()
            .hget(&key, name)
            .hkeys(&key)
            .query_async(&mut conn)
            .await
            .map_err(|e| store.fail(e))?;
        refused.count += count.unwrap_or(0);
        refused.complete &= !fields.iter().any(|f| f.starts_with("rule:"));
    }
    Ok(refused)
}

/// Processes report each second's refusals within about a second: `watch` reads the
/// seconds that ended this long ago.
const REPORT_LAG_S: i64 = 2;

/// What `watch` follows: a sliding window (its config) or a token bucket.
enum Watched {
    Window(inspect::Config),
    Bucket(tokens::State),
}

/// A token bucket's state now; a missing key is a full, cold bucket of `last`'s config.
async fn bucket_now(
    store: &Store,
    key: &str,
    now: i64,
    last: &tokens::State,
) -> Result<tokens::State, Error> {
    let mut conn = store.conn.clone();
    let raw: Option<String> = conn.get(key).await.map_err(|e| store.fail(e))?;
    Ok(match raw.as_deref().and_then(tokens::State::parse) {
        Some(state) => state.at(now),
        None => tokens::State {
            units: last.burst * last.interval_ms,
            cold: last.warmup_ms * last.rate,
            at_ms: now,
            ..*last
        },
    })
}

async fn watch(
    cli: &Cli,
    url: &str,
    name: &str,
    every: Duration,
    count: Option<u64>,
    prefix: &str,
) -> Outcome {
    let store = Store::open(url).await?;
    let mut since = server_now(&store).await?;
    let mut watched = watched(&store, name, since).await?;
    // Refusals from the second watching started on.
    let mut reported_through = since / 1000 - 1;
    if !cli.json {
        print_watch_header(&watched);
    }
    let mut done = 0;
    while count.is_none_or(|c| done < c) {
        tokio::time::sleep(every).await;
        let now = server_now(&store).await?;
        let through = now / 1000 - REPORT_LAG_S;
        let refused = reported_refusals(&store, prefix, name, reported_through, through).await?;
        reported_through = reported_through.max(through);
        let tick = Tick {
            since,
            now,
            elapsed: (now - since).max(1) as f64 / 1000.0,
            refused,
        };
        match &mut watched {
            Watched::Window(config) => window_tick(cli, &store, name, config, &tick).await?,
            Watched::Bucket(last) => *last = bucket_tick(cli, &store, name, last, &tick).await?,
        }
        let _ = std::io::stdout().flush();
        since = now;
        done += 1;
    }
    Ok(())
}

/// What `name` is: a sliding window (its config) or a token bucket (its state at `now`).
async fn watched(store: &Store, name: &str, now: i64) -> Result<Watched, Failure> {
    if let Some(config) = read_config(store, name).await? {
        return Ok(Watched::Window(config));
    }
    let (found, clients) = token_keys(store, name, now, 0).await?;
    match found.first().and_then(|f| f.state) {
        Some(state) => Ok(Watched::Bucket(state)),
        None if clients > 0 => Err(Failure::No(per_client(name))),
        None => Err(Failure::No(not_found(name))),
    }
}

fn print_watch_header(watched: &Watched) {
    match watched {
        Watched::Window(_) => println!(
            "{:<16}  {:>10}  {:>10}  {:>10}  {:>10}",
            "TIME (UTC)", "GRANTED/s", "REFUSED", "AVAILABLE", "IN WINDOW"
        ),
        Watched::Bucket(_) => println!(
            "{:<16}  {:>10}  {:>10}  {:>10}  {:>10}",
            "TIME (UTC)", "TOKENS/s", "REFUSED", "TOKENS", "FULL IN"
        ),
    }
}

/// One refresh of `watch`: the period `(since, now]`, in seconds, and the refusals
/// processes reported for it.
struct Tick {
    since: i64,
    now: i64,
    elapsed: f64,
    refused: Refused,
}

/// A window's line: permits granted in the period, available, in the window.
async fn window_tick(cli: &Cli, store: &Store, name: &str, config: &inspect::Config, tick: &Tick) -> Outcome {
    let mut conn = store.conn.clone();
    let (now, refused) = (tick.now, tick.refused);
    let log_key = suffix(name, "permits");
    let fresh: Vec<(Vec<u8>, f64)> = conn
        .zrangebyscore_withscores(&log_key, format!("({}", tick.since), now)
        .await
        .map_err(|e| store.fail(e))?;
    let window: Vec<Vec<u8>> = conn
        .zrangebyscore(&log_key, format!("({}", now - config.interval_ms), "+inf")
        .await
        .map_err(|e| store.fail(e))?;
    let sum = |members: &mut dyn Iterator<Item = &Vec<u8>>| -> u64 {
        members
            .filter_map(|m| redlimit_runtime::member::decode_permits(m))
            .map(u64::from)
            .sum()
    };
    let granted = sum(&mut fresh.iter().map(|(m, _)| m));
    let in_window = sum(&mut window.iter());
    let value: Option<i64> = conn.get(suffix(name, "value")).await.map_err(|e| store.fail(e))?;
    let per_second = granted as f64 / tick.elapsed;
    if cli.json {
        println!(
            "{}",
            json!({"time_ms": now, "time": duration::show_utc(now), "granted": granted, "granted_per_second": per_second, "refused": refused.count, "refused_complete": refused.complete, "available": value, "permits_in_window": in_window})
        );
    } else {
        println!(
            "{:<16}  {:>10.1}  {:>10}  {:>10}  {:>10}",
            duration::show_time_of_day(now),
            per_second,
            refused.shown(),
            value.map_or("-".to_owned(), |v| v.to_string()),
            in_window
        );
    }
    Ok(())
}

/// A token bucket's line: tokens spent in the period, tokens, time until full. The
/// bucket's state now is returned, the next period's start.
async fn bucket_tick(
    cli: &Cli,
    store: &Store,
    name: &str,
    last: &tokens::State,
    tick: &Tick,
) -> Result<tokens::State, Failure> {
    let (now, refused) = (tick.now, tick.refused);
    let state = bucket_now(store, &suffix(name, "bucket"), now, last).await?;
    // What the period took: the last state refilled to now, less what is
    // there (a warm-up's extra cost included), in tokens.
    let spent = if (state.rate, state.interval_ms, state.burst) == (last.rate, last.interval_ms, last.burst) {
        ((last.at(now).units - state.units).max(0) as f64) / state.interval_ms as f64
    } else {
        0.0
    };
    let per_second = spent / tick.elapsed;
    if cli.json {
        println!(
            "{}",
            json!({"time_ms": now, "time": duration::show_utc(now), "tokens_spent": spent, "tokens_per_second": per_second, "refused": refused.count, "refused_complete": refused.complete, "tokens": state.tokens(), "full_in_ms": state.full_in_ms(), "coldness": state.coldness()})
        );
    } else {
        println!(
            "{:<16}  {:>10.1}  {:>10}  {:>10}  {:>10}",
            duration::show_time_of_day(now),
            per_second,
            refused.shown(),
            state.tokens(),
            duration::show_secs(state.full_in_ms())
        );
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_shown_read_back_as_written() {
        assert_eq!(shell_word("rate_limit:order:user:7"), "rate_limit:order:user:7");
        assert_eq!(shell_word("rate_limit:{u} x"), "'rate_limit:{u} x'");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
    }

    #[test]
    fn passwords_never_show() {
        use redlimit_runtime::{redact_url, scrub_url_secrets};
        let url = "redis://user:s3c,ret@host:6379/";
        assert_eq!(redact_url(url), "redis://***@host:6379/");
        assert_eq!(scrub_url_secrets("auth s3c,ret failed", url), "auth *** failed");
        assert_eq!(redact_url("redis://host/"), "redis://host/");
        assert_eq!(
            redact_url("unix:///r.sock?pass=s3cret"),
            "unix:///r.sock?pass=***"
        );
    }
}
