//! `cargo run --release --example bench_layer --features axum`: requests per second
//! through `RateLimitLayer` next to the same router without it, in one run, over real
//! HTTP/1.1 keep-alive connections on loopback, on both backends (Redis started by
//! this program; needs `redis-server` on PATH).
//!
//! 32 connections, each its own API key (`x-api-key`), send requests one after the
//! other for 3 s; the rule's rate is so high that nothing is refused, so the figures
//! are the cost of deciding. Rounds alternate the servers so that the machine's noise
//! falls on all of them. On Redis the layer is also set against the same route
//! deciding the rule by hand in its handler (`Client::check_rules`, the same HTTP
//! work), and against the bare decision rate: the rule decided by `check_rules` from
//! 32 tasks, no HTTP. For these three it also prints the CPU each request cost this
//! process (`/proc/self/stat`) and the Redis server (`INFO cpu`): on a machine where
//! they share cores, the HTTP work is taken from Redis.
//!
//! Then, without the network, the router called as a tower service on one thread,
//! with and without the in-process layer: the layer's cost per request, and what
//! that cost comes to at 50 000 requests per second.
//!
//! `REDLIMIT_BENCH_ONLY=count REDLIMIT_BENCH_ROW=<row> REDLIMIT_BENCH_CALLS=<n>` calls
//! the router of one row 1 000 times, then `n` times in `counted_calls`, for counting
//! instructions (`scripts/layer-instructions.sh` runs every row under callgrind,
//! counting that function alone, and prints what the layers add to the bare router
//! per request): `bare`, the
//! router alone; `redlimit-headers` and `redlimit-plain`, with the in-process layer,
//! its success fields on and off; `governor-headers` and `governor-plain`, with
//! tower_governor keyed by the same header, its `x-ratelimit-*` headers on and off;
//! `bare-ip`, the router alone with the next rows' requests; `redlimit-ip` and
//! `governor-ip`, each keyed by the peer's address (`Key::client_ip()`,
//! tower_governor's `PeerIpKeyExtractor`), headers off, every request from one of two
//! IPv4 peers given as axum's `ConnectInfo`; `bare-bearer`, `redlimit-bearer` and
//! `governor-bearer`, the same for requests carrying one of two bearer tokens in
//! `Authorization`, each layer keyed by that header; `bare-path`, `redlimit-path` and
//! `governor-path`, a router of one route `/users/{id}` called for one of two users,
//! the layer keyed by `Key::path_param("id")` and tower_governor by the path after
//! `/users/`, each added with `route_layer`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::Request;
use axum::routing::get;
use axum::Router;
use redlimit::tower::{Key, LayerRule, RateLimitLayer};
use redlimit::{Client, Rule};
use redlimit_test_support::RedisServer;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

const CONNECTIONS: usize = 32;
const RUN: Duration = Duration::from_secs(3);
const ROUNDS: usize = 3;
const HUGE_RATE: u64 = 1_000_000_000;
const MINUTE: Duration = Duration::from_secs(60);

/// What the counted requests carry: `API_KEYS`, `PEERS`, `BEARERS` or `PATHS`.
static SHAPE: AtomicU8 = AtomicU8::new(API_KEYS);
/// One of two `x-api-key` values.
const API_KEYS: u8 = 0;
/// No header: from one of two IPv4 peers.
const PEERS: u8 = 1;
/// One of two bearer tokens in `Authorization`.
const BEARERS: u8 = 2;
/// No header: one of two users' paths, `/users/{id}`.
const PATHS: u8 = 3;

fn router() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

/// The in-process layer of one rule keyed by `key`, without its success fields.
fn plain_layer(key: Key) -> RateLimitLayer {
    RateLimitLayer::builder()
        .client(Client::memory())
        .rule(LayerRule::new("bench", HUGE_RATE, MINUTE).key(key))
        .success_fields(false)
        .build()
        .unwrap()
}

/// A router with one route of a path parameter, `/users/{id}`.
fn users_router() -> Router {
    Router::new().route("/users/{id}", get(|| async { "ok" }))
}

