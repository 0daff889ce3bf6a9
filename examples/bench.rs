//! `cargo run --release --example bench`: redlimit measured side by side with what it
//! is built on, in one run, on a redis-server this program starts (needs
//! `redis-server` on PATH). Prints the tables recorded in BENCHMARKS.md.
//!
//! 1. Overhead against the wire: a decorated fn against a bare redis-rs loop running
//!    the same acquire script, 64 tasks each.
//! 2. Round trips: client commands per decision (read with MONITOR: every command a
//!    client sent, not those its scripts ran) for 1, 2 and 3 stacked rules, and the
//!    pattern of calling `trySetRate` then `tryAcquire` before every call.
//! 3. Latency of a decision under that load.
//! 4. Memory in Redis per limiter when saturated, and keys left by idle limiters.
//! 5. In process: the memory backend next to governor, per thread and in total; then
//!    one thread's ns per decision with 1 000, 100 000 and 1 000 000 live limiters, on
//!    one hot key and on every key in turn, and the memory each limiter takes
//!    (`REDLIMIT_BENCH_ONLY=memory` runs section 5 alone, `=keys` only its second
//!    table).
//! 7. A token bucket next to the sliding window: server time per decision and memory
//!    per limiter at 10, 1 000 and 100 000 per minute (`REDLIMIT_BENCH_ONLY=bucket`
//!    runs it alone).
//! 6. Server time per decision side by side with a reference acquire script given in
//!    `REDLIMIT_REFERENCE_SCRIPT` (a path; any script taking Redisson's KEYS and ARGV:
//!    five keys, then permits, the time in ms and 16 random bytes, such as Redisson's
//!    own acquire script taken from its source), on the allow and the deny path.
//! 9. A flood of refused calls on one exhausted limiter beside grants of other
//!    limiters, on one client, with refusals answered in process and without:
//!    grants per second alone and under the flood, and Redis commands per refused
//!    call (`REDLIMIT_BENCH_ONLY=flood` runs it alone; it is not in the default run).
//! 10. One global limiter served in batches (`Rule::batch`) at k = 1 and k = 10:
//!     decisions per second from 64 tasks on one client, and Redis script calls per
//!     decision (`REDLIMIT_BENCH_ONLY=batch` runs it alone; it is not in the default
//!     run).
//! 8. The rows of section 6 one at a time, for counting the instructions Redis and
//!    the caller spend on them: `REDLIMIT_BENCH_ONLY=count` with
//!    `REDLIMIT_BENCH_REDIS_URL` (a server started by the caller, under an instruction
//!    counter or not), `REDLIMIT_BENCH_ROW` (`reference-allow`, `reference-deny`,
//!    `one-allow`, `one-deny`, `three-allow`; `walk-deny-1` and `walk-deny-all`, refusals
//!    of 1 and of 100 000 permits on a log of 100 000 grants; `bucket-allow` and
//!    `bucket-deny`, one token-bucket rule; `flood-deny`, refusals of an exhausted limiter
//!    answered in process, and `governor-check`, governor's keyed check of an exhausted
//!    key; `batch-1` and `batch-10`, grants of one global limiter at k = 1 and k = 10;
//!    `rules-allow`, `reserve-allow`, `reserve-settle` and `reserve-overdraw`, one rule
//!    by hand decided, reserved, and reserved then settled with a refund or an excess;
//!    `bucket-pending`, `reserve-bucket` and `reserve-bucket-settle`, a token bucket with
//!    a reservation pending decided, reserved, and reserved then settled; the `growth-` rows of
//!    `bench/growth.rs`, how a decision's work grows) and
//!    `REDLIMIT_BENCH_CALLS`
//!    (default 20 000), on a current-thread runtime (see `main`). `scripts/script-instructions.sh`
//!    runs every row under callgrind, Redis then the caller, and prints the instructions per
//!    decision of each.

use std::num::NonZeroU32;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use redlimit::{rate_limit, Client, RateLimited, RateType, Rule};

const TASKS: usize = 64;
const RUN: Duration = Duration::from_secs(3);
/// High enough that the throughput runs are never refused: they measure the work.
const HUGE_RATE: u64 = 1_000_000_000;

use redlimit_test_support::RedisServer;

#[path = "bench/growth.rs"]
mod growth;

