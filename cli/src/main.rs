//! `redlimit`: look at and tune the rate limiters in a Redis (single node or cluster),
//! written by redlimit or by Redisson.
//!
//! Exit codes, the same for every command: 0 ok; 1 refused (`check`, `acquire`),
//! unhealthy (`inspect`), not found, not deleted, or a key that is not a limiter's;
//! 2 usage (a bad argument, a URL that cannot name a Redis, a rate, interval or
//! keep-alive out of range); 3 Redis failed: unreachable, refusing the credentials, not
//! a Redis server, timing out, or answering something unexpected.

mod announce;
mod args;
mod commands;
mod duration;
mod inspect;
mod peek;
mod shown;
mod store;
mod tokens;
mod words;

use std::process::ExitCode;

use clap::Parser;
use redlimit_runtime::Error;

use crate::args::{Cli, Command};
use crate::commands::{acquire, check, inspect_one, ls, overrides, reset, set_rate, watch, SetRate};
use crate::shown::shown_message;

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
    if let Some(problem) = without_tls(&url, cfg!(feature = "tls")) {
        eprintln!("redlimit: {problem}");
        return ExitCode::from(2);
    }
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
        eprintln!("redlimit: {}", shown_message(&message));
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

/// Why this build cannot use `url`: a TLS URL (`rediss://`, `rediss+cluster://`,
/// `rediss+sentinel://`, `valkeys://`) in a CLI built without its `tls` feature, which
/// is the CLI's to name (the runtime's error names the library's feature).
fn without_tls(url: &str, built_with_tls: bool) -> Option<String> {
    let url = url.trim_start();
    let tls = ["rediss", "valkeys"].iter().any(|scheme| {
        url.get(..scheme.len())
            .is_some_and(|start| start.eq_ignore_ascii_case(scheme))
    });
    (!built_with_tls && tls).then(|| {
        "this redlimit was built without TLS, which rediss and valkeys URLs need: install it \
         with `cargo install --locked redlimit-cli --features tls`"
            .to_owned()
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_tls_url_without_tls_names_the_clis_feature() {
        use super::without_tls;
        for url in [
            "rediss://:pw@h:6380/",
            "REDISS+cluster://a:1,b:2/",
            " rediss+sentinel://s:26379/m",
            "valkeys://:pw@h:6380/",
        ] {
            let problem = without_tls(url, false).expect(url);
            assert!(problem.contains("redlimit-cli --features tls"), "{problem}");
            assert!(!problem.contains("pw"), "{problem}");
            assert_eq!(without_tls(url, true), None, "{url}");
        }
        for url in [
            "redis://h:6379/",
            "redis+cluster://a:1/",
            "valkey://h:6379/",
            "unix:///r.sock",
            "",
            "redi",
        ] {
            assert_eq!(without_tls(url, false), None, "{url}");
        }
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
