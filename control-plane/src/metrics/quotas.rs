//! Counters of the exact quotas (the rate limit service), with
//! envoyproxy/ratelimit's statistics' names and meanings:
//! `ratelimit.service.rate_limit.<domain>.<key>.<stat>` is
//! `sluice_quota_<stat>_total{domain="<domain>",key="<key>"}` for `stat`
//! in `total_hits`, `over_limit`, `near_limit`, `within_limit`,
//! `shadow_mode` and `over_limit_with_local_cache` (each counting hits, as
//! there); `<domain>.domain_not_found` is
//! `sluice_quota_domain_not_found_total{domain}`,
//! `call.should_rate_limit.<err_type>` is
//! `sluice_quota_should_rate_limit_error_total{err_type}`,
//! `config_load_success` / `config_load_error` and `global_shadow_mode`
//! keep their names. Keys are the configured key paths, so their number is
//! bounded by the configuration; keys naming request values
//! (`detailed_metric`, `value_to_metric`, limit overrides) and unknown
//! domains are bounded here.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::labels::ReasonLabels;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LimitLabels {
    domain: String,
    key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DomainLabels {
    domain: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ErrTypeLabels {
    err_type: &'static str,
}

/// Why a ShouldRateLimit call failed, as envoyproxy/ratelimit counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallError {
    /// The counter store failed (`redis_error`).
    Store,
    /// The request itself (`service_error`): an empty domain or descriptor
    /// list.
    Service,
}

/// How a descriptor's hits went, for the per-key statistics (see
/// [`QuotaMetrics::counted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// Hits of the request.
    pub(crate) hits: u64,
    /// The counter before them.
    pub(crate) before: u64,
    /// The counter after them.
    pub(crate) after: u64,
    /// The limit.
    pub(crate) limit: u64,
    /// Where "near the limit" starts (`floor(limit × NEAR_LIMIT_RATIO)`).
    pub(crate) near: u64,
    /// Whether the algorithm refused them.
    pub(crate) over: bool,
    /// Whether the limit is in shadow mode.
    pub(crate) shadow: bool,
}

/// The quota counters; cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct QuotaMetrics {
    total_hits: Family<LimitLabels, Counter>,
    over_limit: Family<LimitLabels, Counter>,
    near_limit: Family<LimitLabels, Counter>,
    within_limit: Family<LimitLabels, Counter>,
    shadow_mode: Family<LimitLabels, Counter>,
    over_limit_with_local_cache: Family<LimitLabels, Counter>,
    domain_not_found: Family<DomainLabels, Counter>,
    should_rate_limit_error: Family<ErrTypeLabels, Counter>,
    config_load_success: Counter,
    config_load_error: Counter,
    global_shadow_mode: Counter,
    store_errors: Family<ReasonLabels, Counter>,
    refused: Family<ReasonLabels, Counter>,
    /// Keys naming request values that have their own series.
    per_value: Arc<Mutex<HashSet<String>>>,
    per_value_overflow: Counter,
    local_cache_hits: Counter,
}

/// Most series keyed by request values (`detailed_metric`,
/// `value_to_metric`, limit overrides, unknown domains) per process: past
/// it, hits count under the configured key path, so a flood of distinct
/// values cannot grow `/metrics` without bound.
pub(crate) const MAX_DETAILED_KEYS: usize = 1_000;

/// The key of unknown domains past [`MAX_DETAILED_KEYS`].
const OTHER_DOMAINS: &str = "_other";

