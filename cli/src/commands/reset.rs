//! `reset`: every key of a limiter deleted at once, after asking, when all of them are
//! a limiter's; then the processes told.

use std::io::{BufRead, Write};

use redlimit_runtime::keys::{library_key, suffix};
use redlimit_runtime::{delete_limiter_keys, Error};
use serde_json::json;

use crate::announce::announce;
use crate::args::Cli;
use crate::shown::shown;
use crate::store::{self, glob_escape, Store};
use crate::words::{count, not_found};
use crate::{Failure, Outcome};

/// `reset`: every key of the limiter deleted, after asking, when all are a limiter's.
pub async fn reset(cli: &Cli, url: &str, name: &str, yes: bool, prefix: &str) -> Outcome {
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
