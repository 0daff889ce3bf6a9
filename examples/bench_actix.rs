//! `REDLIMIT_BENCH_ROW=<row> REDLIMIT_BENCH_CALLS=<n> cargo run --release --example
//! bench_actix --features actix`: an actix-web app called as a service, without the
//! network, 1 000 times, then `n` times in `counted_calls`, for counting instructions
//! (`scripts/layer-instructions.sh` runs every row under callgrind, counting that
//! function alone, and prints what the middleware adds to the bare app per request):
//! `actix-bare`, the app alone; `actix-redlimit-headers` and `actix-redlimit-plain`,
//! with the in-process middleware keyed by `x-api-key`, its success fields on and off;
//! `actix-governor-headers` and `actix-governor-plain`, with actix-governor keyed by
//! the same header, its `x-ratelimit-*` headers on and off; `actix-bare-ip`, the app
//! alone with the next rows' requests, each from one of two IPv4 peers, and
//! `actix-redlimit-ip` and `actix-governor-ip`, each keyed by the peer's address
//! (`Key::client_ip()`, actix-governor's `PeerIpKeyExtractor`), headers off; and
//! `actix-bare-path`, `actix-redlimit-path` and `actix-governor-path`, a resource
//! `/users/{id}` called for one of two users, each middleware wrapping the resource and
//! keyed by the parameter `id`, headers off.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actix_web::dev::{Service, ServiceRequest, ServiceResponse};
use actix_web::{test, web, App, Error};
use redlimit::actix::{Key, LayerRule, RateLimitLayer};
use redlimit::Client;

/// A rate no request reaches: the figures are the cost of deciding.
const HUGE_RATE: u64 = 1 << 40;

/// actix-governor's key: the same header the middleware's rule is keyed by.
#[derive(Clone)]
struct ApiKey;

impl actix_governor::KeyExtractor for ApiKey {
    type Key = String;
    type KeyExtractionError = actix_governor::SimpleKeyExtractionError<&'static str>;

    fn extract(&self, request: &ServiceRequest) -> Result<String, Self::KeyExtractionError> {
        request
            .headers()
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or_else(|| actix_governor::SimpleKeyExtractionError::new("no x-api-key"))
    }
}

/// Whether the requests come from peers rather than carry API keys.
static PEERS: AtomicBool = AtomicBool::new(false);
/// Whether the requests are to one of two users' paths, `/users/{id}`.
static PATHS: AtomicBool = AtomicBool::new(false);

/// The `i`th request: keyed by one of two API keys in turn, or from one of two peers,
/// or to one of two users' paths.
fn request(i: u32) -> test::TestRequest {
    if PATHS.load(Ordering::Relaxed) {
        return test::TestRequest::get().uri(if i % 2 == 0 { "/users/alice" } else { "/users/bob" });
    }
    let request = test::TestRequest::get().uri("/");
    match PEERS.load(Ordering::Relaxed) {
        false => request.insert_header(("x-api-key", if i % 2 == 0 { "key-a" } else { "key-b" })),
        true => request.peer_addr(SocketAddr::from(([192, 0, 2, 1 + (i % 2) as u8], 40_000))),
    }
}

/// actix-governor's key for `/users/{id}`: the matched parameter.
#[derive(Clone)]
struct UserParam;

impl actix_governor::KeyExtractor for UserParam {
    type Key = String;
    type KeyExtractionError = actix_governor::SimpleKeyExtractionError<&'static str>;

    fn extract(&self, request: &ServiceRequest) -> Result<String, Self::KeyExtractionError> {
        (request.match_info().get("id"))
            .map(str::to_owned)
            .ok_or_else(|| actix_governor::SimpleKeyExtractionError::new("no id"))
    }
}

/// `n` requests through `service`, each awaited where it is made (none of the rows
/// waits: the handler, and both middlewares in process). `make` is
/// `TestRequest::to_request`, whose type actix-web does not name.
async fn calls<S, Q, B>(service: &S, make: fn(test::TestRequest) -> Q, n: u32)
where
    S: Service<Q, Response = ServiceResponse<B>, Error = Error>,
{
    for i in 0..n {
        let response = service.call(make(request(i))).await.unwrap();
        assert!(response.status().is_success());
    }
}

