//! Sluice's domain types, one definition each, for every part that decides
//! or reports on a cell: the wasm filter, the native module, the control
//! plane, its RLQS server and its simulator.
//!
//! No host calls, no async runtime: it compiles for wasm32 and native alike.

mod drop_ratio;
mod keys;
mod priority;
mod reason;

pub use drop_ratio::{DropRatio, DropThreshold, InvalidDropRatio};
pub use keys::{MAX_BUCKET_KEY_BYTES, MAX_TENANT_BYTES, cut};
pub use priority::{CLASSES, Priority};
pub use reason::{DropReason, Reason};