fn layer(client: &Client) -> RateLimitLayer {
    RateLimitLayer::builder()
        .client(client.clone())
        .rule(LayerRule::new("bench", HUGE_RATE, MINUTE).key(Key::header("x-api-key")))
        .build()
        .unwrap()
}

/// The same route deciding the same rule by hand in its handler, with `check_rules`:
/// what the layer saves a service from writing, at the same HTTP cost.
fn by_hand(client: &Client) -> Router {
    let client = client.clone();
    Router::new().route(
        "/",
        get(move |headers: axum::http::HeaderMap| {
            let client = client.clone();
            async move {
                let key = headers
                    .get("x-api-key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                let rule = [Rule::new(
                    format!("rate_limit:bench:hand:{key}"),
                    HUGE_RATE,
                    MINUTE,
                )];
                assert!(client.check_rules(&rule).await.unwrap().allowed);
                "ok"
            }
        }),
    )
}

async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .unwrap();
    });
    addr
}

/// CPU seconds spent so far by this process (all its threads: the load, the HTTP
/// server, the layer, the Redis client) and by the Redis server.
struct Cpu {
    process: f64,
    redis: f64,
}

impl Cpu {
    async fn now(redis: &mut redis::aio::MultiplexedConnection) -> Cpu {
        // utime and stime, fields 14 and 15 of /proc/self/stat, in USER_HZ (100 on Linux)
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
        let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
        let info: String = redis::cmd("INFO").arg("cpu").query_async(redis).await.unwrap();
        let field = |name: &str| -> f64 {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        Cpu {
            process: ticks / 100.0,
            redis: field("used_cpu_user") + field("used_cpu_sys"),
        }
    }

    /// The microseconds each spent per operation since `self`, over `count` operations.
    async fn per_op(&self, redis: &mut redis::aio::MultiplexedConnection, count: u64) -> (f64, f64) {
        let now = Cpu::now(redis).await;
        let per = |spent: f64| spent * 1e6 / count as f64;
        (per(now.process - self.process), per(now.redis - self.redis))
    }
}

/// One measured run: operations per second, and the CPU each operation cost this
/// process and the Redis server (microseconds).
struct Run {
    rate: f64,
    process_us: f64,
    redis_us: f64,
}

async fn measured<Fut: std::future::Future<Output = (f64, u64)>>(
    redis: &mut redis::aio::MultiplexedConnection,
    run: Fut,
) -> Run {
    let before = Cpu::now(redis).await;
    let (rate, count) = run.await;
    let (process_us, redis_us) = before.per_op(redis, count).await;
    Run {
        rate,
        process_us,
        redis_us,
    }
}

/// Operations per second of `CONNECTIONS` tasks over `RUN`, and how many there were;
/// task `i` runs `task(i, stop, done)`, counting each operation in `done` until `stop`.
async fn rate<F, Fut>(task: F) -> (f64, u64)
where
    F: Fn(usize, Arc<AtomicBool>, Arc<AtomicU64>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|i| tokio::spawn(task(i, stop.clone(), done.clone())))
        .collect();
    let started = Instant::now();
    tokio::time::sleep(RUN).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    for task in tasks {
        task.await.unwrap();
    }
    let count = done.load(Ordering::Relaxed);
    (count as f64 / elapsed.as_secs_f64(), count)
}

/// Requests per second from `CONNECTIONS` keep-alive connections.
async fn http_rate(addr: SocketAddr) -> (f64, u64) {
    rate(|i, stop, done| async move {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let mut stream = BufReader::new(stream);
        let request = format!("GET / HTTP/1.1\r\nHost: bench\r\nx-api-key: key-{i}\r\n\r\n");
        let mut line = String::new();
        let mut body = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            stream.get_mut().write_all(request.as_bytes()).await.unwrap();
            // The status line, the headers up to the blank line, the body.
            let mut length = 0;
            let mut first = true;
            loop {
                line.clear();
                stream.read_line(&mut line).await.unwrap();
                if first {
                    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
                    first = false;
                }
                if line == "\r\n" {
                    break;
                }
                if let Some(value) = line.strip_prefix("content-length: ") {
                    length = value.trim().parse().unwrap();
                }
            }
            body.resize(length, 0);
            stream.read_exact(&mut body).await.unwrap();
            done.fetch_add(1, Ordering::Relaxed);
        }
    })
    .await
}

