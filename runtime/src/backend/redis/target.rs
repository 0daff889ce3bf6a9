//! Where a client connects, as it may be shown: passwords never reach an error, a log
//! line or `Debug` output.
//!
//! A URL is parsed into its parts (scheme, user info, hosts, path, query, fragment)
//! and rebuilt from the parts that are known to be harmless: the scheme, hosts and
//! ports, a database number, a sentinel's master name, a socket's path, the `db` and
//! `protocol` query parameters and the `#insecure` fragment. User info becomes `***`,
//! so do the values of `pass`, `password`, `user` and `username`, and any other query
//! parameter whole. A URL whose parts do not all read as one of the
//! forms accepted (`redis://`, `rediss://`, `valkey://`, `valkeys://`, `redis+unix://`,
//! `valkey+unix://`, `unix://`, `redis+cluster://` and `rediss+cluster://` with several
//! hosts, `redis+sentinel://` and `rediss+sentinel://` with several hosts, a master
//! name and a database) is shown as `scheme://***`, followed only by what comes after
//! its last `@` when that reads as hosts: a password with a `/`, `?`, `#` or `,` in it
//! is hidden whole, never cut where the parser would have cut it.

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
    /// From one URL, in any of the forms of the module's documentation.
    pub fn new(url: &str) -> Target {
        Target::nodes(&[url])
    }

    /// From several URLs (a cluster's nodes given one by one), shown joined by commas.
    pub fn nodes<S: AsRef<str>>(urls: &[S]) -> Target {
        let mut secrets = Vec::new();
        let shown = urls
            .iter()
            .map(|url| redact(url.as_ref(), &mut secrets))
            .collect::<Vec<_>>()
            .join(",");
        // Longest first, so that a secret containing another is replaced whole.
        secrets.retain(|s| !s.is_empty());
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Target {
            shown: Arc::from(shown),
            secrets: Arc::from(secrets),
        }
    }

    /// The address with `***` where the credentials were.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// `text` with every secret of the URL (as written and decoded) replaced by `***`.
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

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

/// `url` as it may be shown in a message or a log line: every password and user name
/// hidden (`***`), in any form a Redis URL takes (see [`Client::connect`]); a URL that
/// does not parse shows no more than its scheme and hosts.
///
/// ```
/// use redlimit_runtime::redact_url;
///
/// assert_eq!(redact_url("redis://:a,b@db:6379/0"), "redis://***@db:6379/0");
/// assert_eq!(
///     redact_url("redis+unix:///run/redis.sock?pass=s3cret&db=2"),
///     "redis+unix:///run/redis.sock?pass=***&db=2"
/// );
/// assert_eq!(redact_url("redis://:pa/ss@db:6379/"), "redis://***@db:6379/");
/// ```
///
/// [`Client::connect`]: crate::Client::connect
pub fn redact_url(url: &str) -> String {
    Target::new(url).shown().to_owned()
}

/// `text` (an error message, say) with every secret of `url` replaced by `***`: its
/// passwords and query values as written and decoded.
pub fn scrub_url_secrets(text: &str, url: &str) -> String {
    Target::new(url).scrub(text)
}

/// How a scheme's URL reads after `scheme://`.
#[derive(Clone, Copy, PartialEq)]
enum Form {
    /// One host, a database number as path.
    Tcp,
    /// No host (or an empty one), a socket's path; `db`, `user`, `pass` in the query.
    Unix,
    /// Hosts separated by commas, no path.
    Cluster,
    /// Hosts separated by commas, then `/master[/db]`.
    Sentinel,
}

fn form(scheme: &str) -> Form {
    let scheme = scheme.to_ascii_lowercase();
    if scheme == "unix" || scheme.ends_with("+unix") {
        Form::Unix
    } else if scheme.ends_with("+cluster") {
        Form::Cluster
    } else if scheme.ends_with("+sentinel") {
        Form::Sentinel
    } else {
        Form::Tcp
    }
}

/// The shown form of `url`, adding what it hides to `secrets`.
fn redact(url: &str, secrets: &mut Vec<String>) -> String {
    let Some((scheme, rest)) = split_scheme(url) else {
        // Not `scheme://...`: anything up to the hosts may be a password.
        hidden_pieces(url, secrets);
        return hidden_up_to_hosts("", url, Form::Tcp);
    };
    let form = form(scheme);
    match parse(rest, form) {
        Some(parsed) => parsed.show(scheme, secrets),
        None => {
            hidden_pieces(rest, secrets);
            hidden_up_to_hosts(&format!("{scheme}://"), rest, form)
        }
    }
}

/// `scheme` and what follows `scheme://`, when `url` starts with a valid scheme.
fn split_scheme(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let mut chars = scheme.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    (first_ok && rest_ok).then_some((scheme, rest))
}

