//! Who the client is: its IP address, read from the one forwarding header your proxies
//! write, and only when the peer that wrote it is a proxy you trust.
//!
//! A client can write any forwarding header it likes, so the leftmost entry proves
//! nothing, and neither does a header the proxies do not write (they pass it through
//! as the client sent it): one header is read, the one named on [`TrustedProxies`],
//! never another. Its entries are walked from the right, over the bytes as received,
//! starting at the peer: each hop added by a trusted proxy is believed, and the walk
//! stops at the first address that is not a trusted proxy: that is the client. What
//! lies to the left of it is never read. An entry that does not parse before that
//! point ends the walk at the last address proved. Nothing a client sends can change
//! the address unless a trusted proxy vouches for it.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};
use ipnet::IpNet;

/// The proxies (CIDR ranges or single addresses) whose forwarding header is believed,
/// which header that is, and how IPv6 clients are grouped. One setting serves both
/// [`ClientIp`] and the layer's [`Key::client_ip`](crate::tower::Key::client_ip).
///
/// ```
/// # mod redlimit { pub mod axum { pub use redlimit_edge::{ForwardedHeader, TrustedProxies}; } }
/// use redlimit::axum::{ForwardedHeader, TrustedProxies};
///
/// let trusted = TrustedProxies::new(["10.0.0.0/8", "192.168.1.7"]).unwrap();
/// assert!(trusted.trusts("10.1.2.3".parse().unwrap()));
/// assert!(!trusted.trusts("203.0.113.9".parse().unwrap()));
/// // Proxies that write RFC 7239's header instead of X-Forwarded-For:
/// let trusted = trusted.header(ForwardedHeader::Forwarded);
/// # let _ = trusted;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedProxies {
    /// Shared: a router hands a clone to every request.
    nets: Arc<[IpNet]>,
    ipv6_prefix: u8,
    header: ForwardedHeader,
}

/// The one forwarding header the trusted proxies write (default `X-Forwarded-For`).
/// The others are never read: a proxy passes them through as the client wrote them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: <client>, <proxy 1>, ...`, each proxy appending the address
    /// it saw (nginx's `$proxy_add_x_forwarded_for`, most load balancers). Every line of
    /// the header is read, the last one rightmost.
    #[default]
    XForwardedFor,
    /// `Forwarded: for=<client>, for=<proxy 1>;proto=https, ...` (RFC 7239), each proxy
    /// appending an element; the `for` parameter of each element is read (an element
    /// without one, or with two, does not parse). A comma or semicolon inside a quoted
    /// value (`host="a,b;c"`: a proxy quotes the request's `Host` so) separates nothing.
    Forwarded,
    /// `X-Real-IP: <client>`, which the proxy sets to the address it saw, replacing the
    /// client's own (nginx's `proxy_set_header X-Real-IP $remote_addr`). Each line is
    /// one address; a line with a list does not parse.
    XRealIp,
}

impl ForwardedHeader {
    /// The header's name, lower-case.
    pub fn name(self) -> &'static str {
        match self {
            ForwardedHeader::XForwardedFor => "x-forwarded-for",
            ForwardedHeader::Forwarded => "forwarded",
            ForwardedHeader::XRealIp => "x-real-ip",
        }
    }

    /// [`name`](ForwardedHeader::name) as `http`'s header name, made once: a header
    /// looked up by its text parses that text on every lookup.
    fn header_name(self) -> &'static HeaderName {
        static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
        static FORWARDED: HeaderName = http::header::FORWARDED;
        static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
        match self {
            ForwardedHeader::XForwardedFor => &X_FORWARDED_FOR,
            ForwardedHeader::Forwarded => &FORWARDED,
            ForwardedHeader::XRealIp => &X_REAL_IP,
        }
    }

    /// [`header_name`](ForwardedHeader::header_name) as actix-web's header map takes
    /// it (`http` 0.2's type), made once: looked up by its text, the name would be
    /// parsed on every lookup, and `x-forwarded-for` and `x-real-ip`, which `http` 0.2
    /// has no constants for, copied into a new allocation.
    #[cfg(feature = "actix")]
    pub(crate) fn actix_name(self) -> &'static actix_web::http::header::HeaderName {
        use actix_web::http::header::HeaderName;
        static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
        static FORWARDED: HeaderName = HeaderName::from_static("forwarded");
        static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
        match self {
            ForwardedHeader::XForwardedFor => &X_FORWARDED_FOR,
            ForwardedHeader::Forwarded => &FORWARDED,
            ForwardedHeader::XRealIp => &X_REAL_IP,
        }
    }

    /// One entry of the header (an element between commas; for `X-Real-IP` a whole
    /// line) as an address, or `None` when it does not parse.
    fn parse(self, entry: &[u8]) -> Option<IpAddr> {
        match self {
            ForwardedHeader::XForwardedFor | ForwardedHeader::XRealIp => parse_node(entry),
            ForwardedHeader::Forwarded => {
                // (a parameter's quoted value may hold `;`, `,` and `=`: a `;` in one
                // separates nothing)
                let mut nodes = Entries::new(entry, Some(b';'), true).filter_map(|pair| {
                    let eq = pair.iter().position(|&b| b == b'=')?;
                    pair[..eq]
                        .trim_ascii()
                        .eq_ignore_ascii_case(b"for")
                        .then(|| &pair[eq + 1..])
                });
                let node = nodes.next()?;
                // A parameter occurs once per element (RFC 7239 section 4).
                if nodes.next().is_some() {
                    return None;
                }
                parse_node(node)
            }
        }
    }
}