#[rate_limit(key = "bench:decorated", rate = 1_000_000_000, interval = "1s")]
async fn decorated() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "bench:side:one", rate = 1_000_000_000, interval = "60s")]
async fn side_one() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "bench:side:three:a", rate = 1_000_000_000, interval = "60s")]
#[rate_limit(key = "bench:side:three:b", rate = 1_000_000_000, interval = "60s")]
#[rate_limit(key = "bench:side:three:c", rate = 1_000_000_000, interval = "60s")]
async fn side_three() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "bench:side:deny", rate = 10, interval = "60s")]
async fn side_deny() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "bench:one:a", rate = 1_000_000_000, interval = "1s")]
async fn one_rule() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "bench:two:a", rate = 1_000_000_000, interval = "1s")]
#[rate_limit(key = "bench:two:b", rate = 1_000_000_000, interval = "1s")]
async fn two_rules() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "bench:three:a", rate = 1_000_000_000, interval = "1s")]
#[rate_limit(key = "bench:three:b", rate = 1_000_000_000, interval = "1s")]
#[rate_limit(key = "bench:three:c", rate = 1_000_000_000, interval = "1s")]
async fn three_rules() -> Result<(), RateLimited> {
    Ok(())
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Runs `op` from `TASKS` tasks for `RUN`; answers calls per second and latencies.
async fn load<F, Fut>(op: F) -> (f64, Vec<Duration>)
where
    F: Fn() -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (op, stop) = (op.clone(), stop.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(100_000);
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    op().await;
                    latencies.push(started.elapsed());
                }
                latencies
            })
        })
        .collect();
    let started = Instant::now();
    tokio::time::sleep(RUN).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let rate = all.len() as f64 / started.elapsed().as_secs_f64();
    all.sort_unstable();
    (rate, all)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// A field of `command`'s line in `INFO commandstats` (`calls`, `usec_per_call`).
async fn command_stat(conn: &mut MultiplexedConnection, command: &str, field: &str) -> f64 {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:")))
        .and_then(|rest| rest.split(',').find_map(|f| f.strip_prefix(&format!("{field}="))))
        .map_or(0.0, |v| v.parse().unwrap())
}

async fn reset(conn: &mut MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
}

/// Client commands per decision: every command a client sent, read with MONITOR
/// (`redis-cli monitor`), which marks the commands scripts run inside Redis `[db lua]`.
async fn commands_per_decision<Fut: std::future::Future<Output = ()>>(
    port: u16,
    decide: impl Fn() -> Fut,
) -> f64 {
    decide().await; // loads scripts
    let mut monitor = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "monitor"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli on PATH (apt-get install -y redis-server)");
    let (sender, lines) = std::sync::mpsc::channel::<String>();
    let stdout = monitor.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    // Lines up to a marker sent by another client.
    let until_marker = |marker: &str| -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let _ = Command::new("redis-cli")
                .args(["-p", &port.to_string(), "echo", marker])
                .output();
            while let Ok(line) = lines.recv_timeout(Duration::from_millis(200)) {
                if line.contains(marker) {
                    return seen;
                }
                seen.push(line);
            }
        }
    };
    until_marker("bench-start");
    let decisions = 1000;
    for _ in 0..decisions {
        decide().await;
    }
    let sent = until_marker("bench-end")
        .iter()
        .filter(|line| !line.contains(" lua]") && !line.contains("bench-start"))
        .count();
    let _ = monitor.kill();
    let _ = monitor.wait();
    sent as f64 / decisions as f64
}

async fn memory_usage(conn: &mut MultiplexedConnection, name: &str) -> u64 {
    let keys = [
        name.to_owned(),
        format!("{{{name}}}:value"),
        format!("{{{name}}}:permits"),
    ];
    keys_memory(conn, &keys).await
}

/// The memory of `keys`, summed (0 for a missing key).
async fn keys_memory(conn: &mut MultiplexedConnection, keys: &[String]) -> u64 {
    let mut total = 0;
    for key in keys {
        let bytes: Option<u64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .arg("SAMPLES")
            .arg(0)
            .query_async(conn)
            .await
            .unwrap();
        total += bytes.unwrap_or(0);
    }
    total
}

/// Section 8 (`REDLIMIT_BENCH_ONLY=count`) on a current-thread runtime: the calls and
/// the connection's task take turns on one thread, so the instructions counted repeat
/// from run to run. On worker threads they moved with how the threads happened to park
/// and wake (by some 7 % between runs of one build). Every other section on two worker
/// threads.
fn main() {
    let count = std::env::var("REDLIMIT_BENCH_ONLY").as_deref() == Ok("count");
    let mut runtime = if count {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut runtime = tokio::runtime::Builder::new_multi_thread();
        runtime.worker_threads(2);
        runtime
    };
    let runtime = runtime.enable_all().build().unwrap();
    if count {
        runtime.block_on(count_row());
    } else {
        runtime.block_on(sections());
    }
}