impl QuotaMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        for (name, help, family) in [
            (
                "quota_total_hits",
                "Hits counted against a quota (ratelimit.service.rate_limit.<domain>.<key>.total_hits)",
                &metrics.total_hits,
            ),
            (
                "quota_over_limit",
                "Hits over a quota, shadow mode and the local cache included (….over_limit)",
                &metrics.over_limit,
            ),
            (
                "quota_near_limit",
                "Hits between the near-limit ratio of a quota and the quota (….near_limit)",
                &metrics.near_limit,
            ),
            (
                "quota_within_limit",
                "Hits within a quota (….within_limit)",
                &metrics.within_limit,
            ),
            (
                "quota_shadow_mode",
                "Hits over a quota in shadow mode, answered OK (….shadow_mode)",
                &metrics.shadow_mode,
            ),
            (
                "quota_over_limit_with_local_cache",
                "Hits answered over limit from the local cache of full fixed windows (….over_limit_with_local_cache)",
                &metrics.over_limit_with_local_cache,
            ),
        ] {
            registry.register(name, help, family.clone());
        }
        registry.register(
            "quota_domain_not_found",
            "Descriptors of a domain no configuration names (ratelimit.service.rate_limit.<domain>.domain_not_found)",
            metrics.domain_not_found.clone(),
        );
        registry.register(
            "quota_should_rate_limit_error",
            "ShouldRateLimit calls answered with an error: redis_error (the store failed) or service_error (an empty domain or descriptor list) (ratelimit.service.call.should_rate_limit.<err_type>)",
            metrics.should_rate_limit_error.clone(),
        );
        registry.register(
            "quota_config_load_success",
            "Quota configurations loaded, at start and on reload (ratelimit.service.config_load_success)",
            metrics.config_load_success.clone(),
        );
        registry.register(
            "quota_config_load_error",
            "Quota configurations refused on reload, the previous one kept (ratelimit.service.config_load_error)",
            metrics.config_load_error.clone(),
        );
        registry.register(
            "quota_global_shadow_mode",
            "Requests over limit answered OK by --quota-global-shadow-mode (ratelimit.service.global_shadow_mode)",
            metrics.global_shadow_mode.clone(),
        );
        registry.register(
            "quota_store_errors",
            "Descriptors the store could not count, by reason (store_timeout, store_unavailable, store_full)",
            metrics.store_errors.clone(),
        );
        registry.register(
            "quota_detailed_overflow",
            "Hits of keys naming request values counted under the configured key path because the process already has its maximum of such series",
            metrics.per_value_overflow.clone(),
        );
        registry.register(
            "quota_local_cache_hits",
            "Descriptors answered over limit from the local cache of full fixed windows, without a round trip to the store",
            metrics.local_cache_hits.clone(),
        );
        registry.register(
            "quota_requests_refused",
            "ShouldRateLimit requests refused whole, by reason (too_many_descriptors, too_many_entries, bad_override)",
            metrics.refused.clone(),
        );
        metrics
    }

    /// The key a limit counts under: `per_value` (a path naming request
    /// values) while the
    /// process holds fewer than [`MAX_DETAILED_KEYS`] of them, else the
    /// configured path.
    pub(crate) fn bounded_key(&self, configured: &str, per_value: &str) -> String {
        let mut per_value_set = self
            .per_value
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if per_value_set.contains(per_value) {
            return per_value.to_owned();
        }
        if per_value_set.len() >= MAX_DETAILED_KEYS {
            self.per_value_overflow.inc();
            return configured.to_owned();
        }
        per_value_set.insert(per_value.to_owned());
        per_value.to_owned()
    }

    /// The statistics of one counted descriptor at `key` (`domain.…`), as
    /// envoyproxy/ratelimit accounts them: all hits in `total_hits`; when
    /// over, the hits past the limit in `over_limit` (and `shadow_mode`)
    /// and those between the near-limit threshold and the limit in
    /// `near_limit`; when within, the hits in `within_limit` and those past
    /// the threshold in `near_limit`.
    pub(crate) fn counted(&self, domain: &str, key: &str, outcome: Outcome) {
        let labels = labels(domain, key);
        let add = |family: &Family<LimitLabels, Counter>, by: u64| {
            if by > 0 {
                family.get_or_create(&labels).inc_by(by);
            }
        };
        self.total_hits.get_or_create(&labels).inc_by(outcome.hits);
        let Outcome {
            hits,
            before,
            after,
            limit,
            near,
            over,
            shadow,
        } = outcome;
        if over {
            let over_hits = if before >= limit || after <= limit {
                hits
            } else {
                after - limit
            };
            add(&self.over_limit, over_hits);
            if before < limit && after > limit {
                add(&self.near_limit, limit - near.max(before));
            }
            if shadow {
                add(&self.shadow_mode, over_hits);
            }
        } else {
            add(&self.within_limit, hits);
            if after > near {
                add(
                    &self.near_limit,
                    if before >= near { hits } else { after - near },
                );
            }
        }
    }

    /// `hits` at `key` answered over limit from the local cache.
    pub(crate) fn over_limit_from_cache(&self, domain: &str, key: &str, hits: u64, shadow: bool) {
        let labels = labels(domain, key);
        self.total_hits.get_or_create(&labels).inc_by(hits);
        self.over_limit.get_or_create(&labels).inc_by(hits);
        self.over_limit_with_local_cache
            .get_or_create(&labels)
            .inc_by(hits);
        if shadow {
            self.shadow_mode.get_or_create(&labels).inc_by(hits);
        }
        self.local_cache_hits.inc();
    }

    /// `hits` at `key` the store could not count, for `reason`.
    pub(crate) fn store_error(&self, domain: &str, key: &str, hits: u64, reason: &'static str) {
        self.total_hits
            .get_or_create(&labels(domain, key))
            .inc_by(hits);
        self.store_errors
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// A descriptor of a domain no configuration names (the first
    /// [`MAX_DETAILED_KEYS`] such domains by name, the others as `_other`).
    pub(crate) fn domain_not_found(&self, domain: &str) {
        let domain = self.bounded_key(OTHER_DOMAINS, &format!("\0domain:{domain}"));
        let domain = domain.strip_prefix("\0domain:").unwrap_or(&domain);
        self.domain_not_found
            .get_or_create(&DomainLabels {
                domain: domain.to_owned(),
            })
            .inc();
    }

    /// A call answered with an error.
    pub(crate) fn call_error(&self, error: CallError) {
        let err_type = match error {
            CallError::Store => "redis_error",
            CallError::Service => "service_error",
        };
        self.should_rate_limit_error
            .get_or_create(&ErrTypeLabels { err_type })
            .inc();
    }

    /// A configuration loaded (`true`) or refused.
    pub(crate) fn config_load(&self, success: bool) {
        if success {
            self.config_load_success.inc();
        } else {
            self.config_load_error.inc();
        }
    }

    /// A request over limit answered OK by the global shadow mode.
    pub(crate) fn global_shadow_mode(&self) {
        self.global_shadow_mode.inc();
    }

    /// A request refused whole.
    pub(crate) fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&ReasonLabels { reason }).inc();
    }
}

