//! How much work one decision costs Redis, held against what callers control (the
//! permits of their calls, how many they make, from how many clients, what they
//! settle and release), each against a real redis-server. BENCHMARKS.md, "How each
//! cost grows", has the figures; the in-process twin of these bounds is
//! `runtime/src/backend/memory/growth_tests.rs`.

use redlimit_test_support as support;

use std::time::Duration;

use redlimit::{Client, Clock, ManualClock, Reserved, Rule};
use support::RedisServer;

const START: u64 = 1_700_000_000_000;
const HOUR: Duration = Duration::from_secs(3600);

/// A client deciding at `clock`, every refusal asked of Redis.
async fn client(server: &RedisServer, clock: &ManualClock) -> Client {
    Client::builder()
        .clock(clock.clone())
        .local_refusals(false)
        .connect(&server.url())
        .await
        .unwrap()
}

async fn zcard(raw: &mut redis::aio::MultiplexedConnection, name: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(format!("{{{name}}}:permits"))
        .query_async(raw)
        .await
        .unwrap()
}

/// Whatever callers do, a limiter's log holds at most its rate's entries (each holds a
/// permit or more, and value + log = rate), so the first decision after a busy window,
/// which reads every entry that left, reads at most the rate's worth: read here from
/// the ZREMRANGEBYRANK that drops what it read.
#[tokio::test]
async fn what_left_the_window_is_at_most_the_rate_whatever_the_callers_do() {
    const RATE: u64 = 50;
    const NAME: &str = "rate_limit:growth:left";
    let server = RedisServer::start();
    let clock = ManualClock::new(START);
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(client(&server, &clock).await);
    }
    let mut raw = server.raw().await;
    // kept past its window, so that what left it is still there to read
    let rule = Rule::new(NAME, RATE, Duration::from_secs(1)).keep_alive(Some(HOUR));
    let mut held = async |step: &str| {
        let entries = zcard(&mut raw, NAME).await;
        assert!(
            entries <= RATE,
            "after {step}, the log holds {entries} entries, more than the rate {RATE}"
        );
        entries
    };
    // ten times the rate in one-permit calls from three clients, at one instant
    for call in 0..10 * RATE as usize {
        clients[call % 3]
            .check_rules(std::slice::from_ref(&rule))
            .await
            .unwrap();
    }
    held("ten times the rate in calls").await;
    // a window later, ten times the rate in reservations given back whole
    clock.advance(Duration::from_secs(1));
    for call in 0..10 * RATE as usize {
        if let Reserved::Granted(r) = clients[call % 3]
            .reserve(&[rule.clone().settled()])
            .await
            .unwrap()
        {
            r.settle(0).await.unwrap();
        }
    }
    held("reservations given back whole").await;
    // every size of call, settled with less or with far more (a debt), and releases
    for permits in 1..=RATE {
        clock.advance(Duration::from_millis(1));
        let client = &clients[permits as usize % 3];
        let rules = [rule.clone().settled().permits(permits)];
        if let Reserved::Granted(r) = client.reserve(&rules).await.unwrap() {
            let actual = if permits % 2 == 0 {
                permits / 2
            } else {
                permits * 1_000
            };
            r.settle(actual).await.unwrap();
        }
        client.rate_limiter(NAME).release(permits).await.unwrap();
        held("reservations settled with less and with more, and releases").await;
    }
    // then, a window later, ten times the rate again, and the first decision after the
    // window: it reads and drops what the log held, the rate's worth at most
    clock.advance(Duration::from_secs(1));
    for call in 0..10 * RATE as usize {
        clients[call % 3]
            .check_rules(std::slice::from_ref(&rule))
            .await
            .unwrap();
    }
    let before = held("ten times the rate in calls, again").await;
    assert_eq!(before, RATE, "one-permit calls fill the log to the rate");
    clock.advance(Duration::from_secs(1));
    let monitor = support::monitor::Monitor::start(server.port);
    clients[0].check_rules(std::slice::from_ref(&rule)).await.unwrap();
    let commands = monitor.script_commands();
    let dropped: Vec<u64> = commands
        .iter()
        .filter(|args| args[0] == "zremrangebyrank")
        .map(|args| args[3].parse::<u64>().unwrap() + 1)
        .collect();
    assert_eq!(dropped, [before], "the decision dropped what left: {commands:?}");
    for args in &commands {
        assert!(
            !(args[0] == "zrange" && args.get(3).map(String::as_str) == Some("-1") && args[2] != "-1"),
            "the decision read the rest of the log: {args:?}"
        );
    }
}

