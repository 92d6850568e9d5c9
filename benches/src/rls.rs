//! A minimal implementation of Envoy's global rate limit service API
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) that
//! answers `OK` to every request: the cheapest possible per-request rate
//! limit service, for comparing Envoy's `envoy.filters.http.ratelimit`
//! filter with Sluice. A real service (Envoy's `ratelimit` with Redis) does
//! strictly more work per request, so the numbers it yields are a lower bound
//! for that design.

use std::net::SocketAddr;

use anyhow::{Context, Result};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// Code generated from `benches/proto/envoy/**` (a wire-compatible subset of
/// Envoy's API), in the module layout its cross-package paths expect.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod envoy {
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/envoy.extensions.common.ratelimit.v3.rs"
                    ));
                }
            }
        }
    }
    pub mod service {
        pub mod ratelimit {
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/envoy.service.ratelimit.v3.rs"));
            }
        }
    }
}

use envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

/// The service: every descriptor is under its limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct AlwaysOk;

#[tonic::async_trait]
impl RateLimitService for AlwaysOk {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let descriptors = request.get_ref().descriptors.len();
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok.into(),
            statuses: vec![
                DescriptorStatus {
                    code: Code::Ok.into(),
                };
                descriptors
            ],
        }))
    }
}

/// Binds an ephemeral loopback port.
pub async fn bind() -> Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .context("cannot bind the rate limit service")?;
    let addr = listener.local_addr().context("no local address")?;
    Ok((listener, addr))
}

/// Serves [`AlwaysOk`] on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<()> {
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(RateLimitServiceServer::new(AlwaysOk))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
        .context("rate limit service failed")
}

#[cfg(test)]
mod tests {
    use super::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use super::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use super::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use super::*;

    #[tokio::test]
    async fn answers_ok_for_every_descriptor_over_grpc() {
        let (listener, addr) = bind().await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, async {
            let _ = stopped.await;
        }));
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = RateLimitServiceClient::new(channel);
        let descriptor = |value: &str| RateLimitDescriptor {
            entries: vec![Entry {
                key: "tenant".to_owned(),
                value: value.to_owned(),
            }],
        };
        let reply = client
            .should_rate_limit(RateLimitRequest {
                domain: "bench".to_owned(),
                descriptors: vec![descriptor("a"), descriptor("b")],
                hits_addend: 0,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.overall_code(), Code::Ok);
        assert_eq!(reply.statuses.len(), 2);
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}
