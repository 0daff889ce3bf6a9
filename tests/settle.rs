//! Reserve, then settle: a call's estimate taken, then replaced by what it used. Each
//! scenario runs on both backends (a redis-server of its own, and in process) on one
//! manual clock, and the two must give the same answers; the random sequences at the
//! end compare them step for step.

use redlimit_test_support as support;

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use redlimit::{Algorithm, Client, Error, ManualClock, Reservation, Reserved, Rule, MAX_PERMITS};
use support::RedisServer;

const MINUTE: Duration = Duration::from_secs(60);
/// Kept alive past every test: Redis counts TTLs on its own clock, not the manual one.
const HOUR: Duration = Duration::from_secs(3_600);
const START: u64 = 1_700_000_000_000;

/// An in-process client and a client of a fresh redis-server, on `clock`.
async fn clients(clock: &ManualClock) -> (RedisServer, [Client; 2]) {
    let server = RedisServer::start();
    let memory = Client::builder().clock(clock.clone()).memory();
    let redis = Client::builder()
        .clock(clock.clone())
        .connect(&server.url())
        .await
        .unwrap();
    (server, [memory, redis])
}

async fn granted(client: &Client, rules: &[Rule]) -> Reservation {
    match client.reserve(rules).await.unwrap() {
        Reserved::Granted(reservation) => reservation,
        Reserved::Refused(decision) => panic!("refused: {decision:?}"),
    }
}

async fn available(client: &Client, name: &str) -> u64 {
    client.rate_limiter(name).available_permits().await.unwrap()
}

fn tokens(name: &str) -> Rule {
    Rule::new(name, 1_000, MINUTE).keep_alive(Some(HOUR)).settled()
}

#[tokio::test]
async fn a_window_gives_back_what_was_not_used_and_charges_the_excess() {
    let clock = ManualClock::new(START);
    let (_server, clients) = clients(&clock).await;
    for client in &clients {
        let name = "settle:window";
        let first = granted(client, &[tokens(name).permits(400)]).await;
        assert_eq!(first.decision().remaining, 600);
        let settled = first.settle(100).await.unwrap();
        assert_eq!((settled.refunded(), settled.overdrawn()), (300, 0));
        assert_eq!(available(client, name).await, 900);

        clock.advance(Duration::from_secs(10));
        let second = granted(client, &[tokens(name).permits(500)]).await;
        let settled = second.settle(1_700).await.unwrap();
        assert_eq!((settled.refunded(), settled.overdrawn()), (0, 1_200));
        // 100 + 1 700 counted of 1 000: a debt of 800, refused until it leaves.
        assert_eq!(available(client, name).await, 0);
        let Reserved::Refused(refused) = client.reserve(&[tokens(name)]).await.unwrap() else {
            panic!("a limiter in debt refuses");
        };
        // The first grant leaving (at 60 s) frees 100: still 700 short, until the
        // second leaves, 10 s after it.
        assert_eq!(refused.retry_after, Some(Duration::from_secs(60)));
        clock.advance(Duration::from_secs(50));
        assert_eq!(available(client, name).await, 0, "the first grant left: 700 owed");
        clock.advance(Duration::from_secs(10));
        assert_eq!(
            available(client, name).await,
            1_000,
            "the excess left with its grant"
        );
        clock.advance(MINUTE);
    }
}

#[tokio::test]
async fn a_bucket_goes_below_zero_by_the_excess_and_refills_from_there() {
    let clock = ManualClock::new(START);
    let (_server, clients) = clients(&clock).await;
    for (i, client) in clients.iter().enumerate() {
        let name = format!("settle:bucket:{i}");
        let rule = || {
            Rule::new(&name, 600, MINUTE)
                .algorithm(Algorithm::TokenBucket)
                .settled()
        };
        let bucket = client.token_bucket(&name, 600, MINUTE);
        let reserved = granted(client, &[rule().permits(100)]).await;
        assert_eq!(bucket.available().await.unwrap(), 500);
        reserved.settle(40).await.unwrap();
        assert_eq!(bucket.available().await.unwrap(), 560);
        let reserved = granted(client, &[rule().permits(500)]).await;
        let settled = reserved.settle(1_160).await.unwrap();
        assert_eq!(settled.overdrawn(), 660);
        // 560 - 1 160: 600 owed, refilled at 10 a second.
        assert_eq!(bucket.available().await.unwrap(), 0);
        let Reserved::Refused(refused) = client.reserve(&[rule().permits(10)]).await.unwrap() else {
            panic!("a bucket in debt refuses");
        };
        assert_eq!(refused.retry_after, Some(Duration::from_secs(61)));
        clock.advance(Duration::from_secs(61));
        assert_eq!(bucket.available().await.unwrap(), 10);
    }
}

