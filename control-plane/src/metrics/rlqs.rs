//! Counters of the RLQS service: usages refused and bucket actions sent.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::labels::ReasonLabels;

/// The RLQS counters.
#[derive(Debug, Default)]
pub(super) struct RlqsMetrics {
    usages_refused: Family<ReasonLabels, Counter>,
    actions_sent: Counter,
}

impl RlqsMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "rlqs_usages_refused",
            "RLQS bucket usages not counted, by reason (no_bucket: no or empty bucket id; negative_elapsed; over_cap: a new bucket id beyond the per-proxy cell cap)",
            metrics.usages_refused.clone(),
        );
        registry.register(
            "rlqs_bucket_actions_sent",
            "RLQS bucket actions (assignments and abandons) sent to Envoys",
            metrics.actions_sent.clone(),
        );
        for reason in ["no_bucket", "negative_elapsed", "over_cap"] {
            let _ = metrics
                .usages_refused
                .get_or_create_owned(&ReasonLabels { reason });
        }
        metrics
    }

    pub(super) fn usages_refused(&self, no_bucket: u32, negative_elapsed: u32) {
        for (reason, count) in [
            ("no_bucket", no_bucket),
            ("negative_elapsed", negative_elapsed),
        ] {
            if count > 0 {
                self.usages_refused
                    .get_or_create(&ReasonLabels { reason })
                    .inc_by(u64::from(count));
            }
        }
    }

    pub(super) fn over_cap(&self) {
        self.usages_refused
            .get_or_create(&ReasonLabels { reason: "over_cap" })
            .inc();
    }

    pub(super) fn actions_sent(&self, count: usize) {
        self.actions_sent
            .inc_by(u64::try_from(count).unwrap_or(u64::MAX));
    }
}
