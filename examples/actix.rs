//! A small actix-web API: the middleware on a scope, `#[rate_limit]` on one handler.
//! - `/api/*`: 20 requests per minute per API key (`x-api-key`; 401 without one);
//! - `GET /search`: 3 searches per minute per client address, decided by the
//!   attribute on its handler.
//!
//! ```sh
//! cargo run --example actix --features actix
//! curl -i -H 'x-api-key: k1' http://127.0.0.1:3000/api/report
//! ```
//! In process by default; set `REDIS_URL=redis://127.0.0.1:6379/` to share the limits
//! between several copies of the server (and with servers on axum or Redisson).

use std::time::Duration;

use actix_web::{web, App, HttpServer};
use redlimit::actix::{ClientIp, Key, LayerRule, MissingKey, RateLimitLayer, TrustedProxies};
use redlimit::{rate_limit, RateLimited};

/// Limited by the attribute, keyed by the client's address behind the trusted proxies.
/// A refusal is 429 with `Retry-After` and the RateLimit fields.
#[rate_limit(key = "search:{ip}", rate = 3, interval = "60s")]
async fn search(ip: ClientIp) -> Result<String, RateLimited> {
    Ok(format!("results for {ip}\n"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let api = RateLimitLayer::builder()
        .rule(
            LayerRule::new("api", 20, Duration::from_secs(60))
                .key(Key::header("x-api-key"))
                .missing_key(MissingKey::Unauthorized),
        )
        .build()?;
    // X-Forwarded-For is believed from a local reverse proxy only; `ClientIp` reads it.
    let trusted = TrustedProxies::new(["127.0.0.1", "::1"])?;
    println!("listening on http://127.0.0.1:3000");
    HttpServer::new(move || {
        App::new()
            .app_data(trusted.clone())
            .service(
                web::scope("/api")
                    .wrap(api.clone())
                    .route("/report", web::get().to(|| async { "report\n" })),
            )
            .route("/search", web::get().to(search))
    })
    .bind(("127.0.0.1", 3000))?
    .run()
    .await?;
    Ok(())
}