/// A settle's excess leaves a bucket's debt no deeper than its capacity less 2^53: the
/// room (capacity less tokens) stays within 2^53, where the scripts count exactly. A
/// bucket of 3 x 2^51 units (3 x 2^29 tokens of 2^22 ms), reserved 1 and settled
/// 2^32 - 1 (2^54 units), holds -2^51 units after, and waits as long on both backends;
/// at the debt floor (-2^52) its room would be 5 x 2^51, past 2^53, where the refill
/// added to it rounds in the scripts (which read such a debt at the capacity less
/// 2^53).
#[tokio::test]
async fn a_deep_debt_leaves_a_large_bucket_s_room_within_2_53() {
    let clock = ManualClock::new(START);
    let (_server, clients) = clients(&clock).await;
    let (rate, interval, burst) = (1 << 30, Duration::from_millis(1 << 22), 3 << 29);
    for (i, client) in clients.iter().enumerate() {
        let name = format!("settle:deep:{i}");
        let rule = Rule::new(&name, rate, interval)
            .algorithm(Algorithm::TokenBucket)
            .burst(burst)
            .settled();
        let reserved = granted(client, &[rule.permits(1)]).await;
        reserved.settle(u32::MAX.into()).await.unwrap();
        let bucket = client.token_bucket(&name, rate, interval).burst(burst);
        assert_eq!(bucket.available().await.unwrap(), 0, "client {i}");
        // 2^51 units owed and a token's 2^22, refilled at 2^30 a millisecond
        let refused = bucket.check(1).await.unwrap();
        assert_eq!(
            refused.retry_after,
            Some(Duration::from_millis((1 << 21) + 1)),
            "client {i}"
        );
    }
    let mut raw = redis::Client::open(_server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let text: String = redis::cmd("GET")
        .arg("{settle:deep:1}:bucket")
        .query_async(&mut raw)
        .await
        .unwrap();
    let units: i64 = text.split(':').nth(3).unwrap().parse().unwrap();
    assert_eq!(units, 3 * (1 << 51) - (1 << 53), "{text}");
}

#[tokio::test]
async fn requests_and_tokens_mix_and_only_settled_rules_take_the_actual() {
    let clock = ManualClock::new(START);
    let (_server, clients) = clients(&clock).await;
    for client in &clients {
        let rules = [
            Rule::new("mix:user:tokens", 10_000, MINUTE)
                .settled()
                .permits(2_000),
            Rule::new("mix:tokens", 100_000, MINUTE).settled().permits(2_000),
            Rule::new("mix:user:requests", 20, MINUTE),
        ];
        let reservation = granted(client, &rules).await;
        let settled = reservation.settle_each(&[500, 2_600]).await.unwrap();
        assert_eq!(settled.rules.len(), 2);
        assert_eq!((settled.rules[0].rule, settled.rules[1].rule), (0, 1));
        assert_eq!(available(client, "mix:user:tokens").await, 9_500);
        assert_eq!(available(client, "mix:tokens").await, 97_400);
        assert_eq!(
            available(client, "mix:user:requests").await,
            19,
            "1 per call, not settled"
        );
        clock.advance(MINUTE * 2);
    }
}

#[tokio::test]
async fn misuse_is_refused_and_spends_nothing() {
    let clock = ManualClock::new(START);
    let (_server, clients) = clients(&clock).await;
    for client in &clients {
        let batched = client.reserve(&[tokens("misuse:batch").batch(5)]).await;
        assert!(
            matches!(&batched, Err(Error::InvalidReservation { problem, .. }) if problem.contains("Rule::batch")),
            "{batched:?}"
        );
        let twice = client
            .reserve(&[tokens("misuse:same"), tokens("misuse:same").permits(2)])
            .await;
        assert!(
            matches!(&twice, Err(Error::InvalidReservation { problem, .. }) if problem.contains("same limiter")),
            "{twice:?}"
        );
        let created = client.rate_limiter("misuse:same").is_exists().await.unwrap();
        assert!(!created, "nothing is created");
        // A cap on settles for a rule that is not settled would cap nothing.
        let unsettled = Rule::new("misuse:cap", 1_000, MINUTE).max_overdraft(3);
        for refused in [
            client.reserve(std::slice::from_ref(&unsettled)).await.map(|_| ()),
            client
                .check_rules(std::slice::from_ref(&unsettled))
                .await
                .map(|_| ()),
        ] {
            assert!(
                matches!(&refused, Err(Error::InvalidConfig { problem, .. }) if problem.contains("add .settled()")),
                "{refused:?}"
            );
        }
        assert!(!client.rate_limiter("misuse:cap").is_exists().await.unwrap());
        let reservation = granted(client, &[tokens("misuse:count").permits(10)]).await;
        let wrong = reservation.settle_each(&[1, 2]).await;
        assert!(
            matches!(&wrong, Err(Error::InvalidReservation { problem, .. }) if problem.contains("2 amounts given to settle 1")),
            "{wrong:?}"
        );
        assert_eq!(available(client, "misuse:count").await, 990, "the estimate stays");
        // An amount settled on a reservation of no settled rule would count nowhere.
        let plain = Rule::new("misuse:plain", 1_000, MINUTE).keep_alive(Some(HOUR));
        let reservation = granted(client, &[plain.permits(10)]).await;
        let nowhere = reservation.settle(500).await;
        assert!(
            matches!(&nowhere, Err(Error::InvalidReservation { problem, .. }) if problem.contains("Rule::settled")),
            "{nowhere:?}"
        );
        assert_eq!(available(client, "misuse:plain").await, 990, "the estimate stays");
    }
}

/// A settle made after its grant left the window (a response streamed for longer than
/// the interval) gets nothing back, and its excess is charged at the settle's time.
#[tokio::test]
async fn a_dropped_reservation_keeps_its_estimate_and_a_late_settle_charges_its_excess_now() {
    let clock = ManualClock::new(START);
    let (_server, clients) = clients(&clock).await;
    for client in &clients {
        drop(granted(client, &[tokens("late:dropped").permits(300)]).await);
        assert_eq!(available(client, "late:dropped").await, 700);

        let late = granted(client, &[tokens("late:settled").permits(300)]).await;
        let refund = granted(client, &[tokens("late:refund").permits(300)]).await;
        clock.advance(MINUTE);
        let settled = late.settle(900).await.unwrap();
        assert!(settled.rules[0].applied, "the excess is charged now");
        assert_eq!(settled.overdrawn(), 600);
        // What the value says after the settle: the grant that left is counted back
        // at the next decision.
        assert_eq!(settled.rules[0].remaining, 100);
        assert_eq!(available(client, "late:settled").await, 400);
        let refunded = refund.settle(0).await.unwrap();
        assert!(
            !refunded.rules[0].applied,
            "nothing goes back: the grant already left"
        );
        assert_eq!(available(client, "late:refund").await, 1_000);

        // The excess leaves the window a minute after the settle, not the grant.
        clock.advance(MINUTE - Duration::from_millis(1));
        assert_eq!(available(client, "late:settled").await, 400);
        clock.advance(Duration::from_millis(1));
        assert_eq!(available(client, "late:settled").await, 1_000);
    }
}

#[tokio::test]
async fn an_overdraft_cap_bounds_what_a_hostile_actual_charges() {
    let clock = ManualClock::new(START);
    let (_server, clients) = clients(&clock).await;
    for client in &clients {
        let capped = granted(client, &[tokens("cap:capped").permits(100).max_overdraft(50)]).await;
        let settled = capped.settle(u64::MAX).await.unwrap();
        assert_eq!(settled.rules[0].counted, 150);
        assert_eq!(settled.uncharged(), u64::MAX - 150);
        assert_eq!(available(client, "cap:capped").await, 850);

        // Without a cap the excess is counted, up to what a grant's log field holds:
        // the limiter refuses until the grant leaves, then holds its rate again.
        let open = granted(client, &[tokens("cap:open").permits(100)]).await;
        let settled = open.settle(u64::MAX).await.unwrap();
        assert_eq!(settled.rules[0].counted, MAX_PERMITS);
        assert_eq!(available(client, "cap:open").await, 0);
        assert!(matches!(
            client.reserve(&[tokens("cap:open")]).await.unwrap(),
            Reserved::Refused(_)
        ));
        clock.advance(MINUTE);
        assert_eq!(available(client, "cap:open").await, 1_000);
        for _ in 0..1_000 {
            assert!(matches!(
                client.reserve(&[tokens("cap:open")]).await.unwrap(),
                Reserved::Granted(_)
            ));
        }
        assert!(matches!(
            client.reserve(&[tokens("cap:open")]).await.unwrap(),
            Reserved::Refused(_)
        ));
        clock.advance(MINUTE);
    }
}

/// A settle the server did not answer in time (frozen after it read the command, so it
/// runs when it wakes) is sent again in the background: it counts once.
#[tokio::test]
async fn a_settle_that_times_out_is_sent_again_and_counts_once() {
    let server = RedisServer::start();
    let client = Client::builder()
        .command_timeout(Duration::from_millis(200))
        .connect(&server.url())
        .await
        .unwrap();
    let window = granted(&client, &[tokens("again:window").permits(100)]).await;
    let bucket_rule = Rule::new("again:bucket", 1_000, Duration::from_secs(3_600))
        .algorithm(Algorithm::TokenBucket)
        .settled()
        .permits(100);
    let bucket = granted(&client, &[bucket_rule]).await;
    server.pause();
    let failed = window.settle(400).await;
    assert!(matches!(failed, Err(Error::Timeout { .. })), "{failed:?}");
    let failed = bucket.settle(400).await;
    assert!(matches!(failed, Err(Error::Timeout { .. })), "{failed:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.resume();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(available(&client, "again:window").await, 600, "400 counted once");
    let tokens = client.token_bucket("again:bucket", 1_000, Duration::from_secs(3_600));
    let left = tokens.available().await.unwrap();
    assert!((600..=601).contains(&left), "400 counted once, {left} left");
}

/// The settle script sent twice (a retry after a reply that was lost) counts once: a
/// window's grant is found by its log member, a bucket's settle leaves a mark, and so
/// does a window's excess, so that the same settle sent once its grant has left the
/// window (a late retry, charged at its own time) changes nothing either.
#[tokio::test]
async fn a_settle_sent_twice_counts_once() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    let bucket_rule = Rule::new("twice:bucket", 1_000, HOUR)
        .algorithm(Algorithm::TokenBucket)
        .settled()
        .permits(100);
    drop(granted(&client, &[tokens("twice:window").permits(100), bucket_rule]).await);
    let logged: Vec<Vec<u8>> = redis::cmd("ZRANGE")
        .arg("{twice:window}:permits")
        .arg(0)
        .arg(-1)
        .query_async(&mut raw)
        .await
        .unwrap();
    let window_member = logged[0].clone();
    let mut bucket_member = window_member.clone();
    bucket_member[1] ^= 0xff;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // Twice at the grant's time, then twice after its window has passed.
    for (n, at) in [now, now, now + 60_001, now + 60_001].into_iter().enumerate() {
        let settled: Vec<i64> = redis::Script::new(redlimit::SETTLE_SCRIPT)
            .key("twice:window")
            .key("{twice:window}:value")
            .key("{twice:window}:value:x")
            .key("{twice:window}:permits")
            .key("{twice:window}:permits:x")
            .key("{twice:window}:settled:mark")
            .key("twice:bucket")
            .key("{twice:bucket}:bucket")
            .key("{twice:bucket}:value:x")
            .key("{twice:bucket}:permits")
            .key("{twice:bucket}:permits:x")
            .key("{twice:bucket}:settled:mark")
            .arg(at)
            .arg("w")
            .arg(&window_member[..])
            .arg(100)
            .arg(400)
            // mark_ms:rate:interval:burst:warmup:type:keep_alive:at:room:segment
            .arg("120000:1000:60000:0:0:0:60000:0:0:0")
            .arg("b")
            .arg(&bucket_member[..])
            .arg(100)
            .arg(400)
            .arg(format!("120000:1000:3600000:1000:0:0:0:{now}:0:0"))
            .invoke_async(&mut raw)
            .await
            .unwrap();
        // Settled (-1 or what is left), then nothing to settle (-2).
        if n == 0 {
            assert!(
                settled.len() == 2 && settled.iter().all(|&s| s >= -1),
                "{at}: {settled:?}"
            );
        } else {
            assert_eq!(settled, [-2, -2], "{at}");
        }
    }
    // Terms that do not read as terms fail the script, naming the argument.
    let failed = redis::Script::new(redlimit::SETTLE_SCRIPT)
        .key("twice:window")
        .key("{twice:window}:value")
        .key("{twice:window}:value:x")
        .key("{twice:window}:permits")
        .key("{twice:window}:permits:x")
        .key("{twice:window}:settled:other")
        .arg(now)
        .arg("w")
        .arg(&window_member[..])
        .arg(100)
        .arg(400)
        .arg("120000:1000:60000:0:0:2:60000:0:0:0")
        .invoke_async::<i64>(&mut raw)
        .await
        .unwrap_err();
    assert!(failed.to_string().contains("bad_argument:6 terms"), "{failed}");
    assert_eq!(available(&client, "twice:window").await, 600, "400 counted once");
    let bucket = client.token_bucket("twice:bucket", 1_000, HOUR);
    assert_eq!(bucket.available().await.unwrap(), 600, "400 counted once");
}

/// Random reservations, settles, plain calls and waits on both backends give the same
/// answers, step for step.
/// A grant's log made again before its settle (a change of mode, a rate set by hand)
/// takes the grant with it: the settle gives nothing back, even when another call's
/// grant of the same time and size is in the new log (in process it was taken for the
/// reservation's, and refunded: 6 permits granted in one window of 3).
#[tokio::test]
async fn a_settle_after_its_log_was_made_again_takes_no_other_grant() {
    let clock = ManualClock::new(START);
    let (_server, clients) = clients(&clock).await;
    let rule = |name: &str| {
        Rule::new(name, 3, Duration::from_millis(1_500))
            .keep_alive(Some(HOUR))
            .permits(3)
    };
    for (i, client) in clients.iter().enumerate() {
        for made_again in ["mode", "rate"] {
            let name = format!("again:{made_again}:{i}");
            clock.set(START + 10_000 * (2 * i as u64 + u64::from(made_again == "rate")));
            let reservation = granted(client, &[rule(&name).settled()]).await;
            let other = if made_again == "mode" {
                rule(&name).mode(redlimit::RateType::PerClient)
            } else {
                client
                    .rate_limiter(&name)
                    .set_rate(redlimit::RateType::Overall, 3, Duration::from_millis(1_500))
                    .await
                    .unwrap();
                rule(&name)
            };
            // another call's grant, of the reservation's time and size, in the new log
            assert!(
                client
                    .check_rules(std::slice::from_ref(&other))
                    .await
                    .unwrap()
                    .allowed
            );
            clock.advance(Duration::from_millis(1));
            let settled = reservation.settle(0).await.unwrap();
            assert!(
                !settled.rules[0].applied,
                "{made_again} on {i}: nothing given back, the grant went with its log"
            );
            let next = client.check_rules(std::slice::from_ref(&other)).await.unwrap();
            assert!(
                !next.allowed,
                "{made_again} on {i}: granted past the rate: {next:?}"
            );
        }
    }
}

/// A bucket's settle gives back only what the bucket would still hold had the grant
/// taken only what it used: tokens it refilled since, which that bucket would have
/// refilled past its burst, do not come back. Given back whole, a bucket of 10 a
/// minute emptied by a reservation, refilled a minute later and emptied again, took 9
/// more at that instant (19 at once); refilled half, 14.
#[tokio::test]
async fn a_bucket_settle_gives_back_nothing_the_bucket_refilled_since() {
    let clock = ManualClock::new(START);
    let (_server, clients) = clients(&clock).await;
    for (i, client) in clients.iter().enumerate() {
        for (case, waited, then_granted) in [("full", 60, 10), ("half", 30, 5), ("at once", 0, 0)] {
            let name = format!("refilled:{case}:{i}");
            let rule = || Rule::new(&name, 10, MINUTE).algorithm(Algorithm::TokenBucket);
            let reservation = granted(client, &[rule().settled().permits(10)]).await;
            clock.advance(Duration::from_secs(waited));
            let granted_now = |permits| {
                let rules = [rule().permits(permits)];
                async move { client.check_rules(&rules).await.unwrap().allowed }
            };
            if then_granted > 0 {
                assert!(granted_now(then_granted).await, "{case} on {i}: refilled");
            }
            // A settle of 0 counts 1 token: 9 not used.
            let settled = reservation.settle(0).await.unwrap();
            // Had the grant taken 1: 9 left at once, then refilled up to the burst.
            let owed = (9 + waited / 6).min(10) - then_granted;
            assert_eq!(settled.rules[0].remaining, owed, "{case} on {i}");
            if owed > 0 {
                assert!(granted_now(owed).await, "{case} on {i}: given back");
            }
            assert!(!granted_now(1).await, "{case} on {i}: past the burst");
            clock.advance(HOUR);
        }
        // A config changed since the grant (its tokens carried over): nothing back.
        let name = format!("refilled:config:{i}");
        let rule = || Rule::new(&name, 10, MINUTE).algorithm(Algorithm::TokenBucket);
        let reservation = granted(client, &[rule().settled().permits(5)]).await;
        assert!(client.check_rules(&[rule().burst(20)]).await.unwrap().allowed);
        let settled = reservation.settle(0).await.unwrap();
        assert_eq!(settled.rules[0].remaining, 4, "config on {i}: nothing given back");
        // Changed and changed back (burst 20, then 10 again, a token taken under each):
        // nothing back either, the grant's segment dropped with the first change (with
        // the refill's bound alone, the config the same again: 4 back, 7 left).
        let name = format!("refilled:config-back:{i}");
        let rule = || Rule::new(&name, 10, MINUTE).algorithm(Algorithm::TokenBucket);
        let reservation = granted(client, &[rule().settled().permits(5)]).await;
        assert!(client.check_rules(&[rule().burst(20)]).await.unwrap().allowed);
        assert!(client.check_rules(&[rule()]).await.unwrap().allowed);
        let settled = reservation.settle(0).await.unwrap();
        assert_eq!(
            settled.rules[0].remaining, 3,
            "config and back on {i}: nothing given back"
        );
        // A clock set back after the bucket refilled: what refilled counts up to the
        // bucket's own refill time (given back whole: 9 more at once).
        let name = format!("refilled:clock:{i}");
        let rule = || Rule::new(&name, 10, MINUTE).algorithm(Algorithm::TokenBucket);
        let back_to = START + 100 * HOUR.as_millis() as u64 * (i as u64 + 1);
        clock.set(back_to);
        let reservation = granted(client, &[rule().settled().permits(10)]).await;
        clock.advance(MINUTE);
        assert!(client.check_rules(&[rule().permits(10)]).await.unwrap().allowed);
        clock.set(back_to);
        let settled = reservation.settle(0).await.unwrap();
        assert_eq!(settled.rules[0].remaining, 0, "clock on {i}: nothing given back");
        assert!(
            !client.check_rules(&[rule()]).await.unwrap().allowed,
            "clock on {i}"
        );
        // A bucket made again since the grant on a clock behind it (the one the grant
        // emptied refilled and expired, here deleted, then a call 1.5 s behind made a
        // full one and emptied it): nothing back (given back whole: 9 more at once).
        let name = format!("refilled:again:{i}");
        let rule = || Rule::new(&name, 10, MINUTE).algorithm(Algorithm::TokenBucket);
        let grant_at = back_to + HOUR.as_millis() as u64;
        clock.set(grant_at);
        let reservation = granted(client, &[rule().settled().permits(10)]).await;
        clock.advance(MINUTE);
        // (in process a full bucket counts as none: deleted or not, `false`)
        client.token_bucket(&name, 10, MINUTE).delete().await.unwrap();
        clock.set(grant_at - 1_500);
        assert!(client.check_rules(&[rule().permits(10)]).await.unwrap().allowed);
        let settled = reservation.settle(0).await.unwrap();
        assert_eq!(settled.rules[0].remaining, 0, "again on {i}: nothing given back");
        assert!(
            !client.check_rules(&[rule()]).await.unwrap().allowed,
            "again on {i}"
        );
        clock.set(back_to + 2 * HOUR.as_millis() as u64);
    }
}

/// Several reservations pending on one token bucket: one's settle gives back nothing
/// another's already did. Reservations of 2, 49 and 49 on a bucket of 100 a minute
/// (all in one millisecond), the first two settled 0 (1 counted each), the bucket
/// refilled 30 s and emptied (99 taken), the third settled 0: the bucket whose settled
/// grants took only what they used was full from the settles on, refilled nothing
/// past its burst, and held 1 once emptied; given back by the refill's bound alone,
/// the third's settle left 48 (147 at that instant).
#[tokio::test]
async fn several_pending_reservations_give_back_no_more_than_the_bucket_would_hold() {
    let clock = ManualClock::new(START);
    let (server, clients) = clients(&clock).await;
    for (i, client) in clients.iter().enumerate() {
        let name = format!("several:{i}");
        let rule = || Rule::new(&name, 100, MINUTE).algorithm(Algorithm::TokenBucket);
        let granted_now = |permits| {
            let rules = [rule().permits(permits)];
            async move { client.check_rules(&rules).await.unwrap().allowed }
        };
        let first = granted(client, &[rule().settled().permits(2)]).await;
        let second = granted(client, &[rule().settled().permits(49)]).await;
        let third = granted(client, &[rule().settled().permits(49)]).await;
        clock.advance(Duration::from_millis(1));
        assert_eq!(first.settle(0).await.unwrap().rules[0].remaining, 1, "on {i}");
        assert_eq!(second.settle(0).await.unwrap().rules[0].remaining, 49, "on {i}");
        clock.advance(Duration::from_secs(30));
        // emptied: whatever it holds taken
        let mut emptied = 0;
        for permits in [64, 32, 16, 8, 4, 2, 1] {
            while granted_now(permits).await {
                emptied += permits;
            }
        }
        assert_eq!(emptied, 99, "on {i}: 49 given back and 50 refilled");
        let settled = third.settle(0).await.unwrap();
        assert_eq!(
            settled.rules[0].remaining, 1,
            "on {i}: what the bucket of usage holds"
        );
        if i == 1 {
            // none pending: the bucket's text is back to its own fields
            let mut raw = server.raw().await;
            let key = format!("{{{name}}}:bucket");
            let text: String = redis::cmd("GET").arg(&key).query_async(&mut raw).await.unwrap();
            assert!(!text.contains('|'), "{text}");
        }
        // (past the wait of the last refusal, which a client of Redis keeps: a token
        // more refilled)
        clock.advance(Duration::from_millis(600));
        assert!(granted_now(2).await, "on {i}");
        assert!(!granted_now(1).await, "on {i}: no more");
        clock.advance(HOUR);
    }
}

/// Many reservations pending on one bucket keep its state small: at most 128 grants
/// named, the oldest forgotten (its settle gives nothing back, the safe side), so that
/// every call on the bucket reads and writes a bounded text in Redis (4 000 pending
/// grew it to 43 KB, and a call past 100 ms, each call costing more than the last). A
/// stored text naming more than that is refused before it is read.
#[tokio::test]
async fn many_pending_reservations_keep_a_bucket_small() {
    let clock = ManualClock::new(START);
    let (server, clients) = clients(&clock).await;
    let mut raw = server.raw().await;
    for (i, client) in clients.iter().enumerate() {
        let name = format!("many:{i}");
        // (slow to refill: its key's TTL, which Redis counts in real time, outlasts the test)
        let rule = || {
            Rule::new(&name, 1_000, HOUR)
                .algorithm(Algorithm::TokenBucket)
                .burst(1_000_000)
        };
        let mut held = Vec::new();
        for _ in 0..300 {
            held.push(granted(client, &[rule().settled().permits(2)]).await);
        }
        if i == 1 {
            let key = format!("{{{name}}}:bucket");
            let text: String = redis::cmd("GET").arg(&key).query_async(&mut raw).await.unwrap();
            assert!(text.len() < 4_096, "{} bytes", text.len());
        }
        let newest = held.pop().unwrap();
        let oldest = held.remove(0);
        // (1 counted of each: 1 unused)
        let forgotten = oldest.settle(0).await.unwrap();
        assert_eq!(
            forgotten.rules[0].remaining,
            1_000_000 - 600,
            "on {i}: nothing back"
        );
        let kept = newest.settle(0).await.unwrap();
        assert_eq!(
            kept.rules[0].remaining,
            1_000_000 - 599,
            "on {i}: its unused token back"
        );
        clock.advance(HOUR);
    }
    // Stored texts naming 200 grants, longer than 4 KB, of 100 segments, a grant 0 or
    // one past 2^53: refused, nothing granted.
    let ids: Vec<String> = (1..=200)
        .map(|id| (100_000_000_000_000u64 + id).to_string())
        .collect();
    let long = format!("{START}.0.{}", ["100000000000001"; 300].join("."));
    let tiny = vec![format!("{START}.0.100000000000001"); 100].join(",");
    for segments in [
        format!("{START}.0.{}", ids.join(".")),
        long,
        tiny,
        format!("{START}.0.0"),
        format!("{START}.0.9007199254740993"),
    ] {
        let text = format!("1000:60000:1000:60000000:{START}|{segments}");
        let _: () = redis::cmd("SET")
            .arg("{many:hostile}:bucket")
            .arg(&text)
            .query_async(&mut raw)
            .await
            .unwrap();
        let rule = Rule::new("many:hostile", 1_000, MINUTE).algorithm(Algorithm::TokenBucket);
        let refused = clients[1].check_rules(std::slice::from_ref(&rule)).await;
        assert!(
            matches!(refused, Err(Error::CorruptBucket { .. })),
            "{}: {refused:?}",
            &segments[..segments.len().min(40)]
        );
    }
}

/// A warm-up bucket's grant takes its permits off the bucket's coldness as well as
/// its tokens, and a cold one charges up to three tokens a permit: a settle gives the
/// permits not used their coldness back, and as much as the extra cost it does not
/// give back, or the bucket would be warmer than had the grant taken only what it
/// used. A cold bucket of 100 a minute warming up over a minute, reserved 50 and
/// settled 0 (1 counted), then drained a minute later, grants no more than one that
/// granted 1 then: 99 against 49 while the settle left the coldness where the grant
/// put it (reserved 100, drained after two minutes: 99; 30 after 30 s: 80; 20 after
/// 15 s: 65; each against 49).
#[tokio::test]
async fn a_settle_gives_a_warm_up_back_the_coldness_of_the_permits_not_used() {
    let clock = ManualClock::new(START);
    let (_server, clients) = clients(&clock).await;
    let rule = |name: &str| {
        Rule::new(name, 100, MINUTE)
            .algorithm(Algorithm::TokenBucket)
            .warmup(MINUTE)
    };
    for (estimate, waited) in [(50, 60), (100, 120), (30, 30), (20, 15)] {
        let mut drained = Vec::new();
        for (i, client) in clients.iter().enumerate() {
            let (settled, as_if) = (
                format!("cools:{estimate}:{i}"),
                format!("cools:as-if:{estimate}:{i}"),
            );
            granted(client, &[rule(&settled).settled().permits(estimate)])
                .await
                .settle(0)
                .await
                .unwrap();
            assert!(client.check_rules(&[rule(&as_if)]).await.unwrap().allowed);
            clock.advance(Duration::from_secs(waited));
            let mut counts = [0; 2];
            for (count, name) in counts.iter_mut().zip([&settled, &as_if]) {
                while *count < 1_000 && client.check_rules(&[rule(name)]).await.unwrap().allowed {
                    *count += 1;
                }
            }
            assert!(
                counts[0] <= counts[1],
                "{estimate} after {waited} s on {i}: {counts:?}"
            );
            drained.push(counts);
            clock.advance(HOUR);
        }
        assert_eq!(drained[0], drained[1], "{estimate}: both backends");
    }
}

/// A cold bucket's grant costs up to three tokens a permit, which may leave it further
/// below zero than a settle's excess may take it (its rate below zero): an excess
/// keeps it there, where it was raised to that floor (a reservation of 9 on a cold
/// bucket of 10 a minute settled 10 left 10 tokens two minutes later, the honest
/// settle of 9 left 3).
#[tokio::test]
async fn an_excess_keeps_a_warm_up_debt_below_the_floor() {
    let clock = ManualClock::new(START);
    let (_server, clients) = clients(&clock).await;
    for (i, client) in clients.iter().enumerate() {
        let mut after = Vec::new();
        for actual in [9, 10, u64::MAX] {
            let name = format!("cold:{actual}:{i}");
            let rule = || {
                Rule::new(&name, 10, MINUTE)
                    .algorithm(Algorithm::TokenBucket)
                    .warmup(MINUTE)
            };
            granted(client, &[rule().settled().permits(9)])
                .await
                .settle(actual)
                .await
                .unwrap();
            clock.advance(Duration::from_secs(120));
            let bucket = client.token_bucket(&name, 10, MINUTE).warmup(MINUTE);
            after.push(bucket.available().await.unwrap());
        }
        assert_eq!(after, [3, 3, 3], "on {i}");
    }
}

/// An excess past what the debt's floor lets a settle charge warms a warm-up bucket by
/// the permits the floor let it charge, not by the excess reported: reporting 250,
/// 1 000 or `u64::MAX` where 1 was reserved (a cold bucket of 100 a minute, a burst of
/// 100, a warm-up of ten minutes) leaves the same bucket, which grants no more over
/// the next ten minutes than one no reservation took (drained each second). Taking
/// the coldness of the whole excess off it granted 772, 898 and 898 where 597 (now 520).
#[tokio::test]
async fn an_excess_past_the_floor_warms_a_bucket_no_more_than_it_paid() {
    let clock = ManualClock::new(START);
    let (_server, clients) = clients(&clock).await;
    let rule = |name: &str| {
        Rule::new(name, 100, MINUTE)
            .algorithm(Algorithm::TokenBucket)
            .warmup(10 * MINUTE)
            .keep_alive(Some(HOUR))
    };
    for (i, client) in clients.iter().enumerate() {
        let mut drained = Vec::new();
        for actual in [None, Some(250), Some(1_000), Some(u64::MAX)] {
            let name = format!("warm:{actual:?}:{i}");
            if let Some(actual) = actual {
                granted(client, &[rule(&name).settled()])
                    .await
                    .settle(actual)
                    .await
                    .unwrap();
            }
            let mut grants = 0;
            for _ in 0..600 {
                while client.check_rules(&[rule(&name)]).await.unwrap().allowed {
                    grants += 1;
                }
                clock.advance(Duration::from_secs(1));
            }
            drained.push(grants);
        }
        let (none, rest) = (drained[0], &drained[1..]);
        assert!(
            rest.iter().all(|&g| g == rest[0] && g <= none),
            "on {i}: none reserved {none}, settled 250, 1 000, u64::MAX {rest:?}"
        );
        println!("on {i}: {drained:?}");
    }
}

/// An excess charged into debt warms a warm-up bucket by nothing: a bucket of 16 a
/// second, a burst of 2 and a warm-up of 295 ms, drained every 250 ms, stays cold when
/// its refill past the burst adds more coldness than its grants take off, and warm
/// once warm. Reserving 1 and reporting 1, 2, 4, 5, 17 or `u64::MAX` leaves it
/// granting, over the next 10 s, no more for a larger report and no more than with no
/// reservation (40 with none; 40, 39, 38, 38, 36 and 36). Warmed by an excess's whole
/// tokens (down to the floor), a report of 5 tipped it warm: 40, 39, 38, then 76, 72
/// and 72.
#[tokio::test]
async fn an_excess_in_debt_warms_a_bucket_by_nothing() {
    let clock = ManualClock::new(START);
    let (_server, clients) = clients(&clock).await;
    let rule = |name: &str| {
        Rule::new(name, 16, Duration::from_secs(1))
            .algorithm(Algorithm::TokenBucket)
            .burst(2)
            .warmup(Duration::from_millis(295))
            .keep_alive(Some(HOUR))
    };
    let mut drained = Vec::new();
    for (i, client) in clients.iter().enumerate() {
        let mut grants = Vec::new();
        for actual in [None, Some(1), Some(2), Some(4), Some(5), Some(17), Some(u64::MAX)] {
            let name = format!("tipped:{actual:?}:{i}");
            if let Some(actual) = actual {
                granted(client, &[rule(&name).settled()])
                    .await
                    .settle(actual)
                    .await
                    .unwrap();
            }
            let mut n = 0;
            for _ in 0..40 {
                clock.advance(Duration::from_millis(250));
                while client.check_rules(&[rule(&name)]).await.unwrap().allowed {
                    n += 1;
                }
            }
            grants.push(n);
            clock.advance(HOUR);
        }
        println!("on {i}: {grants:?}");
        let (none, reported) = (grants[0], &grants[1..]);
        assert!(
            reported.iter().all(|&g| g <= none) && reported.windows(2).all(|w| w[1] <= w[0]),
            "on {i}: none reserved {none}, reported 1, 2, 4, 5, 17, u64::MAX {reported:?}"
        );
        drained.push(grants);
    }
    assert_eq!(drained[0], drained[1], "both backends");
}

/// A release takes permits out of the newest grants: when it took a reservation's
/// grant, or shrank it, the settle finds nothing to give back, even beside another
/// call's grant of the same time and size (in process that one was taken for the
/// reservation's and refunded: 4 permits granted after it on a rule of 5 with 3 in
/// use); when the release took the other, the settle finds its own. Redis orders
/// grants of one millisecond by their members, so which one a release takes there is
/// read from the log.
#[tokio::test]
async fn a_settle_after_a_release_took_its_grant_takes_no_other_grant() {
    let clock = ManualClock::new(START);
    let (server, clients) = clients(&clock).await;
    let mut raw = server.raw().await;
    let rule = |name: &str| Rule::new(name, 5, MINUTE).keep_alive(Some(HOUR)).permits(2);
    // (id, permits) of each member of the limiter's log on Redis
    async fn log(raw: &mut redis::aio::MultiplexedConnection, name: &str) -> Vec<(Vec<u8>, u32)> {
        let members: Vec<Vec<u8>> = redis::cmd("ZRANGE")
            .arg(format!("{{{name}}}:permits"))
            .arg(0)
            .arg(-1)
            .query_async(raw)
            .await
            .unwrap();
        members
            .into_iter()
            .map(|m| {
                let len = usize::from(m[0]);
                let permits = u32::from_le_bytes(m[1 + len..].try_into().unwrap());
                (m[1..=len].to_vec(), permits)
            })
            .collect()
    }
    let mut cases = 0;
    for (i, client) in clients.iter().enumerate() {
        for reservation_first in [false, true] {
            for released in [1, 2] {
                let name = format!("release:{i}:{reservation_first}:{released}");
                let case = format!(
                    "{} client, reservation first {reservation_first}, {released} released",
                    ["memory", "redis"][i]
                );
                clock.set(START + 10_000 * cases);
                cases += 1;
                let other = || async { assert!(client.check_rules(&[rule(&name)]).await.unwrap().allowed) };
                if !reservation_first {
                    other().await;
                }
                let before: Vec<Vec<u8>> = log(&mut raw, &name).await.into_iter().map(|(id, _)| id).collect();
                let reservation = granted(client, &[rule(&name).settled()]).await;
                let own = log(&mut raw, &name)
                    .await
                    .into_iter()
                    .find(|(id, _)| !before.contains(id));
                if reservation_first {
                    other().await;
                }
                client.rate_limiter(&name).release(released).await.unwrap();
                // Was the reservation's grant left whole? In process the newest grant
                // is the last logged; on Redis, read from the log.
                let whole = if i == 0 {
                    reservation_first
                } else {
                    let (own, _) = own.clone().expect("the reservation's member in the log");
                    log(&mut raw, &name).await.contains(&(own, 2))
                };
                clock.advance(Duration::from_millis(1));
                let settled = reservation.settle(0).await.unwrap();
                assert_eq!(
                    settled.rules[0].applied, whole,
                    "{case}: settled only when its grant was whole"
                );
                // 4 permits taken, `released` given back, and the reservation's 2 when
                // its own grant was there to settle
                let left = 1 + released + if whole { 2 } else { 0 };
                let mut granted_after = 0;
                while client
                    .check_rules(&[Rule::new(&name, 5, MINUTE).keep_alive(Some(HOUR))])
                    .await
                    .unwrap()
                    .allowed
                {
                    granted_after += 1;
                    assert!(granted_after <= 5, "{case}: granted past the rate");
                }
                assert_eq!(granted_after, left, "{case}: granted after the settle");
            }
        }
    }
}

#[tokio::test]
async fn memory_and_redis_agree_on_reservations() {
    let server = RedisServer::start();
    let mut raw = server.raw().await;
    let (mut settled, mut refused) = (0, 0);
    for seed in 0..20u64 {
        let _: () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();
        let clock = ManualClock::new(START + seed * 13);
        let memory = Client::builder().clock(clock.clone()).memory();
        let redis = Client::builder()
            .clock(clock.clone())
            .connect(&server.url())
            .await
            .unwrap();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut held: Vec<(Reservation, Reservation)> = Vec::new();
        let mut history = Vec::new();
        for step in 0..150 {
            let asked;
            let (on_memory, on_redis) = match rng.random_range(0..10) {
                0..=3 => {
                    let rules = random_rules(&mut rng);
                    asked = format!("reserve {rules:?}");
                    let (m, r) = (memory.reserve(&rules).await, redis.reserve(&rules).await);
                    let shown = (format!("{m:?}"), format!("{r:?}"));
                    if let (Ok(Reserved::Granted(m)), Ok(Reserved::Granted(r))) = (m, r) {
                        held.push((m, r));
                    } else {
                        refused += 1;
                    }
                    (strip_reservation(&shown.0), strip_reservation(&shown.1))
                }
                4..=6 if !held.is_empty() => {
                    let (m, r) = held.swap_remove(rng.random_range(0..held.len()));
                    let actual = [0, 1, 5, 50, 200, 900][rng.random_range(0..6)];
                    asked = format!("settle {actual}");
                    settled += 1;
                    (
                        format!("{:?}", m.settle(actual).await),
                        format!("{:?}", r.settle(actual).await),
                    )
                }
                7 => {
                    let name = ["agree:a", "agree:b"][rng.random_range(0..2)];
                    asked = format!("available {name}");
                    let (m, r) = (memory.rate_limiter(name), redis.rate_limiter(name));
                    (
                        format!("{:?}", m.available_permits().await),
                        format!("{:?}", r.available_permits().await),
                    )
                }
                _ => {
                    let by = rng.random_range(0..=25_000);
                    clock.advance(Duration::from_millis(by));
                    asked = format!("advance {by}");
                    (String::new(), String::new())
                }
            };
            history.push(format!("{asked} -> {on_redis}"));
            assert_eq!(
                on_memory,
                on_redis,
                "seed {seed}, step {step}: backends disagree\n{}",
                history.join("\n")
            );
        }
    }
    println!("{settled} settles, {refused} refusals compared");
    assert!(
        settled > 400 && refused > 100,
        "{settled} settles, {refused} refusals"
    );
}

/// One to three rules on two windows and a bucket, some settled.
fn random_rules(rng: &mut StdRng) -> Vec<Rule> {
    let mut rules = vec![Rule::new("agree:a", 300, MINUTE)
        .keep_alive(Some(HOUR))
        .settled()
        .permits(rng.random_range(1..=150))];
    if rng.random_range(0..2) == 0 {
        rules.push(Rule::new("agree:b", 10, MINUTE).keep_alive(Some(HOUR)));
    }
    if rng.random_range(0..2) == 0 {
        rules.push(
            Rule::new("agree:c", 400, MINUTE)
                .keep_alive(Some(HOUR))
                .algorithm(Algorithm::TokenBucket)
                .settled()
                .permits(rng.random_range(1..=200)),
        );
    }
    rules
}

/// A reservation's Debug without what differs between backends by design (its
/// client, its log members).
fn strip_reservation(shown: &str) -> String {
    match shown.find("decision: ") {
        Some(at) => {
            let rest = &shown[at..];
            rest[..rest.find(" }").map_or(rest.len(), |end| end + 2)].to_owned()
        }
        None => shown.to_owned(),
    }
}

/// An excess whose units no 64-bit product holds (2^31 permits of a bucket refilled
/// over 2^32 ms) leaves the bucket at its debt floor on both backends, never wrapped
/// into tokens.
#[tokio::test]
async fn an_excess_past_64_bits_of_units_stops_at_the_floor() {
    let clock = ManualClock::new(START);
    let (_server, clients) = clients(&clock).await;
    for (i, client) in clients.iter().enumerate() {
        let name = format!("floor:{i}");
        let interval = Duration::from_millis(1 << 32);
        let rule = || {
            Rule::new(&name, 1, interval)
                .algorithm(Algorithm::TokenBucket)
                .burst(1_000_000)
                .settled()
        };
        let reserved = granted(client, &[rule()]).await;
        let settled = reserved.settle((1 << 31) + 2).await.unwrap();
        assert!(settled.rules[0].applied);
        let bucket = client.token_bucket(&name, 1, interval).burst(1_000_000);
        assert_eq!(bucket.available().await.unwrap(), 0, "in debt, not wrapped");
        assert!(matches!(
            client.reserve(&[rule()]).await.unwrap(),
            Reserved::Refused(_)
        ));
    }
}

/// A token bucket's debt stops at its rate below zero: one hostile amount keeps the
/// limiter refused about one interval (as a window's excess leaves with its grant),
/// not for years.
#[tokio::test]
async fn a_bucket_debt_stops_at_its_rate_below_zero() {
    let clock = ManualClock::new(START);
    let (_server, clients) = clients(&clock).await;
    for (i, client) in clients.iter().enumerate() {
        let name = format!("debt:{i}");
        let rule = || {
            Rule::new(&name, 1_000, MINUTE)
                .algorithm(Algorithm::TokenBucket)
                .settled()
        };
        let settled = granted(client, &[rule()]).await.settle(u64::MAX).await.unwrap();
        assert!(settled.rules[0].applied);
        assert_eq!(settled.rules[0].remaining, 0);
        let refused = match client.reserve(&[rule()]).await.unwrap() {
            Reserved::Refused(decision) => decision,
            Reserved::Granted(_) => panic!("granted in debt"),
        };
        // 999 tokens were left: the floor is 1 000 below zero; 1 001 refill in 60.06 s.
        assert_eq!(refused.retry_after, Some(Duration::from_millis(60_060)), "{i}");
        clock.advance(Duration::from_millis(60_059));
        assert!(matches!(
            client.reserve(&[rule()]).await.unwrap(),
            Reserved::Refused(_)
        ));
        clock.advance(Duration::from_millis(1));
        drop(granted(client, &[rule()]).await);
    }
}

/// A token bucket's settle mark lasts as long as the settle may be sent again (the
/// reservation's longest window and a minute), not the bucket's own interval: a retry
/// after a short bucket's interval still finds it.
#[tokio::test]
async fn a_bucket_settle_mark_lasts_as_long_as_a_retry() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    let short = Rule::new("mark:short", 1_000, Duration::from_millis(50))
        .algorithm(Algorithm::TokenBucket)
        .settled()
        .permits(500);
    let reservation = granted(&client, &[short, Rule::new("mark:window", 10, MINUTE)]).await;
    reservation.settle(0).await.unwrap();
    let marks: Vec<String> = redis::cmd("KEYS")
        .arg("{mark:short}:settled:*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(marks.len(), 1, "{marks:?}");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&marks[0])
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(ttl > 100_000, "the mark outlives every retry: {ttl} ms");
}

/// A client deciding at the server's time settles at the server's time too: its own
/// clock, running ahead, does not put a grant still in its window out of it.
#[tokio::test]
async fn a_client_on_the_server_s_time_settles_on_it() {
    let server = RedisServer::start();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let ahead = ManualClock::new(now + 2_000);
    let client = Client::builder()
        .clock(ahead.clone())
        .server_time(true)
        .connect(&server.url())
        .await
        .unwrap();
    let rule = || {
        Rule::new("server:time", 10, Duration::from_secs(5))
            .keep_alive(Some(HOUR))
            .settled()
    };
    let reservation = granted(&client, &[rule()]).await;
    ahead.advance(Duration::from_millis(3_100));
    let settled = reservation.settle(10).await.unwrap();
    assert!(
        settled.rules[0].applied,
        "2.1 s old by the server's clock: in its window"
    );
    assert!(matches!(
        client.reserve(&[rule()]).await.unwrap(),
        Reserved::Refused(_)
    ));
}

/// In process, a limiter holding a reservation's grant is not let go at the bound
/// before the settle: a spray of new keys cannot erase the excess the settle charges.
#[tokio::test]
async fn a_spray_of_new_keys_does_not_erase_a_pending_excess() {
    let client = Client::builder().max_limiters(8).memory();
    let victim = || Rule::new("spray:victim", 10, MINUTE).settled();
    let reservation = granted(&client, &[victim()]).await;
    for i in 0..200 {
        let rule = Rule::new(format!("spray:other:{i}"), 10, MINUTE);
        assert!(client.check_rules(&[rule]).await.unwrap().allowed);
    }
    let settled = reservation.settle(1_000).await.unwrap();
    assert!(settled.rules[0].applied, "the grant was still there to settle");
    assert!(matches!(
        client.reserve(&[victim()]).await.unwrap(),
        Reserved::Refused(_)
    ));
    // Settled, it no longer holds its limiter: the bound may let it go again.
    for i in 200..400 {
        let rule = Rule::new(format!("spray:other:{i}"), 10, MINUTE);
        assert!(client.check_rules(&[rule]).await.unwrap().allowed);
    }
}

/// A bucket another program wrote, not one the scripts read, fails the settle with
/// nothing written (no mark either): once it is mended, the settle sent again applies,
/// an excess charged once, and a refund given back as far as its grant's room, which
/// the settle sent again carries (with none, 300 not given back).
#[tokio::test]
async fn a_settle_on_a_foreign_bucket_fails_and_writes_nothing() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    // (the name, the permits reserved, the amount settled, what is left once it lands)
    for (name, reserved, used, left_after) in [
        ("foreign:bucket", 100, 400, 600..=601),
        ("foreign:refund", 400, 100, 900..=901),
    ] {
        let rule = Rule::new(name, 1_000, HOUR)
            .algorithm(Algorithm::TokenBucket)
            .settled()
            .permits(reserved);
        let key = format!("{{{name}}}:bucket");
        let reservation = granted(&client, &[rule]).await;
        let stored: String = redis::cmd("GET").arg(&key).query_async(&mut raw).await.unwrap();
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg("not a bucket")
            .query_async(&mut raw)
            .await
            .unwrap();
        let failed = reservation.settle(used).await;
        assert!(matches!(failed, Err(Error::CorruptBucket { .. })), "{failed:?}");
        let marks: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{{{name}}}:settled:*"))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(
            marks.is_empty(),
            "no mark for a settle that did nothing: {marks:?}"
        );
        // Mended: the retry sent in the background now lands, once.
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(&stored)
            .query_async(&mut raw)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
        let left = client.token_bucket(name, 1_000, HOUR).available().await.unwrap();
        assert!(
            left_after.contains(&left),
            "{name}: {used} counted once: {left} left"
        );
    }
}

