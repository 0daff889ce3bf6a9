//! Refusals answered in process, against a real redis-server: a flood of refused calls
//! on one limiter costs Redis one script call, each answer is the one Redis would
//! give, the wait is never extended, and each off switch sends every call to Redis.

use redlimit_test_support as support;

use std::time::Duration;

use redlimit::{Client, Decision, ManualClock, Rule};
use support::RedisServer;

const T0: u64 = 1_700_000_000_000;
const MINUTE: Duration = Duration::from_secs(60);

async fn client(server: &RedisServer, clock: &ManualClock, local_refusals: bool) -> Client {
    Client::builder()
        .clock(clock.clone())
        .local_refusals(local_refusals)
        .connect(&server.url())
        .await
        .unwrap()
}

fn evalshas(commands: &[String]) -> usize {
    commands
        .iter()
        .filter(|c| c.as_str() == "EVALSHA" || c.as_str() == "EVAL")
        .count()
}

#[tokio::test]
async fn a_flood_of_refusals_costs_redis_one_call_and_each_answer_is_redis_s() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let cached = client(&server, &clock, true).await;
    let exact = client(&server, &clock, false).await;
    for algorithm in [
        redlimit::Algorithm::SlidingWindow,
        redlimit::Algorithm::TokenBucket,
    ] {
        let name = format!("rate_limit:flood:{algorithm:?}");
        let rule = [Rule::new(name.as_str(), 2, MINUTE).algorithm(algorithm)];
        clock.set(T0);
        for _ in 0..2 {
            assert!(cached.check_rules(&rule).await.unwrap().allowed);
        }
        let monitor = support::monitor::Monitor::start(server.port);
        let mut refused: Vec<Decision> = Vec::new();
        for _ in 0..1_000 {
            refused.push(cached.check_rules(&rule).await.unwrap());
        }
        let calls = evalshas(&monitor.client_commands());
        assert!(refused.iter().all(|d| !d.allowed), "{algorithm:?}");
        assert!(
            calls <= 1,
            "{algorithm:?}: {calls} script calls for 1 000 refusals"
        );
        let wait = refused[0].retry_after.unwrap().as_millis() as u64;
        // Later in the wait: what Redis says, to the millisecond.
        for step in [1, wait / 3, wait - 1] {
            clock.set(T0 + step);
            let local = cached.check_rules(&rule).await.unwrap();
            let redis = exact.check_rules(&rule).await.unwrap();
            assert_eq!(local, redis, "{algorithm:?} at +{step} ms");
        }
        // The client's clock set back within the second Redis decides a call at the
        // limiter's own time: decided by Redis, whose wait the one kept would
        // overstate by the time set back (a 60 s wait answered 60.276 s).
        clock.set(T0 - 276);
        let local = cached.check_rules(&rule).await.unwrap();
        let redis = exact.check_rules(&rule).await.unwrap();
        assert_eq!(local, redis, "{algorithm:?} at -276 ms");
        // The wait over: decided by Redis again, and granted.
        clock.set(T0 + wait);
        let monitor = support::monitor::Monitor::start(server.port);
        assert!(cached.check_rules(&rule).await.unwrap().allowed, "{algorithm:?}");
        assert_eq!(evalshas(&monitor.client_commands()), 1);
    }
}

#[tokio::test]
async fn another_clients_release_is_seen_when_the_wait_ends_never_later() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let cached = client(&server, &clock, true).await;
    let other = client(&server, &clock, false).await;
    let rule = [Rule::new("rate_limit:flood:release", 1, MINUTE)];
    assert!(cached.check_rules(&rule).await.unwrap().allowed);
    let refused = cached.check_rules(&rule).await.unwrap();
    assert_eq!(refused.retry_after, Some(MINUTE));
    other
        .rate_limiter("rate_limit:flood:release")
        .release(1)
        .await
        .unwrap();
    clock.set(T0 + 1_000);
    // Redis would grant now; the client answers the refusal it kept, with what is
    // left of the wait Redis gave, and no longer.
    let kept = cached.check_rules(&rule).await.unwrap();
    assert_eq!(
        (kept.allowed, kept.retry_after),
        (false, Some(Duration::from_secs(59)))
    );
    clock.set(T0 + 60_000);
    assert!(cached.check_rules(&rule).await.unwrap().allowed);
}

