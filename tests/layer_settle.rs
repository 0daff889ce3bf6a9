//! Settled rules at the layer, on real axum servers on loopback and a real
//! redis-server (and in process): an estimate reserved from the request, the actual
//! amount from a header the handler sets, or from the `Usage` a streaming handler
//! records, settled when its body ends or the client goes away mid-stream, over
//! HTTP/1 and HTTP/2; the RateLimit fields after a settle; hostile estimates and
//! hostile amounts.
#![cfg(feature = "axum")]

use redlimit_test_support as support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Request};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use http_body_util::BodyExt;
use redlimit::tower::{Key, LayerRule, RateLimitLayer, Settle, Usage};
use redlimit::{Algorithm, Client};
use support::http::{cost_header, send, serve};
use support::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MINUTE: Duration = Duration::from_secs(60);

/// A number a request header carries (0 without it).
fn number(headers: &HeaderMap, name: &str) -> u64 {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0)
}

/// Answers with `x-tokens-used` set to each `x-report` line the request sent (none
/// when it sent none), as a handler relaying a model's usage would.
async fn reports(headers: HeaderMap) -> Response {
    let mut response = "ok".into_response();
    for line in headers.get_all("x-report") {
        response.headers_mut().append("x-tokens-used", line.clone());
    }
    response
}

/// What each streamed request had recorded when its stream was dropped (the last).
#[derive(Clone, Default)]
struct Seen(Arc<AtomicU64>);

/// Streams `x-chunks` events 20 ms apart, recording `x-per` tokens before each, as an
/// LLM's answer streams; or records nothing when `x-per` is absent.
async fn streams(
    Extension(usage): Extension<Usage>,
    Extension(seen): Extension<Seen>,
    headers: HeaderMap,
) -> Body {
    let (chunks, per) = (number(&headers, "x-chunks"), number(&headers, "x-per"));
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    tokio::spawn(async move {
        for i in 0..chunks {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if per > 0 {
                usage.add(per);
            }
            if tx.send(Ok(Bytes::from(format!("data: {i}\n\n")))).await.is_err() {
                break;
            }
        }
        seen.0.store(usage.get().unwrap_or(0), Ordering::SeqCst);
    });
    Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// Answers as [`reports`] after 300 ms.
async fn reports_slowly(headers: HeaderMap) -> Response {
    tokio::time::sleep(Duration::from_millis(300)).await;
    reports(headers).await
}

/// Records `x-per` and answers: the handler is done with its `Usage` before the head.
async fn records(Extension(usage): Extension<Usage>, headers: HeaderMap) -> &'static str {
    usage.set(number(&headers, "x-per"));
    "ok"
}

/// Records `x-per` on a thread of its own, without a runtime, 20 ms after answering.
async fn records_on_a_thread(Extension(usage): Extension<Usage>, headers: HeaderMap) -> &'static str {
    let per = number(&headers, "x-per");
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        usage.set(per);
    });
    "ok"
}

/// `/header`: 1 000 tokens a minute per `x-user`, the estimate from `x-cost`, settled
/// from `x-tokens-used`, capped at 500 past the estimate; `/capless` the same without a
/// cap; `/stream`: the same budget settled from the handler's `Usage`. A rule of
/// requests beside each (not settled).
async fn server(client: &Client, seen: &Seen) -> SocketAddr {
    let tokens = |name: &'static str, settle: Settle| {
        LayerRule::new(name, 1_000, MINUTE)
            .key(Key::header("x-user"))
            .cost(cost_header)
            .exempt(["partner"])
            .settle(settle)
    };
    let layer = |rule: LayerRule, requests: &'static str| {
        RateLimitLayer::builder()
            .client(client.clone())
            .rule(rule)
            .rule(LayerRule::new(requests, 10_000, MINUTE).key(Key::header("x-user")))
            .build()
            .unwrap()
    };
    let header = tokens("tok-h", Settle::header("x-tokens-used")).max_overdraft(500);
    let capless = tokens("tok-c", Settle::header("x-tokens-used"));
    let usage = tokens("tok-u", Settle::usage());
    // 1 000 a second: a stream of a second and more outlasts its grant's window.
    let long = LayerRule::new("tok-l", 1_000, Duration::from_secs(1))
        .key(Key::header("x-user"))
        .cost(cost_header)
        .settle(Settle::usage());
    // Two layers settling by usage, one inside the other, on one route.
    let inner = RateLimitLayer::builder()
        .client(client.clone())
        .rule(tokens("tok-in", Settle::usage()))
        .build()
        .unwrap();
    let outer = layer(tokens("tok-out", Settle::usage()), "req-out");
    let app = Router::new()
        .route(
            "/nested",
            get(streams)
                .layer::<_, std::convert::Infallible>(inner)
                .layer::<_, std::convert::Infallible>(outer),
        )
        .route("/header", get(reports).layer(layer(header.clone(), "req-h")))
        .route("/slow", get(reports_slowly).layer(layer(header, "req-h")))
        .route("/capless", get(reports).layer(layer(capless, "req-c")))
        .route("/stream", get(streams).layer(layer(usage.clone(), "req-u")))
        .route("/usage", get(records).layer(layer(usage.clone(), "req-u")))
        .route("/thread", get(records_on_a_thread).layer(layer(usage, "req-u")))
        .route("/long", get(streams).layer(layer(long, "req-l")))
        .layer(Extension(seen.clone()));
    serve(app).await
}