/// A window's excess settled late (its mark set, the excess charged at the settle's
/// time), then the same settle sent at a time within the grant's window (a clock that
/// stepped back, a failover to a server whose clock is behind): counted once. Before,
/// the settle in the window did not look at the mark and charged the excess again.
#[tokio::test]
async fn a_late_settle_sent_again_at_an_earlier_time_counts_once() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    drop(granted(&client, &[tokens("back:window").permits(100)]).await);
    let logged: Vec<Vec<u8>> = redis::cmd("ZRANGE")
        .arg("{back:window}:permits")
        .arg(0)
        .arg(-1)
        .query_async(&mut raw)
        .await
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut outcomes = Vec::new();
    for at in [now + 60_001, now] {
        let settled: i64 = redis::Script::new(redlimit::SETTLE_SCRIPT)
            .key("back:window")
            .key("{back:window}:value")
            .key("{back:window}:value:x")
            .key("{back:window}:permits")
            .key("{back:window}:permits:x")
            .key("{back:window}:settled:mark")
            .arg(at)
            .arg("w")
            .arg(&logged[0][..])
            .arg(100)
            .arg(400)
            // mark_ms:rate:interval:burst:warmup:type:keep_alive:at:room:segment
            .arg("120000:1000:60000:0:0:0:3600000:0:0:0")
            .invoke_async(&mut raw)
            .await
            .unwrap();
        outcomes.push(settled);
    }
    assert_eq!(outcomes[1], -2, "the second finds the mark: {outcomes:?}");
    assert_eq!(available(&client, "back:window").await, 600, "300 charged once");
}