/// A reservation this client is granted, and a settle it makes, drop the refusals it
/// kept of their limiters, as a grant of a call does: each answer after them is
/// Redis's. (Kept, a settle's permits given back were refused until the wait Redis gave
/// had passed, 59 s of a minute's window; a reservation's grant left the next call
/// refused with the remaining of before it.)
#[tokio::test]
async fn a_reservation_and_its_settle_drop_the_refusals_kept_of_their_limiters() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let cached = client(&server, &clock, true).await;
    let exact = client(&server, &clock, false).await;
    let reserve = |client: &Client, rule: Rule| {
        let client = client.clone();
        async move {
            match client.reserve(&[rule]).await.unwrap() {
                redlimit::Reserved::Granted(reservation) => reservation,
                redlimit::Reserved::Refused(refused) => panic!("refused: {refused:?}"),
            }
        }
    };
    // Settled with one permit fewer: the next call passes.
    let settled = Rule::new("rate_limit:kept:settle", 3, MINUTE).keep_alive(None);
    let reservation = reserve(&cached, settled.clone().settled().permits(3)).await;
    assert!(
        !cached
            .check_rules(std::slice::from_ref(&settled))
            .await
            .unwrap()
            .allowed
    );
    reservation.settle(2).await.unwrap();
    let after = cached.check_rules(std::slice::from_ref(&settled)).await.unwrap();
    assert!(after.allowed, "{after:?}");
    // A reservation granted: the next call is answered as Redis answers it.
    let reserved = Rule::new("rate_limit:kept:reserve", 5, MINUTE).keep_alive(None);
    assert!(
        cached
            .check_rules(std::slice::from_ref(&reserved))
            .await
            .unwrap()
            .allowed
    );
    let five = reserved.clone().permits(5);
    assert_eq!(
        cached
            .check_rules(std::slice::from_ref(&five))
            .await
            .unwrap()
            .remaining,
        4
    );
    let _kept = reserve(&cached, reserved.clone().settled().permits(3)).await;
    let answered = cached.check_rules(std::slice::from_ref(&five)).await.unwrap();
    let redis = exact.check_rules(std::slice::from_ref(&five)).await.unwrap();
    assert_eq!(
        (answered.remaining, answered.retry_after),
        (redis.remaining, redis.retry_after)
    );
    assert_eq!(answered.remaining, 1);
}

#[tokio::test]
async fn each_off_switch_and_each_other_call_goes_to_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let on = client(&server, &clock, true).await;
    let off = client(&server, &clock, false).await;
    let cases: [(&Client, Rule); 3] = [
        (&off, Rule::new("rate_limit:flood:off", 1, MINUTE)),
        (
            &on,
            Rule::new("rate_limit:flood:rule_off", 1, MINUTE).local_refusals(false),
        ),
        // a warm-up makes a refusal's answer change before its wait ends
        (
            &on,
            Rule::new("rate_limit:flood:warm", 10, MINUTE)
                .algorithm(redlimit::Algorithm::TokenBucket)
                .warmup(MINUTE),
        ),
    ];
    for (client, rule) in cases {
        let rule = [rule];
        while client.check_rules(&rule).await.unwrap().allowed {}
        let monitor = support::monitor::Monitor::start(server.port);
        for _ in 0..10 {
            assert!(!client.check_rules(&rule).await.unwrap().allowed);
        }
        assert_eq!(evalshas(&monitor.client_commands()), 10, "{}", rule[0].name());
    }
    // A call for more permits than the refusal kept, and a call of several rules.
    let one = Rule::new("rate_limit:flood:sizes", 3, MINUTE);
    for _ in 0..3 {
        assert!(on.check_rules(std::slice::from_ref(&one)).await.unwrap().allowed);
    }
    assert!(!on.check_rules(std::slice::from_ref(&one)).await.unwrap().allowed);
    let monitor = support::monitor::Monitor::start(server.port);
    assert!(!on.check_rules(&[one.clone().permits(2)]).await.unwrap().allowed);
    assert!(
        !on.check_rules(&[one.clone(), Rule::new("rate_limit:flood:other", 5, MINUTE)])
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(evalshas(&monitor.client_commands()), 2);

    // A refusal short of more than one permit is not kept: grants leave the window
    // one by one before it passes, and each changes the answer.
    // (the same calls on two limiters, one per client)
    let rules = |name: &str| Rule::new(name, 3, MINUTE);
    let (mine, theirs) = (
        rules("rate_limit:flood:short:on"),
        rules("rate_limit:flood:short:off"),
    );
    for at in [0, 10_000, 20_000] {
        clock.set(T0 + 100_000 + at);
        assert!(on.check_rules(std::slice::from_ref(&mine)).await.unwrap().allowed);
        assert!(
            off.check_rules(std::slice::from_ref(&theirs))
                .await
                .unwrap()
                .allowed
        );
    }
    let (mine, theirs) = ([mine.permits(2)], [theirs.permits(2)]);
    for at in [20_000, 60_001, 69_999, 70_000] {
        clock.set(T0 + 100_000 + at);
        let local = on.check_rules(&mine).await.unwrap();
        let redis = off.check_rules(&theirs).await.unwrap();
        assert_eq!(local, redis, "at +{at} ms");
    }
}