/// What a URL that did not parse shows: `prefix***`, then `@` and what follows the
/// last `@` of `rest` when that reads as hosts (and a path) of `form`.
fn hidden_up_to_hosts(prefix: &str, rest: &str, form: Form) -> String {
    if let Some(at) = rest.rfind('@') {
        let after = &rest[at + 1..];
        let path_at = after.find(['/', '?', '#']).unwrap_or(after.len());
        let (hosts, path) = after.split_at(path_at);
        if valid_hosts(hosts, form) && (path.is_empty() || valid_path(path, form)) {
            return format!("{prefix}***@{after}");
        }
    }
    format!("{prefix}***")
}

/// What a hidden text may hold a password in, as a connection layer would have read
/// it: the text up to its last `@`, and what follows its first `:`.
fn hidden_pieces(text: &str, secrets: &mut Vec<String>) {
    let hidden = text.rfind('@').map_or(text, |at| &text[..at]);
    push_secret(hidden, secrets);
    if let Some((_, password)) = hidden.split_once(':') {
        push_secret(password, secrets);
    }
}

/// `secret` as written, percent-decoded, and decoded as a query value (`+` a space).
fn push_secret(secret: &str, secrets: &mut Vec<String>) {
    if secret.is_empty() {
        return;
    }
    secrets.push(secret.to_owned());
    let decoded = percent_decode(secret);
    if decoded != secret {
        secrets.push(decoded);
    }
    let form_decoded = percent_decode(&secret.replace('+', " "));
    if form_decoded != secret {
        secrets.push(form_decoded);
    }
}

/// A URL read into the parts it is shown from.
struct Parsed<'a> {
    userinfo: Option<&'a str>,
    hosts: &'a str,
    path: &'a str,
    query: Option<&'a str>,
    fragment: Option<&'a str>,
}

/// The parts of `rest` (after `scheme://`), or `None` when one of them is not of the
/// form's grammar.
fn parse(rest: &str, form: Form) -> Option<Parsed<'_>> {
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
        None => (None, authority),
    };
    let (tail, fragment) = match tail.split_once('#') {
        Some((tail, fragment)) => (tail, Some(fragment)),
        None => (tail, None),
    };
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (tail, None),
    };
    if !valid_hosts(hosts, form) || !valid_path(path, form) {
        return None;
    }
    Some(Parsed {
        userinfo,
        hosts,
        path,
        query,
        fragment,
    })
}

impl Parsed<'_> {
    fn show(&self, scheme: &str, secrets: &mut Vec<String>) -> String {
        let mut shown = format!("{scheme}://");
        if let Some(userinfo) = self.userinfo {
            // The password, or the whole user info when it has no `:` (a password
            // alone, as `redis://secret@host` is often meant).
            push_secret(userinfo, secrets);
            if let Some((_, password)) = userinfo.split_once(':') {
                push_secret(password, secrets);
            }
            shown.push_str("***@");
        }
        shown.push_str(self.hosts);
        shown.push_str(self.path);
        if let Some(query) = self.query {
            shown.push('?');
            let pairs: Vec<String> = query.split('&').map(|pair| show_pair(pair, secrets)).collect();
            shown.push_str(&pairs.join("&"));
        }
        if let Some(fragment) = self.fragment {
            shown.push('#');
            if fragment == "insecure" {
                shown.push_str(fragment);
            } else {
                push_secret(fragment, secrets);
                shown.push_str("***");
            }
        }
        shown
    }
}

/// A query parameter as shown: `db` and `protocol` with their value, the parameters
/// that name credentials (`pass`, `password`, `user`, `username`) with `***`, any other
/// parameter `***` whole (its name may be a password written in the wrong place).
fn show_pair(pair: &str, secrets: &mut Vec<String>) -> String {
    if let Some((key, value)) = pair.split_once('=') {
        if matches!(key, "db" | "protocol") && value.chars().all(|c| c.is_ascii_alphanumeric()) {
            return pair.to_owned();
        }
        if matches!(key, "db" | "protocol" | "pass" | "password" | "user" | "username") {
            push_secret(value, secrets);
            return format!("{key}=***");
        }
    }
    push_secret(pair, secrets);
    "***".to_owned()
}

/// Whether `hosts` are the hosts of `form`: one `host[:port]` (none for a socket), or
/// several separated by commas for a cluster or sentinels.
fn valid_hosts(hosts: &str, form: Form) -> bool {
    match form {
        Form::Unix => hosts.is_empty() || valid_host(hosts),
        Form::Tcp => valid_host(hosts),
        Form::Cluster | Form::Sentinel => hosts.split(',').all(|h| valid_host(h.trim())),
    }
}

