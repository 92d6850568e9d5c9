//! Sluice's data plane as a library: everything a proxy does between "a
//! request's attributes in" and "its effects out" (classify the request
//! into a cell, decide, count, answer 429 or let it through), plus the ticks
//! that keep one proxy's agents in step, the leadership of the control-plane
//! stream, the reports, the shared-data records, the configuration and the
//! metrics. No proxy SDK and no `unsafe`: each host (the proxy-wasm filter,
//! the native Envoy module, the simulator) drives it through small traits.
//!
//! Nothing on the request path does network I/O or reads shared data: each
//! agent keeps a cache of the directives and its own counters, and
//! reconciles them with the rest of the process on its ticks (see
//! [`agent`]).

// The docs also link into the private modules and are meant to be read
// with `cargo doc --document-private-items`.
#![allow(rustdoc::private_intra_doc_links)]

pub mod agent;
pub mod config;
pub mod directives;
mod fast_map;
pub mod host;
pub mod identity;
pub mod leader;
pub mod memory;
pub mod metrics;
pub mod modes;
pub mod request;
pub mod settings;
pub(crate) mod shared;
pub mod tick;
pub mod upstream;
pub mod usage;
mod vm;

/// In-memory hosts: the agent outside a proxy, in tests and the simulator.
#[cfg(any(test, feature = "testing"))]
pub mod testing;