impl Default for TrustedProxies {
    /// No proxy is trusted: the client is the peer.
    fn default() -> Self {
        TrustedProxies {
            nets: Arc::from([]),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
            header: ForwardedHeader::default(),
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
        // Quoted whole up to the longest address with a prefix, else by its start.
        let given = match self.given.char_indices().nth(64) {
            Some((end, _)) => format!("{}... ({} bytes)", &self.given[..end], self.given.len()),
            None => self.given.clone(),
        };
        write!(
            f,
            "trusted proxy `{given}` is neither an IP address nor a CIDR range; write e.g. \
             \"10.0.0.0/8\", \"192.168.1.7\" or \"2001:db8::/32\""
        )
    }
}

impl std::error::Error for InvalidProxy {}

impl TrustedProxies {
    /// Trusts the given ranges (`"10.0.0.0/8"`) and addresses (`"192.168.1.7"`), which
    /// write `X-Forwarded-For` (see [`header`](TrustedProxies::header)). List the
    /// proxies only: every address in these ranges may say whom it forwards for.
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
            header: ForwardedHeader::default(),
        })
    }

    /// The one forwarding header the trusted proxies write (default
    /// [`ForwardedHeader::XForwardedFor`]); no other is ever read.
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Groups IPv6 clients by their first `bits` bits (default 64; 128 keeps each
    /// address apart). At most 128. An IPv6 address that embeds an IPv4 address is
    /// that IPv4 address (see [`ClientIp`]), whatever the prefix.
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.min(128);
        self
    }

    /// Whether `ip` is a trusted proxy (an IPv4-mapped address as its IPv4 address).
    pub fn trusts(&self, ip: IpAddr) -> bool {
        let ip = unmapped(ip);
        self.nets.iter().any(|net| net.contains(&ip))
    }

    /// The client behind `peer`, the address that connected, given the request's
    /// headers: the forwarding header the proxies write, believed only as far as
    /// trusted proxies wrote it, walked from the right. The walk stops at the first
    /// address that is not a trusted proxy (the client); at an entry that does not
    /// parse, the last address proved (the peer, or the leftmost trusted hop read) is
    /// the client.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> ClientIp {
        self.client_ip_from(peer, || {
            let lines = headers.get_all(self.header.header_name()).iter();
            lines.map(HeaderValue::as_bytes)
        })
    }

    /// [`client_ip`](TrustedProxies::client_ip) given the lines of the forwarding
    /// header ([`forwarding_header`](TrustedProxies::forwarding_header)) as received,
    /// in order, looked up only when the peer is a trusted proxy (most peers are not:
    /// the header's name is not even hashed then): for requests whose headers are not
    /// `http` 1's (actix-web's) too.
    pub(crate) fn client_ip_from<'a, L: DoubleEndedIterator<Item = &'a [u8]>>(
        &self,
        peer: IpAddr,
        lines: impl FnOnce() -> L,
    ) -> ClientIp {
        let peer = unmapped(peer);
        let client = if self.trusts(peer) {
            self.walk(peer, lines())
        } else {
            peer
        };
        ClientIp::grouped(client, self.ipv6_prefix)
    }

    /// The one forwarding header read.
    #[cfg_attr(not(feature = "actix"), allow(dead_code))]
    pub(crate) fn forwarding_header(&self) -> ForwardedHeader {
        self.header
    }

    /// The first untrusted hop from the right; at an entry that does not parse, or
    /// when every hop is trusted, the last address proved.
    fn walk<'a>(&self, peer: IpAddr, lines: impl DoubleEndedIterator<Item = &'a [u8]>) -> IpAddr {
        // X-Real-IP's lines are one address each; the others' entries are separated by
        // commas, the byte itself, so a byte that is not ASCII only spoils its entry.
        // RFC 7239's elements are separated by commas outside quoted values: a proxy
        // quotes a value holding one (the request's `host="..."`, which the client
        // writes), and that comma separates nothing.
        let separator = (self.header != ForwardedHeader::XRealIp).then_some(b',');
        let quoted = self.header == ForwardedHeader::Forwarded;
        let mut proved = peer;
        for line in lines.rev() {
            for entry in Entries::new(line, separator, quoted) {
                let Some(ip) = self.header.parse(entry) else {
                    return proved;
                };
                proved = unmapped(ip);
                if !self.trusts(proved) {
                    return proved;
                }
            }
        }
        proved
    }
}

