//! Temporary overrides: raise (or lower) a bucket's limit (a request rate
//! or a cost budget), or change a tenant's weight, burst or floor, until a
//! deadline. The base values stay in
//! the file untouched, so when an override expires they apply again.
//!
//! Deadlines are absolute (seconds since the Unix epoch) so that an override
//! written to the limits file survives a restart with its remaining time.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::config::budget::Budget;
use crate::config::limits::{BOTH_LIMITS, Limit};
use crate::config::policy::{BurstMultiplier, Policy, Weight};
use crate::types::LimitRps;

/// Longest accepted override: 30 days. Anything longer is a configuration
/// change and belongs in the base values.
pub(crate) const MAX_TTL_S: u64 = 30 * 24 * 3600;

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Milliseconds since the Unix epoch (0 before it).
pub(crate) fn unix_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How long an override lasts: `1 ..= 30 days`, in whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub(crate) struct OverrideTtl(u64);

impl OverrideTtl {
    /// Validates a TTL in seconds.
    pub(crate) fn from_secs(secs: u64) -> Result<Self, InvalidOverrideTtl> {
        if (1..=MAX_TTL_S).contains(&secs) {
            Ok(Self(secs))
        } else {
            Err(InvalidOverrideTtl)
        }
    }

    /// The TTL in seconds.
    pub(crate) fn as_secs(self) -> u64 {
        self.0
    }

    /// The deadline of an override created at `now`.
    pub(crate) fn expires_at(self, now: u64) -> u64 {
        now.saturating_add(self.0)
    }
}

impl TryFrom<u64> for OverrideTtl {
    type Error = InvalidOverrideTtl;

    fn try_from(secs: u64) -> Result<Self, Self::Error> {
        Self::from_secs(secs)
    }
}

impl From<OverrideTtl> for u64 {
    fn from(ttl: OverrideTtl) -> Self {
        ttl.0
    }
}

/// A TTL outside `1 ..= 2592000` seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("must be between 1 and 2592000 (seconds, 30 days)")]
pub(crate) struct InvalidOverrideTtl;

/// Parses `90s`, `15m`, `1h`, `2d` or a plain number of seconds.
#[cfg(any(test, feature = "ctl"))]
pub(crate) fn parse_duration(text: &str) -> Result<OverrideTtl, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 90s, 15m, 1h or 2d"))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("unknown unit {unit:?}; use s, m, h or d")),
    };
    let secs = number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too long"))?;
    OverrideTtl::from_secs(secs).map_err(|err| format!("duration {err}"))
}

/// A bucket limit in force until `expires_at_unix_s`: `limit_rps` or
/// `budget`, as in the limits file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "LimitOverrideFields")]
pub(crate) struct LimitOverride {
    /// The limit while the override lasts.
    #[serde(flatten)]
    pub(crate) limit: Limit,
    /// When the base limit applies again (seconds since the Unix epoch).
    pub(crate) expires_at_unix_s: u64,
}

/// A [`LimitOverride`] as written, before the check that it has exactly
/// one limit.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitOverrideFields {
    #[serde(default)]
    limit_rps: Option<LimitRps>,
    #[serde(default)]
    budget: Option<Budget>,
    expires_at_unix_s: u64,
}

impl TryFrom<LimitOverrideFields> for LimitOverride {
    type Error = String;

    fn try_from(fields: LimitOverrideFields) -> Result<Self, String> {
        let limit = one_limit(fields.limit_rps, fields.budget)?;
        Ok(Self {
            limit,
            expires_at_unix_s: fields.expires_at_unix_s,
        })
    }
}

/// The one limit of an entry that may give `limit_rps` or `budget`.
pub(crate) fn one_limit(
    limit_rps: Option<LimitRps>,
    budget: Option<Budget>,
) -> Result<Limit, String> {
    match (limit_rps, budget) {
        (Some(rps), None) => Ok(Limit::Rps(rps)),
        (None, Some(budget)) => Ok(Limit::Budget(budget)),
        (Some(_), Some(_)) => Err(BOTH_LIMITS.to_owned()),
        (None, None) => {
            Err("needs `limit_rps` (requests per second) or `budget` (a cost budget)".to_owned())
        }
    }
}

