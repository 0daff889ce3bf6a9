//! The request's identity reaching the attribute in process, through an actix-web
//! server and an axum server on loopback: the same scenario as `request_scope.rs` (on
//! Redis there): GLOBAL, IP and USER by `{request.client_ip}` and
//! `{request.identity}`, forged forwarding headers, a request without an identity,
//! hostile identities, spawned tasks.
#![cfg(all(feature = "actix", feature = "axum"))]

#[path = "request_scope/common.rs"]
mod common;

use std::net::SocketAddr;
use std::sync::OnceLock;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::{from_fn, Next};
use actix_web::{web, App, HttpResponse};
use redlimit::Client;
use redlimit_test_support::serve_actix;

/// The default client of this binary, in process (the attribute decides on it).
fn client() -> &'static Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let client = Client::memory();
        redlimit::set_default(client.clone()).unwrap();
        client
    })
}

async fn authenticated(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    common::authenticate(request.headers().get("x-user").map(|value| value.as_bytes()));
    next.call(request).await
}

fn respond((status, body): (u16, String)) -> HttpResponse {
    HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap()).body(body)
}

/// An actix-web server: the layer outermost, the authentication inside it (actix-web
/// runs the last `wrap` first), then `/ask` and `/spawned`.
fn serve_actix(client: &Client) -> SocketAddr {
    let layer = common::layer(client);
    serve_actix!(move || {
        App::new()
            .route(
                "/ask",
                web::get().to(|| async { respond(common::reply(common::answer("hi".into()).await)) }),
            )
            .route(
                "/spawned",
                web::get().to(|| async { respond(common::spawned().await) }),
            )
            .wrap(from_fn(authenticated))
            .wrap(layer.clone())
    })
}

/// One test: the two servers share this binary's in-process limiters, so they run
/// one after the other, each on limiters of its own (a reset between them).
#[tokio::test]
async fn three_dimensions_in_process_behind_actix_web_and_axum() {
    let client = client();
    common::outside_any_request(client).await;
    common::scenario(serve_actix(client), client).await;
    reset(client).await;
    common::scenario(common::serve_axum(client).await, client).await;
}

/// Forgets every limiter the scenario touches.
async fn reset(client: &Client) {
    let mut names = vec!["rate_limit:llm:global".to_owned()];
    for ip in [
        "198.51.100.7",
        "198.51.100.8",
        "198.51.100.9",
        "127.0.0.2",
        "192.0.2.1",
    ]
    .into_iter()
    .map(str::to_owned)
    .chain((10..20).map(|i| format!("192.0.2.{i}")))
    .chain((100..103).map(|i| format!("192.0.2.{i}")))
    {
        names.push(format!("rate_limit:llm:ip:{ip}"));
    }
    for user in ["alice", "bob", "carol", "u1", "u2", "u3", "u4", "frank"] {
        names.push(common::user_key(user));
    }
    names.extend(
        common::hostile()
            .iter()
            .map(|identity| common::user_key(identity)),
    );
    for name in names {
        client.rate_limiter(name).delete().await.unwrap();
    }
}
