//! Sluice control plane.
//!
//! Envoy proxies running the Sluice filter open one gRPC stream each
//! (`serve::grpc`), report per-bucket request counts, and receive drop
//! ratios. Every control interval ([`serve::control_loop`]) the per-proxy
//! rates are summed over the fleet ([`fleet`]), compared with the limits
//! ([`config::limits`]) and turned into directives ([`control`]); the ones
//! that changed are broadcast to every stream (`serve::push`). Operators
//! read and change limits through the admin API ([`admin`]), which also
//! serves Prometheus [`metrics`], persists every change to the limits file
//! ([`config::live`]) and picks up edits of that file (`config::reload`);
//! `sluice ctl` (`ctl`) is its command-line client. With a shared store
//! ([`store`]) several processes run as [`replicas`] of one control plane.
//! The same listener serves Envoy's own APIs: RLQS (`rlqs`) and the rate
//! limit service for exact quotas ([`quotas`]); `trust` bounds what one
//! proxy can claim.
//!
//! The modules, by job: `state` (the shared state), [`config`] (the limits
//! file, the quota files' schema and the configuration in force),
//! [`control`] (deciding), [`serve`] (`sluice serve`, streams, fan-out, the
//! control loop), [`fleet`] (aggregation), [`replicas`] and [`store`]
//! (running as several processes), [`admin`], [`metrics`], [`cli`],
//! `ctl` (a tool).
//!
//! [`run`] wires these together on listeners the caller has bound, which lets
//! tests use port 0 and lets the binary write its ready file before serving.

// The library's public surface: the re-exports at the end of this file
// (what `main.rs` and an embedding test need to run a control plane), and
// the items the simulator, the benchmarks, the fuzzers and the integration
// tests reach through the module paths below. Everything else is
// `pub(crate)`, so dead code shows: an item outside the crate's users
// starts `pub(crate)` and becomes `pub` only when one of them needs it. Its
// docs link into the private modules and are meant to be read with
// `cargo doc --document-private-items`.
#![allow(rustdoc::private_intra_doc_links)]

pub mod admin;
pub(crate) mod cell;
pub mod cli;
pub mod config;
pub mod control;
#[cfg(feature = "ctl")]
pub(crate) mod ctl;
pub mod fleet;
pub mod metrics;
pub mod quotas;
pub mod replicas;
pub(crate) mod rlqs;
pub mod serve;
pub(crate) mod state;
pub mod store;
pub(crate) mod trust;
pub mod types;

// The surface for running a control plane.
pub use admin::{Admin, admin_router, router};
pub use config::{Config, ConfigError};
pub use control::controller::Controller;
pub use serve::drain::DRAIN_TIMEOUT;
pub use serve::grpc::GrpcEndpoint;
pub use serve::rls_listener::{RlsError, RlsListener};
pub use serve::run::{Listeners, RunError, RunOptions, run};
pub use state::{AppState, Settings};
