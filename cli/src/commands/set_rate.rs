//! `set-rate`: a sliding window's rate changed (keeping its window, or restarting it),
//! the processes told, and whether the change will last (a rule writes its own config
//! back; a token bucket is refused).

use std::time::Duration;

use redlimit_runtime::keys::library_key;
use redlimit_runtime::{Error, RateLimiterArgs, RateType};
use serde_json::json;

use crate::announce::announce;
use crate::args::{Cli, Mode};
use crate::duration;
use crate::inspect::{read_config, token_keys};
use crate::shown::shown;
use crate::store::{self, server_now, Store};
use crate::words::not_found;
use crate::{Failure, Outcome};

/// `set-rate`'s arguments.
pub struct SetRate<'a> {
    pub name: &'a str,
    pub rate: u64,
    pub interval: Duration,
    /// `None`: the stored mode (overall for a limiter `--reset` creates).
    pub mode: Option<Mode>,
    pub keep_alive: Option<Duration>,
    pub reset: bool,
    pub prefix: &'a str,
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

pub async fn set_rate(cli: &Cli, url: &str, args: &SetRate<'_>) -> Outcome {
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
        Some(Mode::Overall) => RateType::Overall,
        Some(Mode::PerClient) => RateType::PerClient,
        // A new rate keeps the limiter's mode unless told otherwise: each client's
        // limit is not turned into one for all.
        None if stored.as_ref().is_some_and(|c| c.mode == 1) => RateType::PerClient,
        None => RateType::Overall,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_shown_read_back_as_written() {
        assert_eq!(shell_word("rate_limit:order:user:7"), "rate_limit:order:user:7");
        assert_eq!(shell_word("rate_limit:{u} x"), "'rate_limit:{u} x'");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
    }
}
