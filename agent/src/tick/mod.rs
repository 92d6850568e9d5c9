//! What every agent does on its ticks to stay in step with the rest of its
//! process: read the shared directive table and its freshness, run the
//! leader lease, hand counts to the leader, and keep its cells' decision
//! state (rate slots, allowances) current.

pub(crate) mod freshness;
pub(crate) mod lease;
pub mod pacing;
pub(crate) mod process_budget;
pub(crate) mod sync;
