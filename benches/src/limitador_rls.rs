//! The peer reference of `bench_rls`: Kuadrant's `limitador` library (the
//! engine of the Limitador service), counters in memory, behind the same
//! minimal rate limit service as [`crate::rls`]. Each call's descriptors
//! become Limitador's `descriptors` binding, as Limitador's own Envoy RLS
//! front end passes them, and one limit per tenant
//! (`descriptors[0].tenant`) is checked and updated.

use std::collections::HashMap;

use anyhow::{Context as _, Result};
use limitador::RateLimiter;
use limitador::limit::{Context, Expression, Limit, Namespace};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

use crate::rls::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use crate::rls::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use crate::rls::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

/// Calls per second and tenant the limit allows: never reached, as in
/// `bench_rls`'s own quota.
const PER_TENANT_PER_SECOND: u64 = 1_000_000_000;
/// Counters the in-memory store keeps.
const CACHE_SIZE: u64 = 100_000;

/// The service: a `RateLimiter` with one per-tenant limit in namespace
/// `domain`.
pub struct LimitadorService {
    limiter: RateLimiter,
    namespace: Namespace,
}

impl LimitadorService {
    /// One limit, per tenant, in `domain`.
    pub fn new(domain: &str) -> Result<Self> {
        let limiter = RateLimiter::new(CACHE_SIZE);
        let tenant = Expression::parse("descriptors[0].tenant")
            .map_err(|err| anyhow::anyhow!("limitador expression: {err:?}"))?;
        let namespace = Namespace::from(domain);
        limiter.add_limit(Limit::new(
            namespace.clone(),
            PER_TENANT_PER_SECOND,
            1,
            Vec::new(),
            vec![tenant],
        ));
        Ok(Self { limiter, namespace })
    }
}

#[tonic::async_trait]
impl RateLimitService for LimitadorService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        if request.domain != self.namespace.as_ref() {
            return Err(Status::invalid_argument("unknown domain"));
        }
        let descriptors: Vec<HashMap<String, String>> = request
            .descriptors
            .iter()
            .map(|descriptor| {
                descriptor
                    .entries
                    .iter()
                    .map(|entry| (entry.key.clone(), entry.value.clone()))
                    .collect()
            })
            .collect();
        let mut context = Context::default();
        context.list_binding("descriptors".to_owned(), descriptors);
        let hits = u64::from(request.hits_addend.max(1));
        let checked = self
            .limiter
            .check_rate_limited_and_update(&self.namespace, &context, hits)
            .map_err(|err| Status::internal(err.to_string()))?;
        let code = if checked.limited {
            Code::OverLimit
        } else {
            Code::Ok
        };
        Ok(Response::new(RateLimitResponse {
            overall_code: code.into(),
            statuses: vec![DescriptorStatus { code: code.into() }; request.descriptors.len()],
        }))
    }
}

/// Serves [`LimitadorService`] for `domain` on `listener` until `shutdown`
/// resolves.
pub async fn serve(
    domain: &str,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<()> {
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(RateLimitServiceServer::new(LimitadorService::new(domain)?))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
        .context("limitador rate limit service failed")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rls::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use crate::rls::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

    fn ask(tenant: &str) -> Request<RateLimitRequest> {
        Request::new(RateLimitRequest {
            domain: "bench".to_owned(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "tenant".to_owned(),
                    value: tenant.to_owned(),
                }],
            }],
            hits_addend: 0,
        })
    }

    #[tokio::test]
    async fn counts_each_tenant_and_refuses_an_unknown_domain() {
        let service = LimitadorService::new("bench").unwrap();
        for tenant in ["a", "b", "a"] {
            let reply = service.should_rate_limit(ask(tenant)).await.unwrap();
            assert_eq!(reply.get_ref().overall_code(), Code::Ok);
        }
        let counters = service.limiter.get_counters(&service.namespace).unwrap();
        assert_eq!(counters.len(), 2, "one counter per tenant");
        let mut other = ask("a");
        other.get_mut().domain = "other".to_owned();
        assert!(service.should_rate_limit(other).await.is_err());
    }
}
