//! Sentinel URLs read: `redis+sentinel://` and `rediss+sentinel://`, their sentinels,
//! master name, database, credentials (the master's and the sentinels' own) and TLS,
//! with every secret kept out of the errors they give and of `Debug`.

use crate::backend::redis::target::Target;
use crate::Error;

/// A sentinel URL's parts.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    pub sentinels: Vec<(String, u16)>,
    pub master: String,
    pub db: i64,
    pub username: Option<String>,
    pub password: Option<String>,
    pub sentinel_username: Option<String>,
    pub sentinel_password: Option<String>,
    pub tls: bool,
    pub insecure: bool,
}

impl std::fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelUrl")
            .field("sentinels", &self.sentinels)
            .field("master", &self.master)
            .field("db", &self.db)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// The parts of a `redis+sentinel://` or `rediss+sentinel://` URL, or `None` for any
/// other URL.
pub(crate) fn parse_url(url: &str) -> Option<Result<SentinelUrl, Error>> {
    let (tls, rest) = match url.strip_prefix("redis+sentinel://") {
        Some(rest) => (false, rest),
        None => (true, url.strip_prefix("rediss+sentinel://")?),
    };
    let invalid = |detail: &str| Error::InvalidUrl {
        url: Target::new(url).shown().to_owned(),
        detail: detail.to_owned(),
    };
    Some(parse_rest(rest, tls).map_err(|detail| invalid(&detail)))
}

fn parse_rest(rest: &str, tls: bool) -> Result<SentinelUrl, String> {
    let (rest, fragment) = split_off(rest, '#');
    let insecure = match fragment {
        None => false,
        Some("insecure") if tls => true,
        Some(_) => return Err("the only fragment accepted is `#insecure`, with rediss+sentinel://".into()),
    };
    let (rest, query) = split_off(rest, '?');
    // The user info ends at the last `@`: a password may hold one.
    let (auth, rest) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let (hosts, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, ""),
    };
    let (master, db) = master_and_db(path)?;
    let (username, password) = credentials(auth)?;
    let (sentinel_username, sentinel_password) = sentinel_credentials(query.unwrap_or_default())?;
    Ok(SentinelUrl {
        sentinels: sentinels(hosts)?,
        master,
        db,
        username,
        password,
        sentinel_username,
        sentinel_password,
        tls,
        insecure,
    })
}

/// The sentinels' hosts and ports, at least one and at most [`MAX_SENTINELS`].
fn sentinels(hosts: &str) -> Result<Vec<(String, u16)>, String> {
    // Sentinels are named by their place in the list, never by their text: with a
    // `?` or `#` left unencoded in a password, the text read as hosts is the password.
    let sentinels = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .enumerate()
        .map(|(i, host)| host_port(host).map_err(|problem| format!("sentinel {} {problem}", i + 1)))
        .collect::<Result<Vec<_>, String>>()?;
    if sentinels.is_empty() {
        return Err("no sentinel listed (expected host:port[,host:port...])".into());
    }
    if sentinels.len() > MAX_SENTINELS {
        return Err(format!(
            "{} sentinels listed: at most {MAX_SENTINELS} are accepted",
            sentinels.len()
        ));
    }
    Ok(sentinels)
}

/// `master_name[/db]`, the path after the hosts.
fn master_and_db(path: &str) -> Result<(String, i64), String> {
    let mut path = path.trim_end_matches('/').split('/');
    let master = path.next().unwrap_or_default();
    if master.is_empty() {
        return Err("no master name (expected .../master_name[/db])".into());
    }
    let db = match path.next() {
        None => 0,
        Some(db) => db
            .parse::<i64>()
            .ok()
            .filter(|db| *db >= 0)
            .ok_or("the database after the master name is not a number")?,
    };
    if path.next().is_some() {
        return Err("more than a master name and a database in the path".into());
    }
    Ok((decode(master)?, db))
}

/// The master's user name and password, from the user info.
fn credentials(auth: Option<&str>) -> Result<(Option<String>, Option<String>), String> {
    let Some(auth) = auth else {
        return Ok((None, None));
    };
    let (user, pass) = match auth.split_once(':') {
        Some((user, pass)) => (user, Some(pass)),
        None => (auth, None),
    };
    let user = decode(user)?;
    Ok((
        (!user.is_empty()).then_some(user),
        pass.map(decode).transpose()?.filter(|p| !p.is_empty()),
    ))
}

/// The sentinels' own user name and password, from the query.
fn sentinel_credentials(query: &str) -> Result<(Option<String>, Option<String>), String> {
    let (mut username, mut password) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = Some(decode(value)?).filter(|v| !v.is_empty());
        match name {
            "sentinel_username" => username = value,
            "sentinel_password" => password = value,
            // Not named back: a parameter's name may be a mistyped secret.
            _ => {
                return Err(
                    "an unknown query parameter (accepted: sentinel_username, sentinel_password)".into(),
                )
            }
        }
    }
    Ok((username, password))
}

fn split_off(text: &str, at: char) -> (&str, Option<&str>) {
    match text.find(at) {
        Some(i) => (&text[..i], Some(&text[i + 1..])),
        None => (text, None),
    }
}

