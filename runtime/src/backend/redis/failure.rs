//! Naming what went wrong on the way to Redis: the real cause, the right setting to
//! change, and never a password.

use std::time::Duration;

use redis::{ErrorKind, RedisError};

use crate::backend::redis::target::Target;
use crate::Error;

/// The [`Error`] for a connection or command failure that is not a script's own error.
/// `connecting`: no connection has answered since the client was made or since the
/// last failure.
pub(crate) fn classify(err: &RedisError, target: &Target, timeout: Duration, connecting: bool) -> Error {
    if err.is_timeout() {
        return Error::Timeout {
            after: timeout,
            connecting,
        };
    }
    refused_by_server(err, target)
        .or_else(|| failed_to_connect(err, target))
        .unwrap_or_else(|| Error::Backend {
            detail: target.scrub(&err.to_string()),
        })
}

/// What the server refused, by its reply: memory, permissions, credentials, the
/// database.
fn refused_by_server(err: &RedisError, target: &Target) -> Option<Error> {
    let shown = || target.shown().to_owned();
    let code = err.code().unwrap_or_default();
    let text = err.to_string();
    let (inner_code, inner) = super::replies::unwrapped(code, err.detail().unwrap_or_default());
    if inner_code == "OOM" {
        return Some(Error::OutOfMemory {
            target: shown(),
            detail: target.scrub(&format!("OOM {inner}")),
        });
    }
    if inner_code == "READONLY" || code == "READONLY" {
        return Some(Error::ReadOnlyReplica { target: shown() });
    }
    // A command refused by the user's ACL: directly (NOPERM), or inside a script, which
    // each server words its own way (Valkey names the user and the command).
    if inner_code == "NOPERM"
        || inner.contains("can't run this command or subcommand")
        || inner.starts_with("ACL failure in script")
    {
        return Some(Error::NoPermission {
            target: shown(),
            detail: target.scrub(&format!("{inner_code} {inner}")),
        });
    }
    // (A cluster's first connections say theirs in the text of an I/O error.)
    if err.kind() == ErrorKind::AuthenticationFailed
        || matches!(code, "NOAUTH" | "WRONGPASS")
        || text.contains("unauthenticated")
        || text.contains("Password authentication failed")
    {
        // What the server said, in words: the connection layer's text names its
        // own error kinds.
        let said = if code == "NOAUTH" || text.contains("NOAUTH") {
            "the server requires a password and none was given"
        } else {
            "the server refused the user name or password"
        };
        return Some(Error::AuthFailed {
            target: shown(),
            detail: said.to_owned(),
        });
    }
    if text.contains("DB index is out of range") || text.contains("invalid DB index") {
        return Some(Error::UnknownDatabase {
            target: shown(),
            detail: target.scrub(&text),
        });
    }
    None
}

/// Why no connection answered: TLS, a server that is not Redis, no master named by
/// the sentinels, the network.
fn failed_to_connect(err: &RedisError, target: &Target) -> Option<Error> {
    let shown = || target.shown().to_owned();
    let text = err.to_string();
    // The connection's own failure, not a server's error reply (`CROSSSLOT` holds
    // "ssl" too).
    if err.code().is_none() && is_tls(&text) {
        return Some(Error::Tls {
            target: shown(),
            detail: target.scrub(&text),
        });
    }
    // A reply that is not RESP at all (the parser's own error, not a reply of an
    // unexpected type): another kind of server on the port.
    if err.kind() == ErrorKind::Parse && text.contains("Parse error at") {
        return Some(Error::NotRedis {
            target: shown(),
            detail: "its reply does not parse as RESP".to_owned(),
        });
    }
    // A URL naming the wrong kind of server: a backend failure (a lazy client's calls
    // go through `on_error`) that lasts, worded for the URL.
    if err.kind() == ErrorKind::InvalidClientConfig && text.contains(super::sentinel::NOT_A_SENTINEL) {
        return Some(Error::WrongServer {
            target: shown(),
            detail: format!(
                "{}; list the sentinels' own addresses (port 26379 by default), or use \
                 redis://host:port/ for a server",
                super::sentinel::NOT_A_SENTINEL
            ),
        });
    }
    if no_cluster(&text) {
        return Some(Error::WrongServer {
            target: shown(),
            detail: NOT_A_CLUSTER_NODE.to_owned(),
        });
    }
    if matches!(
        err.kind(),
        ErrorKind::MasterNameNotFoundBySentinel | ErrorKind::EmptySentinelList
    ) {
        return Some(Error::Unreachable {
            target: shown(),
            detail: "no sentinel named a reachable master of that name (a failover may be under way)"
                .to_owned(),
        });
    }
    if err.is_io_error() || err.kind() == ErrorKind::ClusterConnectionNotFound {
        return Some(Error::Unreachable {
            target: shown(),
            detail: target.scrub(&text),
        });
    }
    None
}

fn is_tls(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    ["tls", "ssl", "certificate", "handshake", "alert"]
        .iter()
        .any(|word| lower.contains(word))
}

/// What a client with a cluster URL says of a server that is no cluster node.
pub(super) const NOT_A_CLUSTER_NODE: &str = "the server is a single Redis, not a cluster node (it answered \
                                             that cluster support is disabled); use redis://host:port/ \
                                             for it";

/// Whether an error's text is a single server's answer to a cluster command.
pub(super) fn no_cluster(text: &str) -> bool {
    text.contains("cluster support disabled")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_are_named() {
        let target = Target::new("redis://:hunter2@db:6379/");
        let io = RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        assert!(matches!(
            classify(&io, &target, Duration::ZERO, true),
            Error::Unreachable { .. }
        ));
        let auth = RedisError::from((ErrorKind::AuthenticationFailed, "Password authentication failed"));
        let err = classify(&auth, &target, Duration::ZERO, true);
        assert!(matches!(err, Error::AuthFailed { .. }), "{err:?}");
        assert!(err.to_string().contains("redis://***@db:6379/"), "{err}");
        let leaky = RedisError::from((ErrorKind::Client, "oops", "hunter2".to_owned()));
        let err = classify(&leaky, &target, Duration::ZERO, false);
        assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
    }
}
