//! `#[rate_limit]` on actix-web handlers (cargo feature `actix`), on real servers on
//! loopback: refusals answered as the axum response answers them (429, `Retry-After`,
//! the RateLimit fields, plain text or problem+json) whatever the handler returns
//! (`Result<T, RateLimited>`, `Result<T, actix_web::Error>`, `HttpResponse`,
//! `ProblemJson`), keys by the actix-web `ClientIp`; the middleware leaving the fields
//! of a response decided inside; and one Redis limit held request for request across
//! an actix-web server and an axum server.
#![cfg(all(feature = "actix", feature = "axum"))]

use redlimit_test_support as support;

use std::net::SocketAddr;
use std::time::Duration;

use actix_web::{web, App, HttpResponse};
use redlimit::actix::{ClientIp, ProblemJson, TrustedProxies};
use redlimit::tower::{Key, LayerRule, RateLimitLayer};
use redlimit::{rate_limit, Client, FromRateLimited, RateLimited};
use support::http::{send, Reply};
use support::{serve_actix, RedisServer};

#[rate_limit(key = "login:{ip}", rate = 2, interval = "60s")]
async fn login(ip: ClientIp) -> Result<String, RateLimited> {
    Ok(format!("welcome {ip}"))
}

#[rate_limit(key = "search", rate = 1, interval = "60s", message = "search is busy")]
async fn search() -> Result<&'static str, actix_web::Error> {
    Ok("results")
}

#[rate_limit(key = "user:{id}", rate = 1, interval = "60s")]
async fn user(id: web::Path<u64>) -> HttpResponse {
    HttpResponse::Ok().body(format!("user {id}"))
}

#[rate_limit(key = "export", rate = 1, interval = "60s")]
async fn export() -> Result<&'static str, ProblemJson> {
    Ok("exported")
}

/// The `#[rate_limit]` functions decide on the default client: in process.
fn in_process_default() {
    static SET: std::sync::Once = std::sync::Once::new();
    SET.call_once(|| redlimit::set_default(Client::memory()).unwrap());
}

fn serve() -> SocketAddr {
    in_process_default();
    serve_actix!(|| {
        App::new()
            .app_data(TrustedProxies::new(["127.0.0.1"]).unwrap())
            .route("/login", web::post().to(login))
            .route("/search", web::get().to(search))
            .route("/users/{id}", web::get().to(user))
            .route("/export", web::get().to(export))
    })
}

fn retry(reply: &Reply) -> u64 {
    reply.header("retry-after").unwrap().parse().unwrap()
}

#[tokio::test]
async fn each_client_behind_the_proxy_has_its_own_limit() {
    let addr = serve();
    let from = |ip| [("x-forwarded-for", ip)];
    for _ in 0..2 {
        let reply = send(addr, "POST", "/login", &from("198.51.100.7")).await;
        assert_eq!((reply.status, reply.body.as_str()), (200, "welcome 198.51.100.7"));
    }
    let refused = send(addr, "POST", "/login", &from("198.51.100.7")).await;
    assert_eq!(refused.status, 429);
    let retry = retry(&refused);
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some("\"login:{ip}\";q=2;w=60")
    );
    assert_eq!(
        refused.header("ratelimit"),
        Some(&*format!("\"login:{{ip}}\";r=0;t={retry}"))
    );
    assert_eq!(refused.body, format!("Too many requests; retry in {retry} s\n"));
    // A forged leftmost entry is still the client the proxy saw.
    let forged = send(addr, "POST", "/login", &from("1.1.1.1, 198.51.100.7")).await;
    assert_eq!(forged.status, 429);
    assert_eq!(
        send(addr, "POST", "/login", &from("198.51.100.8")).await.status,
        200
    );
}