/// Tenant values in force until `expires_at_unix_s`; fields left out keep
/// their base value.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TenantOverride {
    /// Weight while the override lasts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) weight: Option<Weight>,
    /// Burst multiplier while the override lasts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) burst: Option<BurstMultiplier>,
    /// Floor while the override lasts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) min_floor_rps: Option<LimitRps>,
    /// When the base values apply again (seconds since the Unix epoch).
    pub(crate) expires_at_unix_s: u64,
}

/// Every override, by bucket and by tenant.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overrides {
    /// Limit overrides by exact bucket key.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "crate::types::bucket_keyed"
    )]
    pub(crate) limits: BTreeMap<String, LimitOverride>,
    /// Tenant overrides by tenant name.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "crate::types::tenant_keyed"
    )]
    pub(crate) tenants: BTreeMap<String, TenantOverride>,
}

impl Overrides {
    /// No overrides at all.
    pub fn is_empty(&self) -> bool {
        self.limits.is_empty() && self.tenants.is_empty()
    }

    /// Applies the overrides still in force at `now` on top of `policy`.
    pub(crate) fn apply(&self, policy: &mut Policy, now: u64) {
        for (bucket, over) in &self.limits {
            if over.expires_at_unix_s > now {
                policy.limits.set_exact(bucket.clone(), over.limit.clone());
            }
        }
        for (tenant, over) in &self.tenants {
            if over.expires_at_unix_s > now {
                let mut effective = policy.tenants.policy_for(tenant);
                if let Some(weight) = over.weight {
                    effective.weight = weight;
                }
                if let Some(burst) = over.burst {
                    effective.burst = burst;
                }
                if let Some(floor) = over.min_floor_rps {
                    effective.min_floor_rps = floor;
                }
                policy.tenants.insert(tenant.clone(), effective);
            }
        }
    }

