//! What the request-scope tests share, whichever server serves: a service function
//! two calls below the handler limited on three dimensions (GLOBAL, IP, USER) by the
//! request's values, the application's authentication, and the scenario every server
//! is held to.

use std::net::{IpAddr, SocketAddr};

use redlimit::{rate_limit, Client, RateLimited};
use redlimit_test_support::http::{send_from, Reply};

/// The LLM client of the application: three dimensions, decided all or nothing.
pub mod llm {
    use super::*;

    #[rate_limit(key = "llm:global", rate = 1000, interval = "60s")]
    #[rate_limit(key = "llm:ip:{request.client_ip}", rate = 3, interval = "60s")]
    #[rate_limit(key = "llm:user:{request.identity}", rate = 2, interval = "60s")]
    pub async fn complete(prompt: String) -> Result<String, RateLimited> {
        Ok(format!("completed {prompt}"))
    }
}

/// The service between the handler and the LLM client: the handler calls it, it calls
/// `llm::complete`; neither passes the request down.
pub async fn answer(prompt: String) -> Result<String, RateLimited> {
    llm::complete(prompt).await
}

/// The application's authentication, inside the layer: the identity is the `x-user`
/// header, hex-encoded so that a test can send any bytes; none without the header.
/// An empty identity, or a second one, is refused.
pub fn authenticate(header: Option<&[u8]>) {
    use redlimit::request::{set_identity, IdentityError};
    for empty in ["", " \t "] {
        assert_eq!(set_identity(empty), Err(IdentityError::Empty));
    }
    if let Some(hex) = header {
        let identity = String::from_utf8(unhex(hex)).expect("UTF-8 identities");
        set_identity(identity.clone()).unwrap();
        assert_eq!(set_identity("mallory"), Err(IdentityError::AlreadySet));
        assert_eq!(redlimit::request::identity(), Some(identity));
    }
}

/// A handler's status and body for the service's result: the refusal's status, and
/// its cause or the rule that refused.
pub fn reply(result: Result<String, RateLimited>) -> (u16, String) {
    match result {
        Ok(text) => (200, text),
        Err(limited) => (
            limited.status().as_u16(),
            match limited.cause() {
                Some(cause) => format!("rule {} key {:?}: {cause}", limited.rule(), limited.key()),
                None => format!("refused by rule {}", limited.rule()),
            },
        ),
    }
}

