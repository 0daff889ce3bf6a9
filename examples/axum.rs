//! A small API behind `RateLimitLayer`, with `#[rate_limit]` on one handler:
//! - `POST /login`: 5 attempts per minute per client address;
//! - `/api/*`: 20 permits per minute per API key (`x-api-key`), a report costing 5;
//!   a stricter shadow rule (3 requests per minute) reports what it would refuse;
//! - `GET /search`: 3 searches per minute per client address, decided by the
//!   attribute on its handler;
//! - everything: 100 requests per second in all.
//!
//! ```sh
//! cargo run --example axum --features axum
//! ```
//! In process by default; set `REDIS_URL=redis://127.0.0.1:6379/` to share the limits
//! between several copies of the server.

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::{get, post};
use axum::{Extension, Router};
use redlimit::axum::{ClientIp, TrustedProxies};
use redlimit::tower::{Key, LayerRule, RateLimitLayer};
use redlimit::{rate_limit, RateLimited};

const MINUTE: Duration = Duration::from_secs(60);

/// A handler limited by the attribute, keyed by the client's address (behind the
/// trusted proxies, as the layer's `Key::client_ip()`). A refusal is 429 with
/// `Retry-After` and the RateLimit fields.
#[rate_limit(key = "search:{ip}", rate = 3, interval = "60s")]
async fn search(ip: ClientIp) -> Result<String, RateLimited> {
    Ok(format!("results for {ip}\n"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Shadow refusals and backend failures are reported as warnings and errors.
    tracing_subscriber::fmt().with_target(false).init();
    // The layers and the attribute decide on the default client: Redis at REDIS_URL,
    // else this process.
    let backend = if redlimit::default_client()?.is_memory() {
        "in process (set REDIS_URL to use Redis)"
    } else {
        "in Redis"
    };
    // X-Forwarded-For (the only forwarding header read) is believed from a local
    // reverse proxy only. Given once, as an extension outside every layer, it is what
    // the login layer's `Key::client_ip()` and the search handler's `ClientIp` read.
    let trusted = TrustedProxies::new(["127.0.0.1", "::1"])?;

    let login = RateLimitLayer::builder()
        .rule(
            LayerRule::new("login", 5, MINUTE)
                .key(Key::client_ip())
                .message("Too many login attempts"),
        )
        .build()?;

    let api = RateLimitLayer::builder()
        .rule(
            LayerRule::new("api", 20, MINUTE)
                .key(Key::header("x-api-key"))
                .cost(|request| {
                    if request.uri.path().ends_with("/report") {
                        5
                    } else {
                        1
                    }
                })
                .exempt(["internal-monitoring"]),
        )
        .rule(
            LayerRule::new("api-trial", 3, MINUTE)
                .key(Key::header("x-api-key"))
                .shadow(true),
        )
        .build()?
        .problem_json();

    let everything = RateLimitLayer::builder()
        .rule(LayerRule::new("all", 100, Duration::from_secs(1)))
        // The per-route rules' fields are the ones clients need.
        .success_fields(false)
        .build()?;

    let app = Router::new()
        .route("/login", post(|| async { "welcome\n" }).route_layer(login))
        .nest(
            "/api",
            Router::new()
                .route("/items", get(|| async { "[1, 2, 3]\n" }))
                .route("/report", get(|| async { "report\n" }))
                .route_layer(api),
        )
        .route("/search", get(search))
        .layer(everything)
        .layer(Extension(trusted));

    let addr: SocketAddr = std::env::var("ADDR")
        .unwrap_or_else(|_| "127.0.0.1:3000".to_owned())
        .parse()?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}, limits kept {backend}; try:");
    println!("  for i in 1 2 3 4 5 6; do curl -si -X POST http://{addr}/login | head -1; done");
    println!("  curl -si -X POST http://{addr}/login");
    println!("  curl -si -H 'x-api-key: k1' http://{addr}/api/items");
    println!("  for i in 1 2 3 4; do curl -si -H 'x-api-key: k1' http://{addr}/api/report | head -1; done");
    println!("  curl -si -H 'x-api-key: k1' http://{addr}/api/report");
    println!("  for i in 1 2 3 4; do curl -si http://{addr}/search | head -1; done");
    println!("  curl -si http://{addr}/search");
    println!("  curl -si -H 'X-Forwarded-For: 198.51.100.7' http://{addr}/search");
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
    Ok(())
}
