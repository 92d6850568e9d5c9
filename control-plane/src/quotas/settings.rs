//! How exact quotas count and answer: the algorithm, the store's budget,
//! what a store failure answers, the response headers, the global modes.

use super::algorithm::Algorithm;
use crate::config::quota_file::LoadOptions;

/// Default byte budget of the in-memory store's counter keys.
pub(crate) const DEFAULT_STORE_BYTES: usize = 256 << 20;

/// The share of a quota past which admitted hits count as near the limit
/// (`sluice_quota_near_limit_total`; envoyproxy/ratelimit's
/// NEAR_LIMIT_RATIO): strictly between 0 and 1, 0.8 by default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct NearLimitRatio(f64);

impl NearLimitRatio {
    /// The ratio, if it is strictly between 0 and 1.
    pub(crate) fn new(ratio: f64) -> Result<Self, String> {
        if ratio.is_finite() && ratio > 0.0 && ratio < 1.0 {
            Ok(Self(ratio))
        } else {
            Err(format!("must be between 0 and 1 (exclusive), got {ratio}"))
        }
    }

    /// The ratio.
    pub(crate) fn get(self) -> f64 {
        self.0
    }
}

impl Default for NearLimitRatio {
    fn default() -> Self {
        Self(0.8)
    }
}

/// What a hit that cannot be counted (the store is full, down or slower
/// than `--store-timeout-ms`) is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum StoreFailure {
    /// The call fails with a gRPC error (`UNAVAILABLE`), as
    /// envoyproxy/ratelimit's does: the `ratelimit` filter's
    /// `failure_mode_deny` decides.
    #[default]
    Error,
    /// OK, with `x-ratelimit-error` naming why (fail open).
    Allow,
    /// Over limit, with `x-ratelimit-error` naming why (fail closed).
    Deny,
}

/// The response headers envoyproxy/ratelimit adds with
/// `LIMIT_RESPONSE_HEADERS_ENABLED`: the tightest limit's quota, what
/// remains of it and the seconds until it resets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResponseHeaders {
    /// `LIMIT_LIMIT_HEADER` (`RateLimit-Limit`).
    pub(crate) limit: String,
    /// `LIMIT_REMAINING_HEADER` (`RateLimit-Remaining`).
    pub(crate) remaining: String,
    /// `LIMIT_RESET_HEADER` (`RateLimit-Reset`).
    pub(crate) reset: String,
}

impl Default for ResponseHeaders {
    fn default() -> Self {
        Self {
            limit: "RateLimit-Limit".to_owned(),
            remaining: "RateLimit-Remaining".to_owned(),
            reset: "RateLimit-Reset".to_owned(),
        }
    }
}

/// How [`Quotas`](super::engine::Quotas) counts and answers.
#[derive(Debug, Clone)]
pub(crate) struct QuotaSettings {
    /// The algorithm of every quota (fixed windows unless chosen).
    pub(crate) algorithm: Algorithm,
    /// What a hit that cannot be counted is answered.
    pub(crate) store_failure: StoreFailure,
    /// The store's byte budget.
    pub(crate) store_bytes: usize,
    /// With the counters in the shared store: bytes of fixed-window
    /// counters over their limit answered without a round trip (0: off).
    pub(crate) local_cache_bytes: usize,
    /// Where "near the limit" starts.
    pub(crate) near_limit_ratio: NearLimitRatio,
    /// When a request would take a fixed window over its limit, only the
    /// windows that go over count its hits
    /// (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`).
    pub(crate) stop_increment_when_over_limit: bool,
    /// Sliding windows and GCRA count hits they refuse too, as charges
    /// (the fixed window always does): a cost charged after the fact is
    /// then never dropped because its quota is already spent.
    pub(crate) count_refused_hits: bool,
    /// Rate limit headers to add to every answer with a limit (none by
    /// default: Envoy's `enable_x_ratelimit_headers` adds its own).
    pub(crate) response_headers: Option<ResponseHeaders>,
    /// Answer OK whatever the counts say (`SHADOW_MODE`); the counting
    /// and the descriptors' statuses are unchanged.
    pub(crate) global_shadow_mode: bool,
    /// Every descriptor in quota mode (`QUOTA_MODE`).
    pub(crate) global_quota_mode: bool,
    /// Answer with dynamic metadata: the domain, the descriptors and the
    /// `metadata` of the limits that passed (`RESPONSE_DYNAMIC_METADATA`).
    pub(crate) dynamic_metadata: bool,
    /// How configuration files combine (`MERGE_DOMAIN_CONFIG`).
    pub(crate) load: LoadOptions,
}

impl Default for QuotaSettings {
    fn default() -> Self {
        Self {
            algorithm: Algorithm::default(),
            store_failure: StoreFailure::default(),
            store_bytes: DEFAULT_STORE_BYTES,
            local_cache_bytes: 0,
            near_limit_ratio: NearLimitRatio::default(),
            stop_increment_when_over_limit: false,
            count_refused_hits: false,
            response_headers: None,
            global_shadow_mode: false,
            global_quota_mode: false,
            dynamic_metadata: false,
            load: LoadOptions::default(),
        }
    }
}