/// Decisions per second of the layer's rule by `check_rules` from `CONNECTIONS` tasks.
async fn decision_rate(client: &Client) -> (f64, u64) {
    rate(|i, stop, done| {
        let client = client.clone();
        async move {
            let rule = [Rule::new(format!("rate_limit:bench:key-{i}"), HUGE_RATE, MINUTE)];
            while !stop.load(Ordering::Relaxed) {
                assert!(client.check_rules(&rule).await.unwrap().allowed);
                done.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
    .await
}

/// Nanoseconds per request of `service` called directly, `n` times.
async fn per_call<S>(service: &mut S, n: u32) -> f64
where
    S: tower_service::Service<Request<axum::body::Body>>,
{
    let started = Instant::now();
    for i in 0..n {
        let request = Request::get("/")
            .header("x-api-key", if i % 2 == 0 { "key-a" } else { "key-b" })
            .body(axum::body::Body::empty())
            .unwrap();
        let _ = service.call(request).await;
    }
    started.elapsed().as_nanos() as f64 / f64::from(n)
}

/// 1 000 calls of `service`, then `n` in [`counted_calls`]: what an instruction counter
/// measures leaves out the first calls' set-up (lazy statics, governor's clock
/// calibrating itself on its first reading, which takes a different number of
/// instructions from run to run).
fn warmed_calls<S>(service: &mut S, n: u32)
where
    S: tower_service::Service<Request<axum::body::Body>>,
{
    calls(service, 1_000);
    counted_calls(service, n);
}

/// [`calls`] of `service`, `n` of them: the function `scripts/layer-instructions.sh`
/// counts (with what it calls; the warm-up's calls are outside it).
#[inline(never)]
fn counted_calls<S>(service: &mut S, n: u32)
where
    S: tower_service::Service<Request<axum::body::Body>>,
{
    calls(service, n);
}

/// `n` calls of `service`, each polled once where it is made (none of the rows
/// waits: the router's handler, and both layers in process). Each request carries
/// what [`SHAPE`] says: one of two API keys, one of two peers or one of two tokens.
fn calls<S>(service: &mut S, n: u32)
where
    S: tower_service::Service<Request<axum::body::Body>>,
{
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let shape = SHAPE.load(Ordering::Relaxed);
    for i in 0..n {
        let request = match shape {
            PEERS => Request::get("/").extension(axum::extract::ConnectInfo(SocketAddr::from((
                [192, 0, 2, 1 + (i % 2) as u8],
                40_000,
            )))),
            BEARERS => Request::get("/").header("authorization", BEARER_TOKENS[i as usize % 2]),
            PATHS => Request::get(if i % 2 == 0 { "/users/alice" } else { "/users/bob" }),
            _ => Request::get("/").header("x-api-key", if i % 2 == 0 { "key-a" } else { "key-b" }),
        };
        let request = request.body(axum::body::Body::empty()).unwrap();
        let response = std::pin::pin!(service.call(request));
        assert!(
            std::future::Future::poll(response, &mut cx).is_ready(),
            "a request waited"
        );
    }
}

async fn direct() {
    // REDLIMIT_BENCH_CALLS: fewer calls, for running under an instruction counter.
    let calls = std::env::var("REDLIMIT_BENCH_CALLS")
        .ok()
        .and_then(|n| n.parse().ok());
    let calls: u32 = calls.unwrap_or(200_000);
    println!("\n## The layer's own cost (a router called as a service, one thread, {calls} calls)\n");
    println!(
        "| round | router alone, ns | with the layer, ns | layer, ns | share of a core at 50 000 req/s |"
    );
    println!("|---|---:|---:|---:|---:|");
    let mut alone = router();
    let mut limited = router().layer(layer(&Client::memory()));
    for round in 1..=ROUNDS {
        let bare = per_call(&mut alone, calls).await;
        let with = per_call(&mut limited, calls).await;
        let cost = with - bare;
        println!(
            "| {round} | {bare:.0} | {with:.0} | {cost:.0} | {:.1}% |",
            cost * 50_000.0 / 1e9 * 100.0
        );
    }
}

/// tower_governor's key: the same header the layer's rule is keyed by.
#[derive(Clone)]
struct HeaderKey(&'static str);

impl tower_governor::key_extractor::KeyExtractor for HeaderKey {
    type Key = String;

    fn extract<T>(&self, request: &Request<T>) -> Result<String, tower_governor::GovernorError> {
        request
            .headers()
            .get(self.0)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or(tower_governor::GovernorError::UnableToExtractKey)
    }
}

/// tower_governor's key for `/users/{id}`: the path after `/users/`, as a key
/// extractor of its own reads it (tower_governor has none for axum's path parameters).
#[derive(Clone)]
struct UserInPath;

impl tower_governor::key_extractor::KeyExtractor for UserInPath {
    type Key = String;

    fn extract<T>(&self, request: &Request<T>) -> Result<String, tower_governor::GovernorError> {
        (request.uri().path().strip_prefix("/users/"))
            .map(str::to_owned)
            .ok_or(tower_governor::GovernorError::UnableToExtractKey)
    }
}

/// Two bearer tokens, of the length API keys usually have.
const BEARER_TOKENS: [&str; 2] = [
    "Bearer sk-live-4f9a1c7e2b8d4e6f9a0b1c2d3e4f5a6b",
    "Bearer sk-live-8e2d6b1f4a9c3e7d5b0a2c4e6f8a1b3d",
];

/// `n` calls of one row's router (see the file's header).
fn count_row(row: &str, n: u32) {
    let quiet = |on: bool| {
        RateLimitLayer::builder()
            .client(Client::memory())
            .rule(LayerRule::new("bench", HUGE_RATE, MINUTE).key(Key::header("x-api-key")))
            .success_fields(on)
            .build()
            .unwrap()
    };
    let mut config = tower_governor::governor::GovernorConfigBuilder::default();
    config.per_nanosecond(1).burst_size(u32::MAX);
    let mut config = config.key_extractor(HeaderKey("x-api-key"));
    match row {
        "bare" => warmed_calls(&mut router(), n),
        "bare-ip" => {
            SHAPE.store(PEERS, Ordering::Relaxed);
            warmed_calls(&mut router(), n)
        }
        "redlimit-headers" => warmed_calls(&mut router().layer(quiet(true)), n),
        "redlimit-plain" => warmed_calls(&mut router().layer(quiet(false)), n),
        "governor-headers" => {
            let config = Arc::new(config.use_headers().finish().unwrap());
            warmed_calls(&mut router().layer(tower_governor::GovernorLayer::new(config)), n)
        }
        "governor-plain" => {
            let config = Arc::new(config.finish().unwrap());
            warmed_calls(&mut router().layer(tower_governor::GovernorLayer::new(config)), n)
        }
        "redlimit-ip" => {
            SHAPE.store(PEERS, Ordering::Relaxed);
            let layer = plain_layer(Key::client_ip());
            warmed_calls(&mut router().layer(layer), n)
        }
        "governor-ip" => {
            SHAPE.store(PEERS, Ordering::Relaxed);
            let mut config = tower_governor::governor::GovernorConfigBuilder::default();
            config.per_nanosecond(1).burst_size(u32::MAX);
            let config = Arc::new(config.finish().unwrap());
            warmed_calls(&mut router().layer(tower_governor::GovernorLayer::new(config)), n)
        }
        "bare-path" => {
            SHAPE.store(PATHS, Ordering::Relaxed);
            warmed_calls(&mut users_router(), n)
        }
        "redlimit-path" => {
            SHAPE.store(PATHS, Ordering::Relaxed);
            let layer = plain_layer(Key::path_param("id"));
            warmed_calls(&mut users_router().route_layer(layer), n)
        }
        "governor-path" => {
            SHAPE.store(PATHS, Ordering::Relaxed);
            let mut config = tower_governor::governor::GovernorConfigBuilder::default();
            config.per_nanosecond(1).burst_size(u32::MAX);
            let mut config = config.key_extractor(UserInPath);
            let config = Arc::new(config.finish().unwrap());
            let layer = tower_governor::GovernorLayer::new(config);
            warmed_calls(&mut users_router().route_layer(layer), n)
        }
        "bare-bearer" => {
            SHAPE.store(BEARERS, Ordering::Relaxed);
            warmed_calls(&mut router(), n)
        }
        "redlimit-bearer" => {
            SHAPE.store(BEARERS, Ordering::Relaxed);
            let layer = plain_layer(Key::header("authorization"));
            warmed_calls(&mut router().layer(layer), n)
        }
        "governor-bearer" => {
            SHAPE.store(BEARERS, Ordering::Relaxed);
            let mut config = tower_governor::governor::GovernorConfigBuilder::default();
            config.per_nanosecond(1).burst_size(u32::MAX);
            let mut config = config.key_extractor(HeaderKey("authorization"));
            let config = Arc::new(config.finish().unwrap());
            warmed_calls(&mut router().layer(tower_governor::GovernorLayer::new(config)), n)
        }
        other => panic!(
            "REDLIMIT_BENCH_ROW={other}: expected bare, redlimit-headers, redlimit-plain, \
             governor-headers, governor-plain, bare-ip, redlimit-ip, governor-ip, \
             bare-bearer, redlimit-bearer, governor-bearer, bare-path, redlimit-path or \
             governor-path"
        ),
    };
}

#[tokio::main]
async fn main() {
    if std::env::var("REDLIMIT_BENCH_ONLY").as_deref() == Ok("count") {
        let row = std::env::var("REDLIMIT_BENCH_ROW").expect("REDLIMIT_BENCH_ROW is not set");
        let n = std::env::var("REDLIMIT_BENCH_CALLS").map_or(20_000, |n| n.parse().expect("a number"));
        return count_row(&row, n);
    }
    // REDLIMIT_BENCH_ONLY=direct runs the last part alone (no network, no Redis), for
    // profiling the layer.
    if std::env::var("REDLIMIT_BENCH_ONLY").as_deref() == Ok("direct") {
        return direct().await;
    }
    let redis = RedisServer::start();
    let on_redis = Client::connect(&redis.url()).await.unwrap();
    let bare = serve(router()).await;
    let in_process = serve(router().layer(layer(&Client::memory()))).await;
    let through_redis = serve(router().layer(layer(&on_redis))).await;
    let hand_written = serve(by_hand(&on_redis)).await;

    let mut info = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();

    println!(
        "## Through the layer ({CONNECTIONS} keep-alive connections, one API key each, {RUN:?} per run)\n"
    );
    println!("| round | router alone, req/s | layer in process, req/s (ratio) | layer on Redis, req/s | check_rules in the handler on Redis, req/s | layer / handler | check_rules on Redis without HTTP, decisions/s | layer / check_rules |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut cpu = Vec::new();
    for round in 1..=ROUNDS {
        let (alone, _) = http_rate(bare).await;
        let (memory, _) = http_rate(in_process).await;
        let layer = measured(&mut info, http_rate(through_redis)).await;
        let handler = measured(&mut info, http_rate(hand_written)).await;
        let decisions = measured(&mut info, decision_rate(&on_redis)).await;
        println!(
            "| {round} | {alone:.0} | {memory:.0} ({:.3}) | {:.0} | {:.0} | {:.3} | {:.0} | {:.3} |",
            memory / alone,
            layer.rate,
            handler.rate,
            layer.rate / handler.rate,
            decisions.rate,
            layer.rate / decisions.rate
        );
        cpu.push((layer, handler, decisions));
    }

    println!("\n## CPU per request on Redis, microseconds (the same runs)\n");
    println!("This process serves HTTP, generates the load and runs the Redis client; the Redis server runs apart, and its CPU per decision sets the most decisions per second it can make on a core of its own.\n");
    println!("| round | layer: process | layer: Redis | handler: process | handler: Redis | check_rules without HTTP: process | check_rules: Redis | Redis per decision, check_rules / layer |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (round, (layer, handler, decisions)) in cpu.iter().enumerate() {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.3} |",
            round + 1,
            layer.process_us,
            layer.redis_us,
            handler.process_us,
            handler.redis_us,
            decisions.process_us,
            decisions.redis_us,
            decisions.redis_us / layer.redis_us
        );
    }
    direct().await;
}
