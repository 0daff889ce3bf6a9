//! `#[rate_limit]` on a gRPC service method returning `Result<Response<T>, Status>`
//! (cargo feature `tonic`): a refusal is `RESOURCE_EXHAUSTED` with `retry-after`
//! metadata and a `google.rpc.RetryInfo` detail a client can read, called directly and
//! over the wire (a real tonic server and client on loopback).
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
    let _ = redlimit::set_default(Client::memory());
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

mod over_the_wire {
    //! The attribute on a real tonic server's method (the standard health service,
    //! which needs no code generation here), called by a real client over HTTP/2.

    use std::pin::Pin;

    use redlimit::rate_limit;
    use tokio_stream::wrappers::TcpListenerStream;
    use tokio_stream::Stream;
    use tonic::{Code, Request, Response, Status};
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::health_server::{Health, HealthServer};
    use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
    use tonic_types::StatusExt;

    struct LimitedHealth;

    #[tonic::async_trait]
    impl Health for LimitedHealth {
        #[rate_limit(key = "grpc:health", rate = 2, interval = "60s")]
        async fn check(
            &self,
            request: Request<HealthCheckRequest>,
        ) -> Result<Response<HealthCheckResponse>, Status> {
            let _ = request;
            Ok(Response::new(HealthCheckResponse {
                status: ServingStatus::Serving as i32,
            }))
        }

        type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

        async fn watch(&self, _: Request<HealthCheckRequest>) -> Result<Response<Self::WatchStream>, Status> {
            Err(Status::unimplemented("watch"))
        }
    }

    #[tokio::test]
    async fn a_client_reads_resource_exhausted_and_the_retry_delay() {
        let _ = redlimit::set_default(redlimit::Client::memory());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(HealthServer::new(LimitedHealth))
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = HealthClient::new(channel);
        let ask = || {
            Request::new(HealthCheckRequest {
                service: String::new(),
            })
        };
        for _ in 0..2 {
            let answer = client.check(ask()).await.unwrap().into_inner();
            assert_eq!(answer.status, ServingStatus::Serving as i32);
        }
        let status = client.check(ask()).await.unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(status.metadata().get("retry-after").unwrap(), "60");
        let delay = status
            .get_details_retry_info()
            .expect("RetryInfo")
            .retry_delay
            .unwrap();
        assert!(delay.as_secs() >= 59, "{delay:?}");
    }
}