/// Every section but 8, or the one `REDLIMIT_BENCH_ONLY` names.
async fn sections() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    redlimit::set_default(client.clone()).unwrap();
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();

    // REDLIMIT_BENCH_ONLY=side (or =memory) runs section 6 (or 5) alone, for
    // iterating on the scripts (or the in-process backend).
    match std::env::var("REDLIMIT_BENCH_ONLY").as_deref() {
        Ok("side") => return side_by_side(&client, &mut conn).await,
        Ok("memory") => return in_process(),
        Ok("keys") => return live_keys(),
        Ok("bucket") => return token_bucket(&client, &mut conn).await,
        Ok("flood") => return flood(&server.url(), &mut conn).await,
        Ok("batch") => return batches(&client, &mut conn).await,
        _ => {}
    }

    // 1 and 3: the decorated fn against the bare script on redis-rs.
    let script = Arc::new(redis::Script::new(redlimit::ACQUIRE_SCRIPT));
    let bare = {
        let conn = conn.clone();
        move || {
            let (script, mut conn) = (script.clone(), conn.clone());
            async move {
                let mut member = [0u8; 21];
                member[0] = 16;
                member[1..9].copy_from_slice(&now_ms().to_le_bytes());
                member[9..17].copy_from_slice(&rand::random::<u64>().to_le_bytes());
                member[17] = 1;
                let name = "rate_limit:bench:bare";
                let _: redis::Value = script
                    .key(name)
                    .key(format!("{{{name}}}:value"))
                    .key(format!("{{{name}}}:value:x"))
                    .key(format!("{{{name}}}:permits"))
                    .key(format!("{{{name}}}:permits:x"))
                    .arg(now_ms())
                    .arg(1)
                    .arg(&member[..])
                    .arg("1")
                    .arg(HUGE_RATE)
                    .arg(1000)
                    .arg("0")
                    .arg(1000)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
            }
        }
    };
    reset(&mut conn).await;
    let (bare_rate, bare_latency) = load(bare).await;
    let bare_usec = command_stat(&mut conn, "evalsha", "usec_per_call").await;
    reset(&mut conn).await;
    let (macro_rate, macro_latency) = load(|| async { decorated().await.unwrap() }).await;
    let macro_usec = command_stat(&mut conn, "evalsha", "usec_per_call").await;
    println!(
        "## Overhead against the wire ({TASKS} tasks, {} s each)\n",
        RUN.as_secs()
    );
    println!("| | decisions/s | p50 | p99 | p99.9 | script time in Redis |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, rate, latency, usec) in [
        ("bare redis-rs, same script", bare_rate, &bare_latency, bare_usec),
        (
            "#[rate_limit] fn, one rule",
            macro_rate,
            &macro_latency,
            macro_usec,
        ),
    ] {
        println!(
            "| {name} | {rate:.0} | {:.2?} | {:.2?} | {:.2?} | {usec:.1} us |",
            percentile(latency, 0.5),
            percentile(latency, 0.99),
            percentile(latency, 0.999)
        );
    }
    println!(
        "\nratio (decorated / bare): {:.3} (target >= 0.9)\n",
        macro_rate / bare_rate
    );

    // 2: round trips per decision.
    println!("## Client commands per decision\n");
    println!("| pattern | commands |");
    println!("|---|---:|");
    let port = server.port;
    let one = commands_per_decision(port, || async { one_rule().await.unwrap() }).await;
    let two = commands_per_decision(port, || async { two_rules().await.unwrap() }).await;
    let three = commands_per_decision(port, || async { three_rules().await.unwrap() }).await;
    let aop_limiter = client.rate_limiter("rate_limit:bench:aop");
    let aop = commands_per_decision(port, || async {
        aop_limiter
            .try_set_rate(RateType::Overall, HUGE_RATE, Duration::from_secs(1))
            .await
            .unwrap();
        aop_limiter.try_acquire(1).await.unwrap();
    })
    .await;
    println!("| #[rate_limit], 1 rule | {one:.2} |");
    println!("| #[rate_limit], 2 rules | {two:.2} |");
    println!("| #[rate_limit], 3 rules | {three:.2} |");
    println!("| trySetRate then tryAcquire on every call | {aop:.2} |\n");

    // 4: memory per saturated limiter, and idle limiters.
    println!("## Memory in Redis per limiter, saturated (interval 60 s)\n");
    println!("| rate | bytes | bytes per grant |");
    println!("|---:|---:|---:|");
    for rate in [10u64, 1_000, 100_000] {
        let name = format!("rate_limit:bench:memory:{rate}");
        let rule = Rule::new(name.clone(), rate, Duration::from_secs(60));
        let granted = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (client, rule, granted) = (client.clone(), [rule.clone()], granted.clone());
                tokio::spawn(async move {
                    while client.check_rules(&rule).await.unwrap().allowed {
                        granted.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(granted.load(Ordering::Relaxed), rate);
        let bytes = memory_usage(&mut conn, &name).await;
        println!("| {rate} | {bytes} | {:.0} |", bytes as f64 / rate as f64);
    }
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    let idle = Duration::from_secs(1);
    let creators: Vec<_> = (0..TASKS)
        .map(|task| {
            let client = client.clone();
            tokio::spawn(async move {
                for user in (task..10_000).step_by(TASKS) {
                    let rule = [Rule::new(format!("rate_limit:bench:user:{user}"), 5, idle)];
                    client.check_rules(&rule).await.unwrap();
                }
            })
        })
        .collect();
    for creator in creators {
        creator.await.unwrap();
    }
    let keys_at_start: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    let idle_since = Instant::now();
    let mut left: u64 = keys_at_start;
    while left > 0 && idle_since.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    }
    println!(
        "\n10 000 per-user limiters (keep-alive = interval = {} s): {keys_at_start} keys; \
         {left} left {:.1} s after the last was used (target 0)\n",
        idle.as_secs(),
        idle_since.elapsed().as_secs_f64()
    );
    // 6: server time side by side with a reference script.
    side_by_side(&client, &mut conn).await;
    // 7: a token bucket next to the sliding window.
    token_bucket(&client, &mut conn).await;
    drop(server);

    // 5: in process, against governor.
    in_process();
}

/// Section 7: one limiter per algorithm and rate, 64 tasks deciding it for `RUN`
/// (grants until it is saturated, then refusals, as a limit under pressure sees), then
/// the memory of all its keys.
async fn token_bucket(client: &Client, conn: &mut MultiplexedConnection) {
    println!("## A token bucket next to the sliding window (64 tasks on one limiter, 3 s each)\n");
    println!(
        "| rate per minute | sliding window: us per decision in Redis | token bucket | ratio \
         | token bucket with a 60 s warm-up | ratio | sliding window: bytes | token bucket: bytes \
         | with warm-up: bytes |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for rate in [10u64, 1_000, 100_000] {
        let mut figures = Vec::new();
        for kind in ["window", "bucket", "warming"] {
            let name = format!("bench:{kind}:{rate}");
            let rule = Rule::new(name.clone(), rate, Duration::from_secs(60));
            let rule = match kind {
                "window" => rule,
                "bucket" => rule.algorithm(redlimit::Algorithm::TokenBucket),
                _ => rule
                    .algorithm(redlimit::Algorithm::TokenBucket)
                    .warmup(Duration::from_secs(60)),
            };
            let rules = Arc::new([rule]);
            let client = client.clone();
            let (_, usec) = timed(conn, move || {
                let (client, rules) = (client.clone(), rules.clone());
                async move {
                    client.check_rules(&rules[..]).await.unwrap();
                }
            })
            .await;
            let bytes = if kind == "window" {
                memory_usage(conn, &name).await
            } else {
                keys_memory(conn, &[format!("{{{name}}}:bucket")]).await
            };
            figures.push((usec, bytes));
        }
        let [(window_us, window_bytes), (bucket_us, bucket_bytes), (warm_us, warm_bytes)] = figures[..]
        else {
            unreachable!("three kinds")
        };
        println!(
            "| {rate} | {window_us:.1} | {bucket_us:.1} | {:.2} | {warm_us:.1} | {:.2} | {window_bytes} | {bucket_bytes} | {warm_bytes} |",
            bucket_us / window_us,
            warm_us / window_us
        );
    }
    println!(
        "\n(target: a token bucket's server time at most half the sliding window's; its memory constant)\n"
    );
}

/// Runs `op` under load and answers decisions/s and EVALSHA's time per call in Redis.
async fn timed<F, Fut>(conn: &mut MultiplexedConnection, op: F) -> (f64, f64)
where
    F: Fn() -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    op().await; // loads the script
    reset(conn).await;
    let (rate, _) = load(op).await;
    (rate, command_stat(conn, "evalsha", "usec_per_call").await)
}

