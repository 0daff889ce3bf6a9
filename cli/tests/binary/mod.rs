//! The built `redlimit` binary as the CLI's tests run it: once with `REDIS_URL`, its
//! output read as JSON or as the text a person sees.
#![allow(dead_code)]

use std::process::{Command, Output};

use serde_json::Value;

/// Runs `redlimit ARGS` against the server at `url`.
pub fn redlimit(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_redlimit"))
        .args(args)
        .env("REDIS_URL", url)
        .output()
        .unwrap()
}

/// Its standard output as one JSON document.
pub fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)))
}

/// Everything it printed, standard output then standard error.
pub fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Its exit code.
pub fn code(output: &Output) -> i32 {
    output.status.code().unwrap()
}
