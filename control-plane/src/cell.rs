//! A cell is what the filter counts and the control plane decides on: one
//! (bucket, tenant, priority) triple, here as the key the fleet's interned
//! strings make. The cell type, priorities and reasons are the core's.

use std::sync::Arc;

use sluice_core::cell::Cell;

/// Identifies a cell. The strings are shared with the fleet's interner, so
/// cloning a key never copies them.
pub(crate) type CellKey = Cell<Arc<str>>;