/// A bare redis-rs loop over a reference acquire script, with Redisson's KEYS and
/// ARGV, on the limiter `name` (configured beforehand).
fn reference_loop(
    conn: &MultiplexedConnection,
    script: &Arc<redis::Script>,
    name: &'static str,
) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync + Clone + 'static
{
    let (conn, script) = (conn.clone(), script.clone());
    move || {
        let (script, mut conn) = (script.clone(), conn.clone());
        Box::pin(async move {
            let id: [u8; 16] = rand::random();
            let _: redis::Value = script
                .key(name)
                .key(format!("{{{name}}}:value"))
                .key(format!("{{{name}}}:value:x"))
                .key(format!("{{{name}}}:permits"))
                .key(format!("{{{name}}}:permits:x"))
                .arg(1)
                .arg(now_ms())
                .arg(&id[..])
                .invoke_async(&mut conn)
                .await
                .unwrap();
        })
    }
}

async fn side_by_side(client: &Client, conn: &mut MultiplexedConnection) {
    const ROUNDS: usize = 3;
    println!(
        "## Server time per decision, side by side (64 tasks, interval 60 s, keep-alive 60 s, \
         {ROUNDS} rounds in turn)\n"
    );
    let reference = std::env::var("REDLIMIT_REFERENCE_SCRIPT").ok().map(|path| {
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("REDLIMIT_REFERENCE_SCRIPT={path}: {e}"));
        let label = std::path::Path::new(&path)
            .file_name()
            .map_or_else(|| path.clone(), |f| f.to_string_lossy().into_owned());
        (label, Arc::new(redis::Script::new(&text)))
    });
    let minute = Duration::from_secs(60);
    for (name, rate) in [
        ("rate_limit:bench:ref:allow", HUGE_RATE),
        ("rate_limit:bench:ref:deny", 10),
    ] {
        let config =
            redlimit::RateLimiterConfig::new(RateType::Overall, rate, minute).with_keep_alive(minute);
        client.rate_limiter(name).set_config(&config).await.unwrap();
    }
    match &reference {
        Some((label, _)) => {
            println!("Reference: `{label}` from a bare redis-rs loop. Script time in Redis, us:\n")
        }
        None => println!("(set REDLIMIT_REFERENCE_SCRIPT to a reference acquire script for its columns)\n"),
    }
    println!(
        "| round | reference, allow | fn, one rule, allow | ratio | reference, deny | fn, one rule, deny | ratio \
         | fn, three rules, allow | three / one | fn / reference loop, decisions/s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    // Each round measures every row once, in the same order, so that the machine's
    // drifts fall on all of them; the ratios are within one round.
    for round in 1..=ROUNDS {
        let mut reference_rows = [(f64::NAN, f64::NAN); 2];
        if let Some((_, script)) = &reference {
            for (row, name) in ["rate_limit:bench:ref:allow", "rate_limit:bench:ref:deny"]
                .into_iter()
                .enumerate()
            {
                reference_rows[row] = timed(conn, reference_loop(conn, script, name)).await;
            }
        }
        let (one_rate, one_usec) = timed(conn, || async { side_one().await.unwrap() }).await;
        let (_, deny_usec) = timed(conn, || async {
            let _ = side_deny().await;
        })
        .await;
        let (_, three_usec) = timed(conn, || async { side_three().await.unwrap() }).await;
        let [(allow_rate, allow_ref), (_, deny_ref)] = reference_rows;
        // Without a reference script its columns say so, rather than print NaN.
        let figure = |x: f64, digits: usize| {
            if x.is_finite() {
                format!("{x:.digits$}")
            } else {
                "-".to_owned()
            }
        };
        println!(
            "| {round} | {} | {one_usec:.1} | {} | {} | {deny_usec:.1} | {} | {three_usec:.1} | {:.2} | {} |",
            figure(allow_ref, 1),
            figure(one_usec / allow_ref, 2),
            figure(deny_ref, 1),
            figure(deny_usec / deny_ref, 2),
            three_usec / one_usec,
            figure(one_rate / allow_rate, 3)
        );
    }
    println!(
        "\n(targets: fn / reference at most 1 on both paths; three / one at most 2; the fn at least \
         0.9 of the reference loop's decisions/s)\n"
    );
}

