//! A layer whose rules come from a TOML file rather than from code: names, rates,
//! keys and messages are the file's (cargo feature `serde`).
//!
//! ```sh
//! cargo run --example layer_from_toml --features axum,serde -- examples/layer_rules.toml
//! curl -i -H 'x-api-key: k1' http://127.0.0.1:3000/
//! ```
//! A rule the layer would refuse (a rate of 0, an interval without a unit, a name
//! starting with `redlimit`, an unknown field) stops the program with an error naming
//! the rule and the field.

use std::net::SocketAddr;

use axum::routing::get;
use axum::Router;
use redlimit::tower::LayerConfig;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "examples/layer_rules.toml".to_owned());
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let config: LayerConfig = toml::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    for rule in config.rules() {
        println!("rule {rule:?}");
    }
    // Code adds what a file does not say: here the client (REDIS_URL, else in process
    // by default) and the trusted proxies are left as they are by default.
    let layer = config.builder().build()?;

    let app = Router::new().route("/", get(|| async { "hello\n" })).layer(layer);
    let addr: SocketAddr = std::env::var("ADDR")
        .unwrap_or_else(|_| "127.0.0.1:3000".to_owned())
        .parse()?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on http://{addr}");
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
    Ok(())
}
