//! What operators decide besides limits: tenants and their weights, and the
//! rollout modes (shadow, enforce, kill switch, canary).
//!
//! Pure data, validated on construction, so the controller never sees a
//! negative weight or a canary fraction above 1.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use crate::config::limits::LimitTable;
use crate::types::LimitRps;

/// Name of the tenant entry that applies to tenants not listed.
pub(crate) const DEFAULT_TENANT: &str = "default";

/// Largest accepted weight; the ratio between two tenants' weights is what
/// matters, and this keeps shares far from floating-point trouble.
pub(crate) const MAX_WEIGHT: f64 = 1e6;

/// Smallest accepted weight. The fair share divides demands by weights: a
/// weight near zero (a subnormal such as 1e-310) overflows that quotient to
/// infinity and the division admits everything, so weights stay within
/// nine orders of magnitude of each other.
pub(crate) const MIN_WEIGHT: f64 = 1e-3;

/// Largest accepted burst multiplier.
pub(crate) const MAX_BURST: f64 = 100.0;

/// Why a policy value is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidPolicy {
    /// Weight not finite or outside [`MIN_WEIGHT`] ..= [`MAX_WEIGHT`].
    #[error("must be a finite number between 0.001 and 1000000")]
    Weight,
    /// Burst multiplier not within `1 ..= 100`.
    #[error("must be a finite number between 1 and 100")]
    Burst,
    /// Fraction not within `0 ..= 1`.
    #[error("must be a finite number between 0 and 1")]
    Fraction,
}

macro_rules! bounded_f64 {
    ($(#[$doc:meta])* $name:ident, $check:expr, $error:expr, $expecting:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize)]
        #[serde(into = "f64")]
        pub struct $name(f64);

        impl $name {
            /// Validates a raw value.
            pub fn new(value: f64) -> Result<Self, InvalidPolicy> {
                let check: fn(f64) -> bool = $check;
                if value.is_finite() && check(value) {
                    Ok(Self(value))
                } else {
                    Err($error)
                }
            }

            /// The value.
            pub fn get(self) -> f64 {
                self.0
            }
        }

        impl From<$name> for f64 {
            fn from(value: $name) -> Self {
                value.0
            }
        }

        impl TryFrom<f64> for $name {
            type Error = InvalidPolicy;

            fn try_from(value: f64) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        // Validated inside the visitor so a YAML error points at the scalar.
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct ValueVisitor;

                impl Visitor<'_> for ValueVisitor {
                    type Value = $name;

                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($expecting)
                    }

                    fn visit_f64<E: de::Error>(self, v: f64) -> Result<$name, E> {
                        $name::new(v).map_err(E::custom)
                    }

                    fn visit_i64<E: de::Error>(self, v: i64) -> Result<$name, E> {
                        self.visit_f64(v as f64)
                    }

                    fn visit_u64<E: de::Error>(self, v: u64) -> Result<$name, E> {
                        self.visit_f64(v as f64)
                    }
                }

                deserializer.deserialize_f64(ValueVisitor)
            }
        }
    };
}

bounded_f64!(
    /// A tenant's weight in the fair share: finite, `0.001 ..= 1e6`.
    Weight,
    |v| (MIN_WEIGHT..=MAX_WEIGHT).contains(&v),
    InvalidPolicy::Weight,
    "a positive weight"
);

bounded_f64!(
    /// How far above its share a tenant may burst for a moment: `1 ..= 100`.
    BurstMultiplier,
    |v| (1.0..=MAX_BURST).contains(&v),
    InvalidPolicy::Burst,
    "a burst multiplier between 1 and 100"
);

bounded_f64!(
    /// A fraction of proxies: `0 ..= 1`.
    Fraction,
    |v| (0.0..=1.0).contains(&v),
    InvalidPolicy::Fraction,
    "a fraction between 0 and 1"
);

impl Default for Weight {
    fn default() -> Self {
        Self(1.0)
    }
}

