//! The one place the tests and examples choose the server binary they start:
//! `REDLIMIT_REDIS_SERVER` (a path or a name on PATH: Redis 6.2+ `redis-server`,
//! Valkey `valkey-server`), `redis-server` on PATH when unset.
#![allow(dead_code)]

use std::process::Command;

/// The environment variable naming the server binary.
pub const VARIABLE: &str = "REDLIMIT_REDIS_SERVER";

/// The server binary the tests start.
pub fn redis_server() -> String {
    std::env::var(VARIABLE)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "redis-server".to_owned())
}

/// A command running the chosen server binary.
pub fn redis_server_command() -> Command {
    Command::new(redis_server())
}

/// Why the server could not be started, and how to install one.
pub fn cannot_start(err: &std::io::Error) -> String {
    format!(
        "cannot start `{}` ({err}); these tests need a Redis server binary: install it with \
         `apt-get update && apt-get install -y redis-server`, or name one with {VARIABLE}=/path/to/redis-server",
        redis_server()
    )
}

/// Whether the chosen server was built with TLS, asked of the binary itself: its
/// config parser stops at the first directive it does not know, `tls-port` in a build
/// without TLS, else the made-up one after it (so no server is left running).
pub fn has_tls() -> bool {
    let out = redis_server_command()
        .args([
            "--port",
            "0",
            "--tls-port",
            "0",
            "--redlimit-no-such-directive",
            "0",
        ])
        .output();
    match out {
        Ok(out) => {
            let text =
                String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
            !text.contains("tls-port")
        }
        Err(_) => false,
    }
}
