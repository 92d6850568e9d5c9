//! Metrics of the buckets' cost: the estimated cost offered and admitted,
//! the actual cost charged at stream end, and how far the charges run
//! from the estimate, per bucket and cost unit. Only the buckets that get
//! per-bucket series (see `with_series`) and count cost get these.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::labels::F64Gauge;
use crate::control::controller::BucketStatus;

/// The unit label of a bucket whose limit is not a budget.
const NO_UNIT: &str = "";

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
struct CostLabels {
    bucket: String,
    unit: String,
}

/// The cost metrics.
#[derive(Debug, Default)]
pub(super) struct CostMetrics {
    offered: Family<CostLabels, F64Gauge>,
    admitted: Family<CostLabels, F64Gauge>,
    charged: Family<CostLabels, F64Gauge>,
    charged_to_estimate: Family<CostLabels, F64Gauge>,
    charge_factor: Family<CostLabels, F64Gauge>,
    budget: Family<CostLabels, F64Gauge>,
    /// Series of the previous control interval.
    previous: Mutex<BTreeSet<CostLabels>>,
}

impl CostMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "bucket_offered_cost_per_second",
            "Fleet-wide estimated cost offered to a bucket per second, in its unit (unit is empty for a bucket limited in requests)",
            metrics.offered.clone(),
        );
        registry.register(
            "bucket_admitted_cost_per_second",
            "Fleet-wide estimated cost of a bucket's admitted requests per second",
            metrics.admitted.clone(),
        );
        registry.register(
            "bucket_charged_cost_per_second",
            "Fleet-wide actual cost charged to a bucket per second at stream end",
            metrics.charged.clone(),
        );
        registry.register(
            "bucket_charged_to_estimate_ratio",
            "A bucket's charged cost over its admitted estimated cost in the last control interval: above 1, the estimates are low",
            metrics.charged_to_estimate.clone(),
        );
        registry.register(
            "bucket_charge_factor",
            "Under a budget, the charged cost per unit of the same streams' estimates over the last half minute that the controller holds the budget by (1: steered on the estimates as they are)",
            metrics.charge_factor.clone(),
        );
        registry.register(
            "bucket_budget_per_second",
            "A bucket's cost budget as a rate in its unit per second",
            metrics.budget.clone(),
        );
        metrics
    }

    /// Sets the series of `shown` buckets that count cost and removes the
    /// others'.
    pub(super) fn observe<'a>(&self, shown: impl IntoIterator<Item = &'a BucketStatus>) {
        let mut previous = self.previous.lock().unwrap_or_else(PoisonError::into_inner);
        let mut current = BTreeSet::new();
        for status in shown {
            let Some(cost) = &status.cost else {
                continue;
            };
            let labels = CostLabels {
                bucket: status.bucket.to_string(),
                unit: cost
                    .budget
                    .as_ref()
                    .map_or(NO_UNIT, |b| b.unit().as_str())
                    .to_owned(),
            };
            self.offered.get_or_create(&labels).set(cost.offered_per_s);
            self.admitted
                .get_or_create(&labels)
                .set(cost.admitted_per_s);
            self.charged.get_or_create(&labels).set(cost.charged_per_s);
            match cost.charged_to_estimate {
                Some(ratio) => {
                    self.charged_to_estimate.get_or_create(&labels).set(ratio);
                }
                None => {
                    self.charged_to_estimate.remove(&labels);
                }
            }
            match cost.charge_factor {
                Some(factor) => {
                    self.charge_factor.get_or_create(&labels).set(factor);
                }
                None => {
                    self.charge_factor.remove(&labels);
                }
            }
            match &cost.budget {
                Some(budget) => {
                    self.budget.get_or_create(&labels).set(budget.rate().get());
                }
                None => {
                    self.budget.remove(&labels);
                }
            }
            previous.remove(&labels);
            current.insert(labels);
        }
        for labels in std::mem::replace(&mut *previous, current) {
            self.offered.remove(&labels);
            self.admitted.remove(&labels);
            self.charged.remove(&labels);
            self.charged_to_estimate.remove(&labels);
            self.charge_factor.remove(&labels);
            self.budget.remove(&labels);
        }
    }
}
