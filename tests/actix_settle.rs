//! Settled rules in the actix-web middleware, on a real server on loopback and a real
//! redis-server: the actual amount from a header the handler sets, settled before the
//! head goes out, or from the `Usage` a streaming handler records, settled when its
//! body ends or the client goes away mid-stream.
#![cfg(feature = "actix")]

use redlimit_test_support as support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::web::{self, Bytes, ReqData};
use actix_web::{App, HttpRequest, HttpResponse};
use redlimit::actix::{Key, LayerRule, RateLimitLayer, Settle, Usage};
use redlimit::Client;
use support::http::send;
use support::{serve_actix, RedisServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MINUTE: Duration = Duration::from_secs(60);

fn number(request: &HttpRequest, name: &str) -> u64 {
    let value = request.headers().get(name).and_then(|v| v.to_str().ok());
    value.and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// 1 000 tokens a minute per `x-user`, estimated from `x-cost`, settled from `settle`.
fn layer(client: &Client, name: &'static str, settle: Settle) -> RateLimitLayer {
    RateLimitLayer::builder()
        .client(client.clone())
        .rule(
            LayerRule::new(name, 1_000, MINUTE)
                .key(Key::header("x-user"))
                .cost(|head| {
                    let cost = head
                        .headers
                        .get("x-cost")
                        .and_then(|v| v.to_str().ok()?.parse().ok());
                    cost.unwrap_or(1)
                })
                .settle(settle),
        )
        .build()
        .unwrap()
}

/// `/header` answers each `x-report` line as an `x-tokens-used` line; `/stream` streams `x-chunks` events
/// 20 ms apart, recording `x-per` tokens before each; `seen` is what the last stream
/// had recorded when it was dropped.
fn server(client: &Client, seen: Arc<AtomicU64>) -> SocketAddr {
    let (header, usage) = (
        layer(client, "tok-h", Settle::header("x-tokens-used")),
        layer(client, "tok-u", Settle::usage()),
    );
    serve_actix!(move || {
        let seen = seen.clone();
        App::new()
            .service(web::resource("/header").wrap(header.clone()).route(web::get().to(
                |request: HttpRequest| async move {
                    let mut response = HttpResponse::Ok();
                    for line in request.headers().get_all("x-report") {
                        response.append_header(("x-tokens-used", line.clone()));
                    }
                    response.body("ok")
                },
            )))
            .service(web::resource("/usage").wrap(usage.clone()).route(web::get().to(
                |request: HttpRequest, usage: ReqData<Usage>| async move {
                    usage.set(number(&request, "x-per"));
                    HttpResponse::Ok().body("ok")
                },
            )))
            .service(
                web::resource("/stream").wrap(usage.clone()).route(web::get().to(
                    move |request: HttpRequest, usage: ReqData<Usage>| {
                        let (usage, seen) = (usage.into_inner(), seen.clone());
                        let (chunks, per) = (number(&request, "x-chunks"), number(&request, "x-per"));
                        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, actix_web::Error>>(1);
                        actix_web::rt::spawn(async move {
                            for i in 0..chunks {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                usage.add(per);
                                if tx.send(Ok(Bytes::from(format!("data: {i}\n\n")))).await.is_err() {
                                    break;
                                }
                            }
                            seen.store(usage.get().unwrap_or(0), Ordering::SeqCst);
                        });
                        async move {
                            HttpResponse::Ok().streaming(tokio_stream::wrappers::ReceiverStream::new(rx))
                        }
                    },
                )),
            )
    })
}

async fn left(client: &Client, name: &str) -> u64 {
    let name = format!("{}{name}", client.prefix());
    client.rate_limiter(&name).available_permits().await.unwrap()
}

async fn settles_to(client: &Client, name: &str, expected: u64) {
    for _ in 0..200 {
        if left(client, name).await == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(left(client, name).await, expected, "{name}");
}

/// Reads `/stream` whole, or its first `events` events and then drops the connection.
async fn stream(addr: SocketAddr, headers: &[(&str, &str)], events: Option<usize>) -> usize {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request = String::from("GET /stream HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    tcp.write_all(request.as_bytes()).await.unwrap();
    let (mut read, mut buffer) = (Vec::new(), [0u8; 4096]);
    loop {
        let n = tcp.read(&mut buffer).await.unwrap();
        read.extend_from_slice(&buffer[..n]);
        let seen = String::from_utf8_lossy(&read).matches("data: ").count();
        if n == 0 || events.is_some_and(|events| seen >= events) {
            return seen;
        }
    }
}

async fn settled_in_actix(client: Client) {
    let seen = Arc::new(AtomicU64::new(0));
    let addr = server(&client, seen.clone());

    let reply = send(
        addr,
        "GET",
        "/header",
        &[("x-user", "ann"), ("x-cost", "100"), ("x-report", "30")],
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("ratelimit"), Some("\"tok-h\";r=970"));
    assert_eq!(left(&client, "tok-h:ann").await, 970);
    // A line is a list, as a merged field is, and a number in groups is that number
    // too, the largest reading counting; a value that is not an amount beside one that is never counts below
    // the estimate.
    let cases = [
        ("al", &["0, 500"][..], 500),
        ("bo", &["0", "abc"], 900),
        ("cy", &["1,000"], 0),
        ("di", &["1,00,000"], 0),
        ("ed", &["500,0"], 500),
        ("fy", &["1,000,2,000"], 0),
        ("gu", &["5,00,7,50"], 250),
    ];
    for (who, lines, expected) in cases {
        let mut headers = vec![("x-user", who), ("x-cost", "100")];
        headers.extend(lines.iter().map(|line| ("x-report", *line)));
        assert_eq!(send(addr, "GET", "/header", &headers).await.status, 200);
        assert_eq!(
            left(&client, &format!("tok-h:{who}")).await,
            expected,
            "{lines:?}"
        );
    }

    // A handler done with its Usage before it answers: settled before the head goes out.
    let dee = [("x-user", "dee"), ("x-cost", "100"), ("x-per", "30")];
    let reply = send(addr, "GET", "/usage", &dee).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("ratelimit"), Some("\"tok-u\";r=970"));
    assert_eq!(left(&client, "tok-u:dee").await, 970);

    let whole = [
        ("x-user", "bob"),
        ("x-cost", "100"),
        ("x-chunks", "5"),
        ("x-per", "10"),
    ];
    assert_eq!(stream(addr, &whole, None).await, 5);
    settles_to(&client, "tok-u:bob", 950).await;

    seen.store(0, Ordering::SeqCst);
    let leaves = [
        ("x-user", "cy"),
        ("x-cost", "100"),
        ("x-chunks", "40"),
        ("x-per", "10"),
    ];
    stream(addr, &leaves, Some(3)).await;
    let mut recorded = 0;
    for _ in 0..200 {
        recorded = seen.load(Ordering::SeqCst);
        if recorded > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        (30..100).contains(&recorded),
        "recorded {recorded} by the time the client left"
    );
    settles_to(&client, "tok-u:cy", 1_000 - recorded).await;
}

#[tokio::test]
async fn settled_rules_in_actix_on_redis() {
    let server = RedisServer::start();
    settled_in_actix(Client::builder().connect(&server.url()).await.unwrap()).await;
}

#[tokio::test]
async fn settled_rules_in_actix_in_process() {
    settled_in_actix(Client::memory()).await;
}
