//! A cell: what a proxy counts and the control plane directs, one
//! (bucket, tenant, priority) triple, the same type on both sides.
//!
//! Generic over how the strings are held: the agent builds requests' cells
//! in reused `String` buffers, the control plane's fleet shares interned
//! `Arc<str>`s, and RLQS maps a bucket id to an owned cell.

use crate::Priority;

/// One cell. The tenant is empty when the proxy derives none; a cell with
/// no tenant and an unspecified priority is its bucket's bucket-wide cell.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cell<S = String> {
    /// Bucket key.
    pub bucket: S,
    /// Tenant; empty when there is none.
    pub tenant: S,
    /// Priority class.
    pub priority: Priority,
}

impl<S: AsRef<str>> Cell<S> {
    /// Whether this is its bucket's bucket-wide cell (no tenant, no
    /// priority): the cell a bucket-wide directive names.
    #[inline]
    pub fn is_bucket_wide(&self) -> bool {
        self.tenant.as_ref().is_empty() && self.priority == Priority::Unspecified
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_cell_without_tenant_or_priority_is_bucket_wide() {
        let wide: Cell = Cell {
            bucket: "acme".into(),
            ..Cell::default()
        };
        assert!(wide.is_bucket_wide());
        let tenant: Cell<Arc<str>> = Cell {
            bucket: "acme".into(),
            tenant: "gold".into(),
            priority: Priority::Unspecified,
        };
        assert!(!tenant.is_bucket_wide());
        let classed = Cell {
            priority: Priority::Bulk,
            ..wide
        };
        assert!(!classed.is_bucket_wide());
    }
}
