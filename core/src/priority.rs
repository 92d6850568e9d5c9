//! A request's priority class and the order classes are shed in.

use serde::Serialize;
use sluice_proto::v1;

/// A request's priority, as classified by a filter. `Unspecified` is shed
/// together with `BestEffort` but keeps its own cell, so a directive names
/// the priority the filter reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize)]
#[serde(rename_all = "snake_case")]
// The wire enum's representation: with a one-byte one the agent's
// benchmarks ran 9-13 % slower (the request path's structs hold it).
#[repr(i32)]
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

/// Number of priority classes (see [`Priority::class`]).
pub const CLASSES: usize = 4;

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

    /// The wire value as the number a message field holds.
    pub fn to_i32(self) -> i32 {
        self.to_wire() as i32
    }

    /// The name in configurations, logs and JSON.
    #[inline]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Critical => "critical",
            Self::Degraded => "degraded",
            Self::BestEffort => "best_effort",
            Self::Bulk => "bulk",
        }
    }

    /// The priority of a name (see [`Self::name`]); `None` for any other.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|priority| priority.name() == name)
    }

    /// Position in the order capacity is handed out: 0 is served first and
    /// shed last.
    #[inline]
    pub fn class(self) -> usize {
        match self {
            Self::Critical => 0,
            Self::Degraded => 1,
            Self::BestEffort | Self::Unspecified => 2,
            Self::Bulk => 3,
        }
    }

    /// Index into per-priority arrays (wire order).
    #[inline]
    pub fn index(self) -> usize {
        self as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn wire_round_trip_and_unknown_values() {
        for priority in Priority::ALL {
            assert_eq!(Priority::from_wire(priority.to_i32()), priority);
            assert_eq!(priority.to_i32(), priority.index() as i32);
        }
        assert_eq!(Priority::from_wire(99), Priority::Unspecified);
    }

    #[test]
    fn names_are_the_serialized_form_and_parse_back() {
        assert_eq!(Priority::from_name("gold"), None);
        for priority in Priority::ALL {
            assert_eq!(Priority::from_name(priority.name()), Some(priority));
            let serialized = serde_json::to_value(priority).map_err(|e| e.to_string());
            assert_eq!(serialized, Ok(serde_json::Value::from(priority.name())));
        }
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