/// Section 8: one row of section 6, `REDLIMIT_BENCH_CALLS` calls one after the other
/// on the server at `REDLIMIT_BENCH_REDIS_URL`.
async fn count_row() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let url = var("REDLIMIT_BENCH_REDIS_URL");
    let row = var("REDLIMIT_BENCH_ROW");
    let calls: usize = std::env::var("REDLIMIT_BENCH_CALLS")
        .ok()
        .map_or(20_000, |n| n.parse().expect("REDLIMIT_BENCH_CALLS is a number"));
    // Under an instruction counter Redis runs tens of times slower than usual.
    let client = Client::builder()
        .command_timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(10))
        // every row but the flood's counts what the script costs, refusals included
        .local_refusals(row == "flood-deny")
        .connect(&url)
        .await
        .unwrap();
    redlimit::set_default(client.clone()).unwrap();
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    conn.set_response_timeout(Duration::from_secs(60));
    let minute = Duration::from_secs(60);
    match row.as_str() {
        growth if growth.starts_with("growth-") => growth::row(&url, &conn, growth, calls).await,
        "reference-allow" | "reference-deny" => {
            let path = var("REDLIMIT_REFERENCE_SCRIPT");
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            let script = Arc::new(redis::Script::new(&text));
            let (name, rate) = if row == "reference-allow" {
                ("rate_limit:bench:ref:allow", HUGE_RATE)
            } else {
                ("rate_limit:bench:ref:deny", 10)
            };
            let config =
                redlimit::RateLimiterConfig::new(RateType::Overall, rate, minute).with_keep_alive(minute);
            client.rate_limiter(name).set_config(&config).await.unwrap();
            let call = reference_loop(&conn, &script, name);
            for _ in 0..calls {
                call().await;
            }
        }
        "one-allow" => {
            for _ in 0..calls {
                side_one().await.unwrap();
            }
        }
        "one-deny" => {
            for _ in 0..calls {
                let _ = side_deny().await;
            }
        }
        "three-allow" => {
            for _ in 0..calls {
                side_three().await.unwrap();
            }
        }
        "walk-deny-1" | "walk-deny-all" => {
            // A log of 100 000 one-permit grants, every permit taken; then refusals of
            // 1 permit, or of all 100 000 (which read at most the walk's entries).
            let (name, grants) = ("rate_limit:bench:walk", 100_000u64);
            let rule = Rule::new(name, grants, Duration::from_secs(600));
            assert!(
                client
                    .check_rules(std::slice::from_ref(&rule))
                    .await
                    .unwrap()
                    .allowed
            );
            // in batches, each short enough for a connection's reply timeout under an
            // instruction counter
            let fill = "local now = tonumber(redis.call('time')[1]) * 1000 \
                for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do \
                redis.call('zadd', KEYS[1], now, struct.pack('Bc0I', 16, string.format('%016d', i), 1)) end \
                redis.call('set', KEYS[2], '0', 'keepttl')";
            for first in (1..grants).step_by(1_000) {
                let _: () = redis::cmd("EVAL")
                    .arg(fill)
                    .arg(2)
                    .arg(format!("{{{name}}}:permits"))
                    .arg(format!("{{{name}}}:value"))
                    .arg(first)
                    .arg((first + 999).min(grants - 1))
                    .query_async(&mut conn.clone())
                    .await
                    .unwrap();
            }
            let permits = if row == "walk-deny-1" { 1 } else { grants };
            let rules = [rule.permits(permits)];
            for _ in 0..calls {
                assert!(!client.check_rules(&rules).await.unwrap().allowed);
            }
        }
        "bucket-allow" | "bucket-deny" => {
            // One token-bucket rule: granted every time (a bucket far larger than the
            // calls), or refused after its one token.
            let rule = if row == "bucket-allow" {
                Rule::new("rate_limit:bench:tb:allow", HUGE_RATE, minute).burst(HUGE_RATE)
            } else {
                Rule::new("rate_limit:bench:tb:deny", 1, Duration::from_secs(3600))
            };
            let rules = [rule.algorithm(redlimit::Algorithm::TokenBucket)];
            for _ in 0..calls {
                let _ = client.check_rules(&rules).await.unwrap();
            }
        }
        "flood-deny" => {
            // A flood of refused calls on one exhausted limiter, answered in process
            // after the first (the client's local refusals, on by default).
            let rules = [Rule::new("rate_limit:bench:flood", 1, Duration::from_secs(3600))];
            let _ = client.check_rules(&rules).await.unwrap();
            for _ in 0..calls {
                assert!(!client.check_rules(&rules).await.unwrap().allowed);
            }
        }
        "batch-1" | "batch-10" => {
            let rules = [batch_rule(if row == "batch-1" { 1 } else { 10 })];
            for _ in 0..calls {
                assert!(client.check_rules(&rules).await.unwrap().allowed);
            }
        }
        "rules-allow" | "reserve-allow" | "reserve-settle" | "reserve-overdraw" => {
            // One rule by hand: decided, reserved (the reservation dropped, its estimate
            // kept), or reserved then settled with one permit fewer (a refund: the
            // settle script finds the grant, rewrites it and moves the value) or one
            // more (an excess: the same, and the settle mark set).
            let rule = Rule::new("rate_limit:bench:settle", HUGE_RATE, minute).permits(2);
            let rules = [if row == "rules-allow" {
                rule
            } else {
                rule.settled()
            }];
            for _ in 0..calls {
                if row == "rules-allow" {
                    assert!(client.check_rules(&rules).await.unwrap().allowed);
                    continue;
                }
                let redlimit::Reserved::Granted(reservation) = client.reserve(&rules).await.unwrap() else {
                    panic!("a huge rate refused");
                };
                if row == "reserve-settle" {
                    assert!(reservation.settle(1).await.unwrap().rules[0].applied);
                } else if row == "reserve-overdraw" {
                    assert!(reservation.settle(3).await.unwrap().rules[0].applied);
                }
            }
        }
        "bucket-pending" | "reserve-bucket" | "reserve-bucket-settle" => {
            // A token bucket with reservations pending: a plain call on it (one
            // reservation made first and kept), a reservation (each one dropped: its
            // grant stays named in the bucket's segments, at most 128), a reservation
            // then its settle with one token fewer. Each takes the general script. A
            // burst far larger than the calls, refilled at 1 000 a minute: the bucket
            // is never full again within a run, so it and its segments stay.
            let rule = Rule::new("rate_limit:bench:tb:pending", 1_000, minute)
                .burst(HUGE_RATE)
                .algorithm(redlimit::Algorithm::TokenBucket);
            let settled = [rule.clone().permits(2).settled()];
            let reserve = || async {
                let redlimit::Reserved::Granted(reservation) = client.reserve(&settled).await.unwrap() else {
                    panic!("a huge bucket refused");
                };
                reservation
            };
            let _kept = reserve().await;
            let plain = [rule];
            for _ in 0..calls {
                match row.as_str() {
                    "bucket-pending" => assert!(client.check_rules(&plain).await.unwrap().allowed),
                    "reserve-bucket" => drop(reserve().await),
                    _ => assert!(reserve().await.settle(1).await.unwrap().rules[0].applied),
                }
            }
        }
        "governor-check" => {
            // The anchor: governor's keyed check of one exhausted key, in process.
            let limiter =
                governor::RateLimiter::keyed(governor::Quota::per_hour(NonZeroU32::new(1).unwrap()));
            let _ = limiter.check_key(&1u64);
            for _ in 0..calls {
                assert!(limiter.check_key(std::hint::black_box(&1u64)).is_err());
            }
        }
        other => panic!(
            "REDLIMIT_BENCH_ROW={other}: expected a growth- row, reference-allow, reference-deny, one-allow, one-deny, \
             three-allow, walk-deny-1, walk-deny-all, bucket-allow, bucket-deny, flood-deny, governor-check, \
             batch-1, batch-10, rules-allow, reserve-allow, reserve-settle, reserve-overdraw, bucket-pending, \
             reserve-bucket or reserve-bucket-settle"
        ),
    }
}