#[redlimit::rate_limit(key = "flood:attr:on", rate = 1, interval = "60s")]
async fn attribute_on() -> Result<(), redlimit::RateLimited> {
    Ok(())
}

#[redlimit::rate_limit(key = "flood:attr:off", rate = 1, interval = "60s", local_refusals = false)]
async fn attribute_off() -> Result<(), redlimit::RateLimited> {
    Ok(())
}

/// The attribute's and the layer's switch: `local_refusals = false` and
/// `LayerRule::local_refusals(false)` send every refusal to Redis.
#[tokio::test]
async fn the_attribute_and_the_layer_switch_it_off_per_rule() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    redlimit::set_default(client.clone()).unwrap();
    for (off, expected) in [(false, 0), (true, 10)] {
        let call = || async move {
            if off {
                attribute_off().await
            } else {
                attribute_on().await
            }
        };
        call().await.unwrap();
        assert!(call().await.is_err());
        let monitor = support::monitor::Monitor::start(server.port);
        for _ in 0..10 {
            assert!(call().await.is_err());
        }
        assert_eq!(
            evalshas(&monitor.client_commands()),
            expected,
            "local_refusals off: {off}"
        );
    }
    #[cfg(feature = "axum")]
    for (off, expected) in [(false, 0), (true, 10)] {
        use redlimit::tower::{LayerRule, RateLimitLayer};
        let name = if off { "flood:layer:off" } else { "flood:layer:on" };
        let layer = RateLimitLayer::builder()
            .client(client.clone())
            .rule(LayerRule::new(name, 1, MINUTE).local_refusals(!off))
            .build()
            .unwrap();
        let addr = support::http::serve_route("/", |app| app.layer(layer)).await;
        assert_eq!(support::http::send(addr, "GET", "/", &[]).await.status, 200);
        assert_eq!(support::http::send(addr, "GET", "/", &[]).await.status, 429);
        let monitor = support::monitor::Monitor::start(server.port);
        for _ in 0..10 {
            assert_eq!(support::http::send(addr, "GET", "/", &[]).await.status, 429);
        }
        assert_eq!(
            evalshas(&monitor.client_commands()),
            expected,
            "layer, local_refusals off: {off}"
        );
    }
}

/// A spray of refusals with long waits on 11 000 limiters (more than the 10 000 a
/// client keeps) pins nothing: the newest refusals are kept as well as the limiter
/// called all along, each answered again without a script call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spray_of_long_refusals_neither_pins_the_cache_nor_evicts_a_called_limiter() {
    let server = RedisServer::start();
    // (a loaded machine's timeout would decide in process, on_error = "local")
    let client = Client::builder()
        .command_timeout(Duration::from_secs(10))
        .connect(&server.url())
        .await
        .unwrap();
    let long = Duration::from_secs(600);
    let victim = [Rule::new("rate_limit:spray:victim", 1, long)];
    assert!(client.check_rules(&victim).await.unwrap().allowed);
    assert!(!client.check_rules(&victim).await.unwrap().allowed);
    let (tasks, each) = (4, 2_750);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut spray = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let (client, done) = (client.clone(), done.clone());
        spray.spawn(async move {
            for i in 0..each {
                let rule = [Rule::new(format!("rate_limit:spray:{task}:{i}"), 1, long)];
                assert!(client.check_rules(&rule).await.unwrap().allowed);
                assert!(!client.check_rules(&rule).await.unwrap().allowed);
            }
            done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
    }
    while done.load(std::sync::atomic::Ordering::Relaxed) < tasks {
        let decision = client.check_rules(&victim).await.unwrap();
        assert!(!decision.allowed, "the victim: {decision:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while let Some(finished) = spray.join_next().await {
        finished.unwrap();
    }
    let monitor = support::monitor::Monitor::start(server.port);
    assert!(!client.check_rules(&victim).await.unwrap().allowed);
    for task in 0..tasks {
        let newest = [Rule::new(
            format!("rate_limit:spray:{task}:{}", each - 1),
            1,
            long,
        )];
        assert!(!client.check_rules(&newest).await.unwrap().allowed);
    }
    let calls = evalshas(&monitor.client_commands());
    assert_eq!(
        calls, 0,
        "the victim and the {tasks} newest refusals are answered in process"
    );
}