    /// Drops the overrides that expired at or before `now`; returns whether
    /// any did.
    pub(crate) fn remove_expired(&mut self, now: u64) -> bool {
        let before = self.limits.len() + self.tenants.len();
        self.limits.retain(|_, over| over.expires_at_unix_s > now);
        self.tenants.retain(|_, over| over.expires_at_unix_s > now);
        before != self.limits.len() + self.tenants.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::limits::{LimitRule, LimitTable, Selector};
    use crate::config::policy::{TenantPolicy, Tenants};

    fn limit(rps: f64) -> LimitRps {
        LimitRps::new(rps).unwrap()
    }

    fn base() -> Policy {
        let mut tenants = Tenants::default();
        tenants.insert(
            "gold".into(),
            TenantPolicy {
                weight: Weight::new(4.0).unwrap(),
                min_floor_rps: limit(10.0),
                ..TenantPolicy::default()
            },
        );
        Policy {
            limits: LimitTable::from_rules(
                None,
                [LimitRule {
                    selector: Selector::Pattern("acme*".into()),
                    limit: limit(100.0).into(),
                }],
            ),
            tenants,
            ..Policy::default()
        }
    }

    #[test]
    fn active_overrides_win_and_expired_ones_do_not() {
        let mut overrides = Overrides::default();
        overrides.limits.insert(
            "acme".into(),
            LimitOverride {
                limit: limit(500.0).into(),
                expires_at_unix_s: 1000,
            },
        );
        overrides.tenants.insert(
            "gold".into(),
            TenantOverride {
                weight: Some(Weight::new(8.0).unwrap()),
                burst: None,
                min_floor_rps: None,
                expires_at_unix_s: 2000,
            },
        );

        let mut policy = base();
        overrides.apply(&mut policy, 999);
        assert_eq!(policy.limits.limit_for("acme"), Some(limit(500.0)));
        assert_eq!(policy.limits.limit_for("acme-eu"), Some(limit(100.0)));
        let gold = policy.tenants.policy_for("gold");
        assert_eq!(gold.weight.get(), 8.0);
        assert_eq!(gold.min_floor_rps, limit(10.0), "kept from the base");

        let mut policy = base();
        overrides.apply(&mut policy, 1000);
        assert_eq!(policy.limits.limit_for("acme"), Some(limit(100.0)));
        assert_eq!(policy.tenants.policy_for("gold").weight.get(), 8.0);

        assert!(overrides.remove_expired(1000));
        assert!(overrides.limits.is_empty());
        assert_eq!(overrides.tenants.len(), 1);
        assert!(!overrides.remove_expired(1999));
        assert!(overrides.remove_expired(2000));
        assert!(overrides.is_empty());
    }

    #[test]
    fn a_budget_overrides_a_rate_and_reads_back_as_written() {
        let yaml = "acme:\n  budget: {amount: 1200000, unit: tokens, per: minute}\n  expires_at_unix_s: 1000\n";
        let limits: BTreeMap<String, LimitOverride> = serde_yaml_ng::from_str(yaml).unwrap();
        let overrides = Overrides {
            limits,
            ..Overrides::default()
        };
        let mut policy = base();
        overrides.apply(&mut policy, 999);
        let rule = policy.limits.rule_for("acme").unwrap();
        assert_eq!(rule.budget().unwrap().to_string(), "1200000 tokens/minute");
        assert_eq!(policy.limits.limit_for("acme"), Some(limit(20_000.0)));
        // Written back (the limits file, the replicas' document) as read.
        let json = serde_json::to_value(&overrides).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"limits": {"acme": {
                "budget": {"amount": 1_200_000.0, "unit": "tokens", "per": "minute"},
                "expires_at_unix_s": 1000}}})
        );
        let back: Overrides = serde_json::from_value(json).unwrap();
        assert_eq!(back, overrides);
        // A rate reads and writes as before.
        let rate: LimitOverride =
            serde_json::from_str(r#"{"limit_rps": 5, "expires_at_unix_s": 7}"#).unwrap();
        assert_eq!(rate.limit, Limit::Rps(limit(5.0)));
        assert_eq!(
            serde_json::to_string(&rate).unwrap(),
            r#"{"limit_rps":5.0,"expires_at_unix_s":7}"#
        );
    }

    #[test]
    fn an_override_has_exactly_one_good_limit() {
        for (text, message) in [
            (r#"{"expires_at_unix_s": 7}"#, "needs `limit_rps`"),
            (
                r#"{"limit_rps": 5, "budget": {"amount": 5, "unit": "t", "per": "hour"}, "expires_at_unix_s": 7}"#,
                "has both",
            ),
            (
                r#"{"budget": {"amount": 0, "unit": "tokens", "per": "hour"}, "expires_at_unix_s": 7}"#,
                "above 0",
            ),
            (
                r#"{"budget": {"amount": 5, "unit": "tokens", "per": "day"}, "expires_at_unix_s": 7}"#,
                "day",
            ),
            (r#"{"limit_rps": 5, "expires_at_unix_s": 7, "x": 1}"#, "x"),
        ] {
            let err = serde_json::from_str::<LimitOverride>(text).unwrap_err();
            assert!(err.to_string().contains(message), "{text}: {err}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90").unwrap().as_secs(), 90);
        assert_eq!(parse_duration("90s").unwrap().as_secs(), 90);
        assert_eq!(parse_duration("15m").unwrap().as_secs(), 900);
        assert_eq!(parse_duration("1h").unwrap().as_secs(), 3600);
        assert_eq!(parse_duration("2d").unwrap().as_secs(), 172_800);
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("31d").is_err());
        assert!(parse_duration("1w").is_err());
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("-1h").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }
}