/// A settle whose grant left its window, its limiter expired since and its name now
/// another program's hash, fails and writes nothing: neither the config it would have
/// written again into that hash (with the hash's expiry set, so that it was gone a
/// second later), nor, when the hash has a `rate` and an `interval` of its own, the
/// log, the value and the expiry a limiter's config would have had, nor the settle's
/// mark.
#[tokio::test]
async fn a_late_settle_writes_no_config_into_another_programs_hash() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    let foreign: [&[(&str, &str)]; 2] = [
        &[("email", "ada@example.com")],
        &[
            ("rate", "0.05"),
            ("interval", "month"),
            ("keepAliveTime", "2000"),
            ("owner", "billing"),
        ],
    ];
    for (i, fields) in foreign.into_iter().enumerate() {
        let name = format!("shared:profile:{i}");
        let rule = Rule::new(&name, 10, Duration::from_millis(300))
            .settled()
            .permits(5);
        let reservation = granted(&client, &[rule]).await;
        let (value, log) = (format!("{{{name}}}:value"), format!("{{{name}}}:permits"));
        let _: () = redis::cmd("DEL")
            .arg(&name)
            .arg(&value)
            .arg(&log)
            .query_async(&mut raw)
            .await
            .unwrap();
        let _: () = redis::cmd("HSET")
            .arg(&name)
            .arg(fields)
            .query_async(&mut raw)
            .await
            .unwrap();
        let _: () = redis::cmd("EXPIRE")
            .arg(&name)
            .arg(3_600)
            .query_async(&mut raw)
            .await
            .unwrap();
        let dump = |raw: &mut redis::aio::MultiplexedConnection| {
            let (mut raw, name) = (raw.clone(), name.clone());
            async move {
                let dump: Vec<u8> = redis::cmd("DUMP").arg(&name).query_async(&mut raw).await.unwrap();
                dump
            }
        };
        let before = dump(&mut raw).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        let failed = reservation.settle(50).await;
        assert!(
            matches!(&failed, Err(Error::NotALimiter { key, .. }) if *key == name),
            "{name}: {failed:?}"
        );
        // (and nothing written by a settle sent again in the background meanwhile)
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(dump(&mut raw).await, before, "{name}: the hash as it was");
        let ttl: i64 = redis::cmd("PTTL").arg(&name).query_async(&mut raw).await.unwrap();
        assert!(ttl > 3_500_000, "{name}: its own expiry kept, {ttl} ms left");
        let written: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{{{name}}}:*"))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(written.is_empty(), "{name}: no mark, log or value: {written:?}");
    }
}

