//! The CLI's writes (`reset`, `set-rate`) on keys that are not limiters: another
//! program's string or hash, the override table, a refusal report, a key under a
//! limiter's name that holds something else. Each is refused with a message naming
//! what the key holds, exit code 1, and nothing written; limiters and token buckets
//! are still reset and tuned.

mod binary;
use redlimit_test_support as support;

use binary::{redlimit, text};

use std::time::Duration;

use redis::AsyncCommands;
use redlimit::{Client, RateType};
use support::RedisServer;

const MINUTE: Duration = Duration::from_secs(60);

/// A key's type, TTL and contents.
async fn state(raw: &mut redis::aio::MultiplexedConnection, key: &str) -> (String, i64, Option<Vec<u8>>) {
    let kind: String = redis::cmd("TYPE").arg(key).query_async(raw).await.unwrap();
    let ttl: i64 = raw.pttl(key).await.unwrap();
    let dump: Option<Vec<u8>> = redis::cmd("DUMP").arg(key).query_async(raw).await.unwrap();
    (kind, ttl, dump)
}

/// `args` on `key` exit 1 naming what it holds, and leave `key` (and `also`) as they
/// were.
async fn refused(
    url: &str,
    raw: &mut redis::aio::MultiplexedConnection,
    args: &[&str],
    key: &str,
    also: &[&str],
    found: &str,
) {
    let mut before = vec![state(raw, key).await];
    for other in also {
        before.push(state(raw, other).await);
    }
    let out = redlimit(url, args);
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {shown}");
    assert!(shown.contains(found), "{args:?}: {shown}");
    assert!(shown.contains(key), "{args:?}: {shown}");
    assert!(shown.contains("nothing"), "{args:?}: {shown}");
    let mut after = vec![state(raw, key).await];
    for other in also {
        after.push(state(raw, other).await);
    }
    assert_eq!(before, after, "{args:?} wrote");
}

