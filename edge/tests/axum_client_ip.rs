//! `ClientIp` in a real axum server on loopback (IPv4 and IPv6), over real HTTP/1.1:
//! the peer without a proxy, trusted proxies' headers believed, spoofed ones not.
#![cfg(feature = "axum")]

use std::net::SocketAddr;

use axum::routing::get;
use axum::{Extension, Router};
use redlimit_edge::{ClientIp, TrustedProxies};
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

    let v6 = serve(
        "[::1]:0",
        Router::new()
            .route("/", get(whoami))
            .layer(Extension(TrustedProxies::new(["::1"]).unwrap())),
    )
    .await;
    assert_eq!(get_with(v6, &[]).await.1, "::/64");
    let forwarded = [("Forwarded", "for=\"[2001:db8:1:2::7]:4711\"")];
    assert_eq!(get_with(v6, &forwarded).await.1, "2001:db8:1:2::/64");
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
