//! Metrics of the upstream's health per limited bucket, from the filters'
//! sampled response signals: responses, 5xx, and the interval's p99.
//! Only buckets with a configured limit get series, so the number of
//! series is bounded by the configuration, not by request values.

use std::collections::HashMap;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Registry, Unit};

use super::labels::{BucketLabels, F64Gauge};
use crate::fleet::health::UpstreamHealth;

/// The upstream metrics; cheap to clone (clones share the series).
#[derive(Debug, Clone, Default)]
pub(crate) struct UpstreamMetrics {
    responses: Family<BucketLabels, Counter>,
    errors: Family<BucketLabels, Counter>,
    p99: Family<BucketLabels, F64Gauge>,
    adaptive_limit: Family<BucketLabels, F64Gauge>,
}

impl UpstreamMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "upstream_responses",
            "Sampled responses to admitted requests the filters saw, per limited bucket",
            metrics.responses.clone(),
        );
        registry.register(
            "upstream_errors",
            "Of those, 5xx responses, per limited bucket",
            metrics.errors.clone(),
        );
        registry.register_with_unit(
            "upstream_latency_p99",
            "The last control interval's p99 latency from request to response headers, per limited bucket (upper bound of its histogram bucket: at most 19 % above)",
            Unit::Seconds,
            metrics.p99.clone(),
        );
        registry.register(
            "adaptive_limit_rps",
            "The limit in force for an adaptive bucket, as its upstream's health moved it",
            metrics.adaptive_limit.clone(),
        );
        metrics
    }

    /// The adaptive buckets' limits in force.
    pub(crate) fn observe_adaptive(&self, status: &[crate::control::adaptive::AdaptiveStatus]) {
        for bucket in status {
            let labels = BucketLabels {
                bucket: bucket.bucket.clone(),
            };
            self.adaptive_limit
                .get_or_create(&labels)
                .set(bucket.limit_rps);
        }
    }

    /// One interval's health; buckets `limited` says have no limit get no
    /// series.
    pub(crate) fn observe(
        &self,
        health: &HashMap<String, UpstreamHealth>,
        limited: impl Fn(&str) -> bool,
    ) {
        for (bucket, health) in health {
            if !limited(bucket) {
                continue;
            }
            let labels = BucketLabels {
                bucket: bucket.clone(),
            };
            self.responses
                .get_or_create(&labels)
                .inc_by(health.responses);
            self.errors.get_or_create(&labels).inc_by(health.errors);
            if let Some(p99) = health.latency_quantile(0.99) {
                self.p99.get_or_create(&labels).set(p99.as_secs_f64());
            }
        }
    }
}
