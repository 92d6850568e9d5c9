//! Counters of the exact quotas (the rate limit service), per configured
//! limit as envoyproxy/ratelimit users know them: hits, over limit, near
//! limit, shadow mode, store errors (also by reason), and requests refused whole. Labels
//! are the configured key paths, so their number is bounded by the
//! configuration, never by request values.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::ReasonLabels;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LimitLabels {
    key: String,
}

/// The quota counters; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct QuotaMetrics {
    hits: Family<LimitLabels, Counter>,
    over_limit: Family<LimitLabels, Counter>,
    near_limit: Family<LimitLabels, Counter>,
    shadow_mode: Family<LimitLabels, Counter>,
    errors: Family<LimitLabels, Counter>,
    store_errors: Family<ReasonLabels, Counter>,
    refused: Family<ReasonLabels, Counter>,
}

impl QuotaMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        for (name, help, family) in [
            (
                "quota_hits",
                "Hits counted against a configured quota, by key path",
                &metrics.hits,
            ),
            (
                "quota_over_limit",
                "Hits over a quota (shadow mode included), by key path",
                &metrics.over_limit,
            ),
            (
                "quota_near_limit",
                "Admitted hits past 80 % of a quota, by key path",
                &metrics.near_limit,
            ),
            (
                "quota_shadow_mode",
                "Hits over a quota in shadow mode (answered OK), by key path",
                &metrics.shadow_mode,
            ),
            (
                "quota_errors",
                "Hits the store could not count (answered by the failure policy), by key path",
                &metrics.errors,
            ),
        ] {
            registry.register(name, help, family.clone());
        }
        registry.register(
            "quota_store_errors",
            "Descriptors the store could not count, by reason (store_timeout, store_unavailable, store_full)",
            metrics.store_errors.clone(),
        );
        registry.register(
            "quota_requests_refused",
            "ShouldRateLimit requests refused whole, by reason (too_many_descriptors, too_many_entries)",
            metrics.refused.clone(),
        );
        metrics
    }

    fn inc(family: &Family<LimitLabels, Counter>, key: &str, by: u64) {
        family
            .get_or_create(&LimitLabels {
                key: key.to_owned(),
            })
            .inc_by(by);
    }

    /// `hits` counted against the quota at `key`.
    pub fn hit(&self, key: &str, hits: u32) {
        Self::inc(&self.hits, key, u64::from(hits));
    }

    /// A request over the quota at `key`.
    pub fn over_limit(&self, key: &str, shadow: bool) {
        Self::inc(&self.over_limit, key, 1);
        if shadow {
            Self::inc(&self.shadow_mode, key, 1);
        }
    }

    /// An admitted request past 80 % of the quota at `key`.
    pub fn near_limit(&self, key: &str) {
        Self::inc(&self.near_limit, key, 1);
    }

    /// The store could not count a hit for `key`, for `reason`.
    pub fn error(&self, key: &str, reason: &'static str) {
        Self::inc(&self.errors, key, 1);
        self.store_errors
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// A request refused whole.
    pub fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&ReasonLabels { reason }).inc();
    }
}
