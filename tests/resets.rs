//! An operator's reset reaches every process: a refusal a client keeps in process
//! (`local_refusals`, on by default) is dropped within about a second of the limiter
//! being deleted or restarted anywhere, through `check_rules`, the attribute and the
//! layer alike, against a real redis-server. Without the announcement each of these
//! calls stays refused for the whole wait Redis gave (20 s here). A batch a client
//! serves ends with the reset the same way.

use redlimit_test_support as support;

use std::future::Future;
use std::time::{Duration, Instant};

use redlimit::{Client, RateType, Rule};
use support::RedisServer;

const WINDOW: Duration = Duration::from_secs(20);
/// A reset must reach every process within about a second (each reads the
/// announcements every second); allowed here with room for a loaded machine.
const REACHED_WITHIN: Duration = Duration::from_millis(2_500);

/// How the operator resets the limiter `name` (from a client of its own: another
/// process as far as the deciding client can tell).
#[derive(Debug, Clone, Copy)]
enum Reset {
    Delete,
    SetRate,
    /// Deleted as a writer outside redlimit would (a Java service's `delete`), then
    /// announced by hand.
    RawDeleteAnnounced,
}

impl Reset {
    async fn apply(self, operator: &Client, server: &RedisServer, name: &str) {
        let limiter = operator.rate_limiter(name);
        match self {
            Reset::Delete => assert!(limiter.delete().await.unwrap()),
            Reset::SetRate => limiter.set_rate(RateType::Overall, 2, WINDOW).await.unwrap(),
            Reset::RawDeleteAnnounced => {
                let mut raw = server.raw().await;
                let keys = limiter.keys().unwrap().all();
                let _: u64 = redis::cmd("DEL")
                    .arg(&keys[..])
                    .query_async(&mut raw)
                    .await
                    .unwrap();
                operator.announce_reset(name).await.unwrap();
            }
        }
    }
}

