//! Sluice's Envoy filter: a proxy-wasm HTTP filter that classifies every
//! request into a cell (bucket, tenant, priority), counts it, and drops it
//! as the cell's directive, pushed by the Sluice control plane, says.
//!
//! Nothing on the request path does network I/O or reads shared data: each VM
//! keeps a cache of the directives and its own counters, and reconciles them
//! with the rest of the process on its ticks (see [`agent`]).
//!
//! Everything except `host` (the proxy-wasm binding) is plain Rust behind the [`host_api::Host`]
//! trait, so the logic is unit-tested natively and under wasm32 in Node.

// The public modules are what the native module, the benchmarks and the
// simulator use; the docs also link into the private ones and are meant to
// be read with `cargo doc --document-private-items`.
#![allow(rustdoc::private_intra_doc_links)]

pub mod agent;
mod audit;
pub mod backoff;
pub mod bucket_key;
mod cell;
mod cell_map;
mod cell_table;
mod classify;
pub mod config;
pub mod counters;
pub mod directives;
mod fast_map;
mod freshness;
mod grpc_service;
pub mod host_api;
pub mod identity;
mod lease;
pub mod metrics;
pub mod modes;
pub mod new_cells;
pub mod pacing;
mod process_budget;
mod process_rates;
mod reject;
mod report_window;
pub mod request_attributes;
mod shared;
mod stream;
pub mod upstream;
pub mod usage;

/// The proxy-wasm binding; only exists in the Envoy build.
#[cfg(all(target_arch = "wasm32", target_os = "wasi"))]
mod host;

/// In-memory hosts: the agent outside Envoy, in tests and the simulator.
#[cfg(any(test, feature = "testing"))]
pub mod fake_host;
#[cfg(test)]
mod fake_request;