impl Default for BurstMultiplier {
    fn default() -> Self {
        Self(1.0)
    }
}

/// How one tenant shares a limited bucket.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantPolicy {
    /// Relative weight in the weighted max-min fair share.
    #[serde(default)]
    pub weight: Weight,
    /// Burst allowance above the share, as a multiple of it.
    #[serde(default)]
    pub burst: BurstMultiplier,
    /// Below this rate the tenant is never dropped.
    #[serde(default = "zero_rps")]
    pub min_floor_rps: LimitRps,
}

fn zero_rps() -> LimitRps {
    LimitRps::ZERO
}

impl Default for TenantPolicy {
    fn default() -> Self {
        Self {
            weight: Weight::default(),
            burst: BurstMultiplier::default(),
            min_floor_rps: LimitRps::ZERO,
        }
    }
}

/// Tenant policies by name; the `default` entry (weight 1, no floor, unless
/// configured) applies to every tenant not listed.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(into = "BTreeMap<String, TenantPolicy>")]
pub struct Tenants(BTreeMap<String, TenantPolicy>);

// Each name is checked where it stands, so an error names its line.
impl<'de> Deserialize<'de> for Tenants {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        crate::types::tenant_keyed(deserializer).map(Self)
    }
}

impl TryFrom<BTreeMap<String, TenantPolicy>> for Tenants {
    type Error = String;

    /// Tenant names follow the admin API's rules: a name the filter would
    /// cut could never match a request.
    fn try_from(policies: BTreeMap<String, TenantPolicy>) -> Result<Self, Self::Error> {
        for name in policies.keys() {
            crate::types::validate_tenant(name).map_err(|err| {
                let shown: String = name.chars().take(40).collect();
                format!("tenant {shown:?}: {err}")
            })?;
        }
        Ok(Self(policies))
    }
}

impl From<Tenants> for BTreeMap<String, TenantPolicy> {
    fn from(tenants: Tenants) -> Self {
        tenants.0
    }
}

impl Tenants {
    /// Tenants from named policies.
    pub fn new(policies: BTreeMap<String, TenantPolicy>) -> Self {
        Self(policies)
    }

    /// The policy of `tenant`, else the `default` entry, else the built-in
    /// default.
    pub fn policy_for(&self, tenant: &str) -> TenantPolicy {
        self.0
            .get(tenant)
            .or_else(|| self.0.get(DEFAULT_TENANT))
            .copied()
            .unwrap_or_default()
    }

    /// Every configured tenant, `default` included.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &TenantPolicy)> {
        self.0.iter()
    }

    /// The policy configured for `tenant` itself, if any.
    pub(crate) fn get(&self, tenant: &str) -> Option<TenantPolicy> {
        self.0.get(tenant).copied()
    }

    /// Adds or replaces a tenant.
    pub fn insert(&mut self, tenant: String, policy: TenantPolicy) {
        self.0.insert(tenant, policy);
    }

    /// Removes a tenant; returns whether it was configured.
    pub(crate) fn remove(&mut self, tenant: &str) -> bool {
        self.0.remove(tenant).is_some()
    }
}

/// Whether drop decisions reject requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Decide and count would-be drops; never reject.
    Shadow,
    /// Reject with 429.
    #[default]
    Enforce,
}

/// The rollout state: global and per-bucket modes, the kill switch and the
/// canary fraction.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Modes {
    /// Mode of buckets not listed in `buckets`.
    #[serde(default)]
    pub default: Mode,
    /// Per-bucket modes by exact bucket key.
    #[serde(default, deserialize_with = "crate::types::bucket_keyed")]
    pub(crate) buckets: BTreeMap<String, Mode>,
    /// While on, every proxy shadows every bucket; turning it off restores
    /// the modes above unchanged.
    #[serde(default)]
    pub kill_switch: bool,
    /// Fraction of proxies that enforce (the rest shadow); `None` = all.
    #[serde(default)]
    pub canary_fraction: Option<Fraction>,
}

