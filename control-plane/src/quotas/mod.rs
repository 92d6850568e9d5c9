//! Exact quotas: Envoy's rate limit service API
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) on the
//! filters' gRPC listener, configured, counted and answered as
//! envoyproxy/ratelimit does it (a drop-in for it), for the quotas that
//! must count exactly (billing, API plans), layered behind the Sluice
//! filter that sheds the overload without per-request I/O. Their
//! configuration's schema is the configuration's
//! ([`crate::config::quota_file`], [`crate::config::quota_section`]).

pub mod algorithm;
pub(crate) mod cli;
#[cfg(test)]
mod conformance;
pub(crate) mod engine;
pub(crate) mod lookup;
mod metadata;
pub(crate) mod over_limit_cache;
mod read;
pub mod redis_store;
mod reload;
mod service;
pub(crate) mod settings;
pub(crate) mod store;

pub(crate) use crate::config::quota_file::{LoadOptions, QuotaConfig};
pub use algorithm::{Algorithm, Direction};
pub(crate) use engine::{Quotas, system_clock};
pub use read::{QuotaRead, ReadError};
pub use redis_store::RedisCounters;
pub use reload::watch;
pub use service::{MAX_DESCRIPTORS, RateLimitGrpc, counter_for};
