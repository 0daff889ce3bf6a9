//! Hostile requests through the actix-web middleware (cargo feature `actix`), as the
//! tower layer's tests send them: forged `X-Forwarded-For` and `Forwarded` headers from
//! untrusted peers behind a real proxy, a key header sent twice, costs no grant can
//! hold, key values with braces, newlines and bytes that are not UTF-8; both backends
//! where the backend decides.
#![cfg(feature = "actix")]

use redlimit_test_support as support;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use actix_web::{web, App};
use redlimit::actix::{ForwardedHeader, Key, LayerRule, RateLimitLayer, TrustedProxies};
use redlimit::{Algorithm, Client, MAX_PERMITS, MAX_RATE};
use support::http::{proxy, send, send_from, Writes};
use support::{serve_actix, RedisServer};

const MINUTE: Duration = Duration::from_secs(60);

fn serve(layer: RateLimitLayer) -> SocketAddr {
    serve_actix!(move || App::new()
        .wrap(layer.clone())
        .route("/a", web::get().to(|| async { "a" })))
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// How many of `requests` (each a list of raw headers) sent from `from` are granted.
async fn granted(addr: SocketAddr, from: &str, requests: &[Vec<(&str, Vec<u8>)>]) -> usize {
    let mut granted = 0;
    for headers in requests {
        let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_slice())).collect();
        let reply = send_from(Some(ip(from)), addr, "GET", "/a", &headers).await;
        assert!(matches!(reply.status, 200 | 429), "{reply:?}");
        granted += usize::from(reply.status == 200);
    }
    granted
}

/// Values naming the victim 127.0.0.55 in the forms an address takes, and values meant
/// to confuse a parser, in every forwarding header, on one line and on two.
fn forgeries(header: &'static str) -> Vec<Vec<(&'static str, Vec<u8>)>> {
    let values: &[&[u8]] = &[
        b"127.0.0.55",
        b"::ffff:127.0.0.55",
        b"[::ffff:127.0.0.55]:80",
        b"for=127.0.0.55",
        b"for=\"127.0.0.55\"",
        b"FOR=127.0.0.55;for=127.0.0.55",
        b"  127.0.0.55\t,\t127.0.0.55  ",
        b"127.0.0.55,",
        b"fe80::1%eth0",
        b"for=_hidden, for=unknown",
        b"127.0.0.55\xff",
    ];
    let mut requests = Vec::new();
    for value in values {
        for name in [header, "X-FORWARDED-FOR", "Forwarded", "x-real-ip"] {
            requests.push(vec![(name, value.to_vec())]);
        }
        requests.push(vec![(header, value.to_vec()), (header, value.to_vec())]);
    }
    requests
}

#[tokio::test]
async fn attack_forged_forwarding_headers_from_untrusted_peers_grant_at_most_the_rate() {
    for (writes, header, choice) in [
        (
            Writes::XForwardedFor,
            "x-forwarded-for",
            ForwardedHeader::XForwardedFor,
        ),
        (Writes::Forwarded, "forwarded", ForwardedHeader::Forwarded),
        (Writes::XRealIp, "x-real-ip", ForwardedHeader::XRealIp),
    ] {
        let layer = RateLimitLayer::builder()
            .client(Client::memory())
            .trusted_proxies(TrustedProxies::new(["127.0.0.1"]).unwrap().header(choice))
            .rule(
                LayerRule::new("login", 5, MINUTE)
                    .key(Key::client_ip())
                    .exempt(["127.0.0.1"]),
            )
            .build()
            .unwrap();
        let addr = proxy(serve(layer), writes).await;
        let forged = forgeries(header);
        let spent = granted(addr, "127.0.0.66", &forged).await;
        assert_eq!(
            spent,
            5,
            "{header}: {spent} of {} granted at 5 a minute",
            forged.len()
        );
        let victim = send_from(Some(ip("127.0.0.55")), addr, "GET", "/a", &[]).await;
        assert_eq!(
            victim.status, 200,
            "{header}: the forgeries spent the victim's permits"
        );
    }
}

