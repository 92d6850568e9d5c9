//! What one control interval decides: the directives to push, the cells
//! retired, and the directive that lifts a cell.

use std::sync::Arc;

use sluice_core::Priority;
use sluice_proto::v1::Directive;

use super::status::BucketStatus;

/// A drop ratio that moved by at most this much is not pushed again: the
/// estimate is noisy and every push goes to every proxy. A share moving by
/// at most this fraction of itself is not a change either.
pub(crate) const CHANGE_THRESHOLD: f64 = 0.001;

/// The outcome of one control interval.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct IntervalOutcome {
    /// Every bucket with traffic, sorted by bucket.
    pub(crate) buckets: Vec<BucketStatus>,
    /// Directives to push now: those that changed since they were last
    /// pushed, and a final 0 for dropping cells whose traffic stopped.
    pub changed: Vec<Directive>,
    /// Cells no longer tracked: take them out of the snapshot (after
    /// applying `changed`).
    pub(crate) retired: Vec<RetiredCell>,
}

/// A cell the controller stopped tracking.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RetiredCell {
    /// Bucket key.
    pub(crate) bucket: Arc<str>,
    /// Tenant.
    pub(crate) tenant: Arc<str>,
    /// Priority.
    pub(crate) priority: Priority,
}

/// The directive that lifts a cell: no ratio, no limit, no share, no mode.
/// It enforces nothing, so the filter removes the cell's entry instead of
/// holding it (and a filter that predates this still holds a harmless 0).
pub(crate) fn lift(bucket: &str, tenant: &str, priority: Priority) -> Directive {
    Directive {
        bucket: bucket.to_owned(),
        tenant: tenant.to_owned(),
        priority: priority.to_wire() as i32,
        ..Directive::default()
    }
}
