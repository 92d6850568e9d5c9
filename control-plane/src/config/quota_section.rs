//! The limits file's `quotas:` section: exact quotas in Sluice's own
//! vocabulary (buckets, patterns, tenants), served through the rate limit
//! service as the domain [`DOMAIN`].
//!
//! ```yaml
//! quotas:
//!   - bucket: checkout            # or pattern: "free-*" (a trailing `*`)
//!     requests_per_unit: 1000     # the bucket's own quota (optional)
//!     unit: minute
//!     per_tenant: {requests_per_unit: 100, unit: minute}   # each tenant's (optional)
//!     tenants:                    # named tenants' quotas (optional)
//!       enterprise: {requests_per_unit: 500, unit: minute}
//! ```
//!
//! A request names its cell with descriptors of the domain `sluice`:
//! `[bucket]` is counted against the bucket's quota, `[bucket, tenant]`
//! against the tenant's (a named tenant's, else `per_tenant`). Envoy's
//! `ratelimit` filter sends both with two `rate_limits` entries.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::quota_file::{Limit, Node, Unit, Wildcard};
use crate::types::{validate_bucket, validate_tenant};

/// The rate limit service domain the section is served under.
pub(crate) const DOMAIN: &str = "sluice";

/// The `quotas:` section, validated.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "Vec<NativeQuota>", into = "Vec<NativeQuota>")]
pub struct NativeQuotas(Vec<NativeQuota>);

/// Hits per unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PerUnit {
    /// Hits per unit (0: none).
    pub(crate) requests_per_unit: u32,
    /// The unit.
    pub(crate) unit: Unit,
}

