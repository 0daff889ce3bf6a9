//! Who the client is: its IP address, read from forwarding headers only when the peer
//! that wrote them is a proxy you trust.
//!
//! A client can write any `X-Forwarded-For` it likes, so the leftmost entry proves
//! nothing. The chain is walked from the right, starting at the peer: each hop added by
//! a trusted proxy is believed, and the walk stops at the first address that is not a
//! trusted proxy: that is the client. Nothing a client sends can change the address
//! unless a trusted proxy vouches for it.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

use http::HeaderMap;
use ipnet::IpNet;

/// The proxies (CIDR ranges or single addresses) whose forwarding headers are
/// believed, and how IPv6 clients are grouped.
///
/// ```
/// use redlimit_edge::TrustedProxies;
///
/// let trusted = TrustedProxies::new(["10.0.0.0/8", "192.168.1.7"]).unwrap();
/// assert!(trusted.trusts("10.1.2.3".parse().unwrap()));
/// assert!(!trusted.trusts("203.0.113.9".parse().unwrap()));
/// ```
#[derive(Debug, Clone)]
pub struct TrustedProxies {
    /// Shared: a router hands a clone to every request.
    nets: Arc<[IpNet]>,
    ipv6_prefix: u8,
}

impl Default for TrustedProxies {
    /// No proxy is trusted: the client is the peer.
    fn default() -> Self {
        TrustedProxies {
            nets: Arc::from([]),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }
}

/// IPv6 clients are grouped by this prefix by default: a subscriber usually owns a
/// whole /64, and one who rotates addresses within it stays one client.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// A trusted proxy that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidProxy {
    /// What was given.
    pub given: String,
}

impl fmt::Display for InvalidProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "trusted proxy `{}` is neither an IP address nor a CIDR range; write e.g. \
             \"10.0.0.0/8\", \"192.168.1.7\" or \"2001:db8::/32\"",
            self.given
        )
    }
}

impl std::error::Error for InvalidProxy {}

impl TrustedProxies {
    /// Trusts the given ranges (`"10.0.0.0/8"`) and addresses (`"192.168.1.7"`).
    pub fn new<I, S>(proxies: I) -> Result<Self, InvalidProxy>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nets = proxies
            .into_iter()
            .map(|proxy| {
                let text = proxy.as_ref().trim();
                text.parse::<IpNet>()
                    .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
                    .map(|net| net.trunc())
                    .map_err(|_| InvalidProxy {
                        given: text.to_owned(),
                    })
            })
            .collect::<Result<Arc<[_]>, _>>()?;
        Ok(TrustedProxies {
            nets,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        })
    }

    /// Groups IPv6 clients by their first `bits` bits (default 64; 128 keeps each
    /// address apart). At most 128.
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.min(128);
        self
    }

    /// Whether `ip` is a trusted proxy.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.nets.iter().any(|net| net.contains(&ip))
    }

    /// The client behind `peer`, the address that connected, given the request's
    /// headers: `Forwarded`, else `X-Forwarded-For`, else `X-Real-IP`, each believed
    /// only as far as trusted proxies wrote it. A header that does not parse where it
    /// would be believed is ignored, and the peer is the client.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> ClientIp {
        let peer = canonical(peer);
        let client = if self.trusts(peer) {
            self.walk(peer, headers).unwrap_or(peer)
        } else {
            peer
        };
        ClientIp::grouped(client, self.ipv6_prefix)
    }

    /// The first untrusted hop from the right, or `None` when a header that matters
    /// does not parse (or there is none).
    fn walk(&self, peer: IpAddr, headers: &HeaderMap) -> Option<IpAddr> {
        let chain = forwarded_chain(headers)?;
        let mut client = peer;
        for hop in chain.iter().rev() {
            let ip = canonical(hop.as_ref().copied().ok()?);
            client = ip;
            if !self.trusts(ip) {
                return Some(ip);
            }
        }
        Some(client)
    }
}

