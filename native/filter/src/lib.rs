//! Sluice's HTTP filter for Envoy's dynamic modules, in safe Rust.
//!
//! The agent library's logic (`sluice-agent`: the agent, its decisions,
//! directive table, allowance, 429s and request handler) runs here as in
//! the wasm filter. What changes is
//! the host around it: instead of proxy-wasm VMs, Envoy's worker threads call
//! the module directly, so
//!
//! - each worker thread gets its own [`sluice_agent::agent::Agent`] the first
//!   time it sees a request ([`workers`]), exactly as each wasm VM has one;
//! - the agents share one process-wide store of shared data and queues
//!   (the agent library's in-memory store, `sluice_agent::memory`), so they
//!   elect a leader and pass counts and directives the way wasm VMs do
//!   through Envoy's shared data;
//! - the leader's stream to the control plane is a tonic client on the
//!   module's own runtime thread ([`control_stream`]), since a dynamic module
//!   has no access to Envoy's gRPC client;
//! - a ticker thread drives every agent's tick ([`ticker`]) and exports
//!   their metrics to Envoy's stats ([`stats`]).
//!
//! `sluice-envoy-module` turns Envoy's C calls into [`NativeFilter`] calls
//! with an [`HttpRequest`] (the agent's request handler's one host trait)
//! for the request at hand, and keeps a [`FollowedRequest`] between a
//! sampled request's headers and its response's for the upstream signals.

pub mod clock;
pub mod config;
pub mod control_stream;
pub mod filter;
pub mod native_host;
pub mod proxy_name;
pub mod stats;
pub mod ticker;
pub mod workers;

pub use config::{ConfigError, NativeConfig};
pub use filter::NativeFilter;
pub use native_host::Stderr;
pub use sluice_agent::host::{HostError, Log, LogLevel, MetricKind};
pub use sluice_agent::request::charge::PendingCharge;
pub use sluice_agent::request::classify::RequestAttributes;
pub use sluice_agent::request::handler::{
    FollowedRequest, HeadersAction, HttpRequest, REJECT_STATUS,
};
pub use sluice_agent::request::reject::RejectResponse;
pub use stats::{StatsSink, metric_names};