/// The calls `scripts/layer-instructions.sh` counts (the warm-up's are outside it).
#[inline(never)]
fn counted_calls<S, Q, B>(
    runtime: &tokio::runtime::Runtime,
    service: &S,
    make: fn(test::TestRequest) -> Q,
    n: u32,
) where
    S: Service<Q, Response = ServiceResponse<B>, Error = Error>,
{
    runtime.block_on(calls(service, make, n));
}

/// 1 000 calls, then `n` counted.
fn warmed_calls<S, Q, B>(
    runtime: &tokio::runtime::Runtime,
    service: S,
    make: fn(test::TestRequest) -> Q,
    n: u32,
) where
    S: Service<Q, Response = ServiceResponse<B>, Error = Error>,
{
    runtime.block_on(calls(&service, make, 1_000));
    counted_calls(runtime, &service, make, n);
}

fn main() {
    let row = std::env::var("REDLIMIT_BENCH_ROW").expect("REDLIMIT_BENCH_ROW is not set");
    let n = std::env::var("REDLIMIT_BENCH_CALLS").map_or(20_000, |n| n.parse().expect("a number"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let layer = |on: bool| {
        RateLimitLayer::builder()
            .client(Client::memory())
            .rule(LayerRule::new("bench", HUGE_RATE, Duration::from_secs(60)).key(Key::header("x-api-key")))
            .success_fields(on)
            .build()
            .unwrap()
    };
    let mut config = actix_governor::GovernorConfigBuilder::default();
    config.nanoseconds_per_request(1).burst_size(u32::MAX);
    let mut config = config.key_extractor(ApiKey);
    let route = || web::get().to(|| async { "ok" });
    macro_rules! row {
        ($app:expr) => {{
            let service = runtime.block_on(test::init_service($app));
            warmed_calls(&runtime, service, |r| r.to_request(), n)
        }};
    }
    PEERS.store(row.ends_with("-ip"), Ordering::Relaxed);
    PATHS.store(row.ends_with("-path"), Ordering::Relaxed);
    let users = || web::resource("/users/{id}").route(route());
    match row.as_str() {
        "actix-bare" | "actix-bare-ip" => row!(App::new().route("/", route())),
        "actix-redlimit-headers" => row!(App::new().wrap(layer(true)).route("/", route())),
        "actix-redlimit-plain" => row!(App::new().wrap(layer(false)).route("/", route())),
        "actix-governor-headers" => {
            let config = config.use_headers().finish().unwrap();
            row!(App::new()
                .wrap(actix_governor::Governor::new(&config))
                .route("/", route()))
        }
        "actix-governor-plain" => {
            let config = config.finish().unwrap();
            row!(App::new()
                .wrap(actix_governor::Governor::new(&config))
                .route("/", route()))
        }
        "actix-redlimit-ip" => {
            let layer = RateLimitLayer::builder()
                .client(Client::memory())
                .rule(LayerRule::new("bench", HUGE_RATE, Duration::from_secs(60)).key(Key::client_ip()))
                .success_fields(false)
                .build()
                .unwrap();
            row!(App::new().wrap(layer).route("/", route()))
        }
        "actix-governor-ip" => {
            let mut config = actix_governor::GovernorConfigBuilder::default();
            config.nanoseconds_per_request(1).burst_size(u32::MAX);
            let config = config.finish().unwrap();
            row!(App::new()
                .wrap(actix_governor::Governor::new(&config))
                .route("/", route()))
        }
        "actix-bare-path" => row!(App::new().service(users())),
        "actix-redlimit-path" => {
            let layer = RateLimitLayer::builder()
                .client(Client::memory())
                .rule(LayerRule::new("bench", HUGE_RATE, Duration::from_secs(60)).key(Key::path_param("id")))
                .success_fields(false)
                .build()
                .unwrap();
            row!(App::new().service(users().wrap(layer)))
        }
        "actix-governor-path" => {
            let mut config = actix_governor::GovernorConfigBuilder::default();
            config.nanoseconds_per_request(1).burst_size(u32::MAX);
            let config = config.key_extractor(UserParam).finish().unwrap();
            row!(App::new().service(users().wrap(actix_governor::Governor::new(&config))))
        }
        other => panic!(
            "REDLIMIT_BENCH_ROW={other}: expected actix-bare, actix-redlimit-headers, \
             actix-redlimit-plain, actix-governor-headers, actix-governor-plain, \
             actix-bare-ip, actix-redlimit-ip, actix-governor-ip, actix-bare-path, \
             actix-redlimit-path or actix-governor-path"
        ),
    }
}
