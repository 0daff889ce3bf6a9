//! Tests of `client_ip.rs`.

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
    let rfc7239 = trusted.clone().header(ForwardedHeader::Forwarded);
    assert_eq!(client(&rfc7239, "10.0.0.1", &forwarded), honest);
    // Every hop trusted: the leftmost is the client.
    assert_eq!(
        client(&trusted, "10.0.0.1", &[("x-forwarded-for", "10.5.5.5, 10.0.0.2")]),
        "10.5.5.5"
    );
}

/// A `Forwarded` element's quoted values (RFC 7239 quotes any holding `,`, `;` or
/// `=`, such as the request's `host`, which the client writes) separate nothing: the
/// commas and semicolons in them neither end the element nor start a parameter.
#[test]
fn quoted_values_in_a_forwarded_element_separate_nothing() {
    let rfc7239 = TrustedProxies::new(["10.0.0.0/8"])
        .unwrap()
        .header(ForwardedHeader::Forwarded);
    let cases = [
        // the proxy's element, the client's Host quoted in it
        (
            "for=198.51.100.7;host=\"x,for=10.9.9.9\";proto=http",
            "198.51.100.7",
        ),
        (
            "for=198.51.100.7;host=\"x;for=6.6.6.6\";proto=http",
            "198.51.100.7",
        ),
        (
            "proto=http;host=\"x, for=6.6.6.6;a=b\";for=198.51.100.7",
            "198.51.100.7",
        ),
        // an escaped quote does not end the value; an escaped backslash before one does
        ("for=198.51.100.7;host=\"x\\\",for=10.9.9.9\"", "198.51.100.7"),
        (
            "for=6.6.6.6, for=198.51.100.7;host=\"x\\\\\";proto=http",
            "198.51.100.7",
        ),
        // behind a second trusted proxy
        (
            "for=198.51.100.7;host=\"a,for=10.1.1.1\", for=10.0.0.2;host=\"b;c\"",
            "198.51.100.7",
        ),
        // the client's own unterminated quote to the left is never read
        ("for=6.6.6.6;x=\", for=198.51.100.7", "198.51.100.7"),
    ];
    for (value, want) in cases {
        assert_eq!(
            client(&rfc7239, "10.0.0.1", &[("forwarded", value)]),
            want,
            "{value}"
        );
    }
    // A proxy's element still in a quoted value at the line's start does not parse.
    let open = [("forwarded", "for=198.51.100.7;host=\"x")];
    assert_eq!(client(&rfc7239, "10.0.0.1", &open), "10.0.0.1");
}

#[test]
fn unparsable_headers_fall_back_to_the_peer() {
    let trusted = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
    let rfc7239 = trusted.clone().header(ForwardedHeader::Forwarded);
    let real = trusted.clone().header(ForwardedHeader::XRealIp);
    for (trusted, pairs) in [
        (&trusted, &[("x-forwarded-for", "not-an-ip")][..]),
        (&trusted, &[("x-forwarded-for", "198.51.100.7, ")]),
        (&rfc7239, &[("forwarded", "proto=https")]),
        (&rfc7239, &[("forwarded", "for=unknown")]),
        (&rfc7239, &[("forwarded", "for=_hidden")]),
        (&rfc7239, &[("forwarded", "for=198.51.100.7;for=198.51.100.8")]),
        (&real, &[("x-real-ip", "nope")]),
        (&real, &[("x-real-ip", "198.51.100.8, 198.51.100.7")]),
        (&trusted, &[("x-forwarded-for", "fe80::1%eth0")]),
        (&trusted, &[("x-forwarded-for", "[fe80::1%2]:4711")]),
    ] {
        assert_eq!(client(trusted, "10.0.0.1", pairs), "10.0.0.1", "{pairs:?}");
    }
    // Past the first untrusted hop nothing is read, parsable or not.
    let beyond = [("x-forwarded-for", "junk, 198.51.100.7")];
    assert_eq!(client(&trusted, "10.0.0.1", &beyond), "198.51.100.7");
}