/// The permits limiter `name` (without the prefix) has left.
async fn left(client: &Client, name: &str) -> u64 {
    let name = format!("{}{name}", client.prefix());
    client.rate_limiter(&name).available_permits().await.unwrap()
}

/// Waits until `name` has `expected` left (a settle made in the background). Until the
/// settle lands the limiter may have expired (a rule's keep-alive is its interval: a
/// stream can outlast it), so a limiter not there is waited on too.
async fn settles_to(client: &Client, name: &str, expected: u64) {
    let prefixed = format!("{}{name}", client.prefix());
    for _ in 0..200 {
        if client.rate_limiter(&prefixed).available_permits().await.ok() == Some(expected) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(left(client, name).await, expected, "{name}");
}

async fn get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> support::http::Reply {
    send(addr, "GET", path, headers).await
}

/// A header's amount settles before the head goes out: what was not used goes back,
/// the RateLimit field says what is left after the settle, a debt refuses.
async fn settled_by_header(client: Client) {
    let seen = Seen::default();
    let addr = server(&client, &seen).await;
    let ann = [("x-user", "ann"), ("x-cost", "100"), ("x-report", "30")];
    let reply = get_with(addr, "/header", &ann).await;
    assert_eq!(reply.status, 200);
    assert_eq!(left(&client, "tok-h:ann").await, 970);
    // The grant left 900; after the settle, 970 are left.
    assert_eq!(reply.header("ratelimit"), Some("\"tok-h\";r=970"));
    assert_eq!(reply.header("x-tokens-used"), Some("30"), "the header stays");

    // 900 past an estimate of 100: a debt, the whole window's worth and more.
    let bob = [("x-user", "bob"), ("x-cost", "100"), ("x-report", "1600")];
    let reply = get_with(addr, "/capless", &bob).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("ratelimit"), Some("\"tok-c\";r=0"));
    let next = get_with(
        addr,
        "/capless",
        &[("x-user", "bob"), ("x-cost", "1"), ("x-report", "1")],
    )
    .await;
    assert_eq!(
        next.status, 429,
        "a debt refuses until its grant leaves the window"
    );
    let retry: u64 = next.header("retry-after").unwrap().parse().unwrap();
    assert!((59..=60).contains(&retry), "{retry}");
}

