//! redlimit on a local Redis Cluster (3 primaries; with 3 replicas for the failover
//! test): the runtime API, slots, rules on one slot and across slots, resharding
//! under load, and a primary killed with its replica promoted.

use redlimit_test_support as support;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redlimit::keys::hash_slot;
use redlimit::{rate_limit, Client, RateLimited, RateType, Rule};
use support::cluster::{cli, RedisCluster};

const SEC: Duration = Duration::from_secs(1);

/// A name starting with `prefix` whose slot satisfies `accept`.
fn name_in(prefix: &str, accept: impl Fn(u16) -> bool) -> String {
    (0..100_000)
        .map(|i| format!("{prefix}{i}"))
        .find(|name| accept(hash_slot(name.as_bytes())))
        .unwrap()
}

async fn raw(cluster: &RedisCluster) -> redis::cluster_async::ClusterConnection {
    redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_runtime_api_works_on_a_cluster_and_keeps_a_limiter_in_one_slot() {
    let cluster = RedisCluster::start(3, 0);
    let client = Client::connect(&cluster.url()).await.unwrap();
    let limiter = client.rate_limiter("rate_limit:user:42");
    assert!(limiter.try_set_rate(RateType::Overall, 2, SEC).await.unwrap());
    assert!(limiter.try_acquire(1).await.unwrap());
    assert!(limiter.try_acquire(1).await.unwrap());
    let refused = limiter.check(1).await.unwrap();
    assert!(!refused.allowed && refused.retry_after.is_some());
    assert_eq!(limiter.available_permits().await.unwrap(), 0);
    assert_eq!(limiter.config().await.unwrap().unwrap().rate, 2);
    assert!(
        limiter.try_acquire_for(1, Duration::from_secs(2)).await.unwrap(),
        "waiting works"
    );
    limiter.keep_alive(Duration::from_secs(30)).await.unwrap();
    assert!(limiter.expire(Duration::from_secs(60)).await.unwrap());
    assert!(limiter.is_exists().await.unwrap());

    // The five keys share the slot the server computes, which is ours.
    let keys = limiter.keys().unwrap().clone();
    let slot = cluster.keyslot(keys.config());
    for key in keys.all() {
        assert_eq!(cluster.keyslot(&key), slot, "{key}");
        assert_eq!(hash_slot(key.as_bytes()), slot, "{key}");
    }
    for key in ["a", "rate_limit:x", "{t}:y", "émoji🦀", "x{}y{z}"] {
        assert_eq!(hash_slot(key.as_bytes()), cluster.keyslot(key), "{key}");
    }
    assert!(limiter.delete().await.unwrap());
    assert!(!limiter.is_exists().await.unwrap());

    // Per-client rules, and the cluster URL through connect_cluster.
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let other = Client::connect_cluster(&nodes).await.unwrap();
    let rule = [Rule::new("rate_limit:pc", 1, SEC).mode(RateType::PerClient)];
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    assert!(other.check_rules(&rule).await.unwrap().allowed, "its own bucket");
    assert!(!client.check_rules(&rule).await.unwrap().allowed);

    // A lazily connected cluster client (what REDIS_URL=redis+cluster://... gives).
    let lazy = Client::builder().connect_lazy(&cluster.url()).unwrap();
    let shared = [Rule::new("rate_limit:lazy", 1, SEC)];
    assert!(lazy.check_rules(&shared).await.unwrap().allowed);
    assert!(
        !client.check_rules(&shared).await.unwrap().allowed,
        "the same limiter, seen by both"
    );
}

#[tokio::test]
async fn rules_on_one_slot_take_one_call_and_across_slots_stay_all_or_nothing() {
    let cluster = RedisCluster::start(3, 0);
    let client = Client::connect(&cluster.url()).await.unwrap();

    // A user-written hash tag keeps stacked rules in one slot: one script call.
    let tagged = [
        Rule::new("rate_limit:{tenant:7}:orders", 10, SEC),
        Rule::new("rate_limit:{tenant:7}:exports", 10, SEC),
        Rule::new("rate_limit:{tenant:7}:logins", 10, SEC),
    ];
    client.check_rules(&tagged).await.unwrap();
    cluster.reset_stats();
    for _ in 0..5 {
        assert!(client.check_rules(&tagged).await.unwrap().allowed);
    }
    assert_eq!(cluster.command_calls("evalsha"), 5);

    // Rules on different slots: the later refuses, the earlier's keys are unspent.
    let first = name_in("rate_limit:first:", |s| s < 5000);
    let second = name_in("rate_limit:second:", |s| s > 11_000);
    assert_ne!(
        cluster.primary_of(hash_slot(first.as_bytes())).0,
        cluster.primary_of(hash_slot(second.as_bytes())).0
    );
    let rules = [
        Rule::new(first.clone(), 5, Duration::from_secs(60)),
        Rule::new(second, 1, Duration::from_secs(60)),
    ];
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    let mut raw = raw(&cluster).await;
    let value_key = format!("{{{first}}}:value");
    let log_key = format!("{{{first}}}:permits");
    // Each compensation counts one refund (a recorder for this thread only).
    #[cfg(feature = "metrics")]
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    #[cfg(feature = "metrics")]
    let recording = metrics::set_default_local_recorder(&recorder);
    for _ in 0..5 {
        let refused = client.check_rules(&rules).await.unwrap();
        assert_eq!(refused.refused_by, Some(1));
        assert_eq!(refused.remaining, 0);
        let value: String = raw.get(&value_key).await.unwrap();
        let logged: usize = raw.zcard(&log_key).await.unwrap();
        assert_eq!(
            (value.as_str(), logged),
            ("4", 1),
            "the first rule's permit was given back"
        );
    }
    #[cfg(feature = "metrics")]
    {
        drop(recording);
        let refunds: u64 = recorder
            .snapshotter()
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == "redlimit_refunds_total")
            .map(|(.., value)| match value {
                metrics_util::debugging::DebugValue::Counter(n) => n,
                _ => 0,
            })
            .sum();
        assert_eq!(refunds, 5, "one refund per refused call");
    }
    assert_eq!(client.rate_limiter(first).available_permits().await.unwrap(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_under_load_surfaces_no_error_and_the_limit_holds() {
    let cluster = RedisCluster::start(3, 0);
    // What is tested is that redirects during the move are followed, not latency: on
    // a two-core machine running the whole suite, a node busy migrating keys has
    // stalled past the default 250 ms timeout, so this client waits up to 2 s.
    let client = Client::builder()
        .command_timeout(Duration::from_secs(2))
        .connect(&cluster.url())
        .await
        .unwrap();
    let (from_port, from) = cluster.primary_of(0);
    let to = cluster
        .primaries()
        .into_iter()
        .find(|(p, _)| *p != from_port)
        .unwrap()
        .1;
    let (rate, interval) = (20u64, 300u64);
    let names: Vec<String> = (0..4)
        .map(|i| name_in(&format!("rate_limit:moving:{i}:"), |s| s < 2000))
        .collect();
    let errors = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let client = client.clone();
            let rule = [Rule::new(
                names[i % names.len()].clone(),
                rate,
                Duration::from_millis(interval),
            )];
            let (errors, stop) = (errors.clone(), stop.clone());
            tokio::spawn(async move {
                let mut grants = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    match client.check_rules(&rule).await {
                        Ok(decision) if decision.allowed => grants.push(decision.at_ms),
                        Ok(decision) => tokio::time::sleep(decision.retry_after.unwrap() / 2).await,
                        Err(err) => {
                            eprintln!("{err}");
                            errors.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
                (rule[0].name().to_owned(), grants)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Move slots 0..2000 (and more) from one primary to another while calls run.
    let port = from_port.to_string();
    let address = format!("127.0.0.1:{port}");
    let reshard = tokio::task::spawn_blocking(move || {
        cli(&[
            "--cluster",
            "reshard",
            &address,
            "--cluster-from",
            &from,
            "--cluster-to",
            &to,
            "--cluster-slots",
            "2500",
            "--cluster-yes",
        ])
    });
    reshard.await.unwrap();
    cluster.wait_until_ok();
    let moved_to = cluster.primary_of(hash_slot(names[0].as_bytes())).0;
    assert_ne!(moved_to, from_port, "the limiters' slots moved");
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    let mut per_limiter: HashMap<String, Vec<u64>> = HashMap::new();
    for task in tasks {
        let (name, grants) = task.await.unwrap();
        per_limiter.entry(name).or_default().extend(grants);
    }
    assert_eq!(
        errors.load(Ordering::SeqCst),
        0,
        "errors surfaced during the reshard"
    );
    for (name, mut times) in per_limiter {
        times.sort_unstable();
        let mut start = 0;
        for end in 0..times.len() {
            while times[end] - times[start] >= interval {
                start += 1;
            }
            assert!(
                (end - start + 1) as u64 <= rate,
                "{name}: more than {rate} in one window"
            );
        }
        assert!(
            times.len() as u64 > 2 * rate,
            "{name} kept granting: {}",
            times.len()
        );
    }
}

#[rate_limit(key = "failover:{user}", rate = 1000, interval = "1s", on_error = "local")]
async fn guarded(user: &str) -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_fails_over_and_calls_recover_by_themselves() {
    let timeout = Duration::from_millis(200);
    let mut cluster = RedisCluster::start(3, 1);
    let client = Client::builder()
        .command_timeout(timeout)
        .connect(&cluster.url())
        .await
        .unwrap();
    redlimit::set_default(client).unwrap();
    let key = "rate_limit:failover:alice";
    guarded("alice").await.unwrap();
    let (primary, _) = cluster.primary_of(hash_slot(key.as_bytes()));
    cluster.kill(primary);
    let killed = Instant::now();

    // During the gap calls go through on_error ("local") and return promptly; then the
    // replica is promoted and Redis decides again, without any restart.
    let mut slowest = Duration::ZERO;
    let recovered = loop {
        let started = Instant::now();
        guarded("alice").await.unwrap();
        slowest = slowest.max(started.elapsed());
        let promoted = cluster
            .try_primary_of(hash_slot(key.as_bytes()))
            .map(|(port, _)| port);
        if let Some(now_primary) = promoted.filter(|&p| p != primary) {
            let mut conn = redis::Client::open(format!("redis://127.0.0.1:{now_primary}/"))
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let before: usize = conn.zcard(format!("{{{key}}}:permits")).await.unwrap_or(0);
            guarded("alice").await.unwrap();
            let after: usize = conn.zcard(format!("{{{key}}}:permits")).await.unwrap_or(0);
            if after > before {
                break killed.elapsed();
            }
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "no recovery within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!("decided by the promoted replica {recovered:?} after the kill; slowest call {slowest:?}");
    assert!(
        slowest < timeout + Duration::from_millis(400),
        "a call took {slowest:?}"
    );
}

#[tokio::test]
async fn a_token_bucket_in_an_earlier_slot_gets_its_tokens_back() {
    let cluster = RedisCluster::start(3, 0);
    let client = Client::connect(&cluster.url()).await.unwrap();
    let bucket = name_in("rate_limit:tb:", |s| s < 5000);
    let window = name_in("rate_limit:w:", |s| s > 11_000);
    let rules = [
        Rule::new(bucket.clone(), 5, Duration::from_secs(60))
            .algorithm(redlimit::Algorithm::TokenBucket)
            .permits(2),
        Rule::new(window, 1, Duration::from_secs(60)),
    ];
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    let handle = client.token_bucket(bucket, 5, Duration::from_secs(60));
    assert_eq!(handle.available().await.unwrap(), 3);
    for _ in 0..3 {
        let refused = client.check_rules(&rules).await.unwrap();
        assert_eq!(refused.refused_by, Some(1));
        assert_eq!(
            handle.available().await.unwrap(),
            3,
            "the window refused: the tokens came back"
        );
    }

    // A warming bucket (coldness up to 5 tokens, half of it 2.5) gets back the plain
    // tokens, not the extra its coldness charged: fewer calls pass, never more.
    let warming = name_in("rate_limit:tbw:", |s| s < 5000);
    let rules = [
        Rule::new(warming.clone(), 5, Duration::from_secs(60))
            .algorithm(redlimit::Algorithm::TokenBucket)
            .burst(20)
            .warmup(Duration::from_secs(60))
            .permits(2),
        Rule::new(
            name_in("rate_limit:w2:", |s| s > 11_000),
            1,
            Duration::from_secs(60),
        ),
    ];
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    let handle = client
        .token_bucket(warming, 5, Duration::from_secs(60))
        .burst(20)
        .warmup(Duration::from_secs(60));
    assert_eq!(
        handle.available().await.unwrap(),
        14,
        "2 permits cost 6 tokens cold"
    );
    // Still above half cold: 2 permits cost 2.8 tokens, 2 come back.
    let refused = client.check_rules(&rules).await.unwrap();
    assert_eq!(refused.refused_by, Some(1));
    assert_eq!(handle.available().await.unwrap(), 13);
    // Warm now: 2 taken, 2 given back.
    for _ in 0..2 {
        assert_eq!(client.check_rules(&rules).await.unwrap().refused_by, Some(1));
        assert_eq!(handle.available().await.unwrap(), 13);
    }
}

/// A token bucket given its tokens back (its slot granted, a later one refused) gets
/// nothing when its stored text is not one the scripts read exactly: the refund's own
/// call, as MONITOR shows the client sent it, sent again over each such text leaves it
/// as it was (without the check it wrote the rounded or wrapped sum, or made a corrupt
/// text a full bucket), and over a bucket it reads, gives the tokens back.
#[tokio::test]
async fn a_refund_leaves_a_bucket_it_cannot_read_exactly_as_it_was() {
    let cluster = RedisCluster::start(3, 0);
    let client = Client::connect(&cluster.url()).await.unwrap();
    let bucket = name_in("rate_limit:tbr:", |s| s < 5000);
    let key = format!("{{{bucket}}}:bucket");
    let (port, _) = cluster.primary_of(hash_slot(bucket.as_bytes()));
    let monitor = support::monitor::Monitor::start(port);
    let rules = [
        Rule::new(bucket.clone(), 5, Duration::from_secs(60))
            .algorithm(redlimit::Algorithm::TokenBucket)
            .permits(2),
        Rule::new(
            name_in("rate_limit:wr:", |s| s > 11_000),
            1,
            Duration::from_secs(60),
        ),
    ];
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    assert_eq!(client.check_rules(&rules).await.unwrap().refused_by, Some(1));
    // (sha, 1, the bucket's key, the tokens to give back)
    let refund = monitor
        .client_script_calls()
        .into_iter()
        .find(|args| args.len() == 4 && args[2] == key.as_bytes())
        .expect("the refund's call");
    let mut node = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let now = 1_700_000_000_000u64;
    for text in [
        format!("1:1000:5:9007199254740993:{now}"),
        format!("1:3002399751580331:3:9007199254740992:{now}"),
        format!("1:1000:5:-4503599627370497:{now}"),
        format!("1:1000:5:-9999999999999999:{now}"),
        format!("1:99999999999999999999:99999999999999999999:99999999999999999999:{now}"),
        format!("1:1000:5:-1:{now}|{now}.99999999999999999999.100000000000001"),
        format!("1:1000:5:-1:{now}|{now}.0000000000000000000001.100000000000001"),
    ] {
        let _: () = node.set(&key, &text).await.unwrap();
        let given: i64 = redis::cmd("EVALSHA")
            .arg(refund.clone())
            .query_async(&mut node)
            .await
            .unwrap();
        let stored: String = node.get(&key).await.unwrap();
        assert_eq!((given, stored.as_str()), (0, text.as_str()), "{text}");
    }
    let _: () = node.set(&key, format!("5:60000:5:120000:{now}")).await.unwrap();
    let given: i64 = redis::cmd("EVALSHA")
        .arg(refund)
        .query_async(&mut node)
        .await
        .unwrap();
    let stored: String = node.get(&key).await.unwrap();
    assert_eq!((given, stored), (1, format!("5:60000:5:240000:{now}")));
}

/// A settle across slots dropped after its first poll (its caller gone): it is sent
/// from a task of its own, so the slot after the first is settled too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_across_slots_dropped_after_its_first_poll_lands_in_each() {
    let cluster = RedisCluster::start(3, 0);
    let client = Client::connect(&cluster.url()).await.unwrap();
    for round in 0..5 {
        let first = name_in(&format!("rate_limit:s{round}a:"), |s| s < 5000);
        let second = name_in(&format!("rate_limit:s{round}b:"), |s| s > 11_000);
        let rule = |name: &str| {
            Rule::new(name, 1_000, Duration::from_secs(60))
                .settled()
                .permits(10)
        };
        let reservation = match client.reserve(&[rule(&first), rule(&second)]).await.unwrap() {
            redlimit::Reserved::Granted(reservation) => reservation,
            redlimit::Reserved::Refused(refused) => panic!("refused: {refused:?}"),
        };
        let mut settle = Box::pin(reservation.settle(900));
        let waker = std::task::Waker::noop();
        // (answered at once when its task was done first: landed too)
        let _ = settle.as_mut().poll(&mut std::task::Context::from_waker(waker));
        drop(settle);
        for name in [first, second] {
            let limiter = client.rate_limiter(&name);
            let charged = async {
                while limiter.available_permits().await.unwrap() != 100 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            };
            let waited = tokio::time::timeout(Duration::from_secs(2), charged).await;
            let left = limiter.available_permits().await.unwrap();
            assert!(
                waited.is_ok(),
                "round {round}, {name}: 900 used of 10, {left} left"
            );
        }
    }
}

/// A reservation across slots decides each slot in turn, a later one at a later time
/// when its limiter was written then (by a client whose clock is ahead, within the
/// reordering margin): each slot's token bucket was refilled at its own slot's time,
/// and its settle counts what refilled since from there. Counted from the later time,
/// a bucket of 1 000 every 10 s in the earlier slot, emptied by the reservation,
/// refilled 90 over the 900 ms and emptied again, was given back 999 where it would
/// hold 910; counted from the earlier, the later slot's bucket was given back 90 too
/// few (909, where 998).
#[tokio::test]
async fn a_settle_across_slots_counts_a_bucket_s_refill_from_its_own_slot_s_time() {
    let cluster = RedisCluster::start(3, 0);
    let start = 1_700_000_000_000;
    let clock = redlimit::ManualClock::new(start);
    let url = cluster.url();
    let connect = |clock: redlimit::ManualClock| Client::builder().clock(clock).connect(&url);
    let client = connect(clock.clone()).await.unwrap();
    let ahead = connect(redlimit::ManualClock::new(start + 900)).await.unwrap();
    let first = name_in("rate_limit:bucket:a:", |s| s < 5000);
    let second = name_in("rate_limit:bucket:b:", |s| s > 11_000);
    let rule = |name: &str| Rule::new(name, 1_000, 10 * SEC).algorithm(redlimit::Algorithm::TokenBucket);
    assert!(ahead.check_rules(&[rule(&second)]).await.unwrap().allowed);
    let rules = [
        rule(&first).settled().permits(1_000),
        rule(&second).settled().permits(999),
    ];
    let reservation = match client.reserve(&rules).await.unwrap() {
        redlimit::Reserved::Granted(reservation) => reservation,
        redlimit::Reserved::Refused(refused) => panic!("refused: {refused:?}"),
    };
    assert_eq!(
        reservation.decision().at_ms,
        start + 900,
        "the second slot's time"
    );
    clock.set(start + 900);
    assert!(
        client
            .check_rules(&[rule(&first).permits(90)])
            .await
            .unwrap()
            .allowed
    );
    assert!(!client.check_rules(&[rule(&first)]).await.unwrap().allowed);
    // A settle of 0 counts 1. The first: had the grant taken 1, 999 left, refilled to
    // 1 000 (89 past the burst), 90 taken since. The second: 998 at once.
    let settled = reservation.settle(0).await.unwrap();
    let left: Vec<u64> = settled.rules.iter().map(|r| r.remaining).collect();
    assert_eq!(left, [910, 998]);
}