#[test]
fn forms_of_addresses() {
    let trusted = TrustedProxies::new(["10.0.0.0/8", "2001:db8:ffff::/48"]).unwrap();
    let rfc7239 = trusted.clone().header(ForwardedHeader::Forwarded);
    let real = trusted.clone().header(ForwardedHeader::XRealIp);
    let cases = [
        (
            &trusted,
            &[("x-forwarded-for", "198.51.100.7:4711")][..],
            "198.51.100.7",
        ),
        (
            &trusted,
            &[("x-forwarded-for", "198.51.100.7:_a1")],
            "198.51.100.7",
        ),
        (
            &trusted,
            &[("x-forwarded-for", " \t198.51.100.7\t ")],
            "198.51.100.7",
        ),
        (
            &trusted,
            &[("x-forwarded-for", "[2001:db8:1:2::7]")],
            "2001:db8:1:2::/64",
        ),
        (
            &rfc7239,
            &[("forwarded", "for=\"[2001:db8:1:2::7]:4711\"")],
            "2001:db8:1:2::/64",
        ),
        (
            &rfc7239,
            &[("forwarded", "for=\"[2001:db8:1:2::7]:_x\";proto=https")],
            "2001:db8:1:2::/64",
        ),
        (&real, &[("x-real-ip", "198.51.100.7")], "198.51.100.7"),
        (
            &trusted,
            &[("x-forwarded-for", "::ffff:198.51.100.7")],
            "198.51.100.7",
        ),
        (&rfc7239, &[("FORWARDED", "For=198.51.100.7")], "198.51.100.7"),
        (
            &rfc7239,
            &[("forwarded", "proto=https; FOR = 198.51.100.7 ;by=x")],
            "198.51.100.7",
        ),
    ];
    for (trusted, pairs, expected) in cases {
        assert_eq!(client(trusted, "10.0.0.1", pairs), expected, "{pairs:?}");
    }
    for bad in [
        "198.51.100.7:",
        "198.51.100.7:_",
        "198.51.100.7:99999",
        "198.51.100.7:_a/b",
        "[::1",
    ] {
        let pairs = [("x-forwarded-for", bad)];
        assert_eq!(client(&trusted, "10.0.0.1", &pairs), "10.0.0.1", "{bad:?}");
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
fn only_the_header_the_proxies_write_is_read() {
    let all = [
        ("forwarded", "for=6.6.6.6"),
        ("x-forwarded-for", "7.7.7.7"),
        ("x-real-ip", "8.8.8.8"),
    ];
    let trusted = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
    assert_eq!(client(&trusted, "10.0.0.1", &all), "7.7.7.7", "the default");
    for (header, expected) in [
        (ForwardedHeader::Forwarded, "6.6.6.6"),
        (ForwardedHeader::XForwardedFor, "7.7.7.7"),
        (ForwardedHeader::XRealIp, "8.8.8.8"),
    ] {
        let trusted = trusted.clone().header(header);
        assert_eq!(client(&trusted, "10.0.0.1", &all), expected, "{header:?}");
        // Without it, the others are not read: the proxy is the client.
        let others: Vec<_> = all.iter().copied().filter(|(n, _)| *n != header.name()).collect();
        assert_eq!(client(&trusted, "10.0.0.1", &others), "10.0.0.1", "{header:?}");
    }
}

#[test]
fn the_walk_reads_bytes_and_stops_at_the_first_untrusted_address() {
    let trusted = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
    let raw = |value: &[u8]| {
        let mut map = HeaderMap::new();
        map.append("x-forwarded-for", HeaderValue::from_bytes(value).unwrap());
        trusted.client_ip(ip("10.0.0.1"), &map).to_string()
    };
    // What lies left of the client, parsable or not, changes nothing.
    assert_eq!(raw(b"\xff, 198.51.100.7"), "198.51.100.7");
    assert_eq!(
        raw(b"\xff\xfe garbage \x80, 10.9.9.9 , 198.51.100.7, 10.0.0.2"),
        "198.51.100.7"
    );
    assert_eq!(raw(b"198.51.100.\xff7, 198.51.100.7"), "198.51.100.7");
    // An entry that does not parse before the client: the last address proved,
    // here the trusted hop 10.0.0.2 that the peer vouched for.
    assert_eq!(raw(b"198.51.100.7, \xff, 10.0.0.2"), "10.0.0.2");
    assert_eq!(raw(b"198.51.100.7, , 10.0.0.2"), "10.0.0.2");
    // The peer's own entry does not parse: the peer is all that is proved.
    assert_eq!(raw(b"198.51.100.7, \xff"), "10.0.0.1");
    // Lines are walked from the last; a bad line left of the client is never read.
    let mut map = HeaderMap::new();
    map.append("x-forwarded-for", HeaderValue::from_bytes(b"\xff\xff").unwrap());
    map.append("x-forwarded-for", HeaderValue::from_static("198.51.100.7"));
    assert_eq!(
        trusted.client_ip(ip("10.0.0.1"), &map).to_string(),
        "198.51.100.7"
    );
    // A proxy that adds its X-Real-IP line after the client's instead of replacing it.
    let real = trusted.clone().header(ForwardedHeader::XRealIp);
    let added = [("x-real-ip", "6.6.6.6"), ("x-real-ip", "198.51.100.7")];
    assert_eq!(client(&real, "10.0.0.1", &added), "198.51.100.7");
}

#[test]
fn ipv6_addresses_embedding_ipv4_are_that_ipv4_address() {
    let none = TrustedProxies::default();
    for (v6, v4) in [
        ("::ffff:1.2.3.4", "1.2.3.4"),
        ("::1.2.3.4", "1.2.3.4"),
        ("::0.0.0.2", "0.0.0.2"),
        ("64:ff9b::1.2.3.4", "1.2.3.4"),
        ("64:ff9b::5.6.7.8", "5.6.7.8"),
        ("2002:102:304::1", "1.2.3.4"),
        ("2002:102:304:abcd:1234::9", "1.2.3.4"),
        ("2001:0:4136:e378:8000:63bf:fefd:fcfb", "1.2.3.4"),
    ] {
        assert_eq!(client(&none, v6, &[]), v4, "{v6}");
        assert_eq!(client(&none.clone().ipv6_prefix(128), v6, &[]), v4, "{v6} /128");
    }
    for (v6, grouped) in [
        ("::1", "::/64"),
        ("::", "::/64"),
        ("64:ff9b:1::1.2.3.4", "64:ff9b:1::/64"),
        ("64:ff9b:0:0:1::1.2.3.4", "64:ff9b::/64"),
        ("2001:1::1", "2001:1::/64"),
        ("2003:102:304::1", "2003:102:304::/64"),
        ("::1:0:0:1", "::/64"),
    ] {
        assert_eq!(client(&none, v6, &[]), grouped, "{v6}");
    }
    // Trust is decided on the address as received: only an IPv4-mapped peer is its
    // IPv4 address there, never one that a prefix translates.
    let trusted = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
    assert!(trusted.trusts(ip("::ffff:10.0.0.1")));
    for translated in ["64:ff9b::10.0.0.1", "::10.0.0.1", "2002:a00:1::1"] {
        assert!(!trusted.trusts(ip(translated)), "{translated}");
    }
}

#[test]
fn proxies_that_do_not_parse_are_refused_with_the_forms_accepted() {
    let err = TrustedProxies::new(["10.0.0.0/8", "ten"]).unwrap_err();
    assert_eq!(err.given, "ten");
    assert!(err.to_string().contains("CIDR"), "{err}");
    assert!(TrustedProxies::new(["10.0.0.0/33"]).is_err());
    // A megabyte given is quoted by its start: the message stays a line.
    let long = "é".repeat(1 << 19);
    let err = TrustedProxies::new([long.as_str()]).unwrap_err();
    assert_eq!(err.given, long);
    let shown = err.to_string();
    assert!(
        shown.contains(&format!("`{}... (1048576 bytes)`", "é".repeat(64))),
        "{shown}"
    );
    assert!(shown.len() < 300, "{}", shown.len());
}

/// The key's text of a client address is its `Display`, for every IPv4 address's
/// digits and every IPv6 form and prefix: keys written before stay the same limiter.
#[test]
fn a_client_address_text_is_its_display() {
    let mut seen = 0;
    let mut text = String::new();
    let mut check = |client: ClientIp| {
        text.clear();
        client.write_text(&mut text);
        assert_eq!(text, client.to_string());
        seen += 1;
    };
    for octet in 0..=255u8 {
        for at in 0..4 {
            let mut octets = [1, 22, 133, 4];
            octets[at] = octet;
            check(ClientIp::grouped(IpAddr::from(octets), 64));
        }
    }
    let v6 = [
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        "2001:db8:1:2:3:4:5:6",
        "2001:db8::1",
        "::",
        "::1",
        "fe80::1:0:0:0",
        "1:0:0:2:0:0:0:3",
        "::ffff:192.0.2.1",
        "64:ff9b::203.0.113.7",
        "2002:c000:0201::1",
    ];
    for text in v6 {
        for prefix in [0, 1, 7, 16, 48, 63, 64, 65, 99, 127, 128] {
            check(ClientIp::grouped(ip(text), prefix));
        }
    }
    // The longest text there is: eight full groups and a prefix of three digits.
    check(ClientIp {
        ip: ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
        prefix: 127,
    });
    // And addresses drawn at random (xorshift), each grouped at a random prefix.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..20_000 {
        let (high, low, prefix) = (next(), next(), (next() % 129) as u8);
        check(ClientIp::grouped(
            IpAddr::from(Ipv4Addr::from(low as u32)),
            prefix,
        ));
        let v6 = Ipv6Addr::from(u128::from(high) << 64 | u128::from(low));
        check(ClientIp::grouped(IpAddr::from(v6), prefix));
        // With zero groups, for the shortened forms.
        let sparse = u128::from(high & 0xffff_0000_ffff_0000) << 64 | u128::from(low & 0x0000_ffff_0000_0000);
        check(ClientIp::grouped(IpAddr::from(Ipv6Addr::from(sparse)), prefix));
    }
    assert_eq!(seen, 1024 + 110 + 1 + 60_000);
}

/// Each forwarding header's name made once for each server's header map is the name
/// the header is documented by: a request behind a proxy is read by the same header
/// in axum and in actix-web.
#[test]
fn each_forwarding_header_is_looked_up_by_its_own_name() {
    for header in [
        ForwardedHeader::XForwardedFor,
        ForwardedHeader::Forwarded,
        ForwardedHeader::XRealIp,
    ] {
        assert_eq!(header.header_name().as_str(), header.name());
        // The name as each map's parser makes it (a name `http` knows is kept as
        // its constant, and hashed as one), and found where a request's header is.
        let parsed = http::header::HeaderName::from_bytes(header.name().as_bytes()).unwrap();
        assert_eq!(header.header_name(), &parsed);
        let mut map = HeaderMap::new();
        map.insert(parsed, HeaderValue::from_static("192.0.2.1"));
        assert_eq!(map.get_all(header.header_name()).iter().count(), 1);
        #[cfg(feature = "actix")]
        {
            use actix_web::http::header as actix;
            assert_eq!(header.actix_name().as_str(), header.name());
            let parsed = actix::HeaderName::from_bytes(header.name().as_bytes()).unwrap();
            assert_eq!(header.actix_name(), &parsed);
            let mut map = actix::HeaderMap::new();
            map.insert(parsed, actix::HeaderValue::from_static("192.0.2.1"));
            assert_eq!(map.get_all(header.actix_name()).count(), 1);
        }
    }
}