/// What the handler reports is not to be trusted to be well formed: without a number
/// the estimate stays counted; past `u64` or past the cap, the cap holds.
async fn hostile_amounts(client: Client) {
    let seen = Seen::default();
    let addr = server(&client, &seen).await;
    let user = |u| [("x-user", u), ("x-cost", "100")];
    let cases: [(&str, &[&str], u64); 16] = [
        ("a", &[], 900),
        ("b", &["abc"], 900),
        ("c", &["-5"], 900),
        ("d", &["1e9"], 900),
        ("e", &["99999999999999999999999999"], 400), // estimate + the cap of 500
        ("f", &["18446744073709551615"], 400),
        ("g", &["5", "250"], 750), // the largest line counts
        ("h", &["0, 500"], 500),   // a line is a list, as a merged field is
        ("i", &["0", "abc"], 900), // garbled: never below the estimate
        ("j", &["abc", "250"], 750),
        ("k", &["7, -1"], 900),
        ("l", &["1,000"], 400),       // in groups of three: 1 000, to the cap
        ("m", &["0", "2,50"], 750),   // 2 and 50, or 250: the largest reading
        ("n", &["5, 2,000"], 400),    // a list of numbers in groups
        ("o", &["1,000,2,000"], 400), // the same without a space: each runs to its end
        ("p", &["2,00,4,50"], 550),   // 200 then 450: the second counts
    ];
    for (who, lines, expected) in cases {
        let mut headers = user(who).to_vec();
        headers.extend(lines.iter().map(|line| ("x-report", *line)));
        let reply = get_with(addr, "/header", &headers).await;
        assert_eq!(reply.status, 200, "{who}");
        assert_eq!(
            left(&client, &format!("tok-h:{who}")).await,
            expected,
            "{who} {lines:?}"
        );
    }
    // What the caller sends as its estimate: 0 counts as 1, more than the rate never
    // passes, and neither moves the limit.
    let zero = get_with(addr, "/header", &[("x-user", "z"), ("x-cost", "0")]).await;
    assert_eq!(zero.status, 200);
    assert_eq!(left(&client, "tok-h:z").await, 999);
    let huge = [
        ("x-user", "z"),
        ("x-cost", "9223372036854775808"),
        ("x-report", "0"),
    ];
    assert_eq!(get_with(addr, "/header", &huge).await.status, 429);
    assert_eq!(left(&client, "tok-h:z").await, 999);
    // An exempt value takes nothing of the settled rule, whatever is reported.
    let partner = [("x-user", "partner"), ("x-cost", "100"), ("x-report", "5000")];
    assert_eq!(get_with(addr, "/header", &partner).await.status, 200);
    let partner = format!("{}tok-h:partner", client.prefix());
    let untouched = client.rate_limiter(&partner).available_permits().await;
    assert!(
        matches!(untouched, Err(redlimit::Error::NotInitialized { .. })),
        "{untouched:?}"
    );
}

/// A handler done with its `Usage` before it answers is settled before the head goes
/// out; one that drops it on a thread without a runtime is settled all the same; a
/// stream that outlasts its grant's window is charged its excess when it ends.
async fn settled_late_or_early(client: Client) {
    let seen = Seen::default();
    let addr = server(&client, &seen).await;
    let ann = [("x-user", "ann"), ("x-cost", "100"), ("x-per", "30")];
    let reply = get_with(addr, "/usage", &ann).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("ratelimit"), Some("\"tok-u\";r=970"));

    let bob = [("x-user", "bob"), ("x-cost", "100"), ("x-per", "30")];
    assert_eq!(get_with(addr, "/thread", &bob).await.status, 200);
    settles_to(&client, "tok-u:bob", 970).await;

    // An estimate of 1, 60 events of 50 tokens 20 ms apart: 3 000 used over 1.2 s and
    // more, on a window of 1 s.
    let long = [
        ("x-user", "cy"),
        ("x-cost", "1"),
        ("x-chunks", "60"),
        ("x-per", "50"),
    ];
    let started = std::time::Instant::now();
    stream_path(addr, "/long", &long, None).await;
    assert!(
        started.elapsed() > Duration::from_secs(1),
        "the stream outlasts the window"
    );
    settles_to(&client, "tok-l:cy", 0).await;
    let next = get_with(
        addr,
        "/long",
        &[("x-user", "cy"), ("x-cost", "1"), ("x-chunks", "1")],
    )
    .await;
    assert_eq!(next.status, 429, "the excess is charged when the stream ends");
}

/// Under two layers settling by usage, what the handler records settles both.
async fn nested_layers(client: Client) {
    let seen = Seen::default();
    let addr = server(&client, &seen).await;
    let headers = [
        ("x-user", "ann"),
        ("x-cost", "100"),
        ("x-chunks", "3"),
        ("x-per", "7"),
    ];
    let reply = get_with(addr, "/nested", &headers).await;
    assert_eq!(reply.status, 200);
    settles_to(&client, "tok-in:ann", 979).await;
    settles_to(&client, "tok-out:ann", 979).await;
}

/// Reads a streamed response over HTTP/1, whole or only its first `events` events
/// (then the connection is dropped, as a client going away).
async fn stream_http1(addr: SocketAddr, headers: &[(&str, &str)], events: Option<usize>) -> String {
    stream_path(addr, "/stream", headers, events).await
}