/// The proxy's own element quotes the client's `Host`: its commas and semicolons
/// separate nothing, so the client chooses no address, even with the proxy's own
/// address exempt (a client keyed as the proxy would pass them all).
#[tokio::test]
async fn attack_a_host_quoted_in_the_proxys_forwarded_element_chooses_no_address() {
    for writes in [Writes::ForwardedHost, Writes::ForwardedHostLast] {
        let layer = RateLimitLayer::builder()
            .client(Client::memory())
            .trusted_proxies(
                TrustedProxies::new(["127.0.0.1"])
                    .unwrap()
                    .header(ForwardedHeader::Forwarded),
            )
            .rule(
                LayerRule::new("login", 5, MINUTE)
                    .key(Key::client_ip())
                    .exempt(["127.0.0.1"]),
            )
            .build()
            .unwrap();
        let addr = proxy(serve(layer), writes).await;
        let hosts = support::http::quoted_hosts();
        let spent = granted(addr, "127.0.0.66", &hosts).await;
        assert_eq!(
            spent,
            5,
            "{writes:?}: {spent} of {} granted at 5 a minute",
            hosts.len()
        );
        let victim = send_from(Some(ip("127.0.0.55")), addr, "GET", "/a", &[]).await;
        assert_eq!(
            victim.status, 200,
            "{writes:?}: the hosts spent the victim's permits"
        );
    }
}

/// A peer that is not a trusted proxy is the client, whatever it writes about itself.
#[tokio::test]
async fn attack_forwarding_headers_of_an_untrusted_peer_are_never_read() {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .trusted_proxies(TrustedProxies::new(["10.0.0.0/8"]).unwrap())
        .rule(LayerRule::new("login", 2, MINUTE).key(Key::client_ip()))
        .build()
        .unwrap();
    let addr = serve(layer);
    let rotating: Vec<_> = (0..20)
        .map(|i| {
            vec![
                ("x-forwarded-for", format!("198.51.100.{i}").into_bytes()),
                ("forwarded", format!("for=203.0.113.{i}").into_bytes()),
            ]
        })
        .collect();
    assert_eq!(granted(addr, "127.0.0.66", &rotating).await, 2);
}

#[tokio::test]
async fn attack_a_key_header_sent_twice_is_refused_not_keyed_by_one_line() {
    let server = RedisServer::start();
    let redis = Client::connect(&server.url()).await.unwrap();
    for client in [Client::memory(), redis] {
        let layer = RateLimitLayer::builder()
            .client(client)
            .rule(LayerRule::new("per-key", 1, MINUTE).key(Key::header("x-api-key")))
            .build()
            .unwrap();
        let addr = serve(layer);
        assert_eq!(send(addr, "GET", "/a", &[("x-api-key", "a")]).await.status, 200);
        assert_eq!(send(addr, "GET", "/a", &[("x-api-key", "a")]).await.status, 429);
        for twice in [
            [("x-api-key", "z"), ("x-api-key", "a")],
            [("x-api-key", "a"), ("X-Api-Key", "y")],
            [("x-api-key", "fresh"), ("x-api-key", "fresh")],
        ] {
            let reply = send(addr, "GET", "/a", &twice).await;
            assert_eq!(reply.status, 400, "{twice:?}: {reply:?}");
            assert_eq!(
                reply.body,
                "This request sends the x-api-key header more than once; send it once\n"
            );
        }
        let fresh = send(addr, "GET", "/a", &[("x-api-key", "fresh")]).await;
        assert_eq!(fresh.status, 200, "nothing was spent by the refused requests");
    }
}

#[tokio::test]
async fn attack_a_cost_past_the_log_field_is_limited_not_a_server_error() {
    let server = RedisServer::start();
    let redis = Client::connect(&server.url()).await.unwrap();
    for client in [Client::memory(), redis] {
        for (algorithm, interval) in [
            (Algorithm::SlidingWindow, MINUTE),
            (Algorithm::TokenBucket, Duration::from_millis(1)),
        ] {
            let layer = RateLimitLayer::builder()
                .client(client.clone())
                .rule(
                    LayerRule::new(format!("metered-{algorithm:?}"), MAX_RATE, interval)
                        .algorithm(algorithm)
                        .key(Key::header("x-api-key"))
                        .cost(support::http::cost_header),
                )
                .build()
                .unwrap();
            let addr = serve(layer);
            for cost in [MAX_PERMITS + 1, u64::MAX] {
                let cost = cost.to_string();
                let reply = send(addr, "GET", "/a", &[("x-api-key", "k"), ("x-cost", &cost)]).await;
                assert_eq!(reply.status, 429, "{algorithm:?}, cost {cost}: {reply:?}");
                assert_eq!(reply.header("retry-after"), None, "{reply:?}");
            }
            for odd in ["-1", "1e3", "", "0x10", "18446744073709551616"] {
                let reply = send(addr, "GET", "/a", &[("x-api-key", "k"), ("x-cost", odd)]).await;
                assert_eq!(reply.status, 200, "cost {odd:?} counts as 1: {reply:?}");
            }
            let most = MAX_PERMITS.to_string();
            let reply = send(addr, "GET", "/a", &[("x-api-key", "k"), ("x-cost", &most)]).await;
            assert_eq!(
                reply.status, 200,
                "{algorithm:?}: the most one grant holds: {reply:?}"
            );
        }
    }
}

