//! Reads a descriptor's current count for an operator (the admin API's
//! `GET /v1/quotas/{domain}`, `sluice ctl quota`) without counting a hit.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use serde::Serialize;

use super::algorithm::Quota;
use super::engine::Quotas;
use super::lookup::{self, MAX_ENTRIES};
use super::redis_store::Count;
use super::service::counter_key;
use super::store::CountError;

/// A descriptor's quota and where its counter stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QuotaRead {
    /// The domain.
    pub(crate) domain: String,
    /// The descriptor's entries, in order, as `[key, value]`.
    pub(crate) entries: Vec<(String, String)>,
    /// The configured key path the limit is counted under in metrics.
    pub(crate) key: String,
    /// The limit's `name` (empty when it has none).
    pub(crate) name: String,
    /// Hits per unit.
    pub(crate) requests_per_unit: u32,
    /// `second`, `minute`, …
    pub(crate) unit: &'static str,
    /// Whether over-limit hits are answered OK.
    pub(crate) shadow_mode: bool,
    /// The count as the algorithm sees it now (fixed window: hits in the
    /// window, refused ones included; sliding: the weighted estimate;
    /// GCRA: hits in flight).
    pub(crate) used: u64,
    /// Hits left before the next refusal.
    pub(crate) remaining: u32,
    /// Milliseconds until the quota is whole again.
    pub(crate) reset_ms: u64,
}

/// Why a descriptor cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// No configuration names the domain.
    #[error("no quota configuration for domain {0:?}")]
    UnknownDomain(String),
    /// No configured limit matches the descriptor (or its limit is
    /// `unlimited`): requests with it are never counted.
    #[error("no limit applies to this descriptor in domain {0:?}")]
    NoLimit(String),
    /// The descriptor is empty or too long.
    #[error("a descriptor has 1 to {max} entries, not {found}")]
    Entries {
        /// Entries given.
        found: usize,
        /// The most a request may carry.
        max: usize,
    },
    /// The counter store failed.
    #[error(transparent)]
    Store(#[from] CountError),
}

impl Quotas {
    /// The quota the descriptor `entries` of `domain` hits and its counter
    /// now, as a request of no hits would see it.
    pub(crate) async fn read(
        &self,
        domain: &str,
        entries: &[(String, String)],
    ) -> Result<QuotaRead, ReadError> {
        if entries.is_empty() || entries.len() > MAX_ENTRIES {
            return Err(ReadError::Entries {
                found: entries.len(),
                max: MAX_ENTRIES,
            });
        }
        let config = self.config();
        let root = config
            .domains
            .get(domain)
            .ok_or_else(|| ReadError::UnknownDomain(domain.to_owned()))?;
        let pairs: Vec<(&str, &str)> = entries
            .iter()
            .map(|(key, value)| (key.as_str(), value.as_str()))
            .collect();
        let found = lookup::find(root, domain, &pairs)
            .filter(|found| found.limit.quota.is_some())
            .ok_or_else(|| ReadError::NoLimit(domain.to_owned()))?;
        let limit = found.limit;
        let Some((requests, unit)) = limit.quota else {
            return Err(ReadError::NoLimit(domain.to_owned()));
        };
        let descriptor = RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(key, value)| Entry {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            ..RateLimitDescriptor::default()
        };
        let count = Count {
            counter: counter_key(domain, &descriptor, found.shared.as_deref()),
            quota: Quota {
                limit: requests,
                window_ms: unit.window_ms(),
                burst: requests.max(1),
            },
            hits: 0,
            direction: super::algorithm::Direction::Take,
        };
        let decision = self
            .counters
            .peek(self.settings.algorithm, count, (self.clock)())
            .await?;
        Ok(QuotaRead {
            domain: domain.to_owned(),
            entries: entries.to_vec(),
            key: limit.full_key.clone(),
            name: limit.name.clone(),
            requests_per_unit: requests,
            unit: unit.as_str(),
            shadow_mode: limit.shadow_mode,
            used: decision.used,
            remaining: decision.remaining,
            reset_ms: decision.reset_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

    use super::*;
    use crate::metrics::ControlPlaneMetrics;
    use crate::quotas::settings::QuotaSettings;
    use crate::quotas::{Algorithm, QuotaConfig};

    const CONFIG: &str = r#"
domain: api
descriptors:
  - key: plan
    value: free
    rate_limit: {unit: minute, requests_per_unit: 5, name: free}
  - key: plan
    value: vip
    rate_limit: {unlimited: true}
"#;

    fn quotas(algorithm: Algorithm) -> (Quotas, Arc<AtomicU64>) {
        let now = Arc::new(AtomicU64::new(1_000_000));
        let clock_now = Arc::clone(&now);
        let config =
            QuotaConfig::from_files(&[("api.yaml".to_owned(), CONFIG.to_owned())]).unwrap();
        let quotas = Quotas::new(
            config,
            None,
            QuotaSettings {
                algorithm,
                ..QuotaSettings::default()
            },
            Arc::new(move || clock_now.load(Ordering::Relaxed)),
            ControlPlaneMetrics::new(1).quotas(),
        );
        (quotas, now)
    }

    fn free() -> Vec<(String, String)> {
        vec![("plan".to_owned(), "free".to_owned())]
    }

    fn request(hits: u32) -> RateLimitRequest {
        RateLimitRequest {
            domain: "api".to_owned(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "plan".to_owned(),
                    value: "free".to_owned(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: hits,
        }
    }

    #[tokio::test]
    async fn a_read_shows_the_count_and_counts_nothing() {
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::Gcra,
        ] {
            let (quotas, _) = quotas(algorithm);
            let unseen = quotas.read("api", &free()).await.unwrap();
            assert_eq!((unseen.used, unseen.remaining), (0, 5), "{algorithm:?}");
            assert_eq!(unseen.unit, "minute");
            assert_eq!(unseen.name, "free");
            quotas.answer(&request(3)).await.unwrap();
            for _ in 0..3 {
                let read = quotas.read("api", &free()).await.unwrap();
                assert_eq!((read.used, read.remaining), (3, 2), "{algorithm:?}");
            }
            // Reading did not spend the last two.
            let answer = quotas.answer(&request(2)).await.unwrap();
            assert_eq!(answer.overall_code, Code::Ok as i32, "{algorithm:?}");
        }
    }

    #[tokio::test]
    async fn unknown_domains_unlimited_and_unmatched_descriptors_are_named() {
        let (quotas, _) = quotas(Algorithm::Gcra);
        let err = quotas.read("web", &free()).await.unwrap_err();
        assert!(matches!(err, ReadError::UnknownDomain(_)), "{err}");
        let vip = vec![("plan".to_owned(), "vip".to_owned())];
        let err = quotas.read("api", &vip).await.unwrap_err();
        assert!(matches!(err, ReadError::NoLimit(_)), "{err}");
        let other = vec![("user".to_owned(), "bob".to_owned())];
        let err = quotas.read("api", &other).await.unwrap_err();
        assert!(matches!(err, ReadError::NoLimit(_)), "{err}");
        let err = quotas.read("api", &[]).await.unwrap_err();
        assert!(matches!(err, ReadError::Entries { found: 0, .. }), "{err}");
    }
}
