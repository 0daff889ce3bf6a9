//! One limiter as it is stored: its config, keys, TTLs, value and grant log, per-client
//! keys, and what is wrong with it. Read-only: nothing is written or released. What
//! is read is in `read`, what is wrong in `diagnose`, how it is shown in `render`.

mod diagnose;
mod read;
mod render;

use redlimit_runtime::keys::suffix;
use redlimit_runtime::Error;

pub use self::read::{read_config, token_keys, Config};

use self::diagnose::diagnose;
use self::read::{bucket, key_state, window_clients, Bucket, KeyState, TokenKey};
use crate::store::{server_now, Store};

/// A limiter, read whole.
#[derive(Debug, Clone)]
pub struct Inspection {
    pub name: String,
    pub now_ms: i64,
    pub config: Option<Config>,
    pub config_key: KeyState,
    pub buckets: Vec<Bucket>,
    /// Its token bucket's keys, when it is one.
    pub token_buckets: Vec<TokenKey>,
    /// Per-client keys found (for a per_client limiter, one bucket per client).
    pub client_keys: usize,
    pub problems: Vec<String>,
    pub notes: Vec<String>,
}

/// Reads the limiter `name` whole (at most `client_limit` clients' keys) and says what
/// is wrong with it.
pub async fn inspect(store: &Store, name: &str, client_limit: usize) -> Result<Inspection, Error> {
    let now = server_now(store).await?;
    let config_key = key_state(store, name).await?;
    let config = if config_key.kind == "hash" {
        read_config(store, name).await?
    } else {
        None
    };
    let value_key = suffix(name, "value");
    let log_key = suffix(name, "permits");
    let mut buckets = vec![
        bucket(
            store,
            None,
            value_key.clone(),
            log_key.clone(),
            now,
            config.as_ref(),
        )
        .await?,
    ];
    let (clients, window_client_keys) = window_clients(store, &value_key, &log_key).await?;
    let (token_buckets, token_clients) = token_keys(store, name, now, client_limit).await?;
    let client_keys = window_client_keys + token_clients;
    for client in clients.iter().take(client_limit) {
        buckets.push(
            bucket(
                store,
                Some(client.clone()),
                format!("{value_key}:{client}"),
                format!("{log_key}:{client}"),
                now,
                config.as_ref(),
            )
            .await?,
        );
    }
    let mut inspection = Inspection {
        name: name.to_owned(),
        now_ms: now,
        config,
        config_key,
        buckets,
        token_buckets,
        client_keys,
        problems: Vec::new(),
        notes: Vec::new(),
    };
    for (count, what) in [(clients.len(), "window"), (token_clients, "token bucket")] {
        if count > client_limit {
            inspection.notes.push(format!(
                "{count} clients have {what} keys; the first {client_limit} are shown (--clients)"
            ));
        }
    }
    diagnose(&mut inspection);
    // The server's eviction policy (CONFIG GET, else INFO memory): one that can evict
    // limiter keys makes every limit forgettable.
    let mut conn = store.conn.clone();
    if let Ok(Some(eviction)) = redlimit_runtime::read_eviction(&mut conn).await {
        if eviction.can_evict() {
            inspection.problems.push(eviction.warning("this server"));
        }
    }
    Ok(inspection)
}
