//! A cell is what the filter counts and the control plane decides on: one
//! (bucket, tenant, priority) triple. This module holds the control plane's
//! own view of priorities and drop reasons, and their wire forms.

use std::sync::Arc;

use serde::Serialize;
use sluice_proto::v1;

/// A request's priority, as reported. `Unspecified` is shed together with
/// `BestEffort` but keeps its own cell, so the directive names the priority
/// the filter reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Not classified.
    #[default]
    Unspecified,
    /// Shed only when nothing else can cover the excess.
    Critical,
    /// Shed after best-effort traffic.
    Degraded,
    /// Shed after bulk traffic.
    BestEffort,
    /// Shed first.
    Bulk,
}

impl Priority {
    /// Every priority, in wire order.
    pub const ALL: [Self; 5] = [
        Self::Unspecified,
        Self::Critical,
        Self::Degraded,
        Self::BestEffort,
        Self::Bulk,
    ];

    /// The priority of a wire value; values this build does not know are
    /// treated as unclassified.
    pub fn from_wire(value: i32) -> Self {
        match v1::Priority::try_from(value) {
            Ok(v1::Priority::Critical) => Self::Critical,
            Ok(v1::Priority::Degraded) => Self::Degraded,
            Ok(v1::Priority::BestEffort) => Self::BestEffort,
            Ok(v1::Priority::Bulk) => Self::Bulk,
            Ok(v1::Priority::Unspecified) | Err(_) => Self::Unspecified,
        }
    }

    /// The wire value.
    pub fn to_wire(self) -> v1::Priority {
        match self {
            Self::Unspecified => v1::Priority::Unspecified,
            Self::Critical => v1::Priority::Critical,
            Self::Degraded => v1::Priority::Degraded,
            Self::BestEffort => v1::Priority::BestEffort,
            Self::Bulk => v1::Priority::Bulk,
        }
    }

    /// Position in the order capacity is handed out: 0 is served first and
    /// shed last.
    pub fn class(self) -> usize {
        match self {
            Self::Critical => 0,
            Self::Degraded => 1,
            Self::BestEffort | Self::Unspecified => 2,
            Self::Bulk => 3,
        }
    }

    /// Index into per-priority arrays (wire order).
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Number of priority classes (see [`Priority::class`]).
pub const CLASSES: usize = 4;

/// Why a cell's requests are dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The bucket's limit is exceeded and no finer reason applies.
    ClusterOverload,
    /// The tenant offers more than its fair share while others in its class
    /// are not dropped.
    TenantQuotaExceeded,
    /// The cell's priority class is shed because higher classes use the
    /// capacity.
    PriorityShed,
}

impl Reason {
    /// The wire value.
    pub fn to_wire(self) -> v1::Reason {
        match self {
            Self::ClusterOverload => v1::Reason::ClusterOverload,
            Self::TenantQuotaExceeded => v1::Reason::TenantQuotaExceeded,
            Self::PriorityShed => v1::Reason::PriorityShed,
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_round_trip_and_unknown_values() {
        for priority in Priority::ALL {
            assert_eq!(Priority::from_wire(priority.to_wire() as i32), priority);
        }
        assert_eq!(Priority::from_wire(99), Priority::Unspecified);
    }

    #[test]
    fn bulk_is_shed_first_and_critical_last() {
        assert!(Priority::Critical.class() < Priority::Degraded.class());
        assert!(Priority::Degraded.class() < Priority::BestEffort.class());
        assert_eq!(Priority::BestEffort.class(), Priority::Unspecified.class());
        assert!(Priority::BestEffort.class() < Priority::Bulk.class());
        assert!(Priority::Bulk.class() < CLASSES);
    }
}
