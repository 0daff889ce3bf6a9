//! `#[rate_limit]` with `cost` and `settle`, in process: every scenario of
//! `settle_attribute/common.rs` on an in-process default client with a manual clock.
//! The default client is process-wide, so this binary runs one test.

#[path = "settle_attribute/common.rs"]
mod common;

use redlimit::{Client, ManualClock};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costs_known_after_the_call_in_process() {
    let clock = ManualClock::new(1_700_000_000_000);
    let client = Client::builder().clock(clock.clone()).memory();
    redlimit::set_default(client.clone()).unwrap();
    common::an_excess_is_a_debt(&client, &clock).await;
    common::what_is_not_used_goes_back(&client, &clock).await;
    common::mixed_rules_hold_together(&client, &clock).await;
    common::a_fallback_answers_a_refusal(&client, &clock).await;
    common::a_shadow_rule_is_settled_too(&client, &clock).await;
    common::a_waiting_call_settles_what_it_reserved(&client, &clock).await;
    common::hostile_values_keep_the_limit(&client, &clock).await;
}
