//! Sluice's Envoy filter: a proxy-wasm HTTP filter that derives a bucket for
//! every request, counts it, and drops it with probability equal to the
//! bucket's drop ratio, a directive pushed by the Sluice control plane.
//!
//! Nothing on the request path does network I/O or reads shared data: each VM
//! keeps a cache of the directives and its own counters, and reconciles them
//! with the rest of the process on a 100 ms tick (see [`agent`]).
//!
//! Everything except [`host`] is plain Rust behind the [`host_api::Host`]
//! trait, so the logic is unit-tested natively and under wasm32 in Node.

pub mod agent;
pub mod allowance;
pub mod backoff;
pub mod bucket_key;
pub mod config;
pub mod counters;
pub mod credit;
pub mod decision;
pub mod directives;
pub mod drop_ratio;
pub mod host_api;
pub mod lease;
pub mod metrics;
pub mod pacing;
pub mod shared_keys;
pub mod stream;

/// The proxy-wasm binding; only exists in the Envoy build.
#[cfg(all(target_arch = "wasm32", target_os = "wasi"))]
mod host;

#[cfg(test)]
mod fake_host;
