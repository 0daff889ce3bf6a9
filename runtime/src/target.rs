//! Where a client connects, as it may be shown: passwords never reach an error, a log
//! line or `Debug` output.

use std::fmt;
use std::sync::Arc;

/// A server (or a cluster's nodes) for messages, with any password hidden, and the
/// passwords to remove from text that came back from the connection layer.
#[derive(Clone)]
pub(crate) struct Target {
    shown: Arc<str>,
    secrets: Arc<[String]>,
}

impl Target {
    /// From one URL (`redis://`, `rediss://`, `redis+cluster://`), or several joined
    /// by commas.
    pub fn new(url: &str) -> Target {
        let mut secrets = Vec::new();
        let shown = url
            .split(',')
            .map(|part| hide(part, &mut secrets))
            .collect::<Vec<_>>()
            .join(",");
        Target {
            shown: Arc::from(shown),
            secrets: Arc::from(secrets),
        }
    }

    /// The address with `***` where the credentials were.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// `text` with every password of the URL (as written and percent-decoded)
    /// replaced by `***`.
    pub fn scrub(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for secret in self.secrets.iter() {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), "***");
            }
        }
        text
    }
}

/// `scheme://***@rest` for `scheme://userinfo@rest`, collecting the userinfo's
/// password (or the whole userinfo when it has no `:`).
fn hide(url: &str, secrets: &mut Vec<String>) -> String {
    let start = url.find("://").map_or(0, |at| at + 3);
    let Some(at) = url[start..].rfind('@').map(|at| start + at) else {
        return url.to_owned();
    };
    let userinfo = &url[start..at];
    let password = userinfo.split_once(':').map_or(userinfo, |(_, p)| p);
    if !password.is_empty() {
        let decoded = percent_decode(password);
        if decoded != password {
            secrets.push(decoded);
        }
        secrets.push(password.to_owned());
    }
    format!("{}***@{}", &url[..start], &url[at + 1..])
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_and_scrubbed() {
        for (url, shown) in [
            ("redis://user:secret@host:6379/0", "redis://***@host:6379/0"),
            ("redis://:secret@host", "redis://***@host"),
            ("rediss://secret@host/", "rediss://***@host/"),
            (
                "redis+cluster://u:secret@a:1,b:2/",
                "redis+cluster://***@a:1,b:2/",
            ),
            ("redis://:p@ss:secret@host", "redis://***@host"),
            ("redis://host:6379", "redis://host:6379"),
        ] {
            let target = Target::new(url);
            assert_eq!(target.shown(), shown);
            assert!(!format!("{target:?}").contains("secret"));
        }
        let target = Target::new("redis://u:s%40cret@h/");
        assert_eq!(target.scrub("x s@cret y s%40cret"), "x *** y ***");
        let nodes = Target::new("redis://:one1@a:1/,redis://:two2@b:2/");
        assert_eq!(nodes.shown(), "redis://***@a:1/,redis://***@b:2/");
        assert_eq!(nodes.scrub("one1 two2"), "*** ***");
    }
}