/// `name[:port]` or `[v6][:port]`, the name made of letters, digits, `.`, `-`, `_`.
fn valid_host(host: &str) -> bool {
    let (name, port) = if let Some(v6) = host.strip_prefix('[') {
        let Some((address, after)) = v6.split_once(']') else {
            return false;
        };
        if address.parse::<std::net::Ipv6Addr>().is_err() {
            return false;
        }
        match after {
            "" => return true,
            _ => match after.strip_prefix(':') {
                Some(port) => ("v6", port),
                None => return false,
            },
        }
    } else {
        match host.split_once(':') {
            Some((name, port)) => (name, port),
            None => (host, "0"),
        }
    };
    let name_ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    name_ok && !port.is_empty() && port.len() <= 5 && port.chars().all(|c| c.is_ascii_digit())
}

/// Whether `path` is a path of `form`: a database number, a sentinel's master name
/// and database, a socket's file.
fn valid_path(path: &str, form: Form) -> bool {
    let number = |s: &str| !s.is_empty() && s.len() <= 10 && s.chars().all(|c| c.is_ascii_digit());
    let word = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    };
    let trimmed = path.trim_matches('/');
    match form {
        Form::Tcp => trimmed.is_empty() || number(trimmed),
        Form::Cluster => trimmed.is_empty(),
        Form::Sentinel => {
            let mut parts = trimmed.split('/');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(""), None, None) => true,
                (Some(master), None, None) => word(master),
                (Some(master), Some(db), None) => word(master) && number(db),
                _ => false,
            }
        }
        Form::Unix => {
            path.starts_with('/')
                && path
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '-' | '_' | '~'))
        }
    }
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
                "rediss://:secret@host:6380/#insecure",
                "rediss://***@host:6380/#insecure",
            ),
            ("redis://:sec,ret@host:1/", "redis://***@host:1/"),
            ("redis://:p@ss:secret@host", "redis://***@host"),
            ("redis://host:6379", "redis://host:6379"),
            ("redis://[::1]:6379/2", "redis://[::1]:6379/2"),
            (
                "redis+cluster://u:secret@a:1,b:2/",
                "redis+cluster://***@a:1,b:2/",
            ),
            (
                "rediss+cluster://u:sec,ret@a:1,b:2",
                "rediss+cluster://***@a:1,b:2",
            ),
            (
                "redis+sentinel://u:sec,ret@a:1,b:2/mymaster/3",
                "redis+sentinel://***@a:1,b:2/mymaster/3",
            ),
            (
                "rediss+sentinel://:secret@a:1/mymaster",
                "rediss+sentinel://***@a:1/mymaster",
            ),
            (
                "redis+unix:///run/r.sock?pass=secret&db=1",
                "redis+unix:///run/r.sock?pass=***&db=1",
            ),
            (
                "unix:///run/r.sock?user=me&password=secret&protocol=resp3",
                "unix:///run/r.sock?user=***&password=***&protocol=resp3",
            ),
            ("unix:///run/r.sock?secret", "unix:///run/r.sock?***"),
            ("redis://h:1/?x=secret#secret", "redis://h:1/?***#***"),
            ("redis://h:1/?secret=1&db=x!", "redis://h:1/?***&db=***"),
            // Not parsed as written: hidden up to the hosts.
            ("redis://:sec/ret@host:1/", "redis://***@host:1/"),
            ("redis://:sec?ret@host:1/", "redis://***@host:1/"),
            ("redis://:sec#ret@host:1/", "redis://***@host:1/"),
            ("redis://u:123/secret@host/", "redis://***@host/"),
            ("redis://:secret", "redis://***"),
            ("redis://u:secret@h:notaport/", "redis://***"),
            ("unix:///run/r.sock&pass=secret", "unix://***"),
            ("redis//:secret@typo:6379", "***@typo:6379"),
            ("secret", "***"),
            ("redis://:secret@[::1:1/", "redis://***"),
        ] {
            let target = Target::new(url);
            assert_eq!(target.shown(), shown, "{url}");
            assert!(!format!("{target:?}").contains("secret"), "{url}");
            assert!(!format!("{target:?}").contains("sec,"), "{url}");
            let scrubbed = target.scrub(url);
            assert!(
                !["secret", "sec,", "ret@"].iter().any(|p| scrubbed.contains(p)),
                "{url}: {scrubbed}"
            );
        }
        let target = Target::new("redis://u:s%40cret@h/");
        assert_eq!(target.scrub("x s@cret y s%40cret"), "x *** y ***");
        let target = Target::new("unix:///s?pass=a+b%21");
        assert_eq!(target.scrub("a b! a+b%21"), "*** ***");
        let nodes = Target::nodes(&["redis://:one1@a:1/", "redis://:two2@b:2/"]);
        assert_eq!(nodes.shown(), "redis://***@a:1/,redis://***@b:2/");
        assert_eq!(nodes.scrub("one1 two2"), "*** ***");
    }
}