/// The labels of the key path `domain.key…` of `domain`.
fn labels(domain: &str, key: &str) -> LimitLabels {
    let rest = key
        .strip_prefix(domain)
        .and_then(|rest| rest.strip_prefix('.'))
        .unwrap_or(key);
    LimitLabels {
        domain: domain.to_owned(),
        key: rest.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_naming_values_are_bounded() {
        let metrics = QuotaMetrics::default();
        assert_eq!(
            metrics.bounded_key("api.user", "api.user_bob"),
            "api.user_bob"
        );
        for n in 0..MAX_DETAILED_KEYS * 2 {
            let _ = metrics.bounded_key("api.user", &format!("api.user_u{n}"));
        }
        assert_eq!(
            metrics
                .per_value
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len(),
            MAX_DETAILED_KEYS
        );
        assert_eq!(metrics.bounded_key("api.user", "api.user_new"), "api.user");
        assert_eq!(
            metrics.bounded_key("api.user", "api.user_bob"),
            "api.user_bob",
            "known keys stay"
        );
        assert!(metrics.per_value_overflow.get() > 0);
    }

    #[test]
    fn a_domain_with_dots_keeps_them() {
        assert_eq!(
            labels("api.v1", "api.v1.tenant_gold"),
            LimitLabels {
                domain: "api.v1".to_owned(),
                key: "tenant_gold".to_owned()
            }
        );
    }

    fn stat(metrics: &QuotaMetrics, family: &Family<LimitLabels, Counter>) -> u64 {
        let _ = metrics;
        family.get_or_create(&labels("d", "d.k")).get()
    }

    /// The accounting of envoyproxy/ratelimit's `base_limiter.go`: a limit
    /// of 10 (near from 8), hits of 3 from 6 (3 near... ) and so on.
    #[test]
    fn hits_are_accounted_as_envoyproxy_ratelimit_accounts_them() {
        let metrics = QuotaMetrics::default();
        let outcome = |before: u64, hits: u64, shadow: bool| Outcome {
            hits,
            before,
            after: before + hits,
            limit: 10,
            near: 8,
            over: before + hits > 10,
            shadow,
        };
        // 6 → 9: within, 1 near (the ninth).
        metrics.counted("d", "d.k", outcome(6, 3, false));
        assert_eq!(stat(&metrics, &metrics.within_limit), 3);
        assert_eq!(stat(&metrics, &metrics.near_limit), 1);
        // 9 → 12: 2 over, 1 near (the tenth).
        metrics.counted("d", "d.k", outcome(9, 3, false));
        assert_eq!(stat(&metrics, &metrics.over_limit), 2);
        assert_eq!(stat(&metrics, &metrics.near_limit), 2);
        // 12 → 14, shadow: all over, all shadow.
        metrics.counted("d", "d.k", outcome(12, 2, true));
        assert_eq!(stat(&metrics, &metrics.over_limit), 4);
        assert_eq!(stat(&metrics, &metrics.shadow_mode), 2);
        assert_eq!(stat(&metrics, &metrics.total_hits), 8);
    }
}