fn in_process() {
    const KEYS: usize = 1000;
    const DECISIONS: usize = 2_000_000;
    let quota = NonZeroU32::new(1000).unwrap();
    println!("## In process: {KEYS} keys, quota 1000/s per key\n");
    println!("| | 1 thread: ns per decision | 2 threads: ns per decision, per thread | 2 threads: decisions/s in total (x one thread's) |");
    println!("|---|---:|---:|---:|");

    let client = Client::memory();
    let rules: Arc<Vec<[Rule; 1]>> = Arc::new(
        (0..KEYS)
            .map(|k| {
                [Rule::new(
                    format!("rate_limit:bench:mem:{k}"),
                    1000,
                    Duration::from_secs(1),
                )]
            })
            .collect(),
    );
    let ours = |threads: usize| {
        run_threads(threads, DECISIONS, {
            let (client, rules) = (client.clone(), rules.clone());
            move |n| {
                let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
                runtime.block_on(async {
                    for i in 0..n {
                        let _ = client.check_rules(&rules[i % KEYS]).await.unwrap();
                    }
                });
            }
        })
    };
    let (ours_1, ours_2) = (ours(1), ours(2));
    println!(
        "| redlimit memory backend (`check_rules`) | {} |",
        row(ours_1, ours_2)
    );

    let limiter = Arc::new(governor::RateLimiter::keyed(governor::Quota::per_second(quota)));
    let theirs = |threads: usize| {
        run_threads(threads, DECISIONS, {
            let limiter = limiter.clone();
            move |n| {
                for i in 0..n {
                    let _ = limiter.check_key(&(i % KEYS));
                }
            }
        })
    };
    let (gov_1, gov_2) = (theirs(1), theirs(2));
    println!("| governor keyed (`check_key`) | {} |", row(gov_1, gov_2));
    println!(
        "\nratio (redlimit / governor), ns per decision, 1 thread: {:.1}x, 2 threads: {:.1}x",
        ours_1.per_thread_ns / gov_1.per_thread_ns,
        ours_2.per_thread_ns / gov_2.per_thread_ns
    );
    live_keys();
}