/// [`stream_http1`] on `path`.
async fn stream_path(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    events: Option<usize>,
) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut read = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let n = stream.read(&mut buffer).await.unwrap();
        if n == 0 {
            break;
        }
        read.extend_from_slice(&buffer[..n]);
        let text = String::from_utf8_lossy(&read);
        if events.is_some_and(|events| text.matches("data: ").count() >= events) {
            break;
        }
    }
    String::from_utf8_lossy(&read).into_owned()
}

/// Reads a streamed response over HTTP/2 (prior knowledge), whole or only its first
/// `events` events (then the stream is reset and the connection dropped).
async fn stream_http2(addr: SocketAddr, headers: &[(&str, &str)], events: Option<usize>) -> String {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(tcp);
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .unwrap();
    let connection = tokio::spawn(connection);
    let mut request = Request::get(format!("http://{addr}/stream"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = sender
        .send_request(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.version(), axum::http::Version::HTTP_2);
    let mut body = response.into_body();
    let mut read = String::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            read.push_str(&String::from_utf8_lossy(&data));
        }
        if events.is_some_and(|events| read.matches("data: ").count() >= events) {
            break;
        }
    }
    drop(body);
    drop(sender);
    connection.abort();
    read
}

/// A streamed answer settles with what its handler recorded: when the body ends, or
/// when the client goes away mid-stream (what was recorded by then).
async fn settled_by_usage(client: Client, http2: bool) {
    let seen = Seen::default();
    let addr = server(&client, &seen).await;
    let read = |headers: Vec<(&'static str, &'static str)>, events| async move {
        match http2 {
            false => stream_http1(addr, &headers, events).await,
            true => stream_http2(addr, &headers, events).await,
        }
    };
    let whole = vec![
        ("x-user", "ann"),
        ("x-cost", "100"),
        ("x-chunks", "5"),
        ("x-per", "10"),
    ];
    let body = read(whole, None).await;
    assert_eq!(body.matches("data: ").count(), 5, "{body}");
    settles_to(&client, "tok-u:ann", 950).await;

    // 40 events of 10 tokens, estimated at 100: the client leaves after 3.
    seen.0.store(0, Ordering::SeqCst);
    let leaves = vec![
        ("x-user", "bob"),
        ("x-cost", "100"),
        ("x-chunks", "40"),
        ("x-per", "10"),
    ];
    read(leaves, Some(3)).await;
    let mut recorded = 0;
    for _ in 0..200 {
        recorded = seen.0.load(Ordering::SeqCst);
        if recorded > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        (30..100).contains(&recorded),
        "recorded {recorded} by the time the client left"
    );
    settles_to(&client, "tok-u:bob", 1_000 - recorded).await;

    // A handler that records nothing: the estimate stays counted.
    let silent = vec![("x-user", "cy"), ("x-cost", "100"), ("x-chunks", "2")];
    read(silent, None).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(left(&client, "tok-u:cy").await, 900);

    // Past the rate while streaming: a debt, the next request refused.
    let over = vec![
        ("x-user", "dee"),
        ("x-cost", "10"),
        ("x-chunks", "3"),
        ("x-per", "400"),
    ];
    read(over, None).await;
    settles_to(&client, "tok-u:dee", 0).await;
    let next = get_with(addr, "/stream", &[("x-user", "dee"), ("x-cost", "1")]).await;
    assert_eq!(next.status, 429);
}