/// A limiter of `rate` per hour whose log holds `grants` one-permit grants at START,
/// written as the scripts write them, its value the rate less the log.
async fn filled(server: &RedisServer, name: &str, rate: u64, grants: u64) -> Rule {
    let rule = Rule::new(name, rate, HOUR);
    let clock = ManualClock::new(START);
    let client = client(server, &clock).await;
    assert!(
        client
            .check_rules(std::slice::from_ref(&rule))
            .await
            .unwrap()
            .allowed
    );
    let script = redis::Script::new(
        r"
        for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
          redis.call('zadd', KEYS[1], ARGV[3], struct.pack('Bc0I', 16, string.format('%016d', i), 1))
        end
        redis.call('set', KEYS[2], string.format('%d', ARGV[4] - redis.call('zcard', KEYS[1])), 'keepttl')
        ",
    );
    let mut raw = server.raw().await;
    for first in (1..grants.max(2)).step_by(5_000) {
        let _: () = script
            .key(format!("{{{name}}}:permits"))
            .key(format!("{{{name}}}:value"))
            .arg(first)
            .arg((first + 4_999).min(grants - 1))
            .arg(START)
            .arg(rate)
            .invoke_async(&mut raw)
            .await
            .unwrap();
    }
    assert_eq!(zcard(&mut raw, name).await, grants);
    rule
}

/// The least server time of five decisions of `rule` (SLOWLOG logs every command on
/// the server): the machine's other load only ever adds.
async fn least_us(server: &RedisServer, client: &Client, rule: &Rule, granted: bool) -> u64 {
    let mut raw = server.raw().await;
    let mut least = u64::MAX;
    for _ in 0..5 {
        let _: () = redis::cmd("SLOWLOG")
            .arg("RESET")
            .query_async(&mut raw)
            .await
            .unwrap();
        let decision = client.check_rules(std::slice::from_ref(rule)).await.unwrap();
        assert_eq!(decision.allowed, granted, "{}", rule.name());
        let entries: Vec<Vec<redis::Value>> = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(10)
            .query_async(&mut raw)
            .await
            .unwrap();
        let us = entries.iter().find_map(|entry| match (&entry[2], &entry[3]) {
            (redis::Value::Int(us), redis::Value::Array(args))
                if matches!(&args[0], redis::Value::BulkString(n) if n.eq_ignore_ascii_case(b"evalsha")) =>
            {
                Some(*us as u64)
            }
            _ => None,
        });
        least = least.min(us.expect("a script call in SLOWLOG"));
    }
    least
}

/// A grant or a refusal costs Redis about the same on a window of 100 000 grants as
/// on one of 10, and a grant of 100 000 permits what one of 1 permit costs: nothing a
/// decision reads grows with the window or the permits (a walk of the log cost
/// thousands of times more).
#[tokio::test]
async fn a_decision_costs_redis_the_same_whatever_its_window_or_permits() {
    let server = RedisServer::start_with(&["--slowlog-log-slower-than", "0"]);
    let clock = ManualClock::new(START + 1);
    let client = client(&server, &clock).await;
    let mut spent = Vec::new();
    for grants in [10, 100_000] {
        let open = filled(
            &server,
            &format!("rate_limit:growth:open:{grants}"),
            1_000_000,
            grants,
        )
        .await;
        let full = filled(
            &server,
            &format!("rate_limit:growth:full:{grants}"),
            grants,
            grants,
        )
        .await;
        spent.push([
            least_us(&server, &client, &open, true).await,
            least_us(&server, &client, &open.clone().permits(100_000), true).await,
            least_us(&server, &client, &full, false).await,
        ]);
    }
    println!("server time, us, [grant of 1, grant of 100 000, refusal] on 10 and 100 000 grants: {spent:?}");
    let base = spent[0][0].max(spent[0][2]).max(50);
    for (grants, times) in [10, 100_000].iter().zip(&spent) {
        for (what, us) in ["a grant of 1", "a grant of 100 000", "a refusal"]
            .iter()
            .zip(times)
        {
            assert!(
                *us < 20 * base,
                "{what} on a window of {grants} grants took {us} us against {base} us on 10"
            );
        }
    }
    assert!(clock.now_ms() > START);
}
