//! Section 8's `growth-` rows (BENCHMARKS.md, "How each cost grows"): how the work of
//! a decision grows with the rules of a call, the permits it asks, the grants its
//! window holds, the grants that left the window since the limiter's last call, and
//! the limiters held. The row decides on a client whose clock it moves, so each
//! decision meets the same state; what a row sets up in Redis it writes with EVAL,
//! which the instruction count (EVALSHA only) leaves out.
//!
//! `growth-rules-N` (N = 1, 2, 4, 8): one call of N rules on N limiters of 10^9 a
//! second, the clock moved by 1 ms a call. `growth-permits-P` (P = 1, 10, 100, 1000):
//! one rule of 1 000 a second taking P permits, the clock moved by the window a call.
//! `growth-window-N-allow` / `-deny` (N = 10, 1000, 100000): a window holding N live
//! one-permit grants, then a grant (a rate of 2N; the window slides by 1 ms a call,
//! one grant in, one out) or a refusal (a rate of N an hour, nothing leaving).
//! `growth-left-N` (N = 10, 1000, 100000): before each decision, N one-permit grants
//! written an interval earlier, so the decision meets N grants that left the window.
//! `growth-held-N` (N = 1, 1000, 1000000): one limiter decided with N - 1 others held
//! (two keys each).

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redlimit::{Client, ManualClock, Rule};

/// A limiter written whole: its config (a sliding window, overall, kept alive for
/// `keep` ms), its log holding `count` one-permit grants at scores `score`, `score +
/// step`, ... (members numbered from `first`), and its value, the rate less the log.
const FILL: &str = "local rate, interval, keep = ARGV[1], ARGV[2], ARGV[3] \
    redis.call('hset', KEYS[1], 'rate', rate, 'interval', interval, 'type', '0', 'keepAliveTime', keep) \
    local first, count, score, step = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]) \
    for i = 0, count - 1 do \
      redis.call('zadd', KEYS[3], string.format('%d', score + i * step), \
        struct.pack('Bc0I', 16, string.format('%016d', first + i), 1)) end \
    redis.call('set', KEYS[2], string.format('%d', tonumber(rate) - redis.call('zcard', KEYS[3]))) \
    for j = 1, 3 do redis.call('pexpire', KEYS[j], keep) end";

/// Limiters `first` to `last` of the `held` rows, config and value only.
const MANY: &str = "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do \
      local name = 'rate_limit:bench:growth:held:' .. i \
      redis.call('hset', name, 'rate', ARGV[3], 'interval', '1000', 'type', '0', 'keepAliveTime', '3600000') \
      redis.call('set', '{' .. name .. '}:value', ARGV[3], 'px', '3600000') end";

const HOUR_MS: u64 = 3_600_000;
const RATE: u64 = 1_000_000_000;
const START_MS: u64 = 1_700_000_000_000;

/// `rule`'s limiter written by [`FILL`]: `count` grants from `score`, `step` ms apart.
async fn fill(conn: &MultiplexedConnection, rule: &Rule, count: u64, score: u64, step: u64) {
    let name = rule.name();
    let config = rule.config();
    // in batches, each short enough for a reply under an instruction counter
    let mut done = 0;
    while done < count.max(1) {
        let batch = (count - done).min(10_000);
        let _: () = redis::cmd("EVAL")
            .arg(FILL)
            .arg(3)
            .arg(name)
            .arg(format!("{{{name}}}:value"))
            .arg(format!("{{{name}}}:permits"))
            .arg(config.rate)
            .arg(config.interval.as_millis() as u64)
            .arg(HOUR_MS)
            .arg(done)
            .arg(batch)
            .arg(score + done * step)
            .arg(step)
            .query_async(&mut conn.clone())
            .await
            .unwrap();
        done += batch.max(1);
    }
}

async fn decide(client: &Client, rules: &[Rule], granted: bool) {
    assert_eq!(client.check_rules(rules).await.unwrap().allowed, granted);
}

fn rule(name: &str, rate: u64, interval: Duration) -> Rule {
    Rule::new(format!("rate_limit:bench:growth:{name}"), rate, interval)
        .keep_alive(Some(Duration::from_millis(HOUR_MS)))
}

/// The row `row`, `calls` decisions, on the server at `url` (`conn`).
pub async fn row(url: &str, conn: &MultiplexedConnection, row: &str, calls: usize) {
    let mut parts = row.split('-').skip(1);
    let kind = parts.next().unwrap_or_default();
    let n: u64 = parts
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{row}: expected growth-<kind>-<number>"));
    let clock = ManualClock::new(START_MS);
    let client = Client::builder()
        .command_timeout(Duration::from_secs(30))
        .connect_timeout(Duration::from_secs(10))
        .local_refusals(false)
        .clock(clock.clone())
        .connect(url)
        .await
        .unwrap();
    if kind == "left" {
        return left(conn, &client, &clock, n, calls).await;
    }
    let (rules, step, granted) = set_up(conn, kind, n, parts.next() != Some("deny")).await;
    for _ in 0..calls {
        clock.advance(step);
        decide(&client, &rules, granted).await;
    }
}

/// A row but `left`, written in Redis: the rules of each decision, how far the clock
/// moves before each, and whether each is granted.
async fn set_up(
    conn: &MultiplexedConnection,
    kind: &str,
    n: u64,
    allow: bool,
) -> (Vec<Rule>, Duration, bool) {
    let (ms, second) = (Duration::from_millis(1), Duration::from_secs(1));
    match kind {
        "rules" => {
            let rules: Vec<Rule> = (0..n)
                .map(|i| rule(&format!("rules:{i}"), RATE, second))
                .collect();
            for r in &rules {
                fill(conn, r, 0, 0, 0).await;
            }
            (rules, ms, true)
        }
        "permits" => {
            let rules = vec![rule("permits", 1_000, second).permits(n)];
            fill(conn, &rules[0], 0, 0, 0).await;
            (rules, second, true)
        }
        "window" if allow => {
            let rules = vec![rule("window", 2 * n, ms * n as u32)];
            fill(conn, &rules[0], n, START_MS - n + 1, 1).await;
            (rules, ms, true)
        }
        "window" => {
            let rules = vec![rule("window", n, Duration::from_millis(HOUR_MS))];
            fill(conn, &rules[0], n, START_MS, 0).await;
            (rules, ms, false)
        }
        "held" => {
            for first in (0..n).step_by(10_000) {
                let _: () = redis::cmd("EVAL")
                    .arg(MANY)
                    .arg(0)
                    .arg(first)
                    .arg((first + 9_999).min(n - 1))
                    .arg(RATE)
                    .query_async(&mut conn.clone())
                    .await
                    .unwrap();
            }
            (vec![rule("held:0", RATE, second)], ms, true)
        }
        _ => panic!("growth-{kind}: expected growth-rules, -permits, -window, -left or -held"),
    }
}

/// `growth-left-N`: before each decision, N one-permit grants written a window earlier.
async fn left(conn: &MultiplexedConnection, client: &Client, clock: &ManualClock, n: u64, calls: usize) {
    let rules = [rule("left", n, Duration::from_secs(1))];
    let name = rules[0].name();
    let mut now = START_MS;
    for _ in 0..calls {
        now += HOUR_MS;
        let _: () = redis::cmd("DEL")
            .arg(format!("{{{name}}}:permits"))
            .query_async(&mut conn.clone())
            .await
            .unwrap();
        fill(conn, &rules[0], n, now, 0).await;
        clock.set(now + 1_000);
        decide(client, &rules, true).await;
    }
}
