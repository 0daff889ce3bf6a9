//! A call that cannot be decided for a reason other than the backend (here a client
//! prefix that splits the limiter's keys across cluster slots) is refused with the
//! error as its cause, under every `on_error`, naming the enforced rule.

use redlimit::{rate_limit, Client, Error, RateLimited};

#[rate_limit(key = "misuse:shadow", rate = 1, interval = "60s", shadow = true)]
#[rate_limit(
    key = "misuse:enforced",
    rate = 5,
    interval = "60s",
    on_error = "allow",
    message = "enforced"
)]
async fn behind_a_shadow_rule() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "misuse:local", rate = 5, interval = "60s")]
async fn local_policy() -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn misuse_refuses_and_names_the_enforced_rule() {
    redlimit::set_default(Client::builder().prefix("a{b:").memory()).unwrap();
    let refused = behind_a_shadow_rule().await.unwrap_err();
    assert!(
        matches!(refused.cause(), Some(Error::CrossSlotName { .. })),
        "{refused:?}"
    );
    assert_eq!(refused.rule(), 1, "the enforced rule, not the shadow one");
    assert_eq!(refused.message(), Some("enforced"));
    assert_eq!(refused.limit().map(|l| &*l.name), Some("misuse:enforced"));
    let refused = local_policy().await.unwrap_err();
    assert!(
        refused.cause().is_some_and(|c| !c.is_backend_failure()),
        "{refused:?}"
    );
}
