//! The command line: the global options, each command and its arguments (clap's
//! derive, whose doc comments are the help text), and the counts clap checks.

use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::duration;

#[derive(Parser)]
#[command(
    name = "redlimit",
    version,
    about = "Inspect, list, tune and reset rate limiters in Redis"
)]
pub struct Cli {
    /// Redis URL: redis://[user:password@]host:port/[db], rediss:// for TLS,
    /// redis+cluster://host:port,host:port/ for a cluster.
    #[arg(long, env = "REDIS_URL", hide_env_values = true, global = true)]
    pub url: Option<String>,
    /// Machine-readable output (one JSON document; one per line for `watch`).
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// A limiter's config, keys and TTLs, value, grant log and health; a token
    /// bucket's tokens, burst, refill, warm-up coldness, time until full and TTL.
    Inspect {
        name: String,
        /// Per-client keys shown at most.
        #[arg(long, default_value_t = 20)]
        clients: usize,
    },
    /// Limiters (sliding windows and token buckets) found by SCAN on every primary:
    /// kind, rate, usage and memory.
    Ls {
        /// A SCAN pattern for limiter names.
        #[arg(default_value = "*")]
        pattern: String,
        #[arg(long, value_enum, default_value_t = Sort::Name)]
        sort: Sort,
        /// Limiters listed at most (the scan stops there).
        #[arg(long, default_value_t = 1000, value_parser = at_least_one_usize)]
        limit: usize,
    },
    /// Changes a sliding window's rate, keeping its window (or restarting it with
    /// --reset). A rule writes its own config back on its next call: `override set`
    /// changes a rule's rate for good.
    SetRate {
        name: String,
        #[arg(long, value_parser = at_least_one)]
        rate: u64,
        /// The window: 60s, 1m30s, 500ms, 1h, ...
        #[arg(long, value_parser = duration::parse)]
        interval: Duration,
        /// Overall or per client (default: the stored one; overall for a limiter
        /// `--reset` creates).
        #[arg(long, value_enum)]
        mode: Option<Mode>,
        /// Keys' keep-alive (at least the interval; default: the stored one, if any).
        #[arg(long, value_parser = duration::parse)]
        keep_alive: Option<Duration>,
        /// Restart the window (every permit available); creates a missing limiter.
        #[arg(long)]
        reset: bool,
        /// The key prefix of the processes' clients, whose own keys (override table,
        /// refusal reports) are never taken for limiters, and to which the change is
        /// announced (they drop the refusals they kept of it and end their batches of it).
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
        /// refusal reports) are never taken for limiters, and to which the reset is
        /// announced (they drop the refusals they kept of it and end their batches of it).
        #[arg(long, default_value = redlimit_runtime::DEFAULT_PREFIX)]
        prefix: String,
    },
    /// Would N permits be granted now, and if not when? Reads the stored state and
    /// takes nothing (overall limiters: windows and token buckets).
    Check {
        name: String,
        #[arg(long, default_value_t = 1, value_parser = permits)]
        permits: u64,
    },
    /// Takes N permits now, if granted (overall limiters: windows and token buckets).
    Acquire {
        name: String,
        #[arg(long, default_value_t = 1, value_parser = permits)]
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
    /// Every second, at the server's time (UTC): grants per second, refusals redlimit
    /// processes reported, available permits, permits in the window; for a token
    /// bucket, tokens spent per second, refusals, tokens, time until full.
    Watch {
        name: String,
        /// Refresh period.
        #[arg(long, value_parser = duration::parse, default_value = "1s")]
        every: Duration,
        /// Stop after this many refreshes (default: until interrupted).
        #[arg(long, value_parser = at_least_one)]
        count: Option<u64>,
        /// The key prefix of the processes' clients, under which they report refusals.
        #[arg(long, default_value = redlimit_runtime::DEFAULT_PREFIX)]
        prefix: String,
    },
}

#[derive(Subcommand)]
pub enum OverrideAction {
    /// Every limiter of rule NAME (or the limiter NAME) decides with this rate.
    Set {
        name: String,
        #[arg(long, value_parser = at_least_one)]
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
pub enum Sort {
    Name,
    Usage,
    Memory,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Mode {
    Overall,
    PerClient,
}

/// A count of 1 or more, as [`at_least_one`] reads it, of limiters listed.
fn at_least_one_usize(text: &str) -> Result<usize, String> {
    let n = at_least_one(text)?;
    usize::try_from(n).map_err(|_| format!("{n} is more than this machine counts"))
}

/// Permits a call may take: 1 to the library's `MAX_PERMITS`.
fn permits(text: &str) -> Result<u64, String> {
    let n = at_least_one(text)?;
    match n <= redlimit_runtime::MAX_PERMITS {
        true => Ok(n),
        false => Err(format!(
            "{n} permits are more than a call may take: give at most {}",
            redlimit_runtime::MAX_PERMITS
        )),
    }
}

/// A count of 1 or more: rates, permits and refreshes.
fn at_least_one(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(0) => Err("0 is not accepted: give a whole number of at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "`{text}` is not a count: give a whole number of at least 1"
        )),
    }
}
