//! The default client: resolved from `REDIS_URL` on first use, fixed afterwards.
//! (Its own test binary: it sets an environment variable of the process.)

use redlimit_test_support as support;

use redlimit::{Client, Error, RateType};
use support::RedisServer;

#[tokio::test]
async fn the_default_client_comes_from_redis_url_once() {
    let server = RedisServer::start();
    std::env::remove_var("REDIS_URL");
    assert!(Client::from_env().unwrap().is_memory());
    std::env::set_var("REDIS_URL", server.url());
    assert!(!Client::from_env().unwrap().is_memory());

    let default = redlimit::default_client().unwrap();
    assert!(!default.is_memory(), "resolved from REDIS_URL");
    let limiter = default.rate_limiter("rate_limit:default");
    limiter
        .try_set_rate(RateType::Overall, 1, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    assert!(limiter.try_acquire(1).await.unwrap());
    let mut raw = server.raw().await;
    let value: String = redis::cmd("GET")
        .arg("{rate_limit:default}:value")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        value, "0",
        "the default client wrote to the server named by REDIS_URL"
    );

    assert!(std::ptr::eq(default, redlimit::default_client().unwrap()));
    let err = redlimit::set_default(Client::memory()).unwrap_err();
    assert!(matches!(err, Error::DefaultAlreadySet), "{err:?}");

    std::env::set_var("REDIS_URL", "not a url");
    let err = Client::from_env().unwrap_err();
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
    std::env::remove_var("REDIS_URL");
    assert!(Client::from_env().unwrap().is_memory());
}