/// Key values with braces, separators, newline escapes and bytes that are not UTF-8
/// each reach their own limiter (a rate of 1: each value's first request passes, its
/// second is refused), on both backends; none is a server error.
#[tokio::test]
async fn attack_odd_key_values_reach_no_other_value_s_limiter() {
    let server = RedisServer::start();
    let redis = Client::connect(&server.url()).await.unwrap();
    let values: Vec<Vec<u8>> = vec![
        b"{tag}".to_vec(),
        b"{".to_vec(),
        b"}".to_vec(),
        b"a:b".to_vec(),
        b"a%3Ab".to_vec(),
        b"caf\xe9".to_vec(),
        b"caf\xff".to_vec(),
        "caf\u{fffd}".as_bytes().to_vec(),
        b"caf%E9".to_vec(),
        b"\xc3".to_vec(),
        b"\xfe".repeat(300),
    ];
    for client in [Client::memory(), redis] {
        let layer = RateLimitLayer::builder()
            .client(client)
            .rule(LayerRule::new("bytes", 1, MINUTE).key(Key::header("x-user")))
            .build()
            .unwrap();
        let addr = serve(layer);
        for round in ["first", "second"] {
            for value in &values {
                let status = send_from(None, addr, "GET", "/a", &[("x-user", value)])
                    .await
                    .status;
                let expected = if round == "first" { 200 } else { 429 };
                assert_eq!(status, expected, "{round} request of {value:?}");
            }
        }
    }
}

/// Path parameter values with braces and newlines (a raw one cannot be sent in a
/// header; percent-encoded in a path it can), through a resource.
#[tokio::test]
async fn attack_odd_path_parameters_reach_no_other_value_s_limiter() {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(LayerRule::new("user", 1, MINUTE).key(Key::path_param("id")))
        .build()
        .unwrap();
    let addr = serve_actix!(move || App::new().service(
        web::resource("/users/{id}")
            .wrap(layer.clone())
            .route(web::get().to(|| async { "user" }))
    ));
    let paths = [
        "/users/%7Bt%7D",
        "/users/%0A",
        "/users/%0D%0Ax",
        "/users/a:b",
        "/users/%FF",
    ];
    for round in ["first", "second"] {
        for path in paths {
            let status = send(addr, "GET", path, &[]).await.status;
            let expected = if round == "first" { 200 } else { 429 };
            assert_eq!(status, expected, "{round} request of {path}");
        }
    }
}

/// One path parameter spelled many ways (the router leaves `%2B`, `%2F` and `%25`
/// encoded, in the case sent, where the handler's `web::Path` decodes them): every
/// spelling is the value the handler reads, and shares its limiter, on both backends.
#[tokio::test]
async fn attack_spellings_of_a_path_parameter_share_its_limiter() {
    let server = RedisServer::start();
    let redis = Client::connect(&server.url()).await.unwrap();
    let spellings: [(&str, &[&str]); 3] = [
        ("a+b", &["a+b", "a%2Bb", "a%2bb", "%61%2bb", "%61+b"]),
        ("x/y", &["x%2Fy", "x%2fy", "%78%2Fy"]),
        ("p%q", &["p%25q", "%70%25q"]),
    ];
    for client in [Client::memory(), redis] {
        let layer = RateLimitLayer::builder()
            .client(client)
            .rule(LayerRule::new("user", 2, MINUTE).key(Key::path_param("id")))
            .build()
            .unwrap();
        let addr = serve_actix!(move || App::new().service(
            web::resource("/users/{id}")
                .wrap(layer.clone())
                .route(web::get().to(|id: web::Path<String>| async move { id.into_inner() }))
        ));
        for (value, paths) in spellings {
            let mut granted = 0;
            for _ in 0..2 {
                for path in paths {
                    let reply = send(addr, "GET", &format!("/users/{path}"), &[]).await;
                    assert!(matches!(reply.status, 200 | 429), "{path}: {reply:?}");
                    if reply.status == 200 {
                        assert_eq!(reply.body, value, "the handler's value for {path}");
                        granted += 1;
                    }
                }
            }
            assert_eq!(
                granted,
                2,
                "{value}: {} requests, spelled {paths:?}",
                2 * paths.len()
            );
        }
    }
}