/// The most sentinels a URL may list (deployments run three or five).
const MAX_SENTINELS: usize = 64;

fn host_port(host: &str) -> Result<(String, u16), &'static str> {
    let (name, port) = host
        .rsplit_once(':')
        .ok_or("has no port (expected host:port; a `?` or `#` in a password must be written %3F, %23)")?;
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or("has no valid port (1 to 65535)")?;
    let name = match name.strip_prefix('[') {
        Some(v6) => v6
            .strip_suffix(']')
            .filter(|v6| v6.parse::<std::net::Ipv6Addr>().is_ok())
            .ok_or("has an IPv6 address that does not parse (expected [address]:port)")?,
        None if name.contains([':', '[', ']']) => {
            return Err("has a host with a `:` (an IPv6 address is written [address]:port)")
        }
        None => name,
    };
    if name.is_empty() {
        return Err("has no host");
    }
    Ok((name.to_owned(), port))
}

/// Percent-decoding, as URLs write user names, passwords and names.
fn decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("a `%` not followed by two hex digits")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "a percent-encoded part that is not UTF-8".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(url: &str) -> SentinelUrl {
        parse_url(url).expect("a sentinel URL").expect("valid")
    }

    #[test]
    fn sentinel_urls() {
        assert!(parse_url("redis://a:1/").is_none());
        assert!(parse_url("redis+cluster://a:1/").is_none());
        let url = parsed("redis+sentinel://a:26379,b:26380/mymaster");
        assert_eq!(url.sentinels, [("a".into(), 26379), ("b".into(), 26380)]);
        assert_eq!((url.master.as_str(), url.db, url.tls), ("mymaster", 0, false));
        assert_eq!((url.username, url.password), (None, None));

        let url = parsed("rediss+sentinel://app:p%40ss@w@a:1/m/3?sentinel_password=s%26p#insecure");
        assert_eq!(url.username.as_deref(), Some("app"));
        assert_eq!(url.password.as_deref(), Some("p@ss@w"));
        assert_eq!(url.sentinel_password.as_deref(), Some("s&p"));
        assert_eq!((url.db, url.tls, url.insecure), (3, true, true));

        let url = parsed("redis+sentinel://:secret@[::1]:26379/m/");
        assert_eq!(url.sentinels, [("::1".into(), 26379)]);
        assert_eq!((url.username, url.password.as_deref()), (None, Some("secret")));
    }

    #[test]
    fn bad_sentinel_urls_say_what_is_accepted() {
        for (url, says) in [
            ("redis+sentinel:///m", "no sentinel listed"),
            ("redis+sentinel://a:1", "no master name"),
            ("redis+sentinel://a/m", "sentinel 1 has no port"),
            ("redis+sentinel://a:1,b:0/m", "sentinel 2 has no valid port"),
            ("redis+sentinel://a:1:2/m", "with a `:`"),
            ("redis+sentinel://[::1:1/m", "IPv6 address that does not parse"),
            ("redis+sentinel://a:1/m/x", "not a number"),
            ("redis+sentinel://a:1/m/1/2", "more than a master name"),
            ("redis+sentinel://a:1/m?timeout=1", "accepted: sentinel_username"),
            ("redis+sentinel://a:1/m#insecure", "only fragment"),
            ("redis+sentinel://u:%zz@a:1/m", "two hex digits"),
        ] {
            let err = parse_url(url).unwrap().unwrap_err();
            assert!(err.to_string().contains(says), "{url}: {err}");
        }
    }

    #[test]
    fn huge_host_lists_are_refused() {
        let hosts: Vec<String> = (0..65).map(|i| format!("10.0.0.{i}:26379")).collect();
        let err = parse_url(&format!("redis+sentinel://{}/m", hosts.join(",")))
            .unwrap()
            .unwrap_err();
        assert!(err.to_string().contains("at most 64"), "{err}");
        assert!(
            parse_url(&format!("redis+sentinel://{}/m", hosts[..64].join(",")))
                .unwrap()
                .is_ok()
        );
    }

    #[test]
    fn a_password_cut_at_an_unencoded_question_mark_is_not_shown() {
        // Before the `?`: `:hunter2` reads as the only host.
        for url in [
            "redis+sentinel://:hunter2?x@a:1/m",
            "redis+sentinel://u:hunter2?x@a:1/m",
            "redis+sentinel://:hunter2:9?x@a:1/m",
            "redis+sentinel://:hunter2#x@a:1/m",
        ] {
            let err = parse_url(url).unwrap().unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("hunter2"), "{url}: {shown}");
        }
    }

    #[test]
    fn secrets_stay_out_of_errors_and_debug() {
        let err = parse_url("redis+sentinel://u:hunter2@a:1/m?sentinel_password=s3cret&hunter2=1")
            .unwrap()
            .unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("hunter2") && !shown.contains("s3cret"), "{shown}");
        let url = parsed("redis+sentinel://u:hunter2@a:1/m?sentinel_password=s3cret");
        let shown = format!("{url:?}");
        assert!(!shown.contains("hunter2") && !shown.contains("s3cret"), "{shown}");
    }
}