#[tokio::test]
async fn every_return_type_answers_a_refusal_as_axum_does() {
    let addr = serve();
    assert_eq!(send(addr, "GET", "/search", &[]).await.body, "results");
    let refused = send(addr, "GET", "/search", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("content-type"), Some("text/plain; charset=utf-8"));
    let wait = retry(&refused);
    assert_eq!(refused.body, format!("search is busy; retry in {wait} s\n"));

    assert_eq!(send(addr, "GET", "/users/7", &[]).await.body, "user 7");
    let refused = send(addr, "GET", "/users/7", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("ratelimit-policy"), Some("\"user:{id}\";q=1;w=60"));
    assert_eq!(send(addr, "GET", "/users/8", &[]).await.status, 200);

    assert_eq!(send(addr, "GET", "/export", &[]).await.status, 200);
    let refused = send(addr, "GET", "/export", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("content-type"), Some("application/problem+json"));
    let problem: serde_json::Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["retry_after"], retry(&refused));
}

/// The headers a refusal is made of, and its body: what must be the same bytes in
/// both frameworks.
fn refusal(reply: &Reply) -> (u16, Vec<(String, String)>, String) {
    let mut headers: Vec<_> = reply
        .headers
        .iter()
        .filter(|(name, _)| !matches!(name.as_str(), "date" | "connection" | "content-length"))
        .cloned()
        .collect();
    headers.sort();
    (reply.status, headers, reply.body.clone())
}

/// The same rule refused by the tower layer on axum and by the middleware on actix-web:
/// the same status, headers and body, in plain text and in problem+json, the legacy
/// fields on.
#[tokio::test]
async fn the_middleware_refuses_in_the_same_bytes_as_the_tower_layer() {
    let layer = || {
        RateLimitLayer::builder()
            .client(Client::memory())
            .x_ratelimit_headers(true)
            .rule(LayerRule::new("same", 1, Duration::from_secs(3600)).message("slow \"down\""))
            .build()
            .unwrap()
    };
    for problem in [false, true] {
        let (tower, actix) = (layer(), layer());
        let axum_addr = match problem {
            false => support::http::serve_route("/a", |app| app.layer(tower)).await,
            true => support::http::serve_route("/a", |app| app.layer(tower.problem_json())).await,
        };
        let actix_addr = match problem {
            false => serve_actix!(move || App::new()
                .wrap(actix.clone())
                .route("/a", web::get().to(|| async { "ok" }))),
            true => {
                let actix = actix.problem_json();
                serve_actix!(move || App::new()
                    .wrap(actix.clone())
                    .route("/a", web::get().to(|| async { "ok" })))
            }
        };
        let granted = [
            send(axum_addr, "GET", "/a", &[]).await,
            send(actix_addr, "GET", "/a", &[]).await,
        ];
        for name in [
            "ratelimit",
            "ratelimit-policy",
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
        ] {
            assert_eq!(granted[0].header(name), granted[1].header(name), "{name}");
        }
        let axum = refusal(&send(axum_addr, "GET", "/a", &[]).await);
        let actix = refusal(&send(actix_addr, "GET", "/a", &[]).await);
        assert_eq!(axum.0, 429);
        assert_eq!(axum, actix, "problem+json: {problem}");
    }
}

/// An actix-web server and an axum server, each with its own client, share one Redis
/// and one rule: the limit holds request for request across both.
#[tokio::test]
async fn one_redis_limit_across_an_actix_server_and_an_axum_server() {
    let server = RedisServer::start();
    let layer = |client| {
        RateLimitLayer::builder()
            .client(client)
            .rule(LayerRule::new("shared", 6, Duration::from_secs(60)).key(Key::header("x-api-key")))
            .build()
            .unwrap()
    };
    let tower = layer(Client::connect(&server.url()).await.unwrap());
    let actix = layer(Client::connect(&server.url()).await.unwrap());
    let axum_addr = support::http::serve_route("/a", |app| app.layer(tower)).await;
    let actix_addr = serve_actix!(move || App::new()
        .wrap(actix.clone())
        .route("/a", web::get().to(|| async { "ok" })));
    let key = [("x-api-key", "tenant-1")];
    for i in 0..6u64 {
        let addr = if i % 2 == 0 { axum_addr } else { actix_addr };
        let reply = send(addr, "GET", "/a", &key).await;
        assert_eq!(reply.status, 200, "request {i}");
        assert_eq!(
            reply.header("ratelimit"),
            Some(&*format!("\"shared\";r={}", 5 - i)),
            "request {i}: one count across both"
        );
    }
    for addr in [axum_addr, actix_addr] {
        assert_eq!(send(addr, "GET", "/a", &key).await.status, 429);
    }
    assert_eq!(
        send(actix_addr, "GET", "/a", &[("x-api-key", "tenant-2")])
            .await
            .status,
        200
    );
}

