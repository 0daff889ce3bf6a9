//! What the commands say alike: a count with its noun, and what is said of a name
//! with no limiter's keys or of a per-client limiter the CLI cannot speak for.

use redlimit_runtime::keys::suffix;

/// `1 entry`, `2 entries`.
pub fn count(n: impl Into<i128>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// What the CLI says of a name with no limiter's keys.
pub fn not_found(name: &str) -> String {
    format!(
        "no limiter named `{name}`: no config hash `{name}` and no token bucket `{}` \
         (a full token bucket has no key until its next call)",
        suffix(name, "bucket")
    )
}

/// What the CLI says of a per-client limiter it cannot speak for.
pub fn per_client(name: &str) -> String {
    format!(
        "`{name}` is per_client: each client has its own permits, and the CLI is none of \
         them; `inspect {name}` shows every client's"
    )
}