/// The addresses a request says it was forwarded for, leftmost (the claimed client)
/// first; an entry that does not parse is an `Err`. `None` when no header is there.
fn forwarded_chain(headers: &HeaderMap) -> Option<Vec<Result<IpAddr, ()>>> {
    let values = |name: &str| -> Vec<&str> {
        headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap_or("\u{0}"))
            .collect()
    };
    let forwarded = values("forwarded");
    if !forwarded.is_empty() {
        return Some(
            forwarded
                .iter()
                .flat_map(|v| v.split(','))
                .map(|element| {
                    element
                        .split(';')
                        .find_map(|pair| {
                            let (key, value) = pair.split_once('=')?;
                            key.trim().eq_ignore_ascii_case("for").then(|| value.trim())
                        })
                        .map_or(Err(()), parse_node)
                })
                .collect(),
        );
    }
    let xff = values("x-forwarded-for");
    if !xff.is_empty() {
        return Some(
            xff.iter()
                .flat_map(|v| v.split(','))
                .map(|v| parse_node(v.trim()))
                .collect(),
        );
    }
    let real = values("x-real-ip");
    if !real.is_empty() {
        return Some(real.iter().map(|v| parse_node(v.trim())).collect());
    }
    None
}

/// An address as forwarding headers write it: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`,
/// `[2001:db8::1]:443`, optionally in double quotes (RFC 7239).
fn parse_node(text: &str) -> Result<IpAddr, ()> {
    let text = text.trim().trim_matches('"');
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(ip);
    }
    if let Ok(addr) = text.parse::<std::net::SocketAddr>() {
        return Ok(addr.ip());
    }
    let bracketed = text.strip_prefix('[').and_then(|rest| rest.split_once(']'));
    if let Some((inner, _)) = bracketed {
        return inner.parse::<Ipv6Addr>().map(IpAddr::V6).map_err(|_| ());
    }
    Err(())
}

/// IPv4-mapped IPv6 (`::ffff:1.2.3.4`) as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// A client's IP address, without port; an IPv6 client as its network (by default
/// the /64). Its `Display` is what goes into a key: `203.0.113.9`,
/// `2001:db8:1:2::/64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientIp {
    ip: IpAddr,
    prefix: u8,
}

impl ClientIp {
    fn grouped(ip: IpAddr, ipv6_prefix: u8) -> ClientIp {
        match canonical(ip) {
            IpAddr::V6(v6) => {
                let bits = u128::from(v6);
                let mask = if ipv6_prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - u32::from(ipv6_prefix))
                };
                ClientIp {
                    ip: IpAddr::V6(Ipv6Addr::from(bits & mask)),
                    prefix: ipv6_prefix,
                }
            }
            v4 => ClientIp { ip: v4, prefix: 32 },
        }
    }

    /// The address (for IPv6, the first address of the client's network).
    pub fn ip(&self) -> IpAddr {
        self.ip
    }
}