#[rate_limit(key = "inner:{user}", rate = 1, interval = "60s")]
async fn inner(user: u64) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

/// `inner`'s refusal as the handler's error (actix-web makes the response of it).
async fn inner_as_error(user: web::Path<u64>) -> Result<&'static str, RateLimited> {
    inner(*user).await?;
    Ok("ok")
}

/// `inner`'s refusal as an `HttpResponse` the handler returns.
async fn inner_as_response(user: web::Path<u64>) -> HttpResponse {
    match inner(*user).await {
        Ok(()) => HttpResponse::Ok().body("ok"),
        Err(refused) => HttpResponse::from_rate_limited(refused),
    }
}

/// The middleware (1 000 a second, all requests) over handlers whose `#[rate_limit]`
/// function refuses, returned as an error or as a response: the 429 carries the
/// function's fields, which decided it, not the middleware's grant (`"all";r=...`),
/// nor its `X-RateLimit-*`; the handlers' grants carry the middleware's fields; a
/// handler's own fields are left as they are. As the tower layer does on axum.
#[tokio::test]
async fn the_middleware_leaves_the_fields_of_a_response_decided_inside() {
    in_process_default();
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .x_ratelimit_headers(true)
        .rule(LayerRule::new("all", 1_000, Duration::from_secs(1)))
        .build()
        .unwrap();
    let addr = serve_actix!(move || App::new()
        .wrap(layer.clone())
        .route("/error/{user}", web::get().to(inner_as_error))
        .route("/response/{user}", web::get().to(inner_as_response))
        .route(
            "/own",
            web::get().to(|| async {
                HttpResponse::Ok()
                    .insert_header(("ratelimit", "\"own\";r=4"))
                    .body("mine")
            })
        ));
    for (path, user) in [("/error", 1), ("/response", 2)] {
        let uri = format!("{path}/{user}");
        let granted = send(addr, "GET", &uri, &[]).await;
        assert_eq!(granted.status, 200, "{uri}");
        assert_eq!(
            granted.header("ratelimit-policy"),
            Some("\"all\";q=1000;w=1"),
            "{uri}"
        );
        assert_eq!(granted.header("x-ratelimit-limit"), Some("1000"), "{uri}");
        let refused = send(addr, "GET", &uri, &[]).await;
        assert_eq!(refused.status, 429, "{uri}");
        assert_eq!(
            refused.header("ratelimit-policy"),
            Some("\"inner:{user}\";q=1;w=60"),
            "{uri}"
        );
        let wait = retry(&refused);
        assert_eq!(
            refused.header("ratelimit"),
            Some(&*format!("\"inner:{{user}}\";r=0;t={wait}")),
            "{uri}"
        );
        assert_eq!(refused.header("x-ratelimit-limit"), None, "{uri}: {refused:?}");
        assert_eq!(
            refused.header("x-ratelimit-remaining"),
            None,
            "{uri}: {refused:?}"
        );
    }
    let own = send(addr, "GET", "/own", &[]).await;
    assert_eq!(own.header("ratelimit"), Some("\"own\";r=4"));
    assert_eq!(own.header("ratelimit-policy"), None, "{own:?}");
    assert_eq!(own.header("x-ratelimit-limit"), None, "{own:?}");
}
