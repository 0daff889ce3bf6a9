//! Rules keyed by the client address beside rules on a literal, counting differently,
//! at two sites of one process (a layer's `login` per client beside a function's
//! `login:all`; a function's `signin:{request.client_ip}` beside another's
//! `signin:all`): no address is `all`, so none is refused as a rule that may name
//! another's limiters, through an axum server on loopback.
#![cfg(feature = "axum")]

use redlimit_test_support as support;

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use redlimit::tower::{Key, LayerRule, RateLimitLayer};
use redlimit::{rate_limit, Client, RateLimited};
use support::http::{send, serve};

#[rate_limit(key = "login:all", rate = 1000, interval = "60s")]
async fn every_login() -> Result<(), RateLimited> {
    Ok(())
}

// Two functions: one per client address (the address the layer read), one for all.
#[rate_limit(key = "signin:{request.client_ip}", rate = 3, interval = "60s")]
async fn signin_per_client() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "signin:all", rate = 1000, interval = "60s")]
async fn every_signin() -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn a_client_address_beside_a_literal_at_another_site_is_no_overlap() {
    let client = Client::memory();
    redlimit::set_default(client.clone()).unwrap();
    let layer = RateLimitLayer::builder()
        .client(client)
        .rule(LayerRule::new("login", 5, Duration::from_secs(60)).key(Key::client_ip()))
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/login",
            get(|| async {
                let signin = match signin_per_client().await {
                    Ok(()) => every_signin().await.map(|()| "signed in"),
                    Err(refused) if refused.retry_after().is_some() => Ok("per client: refused"),
                    Err(refused) => Err(refused),
                };
                match (every_login().await, signin) {
                    (Ok(()), Ok(said)) => (axum::http::StatusCode::OK, said.to_owned()),
                    (Err(refused), _) | (_, Err(refused)) => {
                        (axum::http::StatusCode::INTERNAL_SERVER_ERROR, refused.to_string())
                    }
                }
            }),
        )
        .layer(layer);
    let addr = serve(app).await;
    let statuses: Vec<(u16, String)> = futures_statuses(addr).await;
    // 5 granted by the layer (each also by `login:all`; the first 3 signed in, then
    // refused per client), then the layer's refusals
    let expected: Vec<(u16, String)> = [
        (200, "signed in"),
        (200, "signed in"),
        (200, "signed in"),
        (200, "per client: refused"),
        (200, "per client: refused"),
    ]
    .into_iter()
    .map(|(status, body)| (status, body.to_owned()))
    .collect();
    assert_eq!(statuses[..5], expected, "{statuses:?}");
    assert_eq!([statuses[5].0, statuses[6].0], [429, 429], "{statuses:?}");
}

async fn futures_statuses(addr: std::net::SocketAddr) -> Vec<(u16, String)> {
    let mut out = Vec::new();
    for _ in 0..7 {
        let reply = send(addr, "GET", "/login", &[]).await;
        out.push((reply.status, reply.body));
    }
    out
}