/// The parts of a header line between `separator` bytes, from the right (the whole
/// line without one); with `quoted`, those outside RFC 7239's quoted strings only: a
/// `"` opens or closes one unless an odd run of `\` comes before it. Read from the
/// right, where the trusted proxies write, a part's bounds depend only on what lies to
/// its right: nothing a client writes to the left of the proxies' elements moves them.
/// A part still inside a quoted string at the line's start does not parse.
struct Entries<'a> {
    rest: Option<&'a [u8]>,
    separator: Option<u8>,
    quoted: bool,
}

impl<'a> Entries<'a> {
    fn new(line: &'a [u8], separator: Option<u8>, quoted: bool) -> Self {
        Entries {
            rest: Some(line),
            separator,
            quoted,
        }
    }
}

impl<'a> Iterator for Entries<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let bytes = self.rest?;
        let Some(separator) = self.separator else {
            self.rest = None;
            return Some(bytes);
        };
        let mut inside = false;
        for i in (0..bytes.len()).rev() {
            match bytes[i] {
                b'"' if self.quoted => {
                    let escapes = bytes[..i].iter().rev().take_while(|&&b| b == b'\\').count();
                    if escapes % 2 == 0 {
                        inside = !inside;
                    }
                }
                b if b == separator && !inside => {
                    self.rest = Some(&bytes[..i]);
                    return Some(&bytes[i + 1..]);
                }
                _ => {}
            }
        }
        self.rest = None;
        // (an unterminated quoted string: made not to parse)
        Some(if inside { b"\"" } else { bytes })
    }
}

/// An address as forwarding headers write it: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`,
/// `[2001:db8::1]`, `[2001:db8::1]:443`, optionally in double quotes (RFC 7239), the
/// port possibly obfuscated (`:_a1`); surrounding whitespace ignored. Anything else
/// does not parse: bytes that are not ASCII, zone ids (`fe80::1%eth0`), RFC 7239's
/// `unknown` and obfuscated identifiers (`_hidden`).
fn parse_node(entry: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(entry.trim_ascii()).ok()?;
    let text = text.trim_matches('"');
    if text.contains('%') {
        return None;
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    // `[2001:db8::1]` without a port, or either form with an obfuscated port.
    let (host, after) = match text.strip_prefix('[') {
        Some(rest) => {
            let (inner, after) = rest.split_once(']')?;
            (IpAddr::V6(inner.parse().ok()?), after)
        }
        None => {
            let colon = text.find(':')?;
            (IpAddr::V4(text[..colon].parse().ok()?), &text[colon..])
        }
    };
    let port_ok = match after.strip_prefix(':') {
        None => after.is_empty(),
        Some(port) => port.strip_prefix('_').is_some_and(|obfuscated| {
            !obfuscated.is_empty()
                && obfuscated
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        }),
    };
    port_ok.then_some(host)
}

/// An IPv4-mapped address (`::ffff:1.2.3.4`, what a dual-stack socket reports for an
/// IPv4 peer) as the IPv4 address it is.
fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The IPv4 address an IPv6 address embeds, if it has one: IPv4-mapped
/// (`::ffff:1.2.3.4`), IPv4-compatible (`::1.2.3.4`; not `::` or `::1`), RFC 6052's
/// well-known NAT64 prefix (`64:ff9b::1.2.3.4`), 6to4 (`2002:0102:0304::/48`, RFC
/// 3056) and Teredo (`2001:0::/32`, RFC 4380: the client's address inverted in the
/// last 32 bits).
fn embedded_ipv4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(v6);
    let low = bits as u32;
    match bits >> 96 {
        0 if bits >> 32 == 0xffff => Some(Ipv4Addr::from(low)),
        0 if bits >> 32 == 0 && bits > 1 => Some(Ipv4Addr::from(low)),
        0x0064_ff9b if (bits >> 32) as u64 == 0 => Some(Ipv4Addr::from(low)),
        0x2001_0000 => Some(Ipv4Addr::from(!low)),
        high if high >> 16 == 0x2002 => Some(Ipv4Addr::from((bits >> 80) as u32)),
        _ => None,
    }
}

