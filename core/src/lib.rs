//! Sluice's domain types and rules, one definition each, and the one
//! per-request decision over a cell's state ([`decision::decide`], whose
//! cases are the coin, the credit, the allowance's cap, the stale-directive
//! fallback and the new-cell limit, with one rate limiter) and its one
//! result ([`decision::Decision`]), for every part that decides or reports
//! on a cell: the agent library and its hosts (the wasm filter, the native
//! module, the simulator), the control plane and its RLQS server.
//!
//! No host calls, no async runtime: it compiles for wasm32 and native alike.
//! What runs per request is `#[inline]`: native builds have no LTO, and a
//! call across the crate boundary would cost more than the work it does.

pub mod allowance;
pub mod backoff;
pub mod cell;
pub mod coin;
pub mod control_interval;
pub mod credit;
pub mod decision;
pub mod directive;
mod drop_ratio;
pub mod gcra;
pub mod glob;
pub mod histogram;
mod keys;
pub mod limit;
mod priority;
pub mod proxy_cap;
mod reason;
pub mod regime;

pub use drop_ratio::{DropRatio, DropThreshold, InvalidDropRatio};
pub use keys::{MAX_BUCKET_KEY_BYTES, MAX_TENANT_BYTES, cut};
pub use priority::{CLASSES, Priority};
pub use reason::{DropReason, Reason};
