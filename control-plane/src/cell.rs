//! A cell is what the filter counts and the control plane decides on: one
//! (bucket, tenant, priority) triple, here as the key the fleet's interned
//! strings make. Priorities and reasons are the core's.

use std::sync::Arc;

use sluice_core::Priority;

/// Identifies a cell. The strings are shared with the fleet's interner, so
/// cloning a key never copies them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CellKey {
    /// Bucket key.
    pub bucket: Arc<str>,
    /// Tenant; empty when the filter derives none.
    pub tenant: Arc<str>,
    /// Priority as reported.
    pub priority: Priority,
}