impl fmt::Display for ClientIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V6(v6) if self.prefix < 128 => write!(f, "{v6}/{}", self.prefix),
            ip => write!(f, "{ip}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn client(trusted: &TrustedProxies, peer: &str, pairs: &[(&str, &str)]) -> String {
        trusted.client_ip(ip(peer), &headers(pairs)).to_string()
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_says() {
        let none = TrustedProxies::default();
        for pairs in [
            &[("x-forwarded-for", "1.1.1.1")][..],
            &[("forwarded", "for=1.1.1.1")],
            &[("x-real-ip", "1.1.1.1")],
        ] {
            assert_eq!(client(&none, "203.0.113.9", pairs), "203.0.113.9");
        }
        let trusted = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
        assert_eq!(
            client(&trusted, "203.0.113.9", &[("x-forwarded-for", "1.1.1.1")]),
            "203.0.113.9"
        );
    }

    #[test]
    fn the_chain_is_walked_from_the_right_and_a_spoofed_leftmost_entry_changes_nothing() {
        let trusted = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
        // client 198.51.100.7 -> proxy 10.0.0.2 -> proxy 10.0.0.1 (the peer)
        let honest = client(
            &trusted,
            "10.0.0.1",
            &[("x-forwarded-for", "198.51.100.7, 10.0.0.2")],
        );
        assert_eq!(honest, "198.51.100.7");
        for spoof in ["1.2.3.4", "10.9.9.9", "garbage", "::1", "198.51.100.8"] {
            let value = format!("{spoof}, 198.51.100.7, 10.0.0.2");
            assert_eq!(
                client(&trusted, "10.0.0.1", &[("x-forwarded-for", &value)]),
                honest,
                "spoofed leftmost {spoof:?}"
            );
        }
        // The same through two header lines, and through Forwarded.
        let split = [
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "198.51.100.7, 10.0.0.2"),
        ];
        assert_eq!(client(&trusted, "10.0.0.1", &split), honest);
        let forwarded = [(
            "forwarded",
            "for=6.6.6.6, for=198.51.100.7;proto=https, for=\"10.0.0.2\"",
        )];
        assert_eq!(client(&trusted, "10.0.0.1", &forwarded), honest);
        // Every hop trusted: the leftmost is the client.
        assert_eq!(
            client(&trusted, "10.0.0.1", &[("x-forwarded-for", "10.5.5.5, 10.0.0.2")]),
            "10.5.5.5"
        );
    }

    #[test]
    fn unparsable_headers_fall_back_to_the_peer() {
        let trusted = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
        for pairs in [
            &[("x-forwarded-for", "not-an-ip")][..],
            &[("x-forwarded-for", "198.51.100.7, ")],
            &[("forwarded", "proto=https")],
            &[("forwarded", "for=unknown")],
            &[("x-real-ip", "nope")],
        ] {
            assert_eq!(client(&trusted, "10.0.0.1", pairs), "10.0.0.1", "{pairs:?}");
        }
        // Past the first untrusted hop nothing is read, parsable or not.
        let beyond = [("x-forwarded-for", "junk, 198.51.100.7")];
        assert_eq!(client(&trusted, "10.0.0.1", &beyond), "198.51.100.7");
    }

    #[test]
    fn forms_of_addresses() {
        let trusted = TrustedProxies::new(["10.0.0.0/8", "2001:db8:ffff::/48"]).unwrap();
        let cases = [
            (&[("x-forwarded-for", "198.51.100.7:4711")][..], "198.51.100.7"),
            (
                &[("forwarded", "for=\"[2001:db8:1:2::7]:4711\"")],
                "2001:db8:1:2::/64",
            ),
            (&[("x-real-ip", "198.51.100.7")], "198.51.100.7"),
            (&[("x-forwarded-for", "::ffff:198.51.100.7")], "198.51.100.7"),
            (&[("FORWARDED", "For=198.51.100.7")], "198.51.100.7"),
        ];
        for (pairs, expected) in cases {
            assert_eq!(client(&trusted, "10.0.0.1", pairs), expected, "{pairs:?}");
        }
        // An IPv4-mapped peer is its IPv4 address, trusted as such.
        assert_eq!(
            client(
                &trusted,
                "::ffff:10.0.0.1",
                &[("x-forwarded-for", "198.51.100.7")]
            ),
            "198.51.100.7"
        );
        assert_eq!(
            client(&TrustedProxies::default(), "::ffff:198.51.100.7", &[]),
            "198.51.100.7"
        );
    }

    #[test]
    fn ipv6_clients_are_grouped_by_their_prefix() {
        let none = TrustedProxies::default();
        assert_eq!(client(&none, "2001:db8:1:2:aaaa::1", &[]), "2001:db8:1:2::/64");
        assert_eq!(client(&none, "2001:db8:1:2:bbbb::9", &[]), "2001:db8:1:2::/64");
        assert_eq!(client(&none, "2001:db8:1:3::1", &[]), "2001:db8:1:3::/64");
        let exact = TrustedProxies::default().ipv6_prefix(128);
        assert_eq!(
            client(&exact, "2001:db8:1:2:aaaa::1", &[]),
            "2001:db8:1:2:aaaa::1"
        );
        let wide = TrustedProxies::default().ipv6_prefix(48);
        assert_eq!(client(&wide, "2001:db8:1:2::1", &[]), "2001:db8:1::/48");
        assert_eq!(client(&none, "::1", &[]), "::/64");
        assert_eq!(client(&none, "127.0.0.1", &[]), "127.0.0.1");
    }

    #[test]
    fn proxies_that_do_not_parse_are_refused_with_the_forms_accepted() {
        let err = TrustedProxies::new(["10.0.0.0/8", "ten"]).unwrap_err();
        assert_eq!(err.given, "ten");
        assert!(err.to_string().contains("CIDR"), "{err}");
        assert!(TrustedProxies::new(["10.0.0.0/33"]).is_err());
    }
}