/// A settle meeting state a call refuses (a config whose numbers a call refuses, a
/// value that is not a decimal integer, a value key of another type) fails as the call
/// would, before writing anything: no mark, so that the settle sent again once the
/// state is mended applies. Before, a late settle set its mark and then failed on the
/// value (the excess never charged), wrote into configs a call refuses (`rate=0`, a
/// `keepAliveTime` past 64 bits, failing only after its writes), and a settle in the
/// window turned a refund into a charge under a rate of -5 and rewrote a value of
/// `0x10` as the rate.
#[tokio::test]
async fn a_settle_on_state_a_call_refuses_writes_nothing_and_lands_once_mended() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    let interval = Duration::from_millis(300);
    // (a name, whether the grant has left its window, the state spoiled, the error)
    type Case = (
        &'static str,
        bool,
        fn(&str) -> Vec<redis::Cmd>,
        fn(&Error) -> bool,
    );
    let cases: [Case; 6] = [
        (
            "late:value-hash",
            true,
            |name| {
                vec![
                    redis::cmd("DEL").arg(format!("{{{name}}}:value")).clone(),
                    redis::cmd("HSET")
                        .arg(format!("{{{name}}}:value"))
                        .arg("x")
                        .arg("y")
                        .clone(),
                ]
            },
            |e| matches!(e, Error::WrongType { role: "value", .. }),
        ),
        (
            "late:rate-zero",
            true,
            |name| vec![redis::cmd("HSET").arg(name).arg("rate").arg("0").clone()],
            |e| matches!(e, Error::CorruptConfig { field: "rate", .. }),
        ),
        (
            "late:keep-past-64-bits",
            true,
            |name| {
                vec![redis::cmd("HSET")
                    .arg(name)
                    .arg("keepAliveTime")
                    .arg("18446744073709551616")
                    .clone()]
            },
            |e| {
                matches!(
                    e,
                    Error::CorruptConfig {
                        field: "keepAliveTime",
                        ..
                    }
                )
            },
        ),
        (
            "late:type-01",
            true,
            |name| vec![redis::cmd("HSET").arg(name).arg("type").arg("01").clone()],
            |e| matches!(e, Error::CorruptConfig { field: "type", .. }),
        ),
        (
            "window:rate-negative",
            false,
            |name| vec![redis::cmd("HSET").arg(name).arg("rate").arg("-5").clone()],
            |e| matches!(e, Error::CorruptConfig { field: "rate", .. }),
        ),
        (
            "window:value-hex",
            false,
            |name| {
                vec![redis::cmd("SET")
                    .arg(format!("{{{name}}}:value"))
                    .arg("0x10")
                    .clone()]
            },
            |e| matches!(e, Error::CorruptValue { .. }),
        ),
    ];
    for (name, late, spoil, expected) in cases {
        let rule = Rule::new(name, 10, if late { interval } else { MINUTE })
            .keep_alive(Some(HOUR))
            .settled()
            .permits(5);
        let reservation = granted(&client, &[rule]).await;
        let spoiled = spoil(name);
        for cmd in &spoiled {
            let _: () = cmd.query_async(&mut raw).await.unwrap();
        }
        let keys = [
            name.to_owned(),
            format!("{{{name}}}:value"),
            format!("{{{name}}}:permits"),
        ];
        let dumps = |raw: &mut redis::aio::MultiplexedConnection| {
            let (mut raw, keys) = (raw.clone(), keys.clone());
            async move {
                let mut dumps = Vec::new();
                for key in &keys {
                    let dump: Option<Vec<u8>> =
                        redis::cmd("DUMP").arg(key).query_async(&mut raw).await.unwrap();
                    dumps.push(dump);
                }
                dumps
            }
        };
        if late {
            tokio::time::sleep(interval + Duration::from_millis(100)).await;
        }
        let before = dumps(&mut raw).await;
        let failed = reservation.settle(if late { 50 } else { 2 }).await;
        assert!(failed.as_ref().is_err_and(expected), "{name}: {failed:?}");
        let marks = |raw: &mut redis::aio::MultiplexedConnection| {
            let mut raw = raw.clone();
            async move {
                let marks: Vec<String> = redis::cmd("KEYS")
                    .arg(format!("{{{name}}}:settled:*"))
                    .query_async(&mut raw)
                    .await
                    .unwrap();
                marks
            }
        };
        assert_eq!(dumps(&mut raw).await, before, "{name}: nothing written");
        assert!(marks(&mut raw).await.is_empty(), "{name}: no mark");
        // Mended: the limiter's keys deleted; the settle sent again in the background
        // lands, once.
        let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut raw).await.unwrap();
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert_eq!(
            marks(&mut raw).await.len(),
            usize::from(late),
            "{name}: landed once"
        );
        // A late excess is charged as one entry of its own, of the 45 beyond the
        // estimate; a refund in the window, its grant gone with the keys, nothing.
        let log: Vec<Vec<u8>> = redis::cmd("ZRANGE")
            .arg(format!("{{{name}}}:permits"))
            .arg(0)
            .arg(-1)
            .query_async(&mut raw)
            .await
            .unwrap();
        let charged: Vec<(u8, u32)> = log
            .iter()
            .map(|m| {
                let (id, permits) = m.split_at(m.len() - 4);
                (id[id.len() - 1], u32::from_le_bytes(permits.try_into().unwrap()))
            })
            .collect();
        let expected_log = if late { vec![(b'L', 45)] } else { Vec::new() };
        assert_eq!(charged, expected_log, "{name}: charged once");
    }
}