/// Calls `call` (true: granted) every 50 ms until it grants; how long that took.
/// Panics past twice [`REACHED_WITHIN`].
async fn until_granted<F: Future<Output = bool>>(mut call: impl FnMut() -> F) -> Duration {
    let started = Instant::now();
    loop {
        if call().await {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < 2 * REACHED_WITHIN,
            "still refused after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Exhausts the limiter through `call`, checks its refusal is kept (answered with
/// no script call), resets it with `reset`, and answers how long until `call` passes.
async fn kept_then_reset<F: Future<Output = bool>>(
    server: &RedisServer,
    operator: &Client,
    name: &str,
    reset: Reset,
    mut call: impl FnMut() -> F,
) -> Duration {
    assert!(call().await && call().await, "{name}: the first two grant");
    assert!(!call().await, "{name}: the third is refused");
    let monitor = support::monitor::Monitor::start(server.port);
    assert!(!call().await, "{name}: refused again");
    let scripts = monitor
        .client_commands()
        .iter()
        .filter(|c| c.starts_with("EVAL"))
        .count();
    assert_eq!(scripts, 0, "{name}: the refusal is kept in process");
    reset.apply(operator, server, name).await;
    until_granted(call).await
}

#[redlimit::rate_limit(key = "resets:attr:{n}", rate = 2, interval = "20s")]
async fn attributed(n: u32) -> Result<(), redlimit::RateLimited> {
    let _ = n;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_anywhere_ends_kept_refusals_within_about_a_second() {
    let server = RedisServer::start();
    let deciding = Client::connect(&server.url()).await.unwrap();
    let operator = Client::connect(&server.url()).await.unwrap();
    redlimit::set_default(deciding.clone()).unwrap();
    let resets = [Reset::Delete, Reset::SetRate, Reset::RawDeleteAnnounced];
    let mut took = Vec::new();

    for (i, reset) in resets.into_iter().enumerate() {
        let name = format!("rate_limit:resets:rules:{i}");
        let rule = [Rule::new(name.as_str(), 2, WINDOW)];
        let call = || async { deciding.check_rules(&rule).await.unwrap().allowed };
        took.push((
            "check_rules",
            reset,
            kept_then_reset(&server, &operator, &name, reset, call).await,
        ));

        let name = format!("rate_limit:resets:attr:{i}");
        let call = || async { attributed(i as u32).await.is_ok() };
        took.push((
            "attribute",
            reset,
            kept_then_reset(&server, &operator, &name, reset, call).await,
        ));
    }
    #[cfg(feature = "axum")]
    for (i, reset) in resets.into_iter().enumerate() {
        use redlimit::tower::{LayerRule, RateLimitLayer};
        let rule = format!("resets:layer:{i}");
        let layer = RateLimitLayer::builder()
            .client(deciding.clone())
            .rule(LayerRule::new(rule.clone(), 2, WINDOW))
            .build()
            .unwrap();
        let addr = support::http::serve_route("/", |app| app.layer(layer)).await;
        let call = || async { support::http::send(addr, "GET", "/", &[]).await.status == 200 };
        let name = format!("rate_limit:{rule}");
        took.push((
            "layer",
            reset,
            kept_then_reset(&server, &operator, &name, reset, call).await,
        ));
    }
    eprintln!("{took:?}");
    for (path, reset, took) in took {
        assert!(
            took <= REACHED_WITHIN,
            "{path}, {reset:?}: granted {took:?} after the reset"
        );
    }
}

/// Whatever the stream's key holds (an entry that is not UTF-8, a value of another
/// type, an entry with the last id a stream can have, so that nothing can be
/// announced), a kept refusal ends within about a second of its limiter's reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_stream_contents_never_keep_a_refusal_past_a_reset() {
    let server = RedisServer::start();
    let deciding = Client::connect(&server.url()).await.unwrap();
    let operator = Client::connect(&server.url()).await.unwrap();
    let key = deciding.resets_key();
    let mut raw = server.raw().await;
    let cases: [(&str, redis::Cmd); 3] = [
        (
            "not UTF-8",
            redis::cmd("XADD")
                .arg(&key)
                .arg("*")
                .arg("name")
                .arg(&[0xff_u8, 0xfe][..])
                .clone(),
        ),
        ("a string", redis::cmd("SET").arg(&key).arg("x").clone()),
        (
            "the last id",
            redis::cmd("XADD")
                .arg(&key)
                .arg("18446744073709551615-18446744073709551615")
                .arg("name")
                .arg("x")
                .clone(),
        ),
    ];
    for (i, (what, poison)) in cases.into_iter().enumerate() {
        let _: () = redis::cmd("DEL").arg(&key).query_async(&mut raw).await.unwrap();
        let _: redis::Value = poison.query_async(&mut raw).await.unwrap();
        let name = format!("rate_limit:resets:hostile:{i}");
        let rule = [Rule::new(name.as_str(), 2, WINDOW)];
        let call = || async { deciding.check_rules(&rule).await.unwrap().allowed };
        let took = kept_then_reset(&server, &operator, &name, Reset::Delete, call).await;
        assert!(took <= REACHED_WITHIN, "{what}: granted {took:?} after the reset");
    }
}

/// A batch (`Rule::batch`) ends with its limiter's reset: the client that resets it
/// serves no permit more from its own batch at once, and every other client within
/// about a second. Without that, a rule of 10 a window granted 19 in the window after a
/// reset: 10 to a client taking them anew, 9 from an old batch, whose lease (up to the
/// interval) had not ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_ends_the_batches_clients_serve() {
    let server = RedisServer::start();
    // A client that only batches, through `check_rules`: it keeps no refusal (which is
    // what starts its background task), so its sweeper reads the resets.
    let batching = Client::connect(&server.url()).await.unwrap();
    let resetting = Client::connect(&server.url()).await.unwrap();
    let operator = Client::connect(&server.url()).await.unwrap();
    let interval = Duration::from_secs(10);
    let batched = |name: &str| {
        [Rule::new(name, 10, interval)
            .batch(10)
            .batch_lease(Duration::from_secs(9))]
    };
    let own_keys = |name: &str| batched(name).map(|rule| rule.mode(RateType::PerClient));
    // Grants of `rule` out of `n` calls by `client`.
    async fn granted(client: &Client, rule: &[Rule], n: usize) -> usize {
        let mut granted = 0;
        for _ in 0..n {
            granted += usize::from(client.check_rules(rule).await.unwrap().allowed);
        }
        granted
    }
    // Each reset by another client, read within about a second.
    let resets = [Reset::Delete, Reset::SetRate, Reset::RawDeleteAnnounced];
    let mut names = Vec::new();
    for (i, _) in resets.iter().enumerate() {
        let name = format!("rate_limit:resets:batch:{i}");
        assert_eq!(granted(&batching, &batched(&name), 1).await, 1);
        names.push(name);
    }
    // Per client, a batch is counted in its client's own keys: another client's
    // `delete`, or `set_rate` to a per-client config, leaves them, and the batch serves
    // on; `set_rate` to an overall config (the batching client's next call, writing its
    // mode back, starts its state afresh) and every client's keys deleted and
    // announced (as the CLI's `reset` does) end it.
    let per_client = ["deleted", "per-client rate", "overall rate", "every key"]
        .map(|case| (case, format!("rate_limit:resets:batch:{case}")));
    for (_, name) in &per_client {
        assert_eq!(granted(&batching, &own_keys(name), 1).await, 1);
    }
    for (reset, name) in resets.iter().zip(&names) {
        reset.apply(&operator, &server, name).await;
    }
    let [deleted, per_client_rate, overall_rate, gone] = per_client.map(|(_, name)| name);
    assert!(operator.rate_limiter(&deleted).delete().await.unwrap());
    let limiter = operator.rate_limiter(&per_client_rate);
    limiter.set_rate(RateType::PerClient, 10, interval).await.unwrap();
    let limiter = operator.rate_limiter(&overall_rate);
    limiter.set_rate(RateType::Overall, 10, interval).await.unwrap();
    let mut raw = server.raw().await;
    let every: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{gone}}}*"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        every.len() >= 2,
        "the batching client's own value and log: {every:?}"
    );
    let _: u64 = redis::cmd("DEL")
        .arg(&gone)
        .arg(&every[..])
        .query_async(&mut raw)
        .await
        .unwrap();
    operator.announce_reset(&gone).await.unwrap();
    // The client's own reset: at once.
    let own = "rate_limit:resets:batch:own";
    assert_eq!(granted(&resetting, &batched(own), 1).await, 1);
    assert!(resetting.rate_limiter(own).delete().await.unwrap());
    let after_own = (
        granted(&operator, &[Rule::new(own, 10, interval)], 10).await,
        granted(&resetting, &batched(own), 20).await,
    );
    assert_eq!(
        after_own,
        (10, 0),
        "the client's own reset ends its batch at once"
    );
    tokio::time::sleep(REACHED_WITHIN).await;
    for (reset, name) in resets.iter().zip(&names) {
        let fresh = granted(&operator, &[Rule::new(name.as_str(), 10, interval)], 10).await;
        let old = granted(&batching, &batched(name), 20).await;
        assert_eq!((fresh, old), (10, 0), "{reset:?}: the window after the reset");
    }
    // (the batching client first: after a delete, a give-back would find no config to
    // give into)
    for name in [&deleted, &per_client_rate] {
        let served_on = granted(&batching, &own_keys(name), 20).await;
        let others = granted(&operator, &own_keys(name), 20).await;
        assert_eq!((others, served_on), (10, 9), "{name}: each client's own window");
    }
    // Its state started afresh, or its keys gone, the batching client's window starts
    // again: 10, not 9 more from the old batch and 10 from the next.
    for name in [&overall_rate, &gone] {
        let anew = granted(&batching, &own_keys(name), 20).await;
        assert_eq!(anew, 10, "{name}: the window after the reset");
    }
}
