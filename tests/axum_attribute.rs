//! `#[rate_limit]` on an axum handler keyed by `ClientIp` (cargo feature `axum`): a
//! real server on loopback, a trusted proxy forwarding two clients; each client is
//! limited on its own, and a forged leftmost `X-Forwarded-For` entry does not give a
//! client a fresh limit.
#![cfg(feature = "axum")]

use std::net::SocketAddr;

use axum::http::StatusCode;
use axum::routing::post;
use axum::{Extension, Router};
use redlimit::axum::{ClientIp, TrustedProxies};
use redlimit::{rate_limit, Client, RateLimited};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct Refused;

impl From<RateLimited> for Refused {
    fn from(_: RateLimited) -> Self {
        Refused
    }
}

impl axum::response::IntoResponse for Refused {
    fn into_response(self) -> axum::response::Response {
        StatusCode::TOO_MANY_REQUESTS.into_response()
    }
}

#[rate_limit(key = "login:{ip}", rate = 2, interval = "60s")]
async fn login(ip: ClientIp) -> Result<String, Refused> {
    Ok(format!("welcome {ip}"))
}

async fn post_with(addr: SocketAddr, forwarded_for: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /login HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: 0\r\n\
         X-Forwarded-For: {forwarded_for}\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response[9..12].parse().unwrap()
}

#[tokio::test]
async fn each_client_behind_the_proxy_has_its_own_limit() {
    redlimit::set_default(Client::memory()).unwrap();
    let app = Router::new()
        .route("/login", post(login))
        .layer(Extension(TrustedProxies::new(["127.0.0.1"]).unwrap()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .unwrap();
    });
    for _ in 0..2 {
        assert_eq!(post_with(addr, "198.51.100.7").await, 200);
    }
    assert_eq!(post_with(addr, "198.51.100.7").await, 429);
    for forged in ["1.1.1.1, 198.51.100.7", "10.0.0.9, 198.51.100.7"] {
        assert_eq!(post_with(addr, forged).await, 429, "forged {forged:?}");
    }
    assert_eq!(post_with(addr, "198.51.100.8").await, 200, "another client");
}