impl Mode {
    /// The wire value.
    pub(crate) fn to_wire(self) -> sluice_proto::v1::Mode {
        match self {
            Self::Shadow => sluice_proto::v1::Mode::Shadow,
            Self::Enforce => sluice_proto::v1::Mode::Enforce,
        }
    }
}

impl Modes {
    /// Whether any proxy may shadow a bucket whose own mode is `mode`
    /// (`None`: not listed): the kill switch, a canary fraction below 1,
    /// or the bucket's (or the default) mode.
    pub(crate) fn shadow_any(&self, mode: Option<Mode>) -> bool {
        self.kill_switch
            || self.canary_fraction.is_some_and(|f| f.get() < 1.0)
            || mode.unwrap_or(self.default) == Mode::Shadow
    }

    /// What every directive batch carries: kill switch, default mode and
    /// canary fraction (per-bucket modes travel in the directives).
    pub(crate) fn to_wire(&self) -> sluice_proto::v1::ModePolicy {
        sluice_proto::v1::ModePolicy {
            kill_switch: self.kill_switch,
            default_mode: self.default.to_wire() as i32,
            canary_fraction: self.canary_fraction.map(Fraction::get),
        }
    }

    /// The configured mode of a bucket (ignoring kill switch and canary,
    /// which proxies apply on top).
    pub fn mode_for(&self, bucket: &str) -> Mode {
        self.buckets.get(bucket).copied().unwrap_or(self.default)
    }
}

/// Everything the controller needs besides the fleet load.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Policy {
    /// Fleet-wide limits by bucket.
    pub limits: LimitTable,
    /// Tenant weights, bursts and floors.
    pub tenants: Tenants,
    /// Rollout modes.
    pub modes: Modes,
    /// Buckets whose limit follows the upstream's health.
    pub adaptive: crate::control::adaptive::spec::AdaptiveSpecs,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_values_reject_what_they_cannot_hold() {
        assert!(Weight::new(0.0).is_err());
        assert!(Weight::new(-1.0).is_err());
        assert!(Weight::new(f64::NAN).is_err());
        assert!(Weight::new(2e6).is_err());
        for tiny in [1e-310, f64::MIN_POSITIVE, 1e-9, 0.000_999] {
            assert_eq!(Weight::new(tiny), Err(InvalidPolicy::Weight), "{tiny}");
        }
        assert_eq!(Weight::new(MIN_WEIGHT).unwrap().get(), 0.001);
        assert_eq!(Weight::new(0.25).unwrap().get(), 0.25);
        assert!(BurstMultiplier::new(0.5).is_err());
        assert!(Fraction::new(1.5).is_err());
        assert!(Fraction::new(f64::INFINITY).is_err());
        assert_eq!(Fraction::new(0.0).unwrap().get(), 0.0);
    }

    #[test]
    fn unknown_tenants_use_the_default_entry() {
        let mut tenants = Tenants::default();
        assert_eq!(tenants.policy_for("x"), TenantPolicy::default());
        let gold = TenantPolicy {
            weight: Weight::new(4.0).unwrap(),
            ..TenantPolicy::default()
        };
        let fallback = TenantPolicy {
            weight: Weight::new(0.5).unwrap(),
            ..TenantPolicy::default()
        };
        tenants.insert("gold".into(), gold);
        tenants.insert(DEFAULT_TENANT.into(), fallback);
        assert_eq!(tenants.policy_for("gold"), gold);
        assert_eq!(tenants.policy_for("x"), fallback);
    }

    #[test]
    fn modes_fall_back_to_the_default() {
        let mut modes = Modes {
            default: Mode::Shadow,
            ..Modes::default()
        };
        modes.buckets.insert("checkout".into(), Mode::Enforce);
        assert_eq!(modes.mode_for("checkout"), Mode::Enforce);
        assert_eq!(modes.mode_for("search"), Mode::Shadow);
    }
}