/// The resident memory of this process, in bytes (Linux; 0 elsewhere).
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Section 5, second table: one thread's decisions with `keys` limiters live (each
/// granted once, within a 60 s window), on one hot key (a rule that always grants, so
/// every decision writes) and on every live key in turn; and the resident memory the
/// live limiters added, per limiter. The clients are kept to the end, so each row's
/// limiters take fresh memory.
fn live_keys() {
    // On a thread of its own: the caller may be inside the benchmark's runtime.
    std::thread::spawn(live_keys_on_this_thread).join().unwrap();
}

fn live_keys_on_this_thread() {
    const HOT: usize = 2_000_000;
    println!("\n## In process: one thread, 1 000 to 1 000 000 live limiters\n");
    println!("| live limiters | ns per decision, one hot key | ns per decision, every key in turn | resident bytes per limiter |");
    println!("|---:|---:|---:|---:|");
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let mut kept = Vec::new();
    for keys in [1_000usize, 100_000, 1_000_000] {
        let client = Client::builder().max_limiters(keys + 1).memory();
        let rules: Vec<[Rule; 1]> = (0..keys)
            .map(|k| {
                [Rule::new(
                    format!("rate_limit:bench:live:{k}"),
                    HUGE_RATE,
                    Duration::from_secs(60),
                )]
            })
            .collect();
        let hot = [Rule::new(
            "rate_limit:bench:hot",
            HUGE_RATE,
            Duration::from_secs(1),
        )];
        let (hot_ns, turn_ns, bytes) = runtime.block_on(async {
            let before = resident_bytes();
            for rule in &rules {
                assert!(client.check_rules(rule).await.unwrap().allowed);
            }
            let bytes = resident_bytes().saturating_sub(before) as f64 / keys as f64;
            let started = Instant::now();
            for _ in 0..HOT {
                let _ = client.check_rules(&hot).await.unwrap();
            }
            let hot_ns = started.elapsed().as_nanos() as f64 / HOT as f64;
            let turns = keys.max(HOT);
            let started = Instant::now();
            for i in 0..turns {
                let _ = client.check_rules(&rules[i % keys]).await.unwrap();
            }
            let turn_ns = started.elapsed().as_nanos() as f64 / turns as f64;
            (hot_ns, turn_ns, bytes)
        });
        println!("| {keys} | {hot_ns:.0} | {turn_ns:.0} | {bytes:.0} |");
        kept.push((client, rules));
    }
}

/// One run of `run_threads`.
#[derive(Clone, Copy)]
struct Run {
    /// Each thread's time over its decisions, averaged over the threads.
    per_thread_ns: f64,
    /// Decisions of all threads over the wall time.
    total_per_s: f64,
}

fn row(one: Run, two: Run) -> String {
    format!(
        "{:.0} | {:.0} | {:.0} ({:.2}x)",
        one.per_thread_ns,
        two.per_thread_ns,
        two.total_per_s,
        two.total_per_s / one.total_per_s
    )
}

