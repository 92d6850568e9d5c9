//! The RLQS server: Envoy's own `rate_limit_quota` filter as a data plane
//! of the same fleet, limits and admin API as the Sluice filter.
//!
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService` runs on the
//! filters' gRPC listener (same TLS, identity rules and report checks as
//! Sluice's own stream). Each stream is one Envoy: its usage reports are
//! turned into Sluice reports ([`usage`]) and summed with every other
//! proxy's; the directives the control loop publishes are merged into the
//! filter's own directive table, and each bucket id gets the allowance the
//! wasm filter would derive, as a token bucket ([`assignment`]).

mod action;
mod assignment;
mod bucket_id;
pub(crate) mod session;
mod usage;

/// How often Envoy 1.40's `rate_limit_quota` filter reports (fixed there:
/// a bucket's `reporting_interval` is not used).
pub(crate) const ENVOY_REPORT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// The gRPC metadata key an Envoy may set (`initial_metadata` of its
/// `grpc_service`) to name its proxy id; without it the stream's peer
/// address is the id.
pub(crate) const PROXY_ID_HEADER: &str = "x-sluice-proxy-id";