/// A settle of several rules reads every rule's state before its first write: a later
/// rule's config a call refuses fails the settle with the earlier rules untouched (no
/// mark, no member rewritten), where the earlier rules were settled and the caller told
/// it failed; mended, the settle sent again lands each rule once.
#[tokio::test]
async fn a_settle_of_several_rules_fails_whole_and_lands_once_mended() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    let rule = |name: &str| {
        Rule::new(name, 10, MINUTE)
            .keep_alive(Some(HOUR))
            .settled()
            .permits(3)
    };
    let reservation = granted(&client, &[rule("several:a"), rule("several:b")]).await;
    let _: () = redis::cmd("HSET")
        .arg("several:b")
        .arg("rate")
        .arg("0")
        .query_async(&mut raw)
        .await
        .unwrap();
    let keys = ["several:a", "{several:a}:value", "{several:a}:permits"];
    let dumps = |raw: &mut redis::aio::MultiplexedConnection| {
        let mut raw = raw.clone();
        async move {
            let mut dumps = Vec::new();
            for key in keys {
                let dump: Option<Vec<u8>> = redis::cmd("DUMP").arg(key).query_async(&mut raw).await.unwrap();
                dumps.push(dump);
            }
            dumps
        }
    };
    let before = dumps(&mut raw).await;
    let failed = reservation.settle(8).await;
    assert!(
        matches!(&failed, Err(Error::CorruptConfig { key, field: "rate", .. }) if key == "several:b"),
        "{failed:?}"
    );
    assert_eq!(dumps(&mut raw).await, before, "the first rule untouched");
    // Mended: the settle sent again in the background lands, each rule once.
    let _: () = redis::cmd("HSET")
        .arg("several:b")
        .arg("rate")
        .arg("10")
        .query_async(&mut raw)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(available(&client, "several:a").await, 2, "8 counted once");
    assert_eq!(available(&client, "several:b").await, 2, "8 counted once");
}