/// `total` decisions split over `threads`, each thread timed on its own.
fn run_threads(threads: usize, total: usize, work: impl Fn(usize) + Send + Sync + Clone + 'static) -> Run {
    let started = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let work = work.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                work(total / threads);
                started.elapsed()
            })
        })
        .collect();
    let per_thread: Vec<Duration> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let wall = started.elapsed();
    let per_decision = per_thread.iter().map(|d| d.as_nanos() as f64).sum::<f64>() / total as f64;
    Run {
        per_thread_ns: per_decision,
        total_per_s: total as f64 / wall.as_secs_f64(),
    }
}

/// One global limiter, never refusing, taking `k` permits from Redis at a time.
fn batch_rule(k: u64) -> Rule {
    Rule::new("rate_limit:bench:batch", HUGE_RATE, Duration::from_secs(1)).batch(k)
}

/// Section 10: decisions per second on one global limiter from `TASKS` tasks, and
/// Redis script calls per decision, at k = 1 and k = 10.
async fn batches(client: &Client, conn: &mut MultiplexedConnection) {
    println!("\n10. One global limiter served in batches ({TASKS} tasks, one client, {RUN:?} each)\n");
    println!("| batch | decisions/s | p50 | p99 | script calls per decision |");
    println!("|---:|---:|---:|---:|---:|");
    for k in [1, 10] {
        reset(conn).await;
        let client = client.clone();
        let (per_s, latencies) = load(move || {
            let client = client.clone();
            async move {
                assert!(client.check_rules(&[batch_rule(k)]).await.unwrap().allowed);
            }
        })
        .await;
        let calls = command_stat(conn, "evalsha", "calls").await;
        let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
        println!(
            "| {k} | {per_s:.0} | {:?} | {:?} | {:.3} |",
            at(0.5),
            at(0.99),
            calls / latencies.len() as f64
        );
    }
}

/// Section 9: `GRANTERS` tasks granting on limiters of their own, alone and then
/// beside `FLOODERS` tasks calling an exhausted limiter, on one client; with the
/// client's local refusals on and off.
async fn flood(url: &str, conn: &mut MultiplexedConnection) {
    const GRANTERS: usize = 8;
    const FLOODERS: usize = 32;
    println!("\n9. A flood of refused calls beside grants of other limiters ({GRANTERS} granting tasks, {FLOODERS} flooding, {RUN:?} each)\n");
    println!("| local refusals | grants/s alone | grants/s under the flood | under / alone | refused calls/s | Redis commands per refused call |");
    println!("|---|---:|---:|---:|---:|---:|");
    for local in [true, false] {
        let client = Client::builder()
            .local_refusals(local)
            .connect(url)
            .await
            .unwrap();
        let exhausted = [Rule::new(
            format!("rate_limit:bench:flood:{local}"),
            1,
            Duration::from_secs(3600),
        )];
        let _ = client.check_rules(&exhausted).await.unwrap();
        let alone = granting(&client, GRANTERS, None).await;
        reset(conn).await;
        let refused = Arc::new(AtomicU64::new(0));
        let under = granting(&client, GRANTERS, Some((FLOODERS, exhausted, refused.clone()))).await;
        let commands = command_stat(conn, "evalsha", "calls").await;
        let refused = refused.load(Ordering::Relaxed) as f64;
        // The granters' own script calls are not the flood's.
        let flood_commands = (commands - under * RUN.as_secs_f64()).max(0.0);
        println!(
            "| {} | {alone:.0} | {under:.0} | {:.2} | {:.0} | {:.4} |",
            if local { "on" } else { "off" },
            under / alone,
            refused / RUN.as_secs_f64(),
            flood_commands / refused.max(1.0)
        );
    }
}

/// Grants per second of `tasks` tasks, each on a limiter of its own, for `RUN`; with
/// `flood`, as many more tasks call the exhausted rules meanwhile, counting refusals.
async fn granting(client: &Client, tasks: usize, flood: Option<(usize, [Rule; 1], Arc<AtomicU64>)>) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let granted = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (client, stop, granted) = (client.clone(), stop.clone(), granted.clone());
        handles.push(tokio::spawn(async move {
            let rules = [Rule::new(
                format!("rate_limit:bench:granter:{task}"),
                HUGE_RATE,
                Duration::from_secs(1),
            )];
            while !stop.load(Ordering::Relaxed) {
                if client.check_rules(&rules).await.unwrap().allowed {
                    granted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    if let Some((flooders, rules, refused)) = flood {
        for _ in 0..flooders {
            let (client, stop, rules, refused) =
                (client.clone(), stop.clone(), rules.clone(), refused.clone());
            handles.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if !client.check_rules(&rules).await.unwrap().allowed {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                    // Answered in process without awaiting anything: let the others run.
                    tokio::task::yield_now().await;
                }
            }));
        }
    }
    tokio::time::sleep(RUN).await;
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.await.unwrap();
    }
    granted.load(Ordering::Relaxed) as f64 / RUN.as_secs_f64()
}