/// One entry of the section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawNativeQuota", into = "RawNativeQuota")]
pub(crate) struct NativeQuota {
    /// An exact bucket key, or a prefix (from `pattern: "free-*"`).
    bucket: BucketMatch,
    /// The bucket's own quota.
    whole: Option<PerUnit>,
    /// Each tenant's quota.
    per_tenant: Option<PerUnit>,
    /// Named tenants' quotas.
    tenants: BTreeMap<String, PerUnit>,
    /// Over-quota hits are counted but answered OK.
    shadow_mode: bool,
    /// The limit's name (for `replaces` in other domains' terms).
    name: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum BucketMatch {
    Exact(String),
    /// `pattern: "free-*"`: the text before the `*`.
    Prefix(String),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNativeQuota {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bucket: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pattern: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    requests_per_unit: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unit: Option<Unit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    per_tenant: Option<PerUnit>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    tenants: BTreeMap<String, PerUnit>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    shadow_mode: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    name: String,
}

impl TryFrom<RawNativeQuota> for NativeQuota {
    type Error = String;

    fn try_from(raw: RawNativeQuota) -> Result<Self, String> {
        let bucket = match (raw.bucket, raw.pattern) {
            (Some(bucket), None) => {
                validate_bucket(&bucket).map_err(|err| format!("bucket: {err}"))?;
                BucketMatch::Exact(bucket)
            }
            (None, Some(pattern)) => {
                validate_bucket(&pattern).map_err(|err| format!("pattern: {err}"))?;
                match pattern.strip_suffix('*') {
                    Some(prefix) if !prefix.contains('*') => BucketMatch::Prefix(prefix.to_owned()),
                    _ => {
                        return Err(format!(
                            "pattern: {pattern:?}: a quota pattern has one `*`, at the end (the rate limit service matches prefixes)"
                        ));
                    }
                }
            }
            _ => return Err("give exactly one of bucket and pattern".to_owned()),
        };
        let whole = match (raw.requests_per_unit, raw.unit) {
            (Some(requests_per_unit), Some(unit)) => Some(PerUnit {
                requests_per_unit,
                unit,
            }),
            (None, None) => None,
            _ => return Err("requests_per_unit and unit go together".to_owned()),
        };
        for tenant in raw.tenants.keys() {
            validate_tenant(tenant).map_err(|err| format!("tenants.{tenant}: {err}"))?;
        }
        if whole.is_none() && raw.per_tenant.is_none() && raw.tenants.is_empty() {
            return Err(
                "no quota: give requests_per_unit and unit, per_tenant, or tenants".to_owned(),
            );
        }
        Ok(Self {
            bucket,
            whole,
            per_tenant: raw.per_tenant,
            tenants: raw.tenants,
            shadow_mode: raw.shadow_mode,
            name: raw.name,
        })
    }
}

impl From<NativeQuota> for RawNativeQuota {
    fn from(quota: NativeQuota) -> Self {
        let (bucket, pattern) = match quota.bucket {
            BucketMatch::Exact(bucket) => (Some(bucket), None),
            BucketMatch::Prefix(prefix) => (None, Some(format!("{prefix}*"))),
        };
        Self {
            bucket,
            pattern,
            requests_per_unit: quota.whole.map(|w| w.requests_per_unit),
            unit: quota.whole.map(|w| w.unit),
            per_tenant: quota.per_tenant,
            tenants: quota.tenants,
            shadow_mode: quota.shadow_mode,
            name: quota.name,
        }
    }
}

impl TryFrom<Vec<NativeQuota>> for NativeQuotas {
    type Error = String;

    fn try_from(quotas: Vec<NativeQuota>) -> Result<Self, String> {
        let mut seen = HashSet::new();
        for (index, quota) in quotas.iter().enumerate() {
            if !seen.insert(quota.bucket.composite()) {
                return Err(format!(
                    "[{index}]: {} has a quota already",
                    quota.bucket.shown()
                ));
            }
        }
        Ok(Self(quotas))
    }
}

impl From<NativeQuotas> for Vec<NativeQuota> {
    fn from(quotas: NativeQuotas) -> Self {
        quotas.0
    }
}

impl BucketMatch {
    /// The descriptor tree key: `bucket_<key>` (a prefix keeps its `*`).
    fn composite(&self) -> String {
        match self {
            BucketMatch::Exact(bucket) => format!("bucket_{bucket}"),
            BucketMatch::Prefix(prefix) => format!("bucket_{prefix}*"),
        }
    }

    fn shown(&self) -> String {
        match self {
            BucketMatch::Exact(bucket) => format!("bucket {bucket:?}"),
            BucketMatch::Prefix(prefix) => format!("pattern {:?}", format!("{prefix}*")),
        }
    }
}

impl NativeQuotas {
    /// Whether the section is empty (or absent).
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The [`DOMAIN`] tree the rate limit service matches requests
    /// against; `None` for an empty section.
    pub(crate) fn domain(&self) -> Option<Node> {
        if self.is_empty() {
            return None;
        }
        let mut root = Node::default();
        for quota in &self.0 {
            let key = quota.bucket.composite();
            let path = format!("{DOMAIN}.{key}");
            let limit = |per: PerUnit, full_key: String| Limit {
                quota: Some((per.requests_per_unit, per.unit)),
                shadow_mode: quota.shadow_mode,
                name: quota.name.clone(),
                full_key,
                ..Limit::default()
            };
            let mut children = HashMap::new();
            if let Some(per) = quota.per_tenant {
                let node = Node {
                    limit: Some(limit(per, format!("{path}.tenant"))),
                    ..Node::default()
                };
                children.insert("tenant".to_owned(), node);
            }
            for (tenant, per) in &quota.tenants {
                let node = Node {
                    limit: Some(limit(*per, format!("{path}.tenant_{tenant}"))),
                    ..Node::default()
                };
                children.insert(format!("tenant_{tenant}"), node);
            }
            let node = Node {
                children,
                limit: quota.whole.map(|per| limit(per, path.clone())),
                ..Node::default()
            };
            if matches!(quota.bucket, BucketMatch::Prefix(_)) {
                root.wildcards.push(Wildcard::new(&key));
            }
            root.children.insert(key, node);
        }
        Some(root)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::quotas::lookup;

    fn parse(yaml: &str) -> Result<NativeQuotas, String> {
        serde_yaml_ng::from_str(yaml).map_err(|err| err.to_string())
    }

    const SECTION: &str = r#"
- bucket: checkout
  requests_per_unit: 1000
  unit: minute
  per_tenant: {requests_per_unit: 100, unit: minute}
  tenants:
    enterprise: {requests_per_unit: 500, unit: minute}
- pattern: "free-*"
  per_tenant: {requests_per_unit: 10, unit: second}
"#;

    fn quota_of(root: &Node, entries: &[(&str, &str)]) -> Option<(u32, Unit, String)> {
        lookup::find(root, DOMAIN, entries).and_then(|found| {
            let limit = found.limit;
            limit
                .quota
                .map(|(n, unit)| (n, unit, limit.full_key.clone()))
        })
    }

    #[test]
    fn buckets_and_tenants_map_to_descriptors() {
        let quotas = parse(SECTION).unwrap();
        let root = quotas.domain().unwrap();
        assert_eq!(
            quota_of(&root, &[("bucket", "checkout")]),
            Some((1000, Unit::Minute, "sluice.bucket_checkout".to_owned()))
        );
        assert_eq!(
            quota_of(&root, &[("bucket", "checkout"), ("tenant", "acme")]),
            Some((
                100,
                Unit::Minute,
                "sluice.bucket_checkout.tenant".to_owned()
            ))
        );
        assert_eq!(
            quota_of(&root, &[("bucket", "checkout"), ("tenant", "enterprise")]),
            Some((
                500,
                Unit::Minute,
                "sluice.bucket_checkout.tenant_enterprise".to_owned()
            ))
        );
        assert_eq!(
            quota_of(&root, &[("bucket", "free-42"), ("tenant", "x")]),
            Some((10, Unit::Second, "sluice.bucket_free-*.tenant".to_owned()))
        );
        assert_eq!(
            quota_of(&root, &[("bucket", "free-42")]),
            None,
            "no bucket-wide quota"
        );
        assert_eq!(quota_of(&root, &[("bucket", "other")]), None);
        // It writes back as it was read.
        let written = serde_yaml_ng::to_string(&quotas).unwrap();
        assert_eq!(parse(&written).unwrap(), quotas);
    }

    #[test]
    fn bad_entries_say_what_is_wrong() {
        for (yaml, expected) in [
            (
                "- {requests_per_unit: 1, unit: second}",
                "exactly one of bucket and pattern",
            ),
            (
                "- {bucket: a, pattern: b*, requests_per_unit: 1, unit: second}",
                "exactly one",
            ),
            (
                "- {pattern: 'a*b*', requests_per_unit: 1, unit: second}",
                "one `*`, at the end",
            ),
            (
                "- {pattern: 'a', requests_per_unit: 1, unit: second}",
                "one `*`, at the end",
            ),
            ("- {bucket: a, requests_per_unit: 1}", "go together"),
            ("- {bucket: a}", "no quota"),
            (
                "- {bucket: a, requests_per_unit: 1, unit: fortnight}",
                "unknown variant",
            ),
            (
                "- {bucket: a, requests_per_unit: -1, unit: second}",
                "expected u32",
            ),
            (
                "- {bucket: a, requests_per_unit: 1, unit: second, burst: 3}",
                "unknown field",
            ),
            (
                "- {bucket: a, requests_per_unit: 1, unit: second}\n- {bucket: a, per_tenant: {requests_per_unit: 1, unit: second}}",
                "has a quota already",
            ),
        ] {
            let err = parse(yaml).unwrap_err();
            assert!(err.contains(expected), "{yaml}: {err}");
        }
        let long = format!(
            "- {{bucket: {}, requests_per_unit: 1, unit: second}}",
            "b".repeat(300)
        );
        assert!(parse(&long).unwrap_err().contains("bucket"), "too long");
    }

    #[test]
    fn a_directory_domain_named_sluice_clashes_and_changes_nothing() {
        use crate::quotas::settings::QuotaSettings;
        use crate::quotas::{QuotaConfig, Quotas};
        let clashing = QuotaConfig::from_files(&[(
            "sluice.yaml".to_owned(),
            "domain: sluice\ndescriptors: []\n".to_owned(),
        )])
        .unwrap();
        let quotas = Quotas::new(
            clashing.clone(),
            None,
            QuotaSettings::default(),
            std::sync::Arc::new(|| 0),
            crate::metrics::ControlPlaneMetrics::new(1).quotas(),
        );
        let section = parse(SECTION).unwrap();
        let err = quotas.set_native(&section).unwrap_err();
        assert!(err.contains("domain \"sluice\""), "{err}");
        assert_eq!(*quotas.config(), clashing, "nothing changed");
        // Without the clash it is served beside the directory's domains.
        assert_eq!(quotas.replace(QuotaConfig::default()), Ok(true));
        assert_eq!(quotas.set_native(&section), Ok(true));
        assert!(quotas.config().domains.contains_key(DOMAIN));
        assert_eq!(quotas.set_native(&section), Ok(false), "unchanged");
        // Now the directory may not take the domain back.
        assert!(quotas.replace(clashing).is_err());
        assert!(quotas.config().domains.contains_key(DOMAIN));
    }
}
