//! Why requests are dropped: the reasons a directive states, and the wider
//! set a filter reports (those plus its own local limits).

use serde::Serialize;
use sluice_proto::v1;

/// Why the control plane drops a cell's requests: what a directive says.
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

    /// The reason of a directive's wire value; unspecified and unknown
    /// values are the bucket limit.
    pub fn from_wire(value: i32) -> Self {
        match v1::Reason::try_from(value) {
            Ok(v1::Reason::TenantQuotaExceeded) => Self::TenantQuotaExceeded,
            Ok(v1::Reason::PriorityShed) => Self::PriorityShed,
            _ => Self::ClusterOverload,
        }
    }
}

/// Why a filter dropped a request: a directive's [`Reason`], or one of the
/// limits the filter applies on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The bucket's fleet-wide limit is exceeded.
    ClusterOverload,
    /// The tenant offers more than its share.
    TenantQuotaExceeded,
    /// The priority class is shed to protect higher classes.
    PriorityShed,
    /// The directives are stale and the local fallback limit is exceeded.
    FallbackLimit,
    /// A bucket without a directive exceeded the new-bucket limit.
    NewBucketLimit,
}

impl DropReason {
    /// Every reason, in metric order.
    pub const ALL: [Self; 5] = [
        Self::ClusterOverload,
        Self::TenantQuotaExceeded,
        Self::PriorityShed,
        Self::FallbackLimit,
        Self::NewBucketLimit,
    ];

    /// The reason of a directive's wire value; unspecified is the bucket
    /// limit.
    pub fn of_directive(reason: i32) -> Self {
        Reason::from_wire(reason).into()
    }

    /// The name in headers, bodies and metrics.
    #[inline]
    pub const fn name(self) -> &'static str {
        match self {
            Self::ClusterOverload => "cluster_overload",
            Self::TenantQuotaExceeded => "tenant_quota_exceeded",
            Self::PriorityShed => "priority_shed",
            Self::FallbackLimit => "local_fallback_limit",
            Self::NewBucketLimit => "new_bucket_limit",
        }
    }

    /// Index in [`Self::ALL`].
    #[inline]
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl From<Reason> for DropReason {
    fn from(reason: Reason) -> Self {
        match reason {
            Reason::ClusterOverload => Self::ClusterOverload,
            Reason::TenantQuotaExceeded => Self::TenantQuotaExceeded,
            Reason::PriorityShed => Self::PriorityShed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_directive_reason_survives_the_wire_and_keeps_its_name() {
        for reason in [
            Reason::ClusterOverload,
            Reason::TenantQuotaExceeded,
            Reason::PriorityShed,
        ] {
            assert_eq!(Reason::from_wire(reason.to_wire() as i32), reason);
            let serialized = serde_json::to_value(reason).map_err(|e| e.to_string());
            assert_eq!(
                serialized,
                Ok(serde_json::Value::from(DropReason::from(reason).name()))
            );
        }
    }

    #[test]
    fn unspecified_and_unknown_wire_values_are_the_bucket_limit() {
        assert_eq!(
            DropReason::of_directive(v1::Reason::Unspecified as i32),
            DropReason::ClusterOverload
        );
        assert_eq!(DropReason::of_directive(99), DropReason::ClusterOverload);
    }

    #[test]
    fn indexes_follow_the_metric_order_and_names_are_distinct() {
        for (i, reason) in DropReason::ALL.into_iter().enumerate() {
            assert_eq!(reason.index(), i);
            for other in &DropReason::ALL[..i] {
                assert_ne!(other.name(), reason.name());
            }
        }
        assert_eq!(
            DropReason::of_directive(v1::Reason::PriorityShed as i32),
            DropReason::PriorityShed
        );
    }
}