/// A value above the rate (inflated by hand), which a call rebuilds from the log, is
/// left for the next call to rebuild, the settled grant or the excess's entry in the
/// log: before, a settle in the window took it as the rate and wrote it (the grant and
/// its excess never counted: a call of 10 was granted beside a grant settled at 5), and
/// a late one wrote it less the excess, past 64 bits as -2^63.
#[tokio::test]
async fn a_settle_leaves_a_value_above_the_rate_for_the_log_to_rebuild() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    for (name, interval, inflated) in [
        ("above:window", MINUTE, "1000"),
        ("above:late", Duration::from_millis(300), "99999999999999999999"),
    ] {
        let rule = Rule::new(name, 10, interval)
            .keep_alive(Some(HOUR))
            .settled()
            .permits(2);
        let reservation = granted(&client, &[rule]).await;
        let _: () = redis::cmd("SET")
            .arg(format!("{{{name}}}:value"))
            .arg(inflated)
            .query_async(&mut raw)
            .await
            .unwrap();
        if interval < MINUTE {
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        let settled = reservation.settle(5).await.unwrap();
        assert!(settled.rules[0].applied, "{name}: {settled:?}");
        let value: String = redis::cmd("GET")
            .arg(format!("{{{name}}}:value"))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(value, inflated, "{name}: left for the next call");
        // The next call rebuilds it: 10 less the 5 the log holds (the window), or less
        // the excess of 3 (late: the grant has left the window).
        let left = if interval == MINUTE { 5 } else { 7 };
        let limiter = client.rate_limiter(name);
        assert!(
            !limiter.try_acquire(left + 1).await.unwrap(),
            "{name}: {} refused",
            left + 1
        );
        assert!(limiter.try_acquire(left).await.unwrap(), "{name}: {left} granted");
    }
}