/// A handler spawning the service twice: bare (outside the request) and carrying the
/// request's scope.
pub async fn spawned() -> (u16, String) {
    let bare = tokio::spawn(answer("bare".into())).await.unwrap();
    let scope = redlimit::request::current().expect("inside the request");
    let carried = tokio::spawn(scope.run(answer("carried".into()))).await.unwrap();
    (
        200,
        format!("bare: {:?}; carried: {:?}", reply(bare), reply(carried)),
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(hex: &[u8]) -> Vec<u8> {
    hex.chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

/// `GET path` from the peer `from` (a loopback address), with `X-Forwarded-For` and
/// the identity when given.
pub async fn ask(addr: SocketAddr, from: &str, path: &str, forwarded: &str, user: Option<&str>) -> Reply {
    let user = user.map(|user| hex(user.as_bytes()));
    let mut headers: Vec<(&str, &[u8])> = vec![("x-forwarded-for", forwarded.as_bytes())];
    if let Some(user) = &user {
        headers.push(("x-user", user.as_bytes()));
    }
    let from: IpAddr = from.parse().unwrap();
    send_from(Some(from), addr, "GET", path, &headers).await
}

/// Permits left of limiter `name` (prefix included); `None` when it does not exist.
async fn left(client: &Client, name: &str) -> Option<u64> {
    client.rate_limiter(name).available_permits().await.ok()
}

/// The limiter name `{request.identity}` makes of `identity`, as the attribute escapes it.
pub fn user_key(identity: &str) -> String {
    let mut key = redlimit::__private::KeyBuf::new();
    key.text("rate_limit:llm:user:");
    key.value_str(identity);
    key.finish()
}

/// The hostile identities: separators, braces, the library's and another rule's
/// names, control bytes, and values far past the digest's bound.
pub fn hostile() -> Vec<String> {
    vec![
        "}{".to_owned(),
        "a:b".to_owned(),
        "198.51.100.7".to_owned(),
        "x}:llm:ip:198.51.100.7".to_owned(),
        "{rate_limit:llm:ip:198.51.100.7}".to_owned(),
        "redlimit:overrides".to_owned(),
        "\u{0}\u{1}\u{1b}[31m\r\n\t\u{7f}".to_owned(),
        "{:}\u{1}".repeat(700),
        format!("{}x", "{:}\u{1}".repeat(700)),
    ]
}

/// The scenario every server is held to: `addr` serves `/ask` and `/spawned` behind a
/// layer trusting 127.0.0.1 as a proxy, with the authentication above, and the
/// attribute decides on `client`.
pub async fn scenario(addr: SocketAddr, client: &Client) {
    dimensions(addr).await;
    forged_addresses(addr, client).await;
    refused_without_identity(addr, client).await;
    hostile_identities(addr, client).await;
    spawned_tasks(addr).await;
}

/// USER (2 a minute), then IP (3 a minute), each refusing on its own.
async fn dimensions(addr: SocketAddr) {
    let a = "198.51.100.7";
    for _ in 0..2 {
        let reply = ask(addr, "127.0.0.1", "/ask", a, Some("alice")).await;
        assert_eq!((reply.status, reply.body.as_str()), (200, "completed hi"));
    }
    let refused = ask(addr, "127.0.0.1", "/ask", a, Some("alice")).await;
    assert_eq!(
        (refused.status, refused.body.as_str()),
        (429, "refused by rule 2")
    );
    // bob from the same address: its third grant, then the address refuses him.
    assert_eq!(ask(addr, "127.0.0.1", "/ask", a, Some("bob")).await.status, 200);
    let refused = ask(addr, "127.0.0.1", "/ask", a, Some("bob")).await;
    assert_eq!(
        (refused.status, refused.body.as_str()),
        (429, "refused by rule 1")
    );
    // From another address bob has his second grant, then his own limit refuses.
    assert_eq!(
        ask(addr, "127.0.0.1", "/ask", "198.51.100.8", Some("bob"))
            .await
            .status,
        200
    );
    let refused = ask(addr, "127.0.0.1", "/ask", "198.51.100.9", Some("bob")).await;
    assert_eq!(
        (refused.status, refused.body.as_str()),
        (429, "refused by rule 2")
    );
}

/// A forged leftmost entry behind the trusted proxy, and any entry from a peer that is
/// not a trusted proxy, leave the client address the layer read.
async fn forged_addresses(addr: SocketAddr, client: &Client) {
    let forged = ask(addr, "127.0.0.1", "/ask", "1.1.1.1, 198.51.100.7", Some("carol")).await;
    assert_eq!((forged.status, forged.body.as_str()), (429, "refused by rule 1"));
    for (i, user) in ["u1", "u2", "u3"].into_iter().enumerate() {
        let forged = format!("203.0.113.{i}");
        assert_eq!(
            ask(addr, "127.0.0.2", "/ask", &forged, Some(user)).await.status,
            200
        );
    }
    let refused = ask(addr, "127.0.0.2", "/ask", "203.0.113.9", Some("u4")).await;
    assert_eq!(
        (refused.status, refused.body.as_str()),
        (429, "refused by rule 1")
    );
    assert_eq!(left(client, "rate_limit:llm:ip:127.0.0.2").await, Some(0));
    for i in [0, 1, 2, 9] {
        let forged = format!("rate_limit:llm:ip:203.0.113.{i}");
        assert_eq!(left(client, &forged).await, None, "{forged}");
    }
}

/// A request whose authentication set no identity is refused as misuse, naming the
/// middleware that must set it; nothing is spent, no key is shared.
async fn refused_without_identity(addr: SocketAddr, client: &Client) {
    let global = left(client, "rate_limit:llm:global").await;
    let ip = left(client, "rate_limit:llm:ip:192.0.2.1").await;
    let refused = ask(addr, "127.0.0.1", "/ask", "192.0.2.1", None).await;
    assert_eq!(refused.status, 500, "{}", refused.body);
    assert!(
        refused.body.starts_with(
            "rule 2 key \"\": rule `llm:user:{request.identity}` keys by the request's identity \
             ({request.identity}), which this call does not have: no identity is set for this request: \
             the middleware that authenticates it, inside the layer (after it, nearer the handler), must \
             call redlimit::request::set_identity"
        ),
        "{}",
        refused.body
    );
    assert_eq!(left(client, "rate_limit:llm:global").await, global);
    assert_eq!(left(client, "rate_limit:llm:ip:192.0.2.1").await, ip);
    assert_eq!(left(client, "rate_limit:llm:user:%00").await, None);
    assert_eq!(left(client, "rate_limit:llm:user:").await, None);
}

/// Each hostile identity keys a limiter of its own under `llm:user:`, escaped (and
/// digested when long), reaching neither the IP rule's limiters nor the library's.
async fn hostile_identities(addr: SocketAddr, client: &Client) {
    let a = left(client, "rate_limit:llm:ip:198.51.100.7").await;
    for (i, identity) in hostile().iter().enumerate() {
        let from = format!("192.0.2.{}", 10 + i);
        let reply = ask(addr, "127.0.0.1", "/ask", &from, Some(identity)).await;
        assert_eq!(reply.status, 200, "{identity:?}: {}", reply.body);
        let key = user_key(identity);
        assert!(key.len() <= 20 + 64 + 2 + 32, "{key}");
        let value = &key["rate_limit:llm:user:".len()..];
        assert!(!value.contains([':', '{', '}']), "{key}");
        assert_eq!(left(client, &key).await, Some(1), "{key}");
    }
    assert_eq!(
        user_key("x}:llm:ip:198.51.100.7"),
        "rate_limit:llm:user:x%7D%3Allm%3Aip%3A198.51.100.7"
    );
    assert_eq!(left(client, "rate_limit:llm:ip:198.51.100.7").await, a);
    assert_eq!(left(client, "rate_limit:redlimit:overrides").await, None);
}

/// A spawned task is outside the request unless it carries the scope; carried, it keys
/// by the request's identity and address.
async fn spawned_tasks(addr: SocketAddr) {
    let reply = ask(addr, "127.0.0.1", "/spawned", "192.0.2.100", Some("frank")).await;
    assert_eq!(reply.status, 200);
    assert!(
        reply.body.starts_with(
            "bare: (500, \"rule 1 key \\\"\\\": rule `llm:ip:{request.client_ip}` keys by the request's \
             client address ({request.client_ip}), which this call does not have: the call is outside any \
             request the layer serves"
        ),
        "{}",
        reply.body
    );
    assert!(
        reply.body.ends_with("carried: (200, \"completed carried\")"),
        "{}",
        reply.body
    );
    // The carried call took one of frank's two.
    assert_eq!(
        ask(addr, "127.0.0.1", "/ask", "192.0.2.101", Some("frank"))
            .await
            .status,
        200
    );
    let refused = ask(addr, "127.0.0.1", "/ask", "192.0.2.102", Some("frank")).await;
    assert_eq!(
        (refused.status, refused.body.as_str()),
        (429, "refused by rule 2")
    );
}

/// Outside any request: each value refuses, and `set_identity` says why.
pub async fn outside_any_request(client: &Client) {
    let global = left(client, "rate_limit:llm:global").await;
    let refused = llm::complete("x".into()).await.unwrap_err();
    assert_eq!(refused.rule(), 1);
    assert_eq!(refused.key(), "");
    assert!(refused.retry_after().is_none());
    let cause = refused.cause().unwrap().to_string();
    assert!(
        cause.contains("the call is outside any request the layer serves"),
        "{cause}"
    );
    assert_eq!(left(client, "rate_limit:llm:global").await, global);
    use redlimit::request::IdentityError;
    assert_eq!(
        redlimit::request::set_identity("x"),
        Err(IdentityError::OutsideRequest)
    );
    assert_eq!(redlimit::request::identity(), None);
    assert!(redlimit::request::current().is_none());
}

/// The layer in front of every test server: a global rule of its own, trusting
/// 127.0.0.1 as a proxy, deciding on `client`.
pub fn layer(client: &Client) -> redlimit::tower::RateLimitLayer {
    use redlimit::axum::TrustedProxies;
    use redlimit::tower::{LayerRule, RateLimitLayer};
    RateLimitLayer::builder()
        .client(client.clone())
        .trusted_proxies(TrustedProxies::new(["127.0.0.1"]).unwrap())
        .rule(LayerRule::new("edge", 10_000, std::time::Duration::from_secs(60)))
        .build()
        .unwrap()
}

/// An axum server: the layer, then the authentication (`from_fn`, inside the layer),
/// then `/ask` and `/spawned`.
pub async fn serve_axum(client: &Client) -> SocketAddr {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    use axum::routing::get;

    async fn authenticated(
        request: axum::extract::Request,
        next: axum::middleware::Next,
    ) -> axum::response::Response {
        authenticate(request.headers().get("x-user").map(|value| value.as_bytes()));
        next.run(request).await
    }
    fn respond((status, body): (u16, String)) -> axum::response::Response {
        (StatusCode::from_u16(status).unwrap(), body).into_response()
    }
    let app = axum::Router::new()
        .route(
            "/ask",
            get(|| async { respond(reply(answer("hi".into()).await)) }),
        )
        .route("/spawned", get(|| async { respond(spawned().await) }))
        .layer(axum::middleware::from_fn(authenticated))
        .layer(layer(client));
    redlimit_test_support::http::serve(app).await
}