/// The trusted proxies a `RateLimitLayer` read a request's client with (and the client,
/// when a rule is keyed by it), left on the request so that the handler's [`ClientIp`]
/// is the layer's, and a different setting further in is refused.
#[cfg(feature = "tower")]
#[derive(Clone)]
pub(crate) struct ReadBy {
    pub(crate) trusted: TrustedProxies,
    /// Read by the axum and actix-web extractors.
    #[cfg_attr(not(any(feature = "axum", feature = "actix")), allow(dead_code))]
    pub(crate) client: Option<ClientIp>,
}

/// Why a request is refused when two of its trusted-proxy settings differ.
#[cfg(feature = "tower")]
pub(crate) const TWO_SETTINGS: &str = "two different TrustedProxies settings reach this request (a \
     RateLimitLayer's .trusted_proxies(...), a TrustedProxies extension, another layer's): the \
     layer's key and the handler's ClientIp would not be the same client; set it once, on the \
     layer or as an Extension outside every layer";

/// The one trusted-proxy setting among those present, `None` when none is, or
/// [`TWO_SETTINGS`] when two differ.
#[cfg(feature = "tower")]
pub(crate) fn one_setting<'a>(
    settings: impl IntoIterator<Item = Option<&'a TrustedProxies>>,
) -> Result<Option<&'a TrustedProxies>, &'static str> {
    let mut one: Option<&TrustedProxies> = None;
    for setting in settings.into_iter().flatten() {
        match one {
            Some(seen) if seen != setting => return Err(TWO_SETTINGS),
            _ => one = Some(setting),
        }
    }
    Ok(one)
}

/// A client's IP address, without port; an IPv6 client as its network (by default
/// the /64), except that an IPv6 address embedding an IPv4 address (IPv4-mapped,
/// IPv4-compatible, NAT64's well-known prefix `64:ff9b::/96`, 6to4, Teredo) is that
/// IPv4 address. Its `Display` is what goes into a key: `203.0.113.9`,
/// `2001:db8:1:2::/64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientIp {
    ip: IpAddr,
    prefix: u8,
}

impl ClientIp {
    fn grouped(ip: IpAddr, ipv6_prefix: u8) -> ClientIp {
        let ip = match ip {
            IpAddr::V6(v6) => embedded_ipv4(v6).map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match ip {
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

    /// Writes the text its `Display` writes into `out`: a key's value for every
    /// request a rule keys by the client, where formatting into a new `String` cost
    /// four times the rest of reading the address. An IPv4 address is written digit
    /// by digit, an IPv6 one through its `Display`.
    pub(crate) fn write_text(&self, out: &mut String) {
        match self.ip {
            IpAddr::V4(v4) => {
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        out.push('.');
                    }
                    if octet >= 100 {
                        out.push(char::from(b'0' + octet / 100));
                    }
                    if octet >= 10 {
                        out.push(char::from(b'0' + octet / 10 % 10));
                    }
                    out.push(char::from(b'0' + octet % 10));
                }
            }
            IpAddr::V6(_) => {
                // (writing into a `String` does not fail)
                let _ = fmt::Write::write_fmt(out, format_args!("{self}"));
            }
        }
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
mod tests;