/// A token bucket's grants given back whole: each settle leaves a mark in Redis for as
/// long as it may be sent again (an interval and a minute), so a settle counts at
/// least 1 and the marks are bounded by the rule. A bucket of 10 a minute, each request
/// estimating 5 and reporting 0: 6 of 50 granted (10 tokens less 1 a grant, 5 needed),
/// and at most as many marks.
async fn a_bucket_given_back_whole(client: Client, server: Option<&RedisServer>) {
    let rule = LayerRule::new("tok-b", 10, MINUTE)
        .algorithm(Algorithm::TokenBucket)
        .key(Key::header("x-user"))
        .cost(cost_header)
        .settle(Settle::header("x-tokens-used"));
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .rule(rule)
        .build()
        .unwrap();
    let addr = serve(Router::new().route("/bucket", get(reports).layer(layer))).await;
    let mut granted = 0;
    for _ in 0..50 {
        let headers = [("x-user", "flood"), ("x-cost", "5"), ("x-report", "0")];
        granted += u32::from(get_with(addr, "/bucket", &headers).await.status == 200);
    }
    if let Some(server) = server {
        let marks: Vec<String> = redis::cmd("KEYS")
            .arg("*settled*")
            .query_async(&mut server.raw().await)
            .await
            .unwrap();
        assert!(marks.len() <= 6, "{} marks", marks.len());
    }
    assert_eq!(granted, 6, "a grant given back whole still counts 1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_given_back_whole_still_counts_on_redis() {
    let server = RedisServer::start();
    a_bucket_given_back_whole(redis_client(&server).await, Some(&server)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_given_back_whole_still_counts_in_process() {
    a_bucket_given_back_whole(Client::memory(), None).await;
}

async fn redis_client(server: &RedisServer) -> Client {
    Client::builder().connect(&server.url()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_settles_before_the_head_goes_out_on_redis() {
    let server = RedisServer::start();
    settled_by_header(redis_client(&server).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_settles_before_the_head_goes_out_in_process() {
    settled_by_header(Client::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_estimates_and_amounts_keep_the_limit_on_redis() {
    let server = RedisServer::start();
    hostile_amounts(redis_client(&server).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_estimates_and_amounts_keep_the_limit_in_process() {
    hostile_amounts(Client::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_settles_what_it_recorded_over_http1_on_redis() {
    let server = RedisServer::start();
    settled_by_usage(redis_client(&server).await, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_settles_what_it_recorded_over_http2_on_redis() {
    let server = RedisServer::start();
    settled_by_usage(redis_client(&server).await, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_settles_what_it_recorded_over_http2_in_process() {
    settled_by_usage(Client::memory(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_layers_both_settle_what_the_handler_recorded_on_redis() {
    let server = RedisServer::start();
    nested_layers(redis_client(&server).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_before_the_head_on_a_thread_and_after_the_window_on_redis() {
    let server = RedisServer::start();
    settled_late_or_early(redis_client(&server).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_before_the_head_on_a_thread_and_after_the_window_in_process() {
    settled_late_or_early(Client::memory()).await;
}

/// A settle before the head waits for Redis at most the command timeout: with the
/// server frozen the head goes out with the grant's fields, and the settle lands once
/// it wakes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_delays_the_head_by_the_command_timeout_at_most() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let addr = server_with(&client).await;
    let ann = [("x-user", "ann"), ("x-cost", "100"), ("x-report", "10")];
    let started = std::time::Instant::now();
    let reply = tokio::spawn(async move { get_with(addr, "/slow", &ann).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.pause();
    let reply = reply.await.unwrap();
    let took = started.elapsed();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("ratelimit"), Some("\"tok-h\";r=900"), "the grant's");
    assert!(took < Duration::from_millis(1_500), "{took:?}");
    server.resume();
    settles_to(&client, "tok-h:ann", 990).await;
}

/// A client gone while the settle before the head waits on Redis (the server frozen,
/// the settle's script to be loaded again once it wakes): the settle, sent from a task
/// of its own, still lands, where it was dropped with the response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_the_settle_waits_leaves_it_to_land_on_redis() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let addr = server_with(&client).await;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = "GET /slow HTTP/1.1\r\nhost: x\r\nx-user: ann\r\nx-cost: 10\r\nx-report: 400\r\n\r\n";
    stream.write_all(request.as_bytes()).await.unwrap();
    // Reserved; the handler answers 300 ms after it began.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut server.raw().await)
        .await
        .unwrap();
    server.pause();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.resume();
    // 400 used of 10 reserved: 600 left, not the 990 the estimate left.
    settles_to(&client, "tok-h:ann", 600).await;
}

/// A `Usage` whose last handle a handler hands to a thread with a runtime of its own
/// that ends right after: dropped inside that runtime's `block_on`, the runtime then
/// dropped; held by a task of a current-thread runtime dropped, or of a multi-thread
/// runtime shut down (a server's, as its process stops); dropped on a runtime without
/// a timer, and as a panic unwinds. Each still settles what was recorded (900 of an
/// estimate of 10: 100 left, not 990), where the settle was spawned on the ending
/// runtime and dropped with it before it started, and no drop panics (polled where
/// the last handle went, a settle in Redis timed its wait on a runtime without a
/// timer, and panicked there).
async fn a_usage_dropped_as_its_runtime_ends(client: Client) {
    let stash: Arc<std::sync::Mutex<Option<Usage>>> = Arc::default();
    let kept = stash.clone();
    let hands_off = move |Extension(usage): Extension<Usage>| {
        *kept.lock().unwrap() = Some(usage);
        async { "ok" }
    };
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .rule(
            LayerRule::new("tok-rt", 1_000, MINUTE)
                .key(Key::header("x-user"))
                .cost(cost_header)
                .settle(Settle::usage()),
        )
        .build()
        .unwrap();
    let addr = serve(Router::new().route("/", get(hands_off)).layer(layer)).await;
    let modes = [
        "block-on",
        "current-thread-task",
        "multi-thread-task",
        "no-timer",
        "unwinding",
    ];
    for mode in modes {
        let reply = get_with(addr, "/", &[("x-user", mode), ("x-cost", "10")]).await;
        assert_eq!(reply.status, 200, "{mode}");
        let usage = stash.lock().unwrap().take().expect("the handler's Usage");
        let dropped = std::thread::spawn(move || {
            let mut builder = match mode {
                "multi-thread-task" => tokio::runtime::Builder::new_multi_thread(),
                _ => tokio::runtime::Builder::new_current_thread(),
            };
            builder.worker_threads(1);
            if mode != "no-timer" {
                builder.enable_all();
            }
            let runtime = builder.build().unwrap();
            runtime.block_on(async move {
                usage.add(900);
                match mode {
                    "block-on" | "no-timer" => return drop(usage),
                    // (dropped as a panic unwinds: a panic in the drop would abort)
                    "unwinding" => {
                        let _usage = usage;
                        panic!("the handler's own panic");
                    }
                    _ => {}
                }
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(3_600)).await;
                    drop(usage);
                });
                tokio::time::sleep(Duration::from_millis(20)).await;
            });
            runtime.shutdown_timeout(Duration::from_secs(1));
        })
        .join();
        assert_eq!(
            dropped.is_err(),
            mode == "unwinding",
            "{mode}: the thread panicked"
        );
        settles_to(&client, &format!("tok-rt:{mode}"), 100).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_dropped_as_its_runtime_ends_still_settles_on_redis() {
    let server = RedisServer::start();
    a_usage_dropped_as_its_runtime_ends(redis_client(&server).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_dropped_as_its_runtime_ends_still_settles_in_process() {
    a_usage_dropped_as_its_runtime_ends(Client::memory()).await;
}

/// A server's runtime shut down (its process stopping) while a task holds a stream's
/// last `Usage`, the client made on that runtime too: the settle still lands, on the
/// library's own runtime, where it was spawned on the runtime shutting down, which
/// dropped it unstarted (and counted it abandoned).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_dropped_as_the_client_s_own_runtime_ends_still_settles_on_redis() {
    let server = RedisServer::start();
    let url = server.url();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let client = Client::connect(&url).await.unwrap();
            let stash: Arc<std::sync::Mutex<Option<Usage>>> = Arc::default();
            let kept = stash.clone();
            let hands_off = move |Extension(usage): Extension<Usage>| {
                *kept.lock().unwrap() = Some(usage);
                async { "ok" }
            };
            let layer = RateLimitLayer::builder()
                .client(client)
                .rule(
                    LayerRule::new("tok-rt", 1_000, MINUTE)
                        .key(Key::header("x-user"))
                        .cost(cost_header)
                        .settle(Settle::usage()),
                )
                .build()
                .unwrap();
            let addr = serve(Router::new().route("/", get(hands_off)).layer(layer)).await;
            let reply = get_with(addr, "/", &[("x-user", "own"), ("x-cost", "10")]).await;
            assert_eq!(reply.status, 200);
            let usage = stash.lock().unwrap().take().expect("the handler's Usage");
            usage.add(900);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(3_600)).await;
                drop(usage);
            });
            tokio::time::sleep(Duration::from_millis(20)).await;
        });
        runtime.shutdown_timeout(Duration::from_secs(1));
    })
    .join()
    .unwrap();
    settles_to(&redis_client(&server).await, "tok-rt:own", 100).await;
}

async fn server_with(client: &Client) -> SocketAddr {
    server(client, &Seen::default()).await
}