#[tokio::test]
async fn reset_deletes_only_limiters() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.raw().await;

    // A limiter that does not exist yet, whose state keys another program holds: the
    // restart would have deleted them.
    let _: () = redis::cmd("SADD")
        .arg("{app:user:43}:permits")
        .arg("read")
        .query_async(&mut raw)
        .await
        .unwrap();
    refused(
        &url,
        &mut raw,
        &[
            "set-rate",
            "app:user:43",
            "--rate",
            "5",
            "--interval",
            "1m",
            "--reset",
        ],
        "{app:user:43}:permits",
        &[],
        "holds a set",
    )
    .await;
    let _: () = raw.set("session:abc", "token").await.unwrap();
    refused(
        &url,
        &mut raw,
        &["reset", "session:abc", "--yes"],
        "session:abc",
        &[],
        "holds a string",
    )
    .await;
    let _: () = raw
        .hset_multiple("user:42", &[("name", "ada"), ("email", "ada@example.com")])
        .await
        .unwrap();
    refused(
        &url,
        &mut raw,
        &["reset", "user:42", "--yes"],
        "user:42",
        &[],
        "without rate, interval, type",
    )
    .await;

    // The library's keys, by name, whatever they hold.
    let out = redlimit(
        &url,
        &["override", "set", "login", "--rate", "3", "--interval", "1m"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let _: () = raw
        .hset_multiple(
            "rate_limit:redlimit:overrides",
            &[("rate", "5"), ("interval", "1000"), ("type", "0")],
        )
        .await
        .unwrap();
    refused(
        &url,
        &mut raw,
        &["reset", "rate_limit:redlimit:overrides", "--yes"],
        "rate_limit:redlimit:overrides",
        &[],
        "override table",
    )
    .await;
    let _: () = raw
        .hset("rate_limit:redlimit:refused:1700000000", "login", 3)
        .await
        .unwrap();
    refused(
        &url,
        &mut raw,
        &["reset", "rate_limit:redlimit:refused:1700000000", "--yes"],
        "rate_limit:redlimit:refused:1700000000",
        &[],
        "refusal report",
    )
    .await;

    // A limiter whose keys include one that is not a limiter's: nothing deleted.
    let client = Client::connect(&url).await.unwrap();
    let limiter = client.rate_limiter("mixed");
    limiter
        .try_set_rate(RateType::PerClient, 5, MINUTE)
        .await
        .unwrap();
    assert!(limiter.try_acquire(1).await.unwrap());
    let _: () = raw.hset("{mixed}:value:foreign", "x", "y").await.unwrap();
    refused(
        &url,
        &mut raw,
        &["reset", "mixed", "--yes"],
        "{mixed}:value:foreign",
        &["mixed"],
        "holds a hash",
    )
    .await;
    let _: () = raw.del("{mixed}:value:foreign").await.unwrap();
    let out = redlimit(&url, &["reset", "mixed", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("3 keys deleted"), "{}", text(&out));

    // A token bucket's state is a limiter's; a string under a bucket's name that does
    // not decode is not.
    let bucket = client.token_bucket("tb", 5, MINUTE);
    assert!(bucket.try_acquire(1).await.unwrap());
    let out = redlimit(&url, &["reset", "tb", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("1 key deleted"), "{}", text(&out));
    let exists: bool = raw.exists("{tb}:bucket").await.unwrap();
    assert!(!exists);
    let _: () = raw.set("{tb2}:bucket", "1:2:3").await.unwrap();
    refused(
        &url,
        &mut raw,
        &["reset", "tb2", "--yes"],
        "{tb2}:bucket",
        &[],
        "not a token bucket",
    )
    .await;

    let out = redlimit(&url, &["reset", "nothing:here", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("no limiter named"), "{}", text(&out));
}

#[tokio::test]
async fn set_rate_writes_only_limiters() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.raw().await;

    let _: () = raw
        .hset_multiple("user:42", &[("name", "ada"), ("email", "ada@example.com")])
        .await
        .unwrap();
    for extra in [&[][..], &["--reset"][..], &["--keep-alive", "2m", "--reset"][..]] {
        let mut args = vec!["set-rate", "user:42", "--rate", "5", "--interval", "1m"];
        args.extend(extra);
        refused(
            &url,
            &mut raw,
            &args,
            "user:42",
            &[],
            "without rate, interval, type",
        )
        .await;
    }
    let _: () = raw.set("session:abc", "token").await.unwrap();
    refused(
        &url,
        &mut raw,
        &[
            "set-rate",
            "session:abc",
            "--rate",
            "5",
            "--interval",
            "1m",
            "--reset",
        ],
        "session:abc",
        &[],
        "holds a string",
    )
    .await;

    // The override table, as it is and made to look like a config: never a limiter,
    // so it is neither rewritten nor given a TTL.
    let out = redlimit(
        &url,
        &["override", "set", "login", "--rate", "3", "--interval", "1m"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for extra in [&[][..], &["--reset"][..]] {
        let mut args = vec![
            "set-rate",
            "rate_limit:redlimit:overrides",
            "--rate",
            "5",
            "--interval",
            "1s",
            "--keep-alive",
            "1s",
        ];
        args.extend(extra);
        refused(
            &url,
            &mut raw,
            &args,
            "rate_limit:redlimit:overrides",
            &[],
            "override table",
        )
        .await;
    }
    let _: () = raw
        .hset_multiple(
            "rate_limit:redlimit:overrides",
            &[("rate", "5"), ("interval", "1000"), ("type", "0")],
        )
        .await
        .unwrap();
    refused(
        &url,
        &mut raw,
        &[
            "set-rate",
            "rate_limit:redlimit:overrides",
            "--rate",
            "5",
            "--interval",
            "1s",
            "--keep-alive",
            "1s",
        ],
        "rate_limit:redlimit:overrides",
        &[],
        "override table",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let table: Option<String> = raw
        .hget("rate_limit:redlimit:overrides", "rule:login")
        .await
        .unwrap();
    assert!(
        table.is_some(),
        "the override table outlives a refused keep-alive"
    );

    // A missing key becomes a limiter with --reset; a limiter is tuned.
    let out = redlimit(
        &url,
        &["set-rate", "new:1", "--rate", "5", "--interval", "1m", "--reset"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = redlimit(&url, &["set-rate", "new:1", "--rate", "6", "--interval", "1m"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rate: String = raw.hget("new:1", "rate").await.unwrap();
    assert_eq!(rate, "6");
    let out = redlimit(&url, &["set-rate", "new:2", "--rate", "5", "--interval", "1m"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("no limiter named"), "{}", text(&out));
}

/// A config another program wrote at the limits of its numbers (a rate of
/// `i64::MAX`, an interval of `i64::MIN`, a value below zero) is shown, not a panic
/// (the tests run a debug build, which panics on overflow), and a count of permits no
/// call may take is refused, not answered "would be granted".
#[tokio::test]
async fn configs_at_the_limits_and_too_many_permits_are_answered() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.raw().await;
    let _: () = redis::cmd("HSET")
        .arg("edge")
        .arg(&[
            "rate",
            &i64::MAX.to_string(),
            "interval",
            &i64::MIN.to_string(),
            "type",
            "0",
        ])
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: () = raw.set("{edge}:value", "-5").await.unwrap();
    let _: () = redis::cmd("ZADD")
        .arg("{edge}:permits")
        .arg(1)
        .arg(b"\x01\x02\x03\x04\x05\x06\x07\x08\x01\x00\x00\x00".as_slice())
        .query_async(&mut raw)
        .await
        .unwrap();
    for args in [
        &["ls"][..],
        &["check", "edge"],
        &["inspect", "edge"],
        &["watch", "edge", "--count", "1"],
    ] {
        let out = redlimit(&url, args);
        let shown = text(&out);
        assert!(
            matches!(out.status.code(), Some(0..=3)),
            "{args:?} ended {:?}: {shown}",
            out.status
        );
        assert!(!shown.contains("panicked"), "{args:?}: {shown}");
    }

    let client = Client::connect(&url).await.unwrap();
    let limiter = client.rate_limiter("small");
    assert!(limiter.try_set_rate(RateType::Overall, 3, MINUTE).await.unwrap());
    for permits in ["4294967296", "9223372036854775808", "18446744073709551615"] {
        for command in ["check", "acquire"] {
            let out = redlimit(&url, &[command, "small", "--permits", permits]);
            let shown = text(&out);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{command} --permits {permits}: {shown}"
            );
            assert!(
                shown.contains("at most 4294967295"),
                "{command} --permits {permits}: {shown}"
            );
        }
    }
    assert_eq!(limiter.available_permits().await.unwrap(), 3, "nothing taken");
}

/// Keys whose names are not UTF-8 (another program's: no limiter's name is) are
/// passed over: `ls`, `inspect` and `reset` of a limiter beside them work, and they
/// are left as they were.
#[tokio::test]
async fn keys_named_in_bytes_that_are_not_utf8_are_passed_over() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.raw().await;
    let client = Client::connect(&url).await.unwrap();
    let limiter = client.rate_limiter("good");
    assert!(limiter.try_set_rate(RateType::Overall, 3, MINUTE).await.unwrap());
    assert!(limiter.try_acquire(1).await.unwrap());
    let foreign: [&[u8]; 2] = [b"bad\xffkey", b"{good}:value:\xff"];
    for key in foreign {
        let _: () = raw.hset(key, "rate", "1").await.unwrap();
    }
    for args in [&["ls"][..], &["inspect", "good"], &["reset", "good", "--yes"]] {
        let out = redlimit(&url, args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
    }
    assert!(!raw.exists::<_, bool>("good").await.unwrap(), "the limiter reset");
    for key in foreign {
        let kept: Option<String> = raw.hget(key, "rate").await.unwrap();
        assert_eq!(kept.as_deref(), Some("1"), "{key:?} left as it was");
    }
}

/// A string of another program's under a limiter's name, 10 MB long, is read and
/// shown only as far as a value or a bucket's state can be (256 bytes): `inspect`,
/// `ls` and `check` answer in a few kilobytes, not in megabytes.
#[tokio::test]
async fn a_huge_string_under_a_limiter_s_name_is_not_read_whole() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.raw().await;
    let huge = "x".repeat(10 << 20);
    let _: () = raw.set("{hb}:bucket", &huge).await.unwrap();
    let client = Client::connect(&url).await.unwrap();
    let limiter = client.rate_limiter("hv");
    assert!(limiter.try_set_rate(RateType::Overall, 3, MINUTE).await.unwrap());
    let _: () = raw.set("{hv}:value", &huge).await.unwrap();
    for args in [
        &["inspect", "hb"][..],
        &["inspect", "hv"],
        &["ls"],
        &["check", "hv"],
    ] {
        let out = redlimit(&url, args);
        let shown = text(&out);
        assert!(shown.len() < 4_096, "{args:?}: {} bytes shown", shown.len());
        assert!(!shown.contains("panicked"), "{args:?}: {shown}");
    }
    let shown = text(&redlimit(&url, &["inspect", "hb"]));
    assert!(shown.contains("not a token bucket's state"), "{shown}");
}

/// A limiter's value is read as the scripts read it, or not at all: `+0`, ` 0` and
/// `0 ` are "not a number" (every call fails on them), and a value longer than the CLI
/// reads (257 bytes of `-000…05`) is said to be beyond it. `check` answers none of
/// them (exit 1) where it said "would be granted", and `inspect` names each a problem
/// rather than "missing"; a value of `i64::MAX` is inspected without a panic. An
/// inflated value, beside entries that left the window or not, and a debt deeper than
/// the log holds (past 64 bits either) are rebuilt from the log, as the next call
/// rebuilds them.
#[tokio::test]
async fn values_are_read_as_the_scripts_read_them() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.raw().await;
    let client = Client::connect(&url).await.unwrap();
    let limiter = client.rate_limiter("w");
    assert!(limiter.try_set_rate(RateType::Overall, 10, MINUTE).await.unwrap());
    assert!(limiter.try_acquire(3).await.unwrap());
    let long = format!("-{}5", "0".repeat(255));
    for (value, said) in [
        ("+0", "not a number"),
        (" 0", "not a number"),
        ("0 ", "not a number"),
        (long.as_str(), "longer than the CLI reads"),
    ] {
        let _: () = raw.set("{w}:value", value).await.unwrap();
        let out = redlimit(&url, &["check", "w"]);
        let shown = text(&out);
        assert_eq!(out.status.code(), Some(1), "{value:?}: {shown}");
        assert!(shown.contains(said), "{value:?}: {shown}");
        let shown = text(&redlimit(&url, &["inspect", "w"]));
        assert!(shown.contains(said), "{value:?}: {shown}");
        assert!(!shown.contains("is missing"), "{value:?}: {shown}");
    }
    // i64::MAX beside a grant that left the window (their sum overflowed in `inspect`)
    let now: (u64, u64) = redis::cmd("TIME").query_async(&mut raw).await.unwrap();
    let left_ms = now.0 * 1_000 - 120_000;
    let gone = support::redisson_member(b"gone0000", 1);
    let _: () = raw.zadd("{w}:permits", &gone, left_ms).await.unwrap();
    let _: () = raw.set("{w}:value", i64::MAX).await.unwrap();
    let out = redlimit(&url, &["inspect", "w"]);
    assert!(!text(&out).contains("panicked"), "{}", text(&out));
    assert!(text(&out).contains("available now 7;"), "{}", text(&out));
    // (the JSON's figure is the text's: it added the value to what left, and overflowed)
    let out = redlimit(&url, &["inspect", "w", "--json"]);
    assert!(text(&out).contains("\"available_now\":7"), "{}", text(&out));
    let _: () = raw.zrem("{w}:permits", &gone).await.unwrap();
    // 1 000 stored, 2 permits left the window: rebuilt from the log (10 less the 3
    // held), as the next call rebuilds it, so 8 would be refused (7 available). Then
    // 1 000 stored again, nothing left the window since: rebuilt from the log too, as
    // the next call rebuilds a value above the rate; so are a debt deeper than the log
    // holds, numbers past 64 bits and any of more than 16 characters, which the
    // scripts take for one above any rate.
    for (stale, inflated) in [
        (true, "1000"),
        (false, "1000"),
        (false, "-1000"),
        (false, "9223372036854775808"),
        (false, "99999999999999999999"),
        (false, "-9223372036854775809"),
        // 17 characters: above any rate to the scripts, which read it as text
        (false, "00000000000000005"),
    ] {
        if stale {
            let now: (u64, u64) = redis::cmd("TIME").query_async(&mut raw).await.unwrap();
            let left_ms = now.0 * 1_000 - 120_000;
            let member = support::redisson_member(b"12345678", 2);
            let _: () = raw.zadd("{w}:permits", member, left_ms).await.unwrap();
        }
        let _: () = raw.set("{w}:value", inflated).await.unwrap();
        let out = redlimit(&url, &["check", "w", "--permits", "8"]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(
            text(&out).contains("7 available"),
            "{stale} {inflated}: {}",
            text(&out)
        );
        let said = if inflated.len() > 16 {
            "more than 16 characters"
        } else {
            "not the rate"
        };
        let shown = text(&redlimit(&url, &["inspect", "w"]));
        assert!(shown.contains(said), "{inflated}: {shown}");
        assert!(shown.contains("available now 7;"), "{inflated}: {shown}");
        let out = redlimit(&url, &["inspect", "w", "--json"]);
        assert!(
            text(&out).contains("\"available_now\":7"),
            "{inflated}: {}",
            text(&out)
        );
        assert!(
            !limiter.try_acquire(8).await.unwrap(),
            "the call refuses as check said"
        );
    }
}

/// What `check` says of a state written by hand, against a real call on it.
#[derive(Clone, Copy, Debug)]
enum Said {
    /// Granted or refused as the call is, with this many available.
    Answer(bool, i64),
    /// An error (exit 1, nothing on stdout), as the call fails.
    CallFails,
    /// An error saying what a call finds is not said here: state no limiter writes,
    /// whose arithmetic in the scripts' doubles `check` does not follow.
    Untold,
}

/// One state written by hand for `check_answers_as_the_next_call_does`: its name, the
/// config fields written over a rate of 10 a minute (a `None` field deleted), the
/// value (`None`: missing), the log as (ms from now, permits; `u32::MAX`: a member that
/// does not decode), the permits asked, and what `check` says.
type Written = (
    &'static str,
    Vec<(&'static str, Option<&'static str>)>,
    Option<&'static str>,
    Vec<(f64, u32)>,
    u64,
    Said,
);

/// `check` answers as the next call does, read through the scripts' own steps (the Rust
/// twin they are held equal to), on state a call reads its own way; each answer is
/// then compared with a real call's on the same state. A debt the 64 oldest entries of
/// the log cannot repay, with more entries past them, is waited out (the wait until
/// the newest leaves), not rebuilt: check rebuilt it; so is a debt behind 65 entries
/// of 0 permits (Redisson's `tryAcquire(0)` logs them), while behind 3, read past
/// within the 64, it is rebuilt; a grant up to 1 s ahead of the clock moves
/// the call's time to it (an older grant then leaves the window): check refused. A
/// member that does not decode, permits above the rate, configs the scripts refuse
/// (`+10`, no type, a keep-alive of `abc`) and a value key of another type fail the
/// call, and check answers none of them (it answered them all). State no limiter
/// writes and whose doubles check does not follow (a rate past 2^52, a score that is
/// a fraction or negative) is said to be so, where check answered otherwise than the
/// call.
#[tokio::test]
async fn check_answers_as_the_next_call_does() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.raw().await;
    let client = Client::connect(&url).await.unwrap();
    let live = |n: u32, permits: u32| {
        (0..n)
            .map(|i| (-30_000.0 + f64::from(i), permits))
            .collect::<Vec<_>>()
    };
    let rate = |text| vec![("rate", Some(text))];
    let cases: Vec<Written> = vec![
        (
            "walk:65",
            rate("100"),
            Some("-100"),
            live(65, 1),
            1,
            Said::Answer(false, -100),
        ),
        (
            "walk:64",
            rate("100"),
            Some("-100"),
            live(64, 1),
            1,
            Said::Answer(true, 36),
        ),
        (
            "zeros:65",
            vec![],
            Some("-1"),
            live(65, 0),
            1,
            Said::Answer(false, -1),
        ),
        (
            "zeros:3",
            vec![],
            Some("-1"),
            live(3, 0),
            1,
            Said::Answer(true, 10),
        ),
        (
            "zeros:2",
            vec![],
            Some("-1"),
            live(2, 0),
            1,
            Said::Answer(true, 10),
        ),
        (
            "reorder",
            rate("2"),
            Some("0"),
            vec![(-59_100.0, 1), (990.0, 1)],
            1,
            Said::Answer(true, 1),
        ),
        (
            "undecodable",
            vec![],
            Some("-1000"),
            vec![(-30_000.0, 3), (-20_000.0, u32::MAX)],
            1,
            Said::CallFails,
        ),
        ("above-rate", vec![], Some("10"), Vec::new(), 11, Said::CallFails),
        ("plus-rate", rate("+10"), None, Vec::new(), 1, Said::CallFails),
        (
            "zeros-rate",
            rate("00000000000000010"),
            None,
            Vec::new(),
            1,
            Said::CallFails,
        ),
        (
            "no-type",
            vec![("type", None)],
            None,
            Vec::new(),
            1,
            Said::CallFails,
        ),
        (
            "keep-abc",
            vec![("keepAliveTime", Some("abc"))],
            None,
            Vec::new(),
            1,
            Said::CallFails,
        ),
        (
            "past-2^52",
            rate("9007199254740992"),
            Some("9007199254740993"),
            live(1, 1),
            1,
            Said::Untold,
        ),
        (
            "fraction",
            vec![],
            Some("0"),
            vec![(-59_499.5, 5), (500.5, 1)],
            1,
            Said::Untold,
        ),
        ("negative", vec![], Some("5"), vec![(-2e13, 5)], 1, Said::Untold),
    ];
    for (name, config, value, log, permits, said) in cases {
        let now: (u64, u64) = redis::cmd("TIME").query_async(&mut raw).await.unwrap();
        let now = (now.0 * 1_000 + now.1 / 1_000) as f64;
        let _: () = redis::cmd("HSET")
            .arg(name)
            .arg(&[
                ("rate", "10"),
                ("interval", "60000"),
                ("type", "0"),
                ("keepAliveTime", "0"),
            ])
            .query_async(&mut raw)
            .await
            .unwrap();
        for (field, text) in config {
            let _: () = match text {
                Some(text) => raw.hset(name, field, text).await.unwrap(),
                None => raw.hdel(name, field).await.unwrap(),
            };
        }
        if let Some(value) = value {
            let _: () = raw.set(format!("{{{name}}}:value"), value).await.unwrap();
        }
        for (i, &(at, held)) in log.iter().enumerate() {
            let member = if held == u32::MAX {
                b"bad".to_vec()
            } else {
                support::redisson_member(&(i as u64).to_le_bytes(), held)
            };
            let _: () = raw
                .zadd(format!("{{{name}}}:permits"), member, now + at)
                .await
                .unwrap();
        }
        let out = redlimit(
            &url,
            &["check", name, "--permits", &permits.to_string(), "--json"],
        );
        let call = client.rate_limiter(name).try_acquire(permits).await;
        match said {
            Said::Answer(granted, available) => {
                assert_eq!(
                    out.status.code(),
                    Some(if granted { 0 } else { 1 }),
                    "{name}: {}",
                    text(&out)
                );
                let read = binary::json(&out);
                assert_eq!(read["allowed"], granted, "{name}: {read}");
                assert_eq!(read["available"], available, "{name}: {read}");
                assert_eq!(call.unwrap(), granted, "{name}: the call");
            }
            Said::CallFails => {
                assert_eq!(out.status.code(), Some(1), "{name}: {}", text(&out));
                assert!(out.stdout.is_empty(), "{name}: answered {}", text(&out));
                assert!(call.is_err(), "{name}: the call fails: {call:?}");
            }
            Said::Untold => {
                assert_eq!(out.status.code(), Some(1), "{name}: {}", text(&out));
                assert!(text(&out).contains("not said here"), "{name}: {}", text(&out));
            }
        }
    }
    // A value key of another type: named, not taken for an outage.
    let _: () = raw.hset("wrong", "rate", "10").await.unwrap();
    let _: () = raw.hset("wrong", "interval", "60000").await.unwrap();
    let _: () = raw.hset("wrong", "type", "0").await.unwrap();
    let _: () = raw.rpush("{wrong}:value", "1").await.unwrap();
    let out = redlimit(&url, &["check", "wrong"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("is a list, not a string"), "{}", text(&out));
    assert!(client.rate_limiter("wrong").try_acquire(1).await.is_err());
    let shown = text(&redlimit(&url, &["inspect", "wrong"]));
    assert!(!shown.contains("rebuilds it from the log"), "{shown}");
}

/// A log longer than one transaction reads (10 000 entries) is read in ranges after
/// the value; a call landing between the reads (moving what left the window out of
/// the log into the value) is seen, and `check` says it cannot tell rather than answer
/// from neither state: without the check it said "refused; 0 available" where 1 000
/// and then 999 were available (value 0, 1 000 grants gone from the window, 20 000 in
/// it).
#[tokio::test]
async fn check_sees_a_call_land_while_a_long_log_is_read() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.raw().await;
    let _: () = redis::cmd("HSET")
        .arg("long")
        .arg(&[
            ("rate", "21000"),
            ("interval", "600000"),
            ("type", "0"),
            ("keepAliveTime", "0"),
        ])
        .query_async(&mut raw)
        .await
        .unwrap();
    let now: (u64, u64) = redis::cmd("TIME").query_async(&mut raw).await.unwrap();
    let now = now.0 * 1_000;
    let gone: Vec<(u64, Vec<u8>)> = (0..1_000u64)
        .map(|i| (now - 605_000, support::redisson_member(&i.to_le_bytes(), 1)))
        .collect();
    for chunk in (1_000..21_000u64).collect::<Vec<_>>().chunks(10_000) {
        let members: Vec<(u64, Vec<u8>)> = chunk
            .iter()
            .map(|&i| (now - 300_000, support::redisson_member(&i.to_le_bytes(), 1)))
            .collect();
        let _: () = raw.zadd_multiple("{long}:permits", &members).await.unwrap();
    }
    let client = Client::connect(&url).await.unwrap();
    let limiter = client.rate_limiter("long");
    for delay in [0u64, 20, 40, 60, 80, 100, 150, 200] {
        let _: () = raw.zadd_multiple("{long}:permits", &gone).await.unwrap();
        let _: () = raw.set("{long}:value", 0).await.unwrap();
        let url = url.clone();
        let check = std::thread::spawn(move || redlimit(&url, &["check", "long"]));
        tokio::time::sleep(Duration::from_millis(delay)).await;
        assert!(limiter.try_acquire(1).await.unwrap());
        let out = check.join().unwrap();
        let said = text(&out);
        // Either state (1 000 available, then 999) grants; or the call is seen.
        assert!(
            said.contains("would be granted") || said.contains("changed while"),
            "after {delay} ms: {said}"
        );
    }
}
