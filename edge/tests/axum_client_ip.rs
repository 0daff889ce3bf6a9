//! `ClientIp` in a real axum server on loopback (IPv4 and IPv6), over real HTTP/1.1:
//! the peer without a proxy, the one header trusted proxies write believed, spoofed
//! entries and the other headers not.
#![cfg(feature = "axum")]

use std::net::SocketAddr;

use axum::routing::get;
use axum::{Extension, Router};
use redlimit_edge::{ClientIp, ForwardedHeader, TrustedProxies};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn whoami(ip: ClientIp) -> String {
    ip.to_string()
}

/// Serves `app` on `bind` (port 0); answers the address.
async fn serve(bind: &str, app: Router) -> SocketAddr {
    let listener = TcpListener::bind(bind).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .unwrap();
    });
    addr
}

/// One GET with `headers`; answers the status line's code and the body.
async fn get_with(addr: SocketAddr, headers: &[(&str, &str)]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut request = String::from("GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

#[tokio::test]
async fn without_trusted_proxies_the_peer_is_the_client() {
    let app = Router::new().route("/", get(whoami));
    let addr = serve("127.0.0.1:0", app).await;
    assert_eq!(get_with(addr, &[]).await, (200, "127.0.0.1".to_owned()));
    let spoofed = [
        ("X-Forwarded-For", "1.2.3.4"),
        ("Forwarded", "for=5.6.7.8"),
        ("X-Real-IP", "9.9.9.9"),
    ];
    assert_eq!(get_with(addr, &spoofed).await, (200, "127.0.0.1".to_owned()));
}

#[tokio::test]
async fn a_trusted_proxy_is_believed_and_a_spoofed_leftmost_entry_is_not() {
    let trusted = TrustedProxies::new(["127.0.0.0/8", "::1"]).unwrap();
    let app = Router::new().route("/", get(whoami)).layer(Extension(trusted));
    let addr = serve("127.0.0.1:0", app).await;
    // The loopback peer is a trusted proxy that saw 198.51.100.7.
    let forwarded = [("X-Forwarded-For", "198.51.100.7")];
    assert_eq!(get_with(addr, &forwarded).await.1, "198.51.100.7");
    let spoofed = [("X-Forwarded-For", "1.2.3.4, 198.51.100.7")];
    assert_eq!(get_with(addr, &spoofed).await.1, "198.51.100.7");
    let garbage = [("X-Forwarded-For", "garbage")];
    assert_eq!(get_with(addr, &garbage).await.1, "127.0.0.1");

    // Proxies that write RFC 7239's header: that one is read, and no other.
    let rfc7239 = TrustedProxies::new(["::1"])
        .unwrap()
        .header(ForwardedHeader::Forwarded);
    let v6 = serve(
        "[::1]:0",
        Router::new().route("/", get(whoami)).layer(Extension(rfc7239)),
    )
    .await;
    assert_eq!(get_with(v6, &[]).await.1, "::/64");
    let forwarded = [("Forwarded", "for=\"[2001:db8:1:2::7]:4711\"")];
    assert_eq!(get_with(v6, &forwarded).await.1, "2001:db8:1:2::/64");
    let others = [("X-Forwarded-For", "198.51.100.7"), ("X-Real-IP", "198.51.100.8")];
    assert_eq!(get_with(v6, &others).await.1, "::/64");
    // An IPv6 address that embeds an IPv4 address is that address.
    let nat64 = [("Forwarded", "for=\"[64:ff9b::198.51.100.9]\"")];
    assert_eq!(get_with(v6, &nat64).await.1, "198.51.100.9");
}

#[tokio::test]
async fn only_the_named_header_is_read_and_its_bytes_left_of_the_client_change_nothing() {
    let trusted = TrustedProxies::new(["127.0.0.0/8"]).unwrap();
    let app = Router::new().route("/", get(whoami)).layer(Extension(trusted));
    let addr = serve("127.0.0.1:0", app).await;
    let spoofed = [("Forwarded", "for=6.6.6.6"), ("X-Real-IP", "9.9.9.9")];
    assert_eq!(get_with(addr, &spoofed).await.1, "127.0.0.1");
    let both = [("Forwarded", "for=6.6.6.6"), ("X-Forwarded-For", "198.51.100.7")];
    assert_eq!(get_with(addr, &both).await.1, "198.51.100.7");
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\nX-Forwarded-For: \xff, 198.51.100.7\r\n\r\n",
        )
        .await
        .unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    assert!(
        response.ends_with(b"\r\n\r\n198.51.100.7"),
        "{}",
        String::from_utf8_lossy(&response)
    );
}

#[tokio::test]
async fn without_connect_info_the_extractor_says_how_to_serve() {
    let app = Router::new().route("/", get(whoami));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let (status, body) = get_with(addr, &[]).await;
    assert_eq!(status, 500);
    assert!(body.contains("into_make_service_with_connect_info"), "{body}");
}
