//! Counters of the exact quotas (the rate limit service), per configured
//! limit as envoyproxy/ratelimit users know them: hits, over limit, near
//! limit, shadow mode, store errors (also by reason), and requests refused whole. Labels
//! are the configured key paths, so their number is bounded by the
//! configuration, never by request values.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

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
    /// Key paths with values (`detailed_metric`) that have their own series.
    detailed: Arc<Mutex<HashSet<String>>>,
    detailed_overflow: Counter,
    local_cache_hits: Counter,
}

/// Most series keyed by request values (`detailed_metric`) per process:
/// past it, hits count under the configured key path, so a flood of
/// distinct values cannot grow `/metrics` without bound.
pub const MAX_DETAILED_KEYS: usize = 1_000;
/// Longest value kept in a detailed key path (longer ones are cut, so two
/// values alike in their first bytes share a series).
pub const MAX_DETAILED_VALUE_BYTES: usize = 64;

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
            "quota_detailed_overflow",
            "Hits of detailed_metric limits counted under the configured key path because the process already has its maximum of per-value series",
            metrics.detailed_overflow.clone(),
        );
        registry.register(
            "quota_local_cache_hits",
            "Descriptors answered over limit from the local cache of full fixed windows, without a round trip to the store",
            metrics.local_cache_hits.clone(),
        );
        registry.register(
            "quota_requests_refused",
            "ShouldRateLimit requests refused whole, by reason (too_many_descriptors, too_many_entries)",
            metrics.refused.clone(),
        );
        metrics
    }

    /// The key path a `detailed_metric` limit's hits count under:
    /// `domain.key_value.key_value…` with the request's own values, as
    /// envoyproxy/ratelimit names them; the configured path once the
    /// process holds [`MAX_DETAILED_KEYS`] of them.
    pub fn detailed_key<'a>(
        &self,
        configured: &str,
        domain: &str,
        entries: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> String {
        let mut key = domain.to_owned();
        for (name, value) in entries {
            key.push('.');
            key.push_str(name);
            key.push('_');
            key.push_str(cut(value, MAX_DETAILED_VALUE_BYTES));
        }
        let mut detailed = self.detailed.lock().unwrap_or_else(PoisonError::into_inner);
        if detailed.contains(&key) {
            return key;
        }
        if detailed.len() >= MAX_DETAILED_KEYS {
            self.detailed_overflow.inc();
            return configured.to_owned();
        }
        detailed.insert(key.clone());
        key
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

    /// A descriptor answered from the local over-limit cache.
    pub fn local_cache_hit(&self) {
        self.local_cache_hits.inc();
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

/// `text` cut to at most `max` bytes on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detailed(metrics: &QuotaMetrics, value: &str) -> String {
        metrics.detailed_key("api.user", "api", [("user", value)].into_iter())
    }

    #[test]
    fn detailed_keys_name_the_values_up_to_a_bound() {
        let metrics = QuotaMetrics::default();
        assert_eq!(detailed(&metrics, "bob"), "api.user_bob");
        assert_eq!(detailed(&metrics, "bob"), "api.user_bob");
        let long = "é".repeat(100);
        let key = detailed(&metrics, &long);
        assert!(
            key.len() <= "api.user_".len() + MAX_DETAILED_VALUE_BYTES,
            "{key}"
        );
        for n in 0..MAX_DETAILED_KEYS * 2 {
            let _ = detailed(&metrics, &format!("u{n}"));
        }
        assert_eq!(
            metrics
                .detailed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len(),
            MAX_DETAILED_KEYS
        );
        assert_eq!(detailed(&metrics, "one-more"), "api.user");
        assert_eq!(detailed(&metrics, "bob"), "api.user_bob", "known keys stay");
        assert!(metrics.detailed_overflow.get() > 0);
    }
}
