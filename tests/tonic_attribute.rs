//! `#[rate_limit]` on a gRPC service method returning `Result<Response<T>, Status>`
//! (cargo feature `tonic`): a refusal is `RESOURCE_EXHAUSTED` with `retry-after`
//! metadata and a `google.rpc.RetryInfo` detail a client can read.
#![cfg(feature = "tonic")]

use std::time::Duration;

use redlimit::{rate_limit, Client};
use tonic::{Code, Response, Status};
use tonic_types::StatusExt;

struct Accounts;

impl Accounts {
    #[rate_limit(key = "rpc:balance:{id}", rate = 1, interval = "90s")]
    async fn balance(&self, id: u32) -> Result<Response<u64>, Status> {
        Ok(Response::new(u64::from(id) * 100))
    }
}

#[tokio::test]
async fn a_refused_call_is_resource_exhausted_with_retry_info() {
    redlimit::set_default(Client::memory()).unwrap();
    let accounts = Accounts;
    assert_eq!(accounts.balance(7).await.unwrap().into_inner(), 700);
    let status = accounts.balance(7).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.metadata().get("retry-after").unwrap(), "90");
    let retry = status.get_details_retry_info().expect("RetryInfo");
    let delay = retry.retry_delay.expect("a delay");
    assert!(
        delay > Duration::from_secs(89) && delay <= Duration::from_secs(90),
        "{delay:?}"
    );
    assert!(accounts.balance(8).await.is_ok(), "another account");
}
