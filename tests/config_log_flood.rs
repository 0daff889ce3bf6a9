//! The log of configs a rule rewrote, under a spray of keys: two services deciding one
//! rule keyed by a caller's value at two rates (as during a rolling deploy that changes
//! it: two processes, each a client of one server, here two clients of one process
//! deciding by hand, which the registry of one process's rules would refuse from two
//! layers) rewrite a limiter's config for every value sent. The log holds at most 20
//! lines a period over all limiters, and says how many it left out. (A file of its
//! own: a test running beside it without a subscriber could leave the log's call sites
//! disabled.)

use redlimit_test_support as support;

use std::time::Duration;

use redlimit::{Client, ManualClock, Rule};
use support::RedisServer;

#[tokio::test(flavor = "current_thread")]
async fn a_spray_of_keys_across_two_configs_is_logged_in_a_bounded_number_of_lines() {
    let capture = support::capture::Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let server = RedisServer::start();
    let clock = ManualClock::new(1_700_000_000_000);
    let mut services = Vec::new();
    for rate in [100, 120] {
        let client = Client::builder()
            .clock(clock.clone())
            .connect(&server.url())
            .await
            .unwrap();
        services.push((client, rate));
    }
    let lines = || capture.text().matches("differs from the rule's").count();
    let spray = |from: usize, to: usize| {
        let services = services.clone();
        async move {
            for key in from..to {
                for (client, rate) in &services {
                    let rule = [Rule::new(
                        format!("rate_limit:api:sprayed-{key}"),
                        *rate,
                        Duration::from_secs(60),
                    )];
                    assert!(client.check_rules(&rule).await.unwrap().allowed);
                }
            }
        }
    };
    spray(0, 500).await;
    assert_eq!(lines(), 20, "500 limiters rewritten in one period");
    // An operator's limiter rewritten while the spray spent the period's lines: not
    // named then, and its next line counts it.
    let operator = Client::builder()
        .clock(clock.clone())
        .connect(&server.url())
        .await
        .unwrap();
    let orders = |rate| [redlimit::Rule::new("orders", rate, Duration::from_secs(60))];
    operator.check_rules(&orders(5)).await.unwrap();
    operator.check_rules(&orders(6)).await.unwrap();
    assert_eq!(lines(), 20);
    clock.advance(Duration::from_secs(10));
    spray(500, 501).await;
    assert_eq!(lines(), 21);
    assert!(
        capture.text().contains("rewrites_left_out_overall=481"),
        "{}",
        capture.text().lines().last().unwrap_or_default()
    );
    operator.check_rules(&orders(5)).await.unwrap();
    let last = capture.text().lines().last().unwrap_or_default().to_owned();
    assert!(
        last.contains("orders") && last.contains("rewrites_left_out=1 "),
        "{last}"
    );
}