/// State a call reads as it is, a settle reads alike and lands: a `keepAliveTime`
/// written with a leading zero (`060000`, which Redis refuses as an expiry: the late
/// settle failed after its writes, and an acquire or a release on a config it does not
/// own too),
/// and another type at the log of the mode the limiter is not in (which calls never
/// read: every settle of a per-client limiter failed on it, its excess never charged).
#[tokio::test]
async fn a_settle_reads_what_a_call_reads_and_lands() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    // A late excess under a keepAliveTime of `060000`.
    let name = "lands:keep";
    let rule = Rule::new(name, 10, Duration::from_millis(300))
        .keep_alive(Some(HOUR))
        .settled()
        .permits(5);
    let reservation = granted(&client, &[rule]).await;
    let _: () = redis::cmd("HSET")
        .arg(name)
        .arg("keepAliveTime")
        .arg("060000")
        .query_async(&mut raw)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let settled = reservation.settle(50).await.unwrap();
    assert!(settled.rules[0].applied, "{settled:?}");
    let ttl: i64 = redis::cmd("PTTL").arg(name).query_async(&mut raw).await.unwrap();
    assert!((50_000..=60_000).contains(&ttl), "{name}: 60 s, {ttl} ms left");
    let limiter = client.rate_limiter(name);
    assert!(limiter.try_acquire(1).await.is_ok(), "a call reads it too");
    assert!(limiter.release(1).await.is_ok(), "and a release");
    // A release refuses a config a call refuses, before it writes: a rate of -5 took
    // permits away where it gives them back.
    let _: () = redis::cmd("HSET")
        .arg(name)
        .arg("rate")
        .arg("-5")
        .query_async(&mut raw)
        .await
        .unwrap();
    let value: Option<String> = redis::cmd("GET")
        .arg("{lands:keep}:value")
        .query_async(&mut raw)
        .await
        .unwrap();
    let failed = limiter.release(2).await;
    assert!(
        matches!(failed, Err(Error::CorruptConfig { field: "rate", .. })),
        "{failed:?}"
    );
    let after: Option<String> = redis::cmd("GET")
        .arg("{lands:keep}:value")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(after, value, "nothing written");
    // A per-client limiter beside a string at the overall log.
    let name = "lands:mode";
    let rule = Rule::new(name, 10, MINUTE)
        .mode(redlimit::RateType::PerClient)
        .settled()
        .permits(5);
    let reservation = granted(&client, &[rule]).await;
    let _: () = redis::cmd("SET")
        .arg("{lands:mode}:permits")
        .arg("another program's")
        .query_async(&mut raw)
        .await
        .unwrap();
    let settled = reservation.settle(8).await.unwrap();
    assert!(settled.rules[0].applied, "{settled:?}");
    assert_eq!(settled.rules[0].counted, 8);
}

/// A caller's wait for its settle is timed on its own runtime: with the client's
/// runtime held up (its one worker blocked for 4 s), the settle answers `Timeout`
/// within four command timeouts (500 ms each: long enough for the reservation before
/// on a busy machine), and lands once that runtime runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_on_a_held_up_client_runtime_answers_within_its_wait() {
    let server = RedisServer::start();
    let url = server.url();
    let client_runtime = std::thread::spawn(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    })
    .join()
    .unwrap();
    let client = client_runtime
        .spawn(async move {
            Client::builder()
                .command_timeout(Duration::from_millis(500))
                .connect(&url)
                .await
                .unwrap()
        })
        .await
        .unwrap();
    let reservation = granted(&client, &[tokens("held:window").permits(10)]).await;
    client_runtime.spawn(async { std::thread::sleep(Duration::from_millis(4_000)) });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    let answered = reservation.settle(400).await;
    let took = started.elapsed();
    assert!(matches!(answered, Err(Error::Timeout { .. })), "{answered:?}");
    assert!(took < Duration::from_millis(3_000), "answered after {took:?}");
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    assert_eq!(available(&client, "held:window").await, 600, "400 counted, once");
    client_runtime.shutdown_background();
}
