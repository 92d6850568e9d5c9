//! A lock-free histogram for the per-report and per-push paths.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// A histogram with fixed buckets kept in atomics: observing is lock-free.
#[derive(Debug, Clone)]
pub(crate) struct AtomicHistogram {
    inner: Arc<HistogramInner>,
}

#[derive(Debug)]
struct HistogramInner {
    /// Upper bounds, ascending; an implicit `+Inf` bucket follows.
    bounds: Vec<f64>,
    /// Per-bucket (not cumulative) counts, one more than `bounds`.
    counts: Vec<AtomicU64>,
    /// Sum of observations in nanoseconds; integer, so it can be added
    /// atomically.
    sum_ns: AtomicU64,
}

impl AtomicHistogram {
    /// A histogram with these upper bounds, in seconds, ascending.
    pub(crate) fn new(bounds: &[f64]) -> Self {
        Self {
            inner: Arc::new(HistogramInner {
                bounds: bounds.to_vec(),
                counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
                sum_ns: AtomicU64::new(0),
            }),
        }
    }

    /// Records one duration.
    pub(crate) fn observe(&self, duration: Duration) {
        let seconds = duration.as_secs_f64();
        let inner = &self.inner;
        let index = inner.bounds.partition_point(|&bound| bound < seconds);
        if let Some(count) = inner.counts.get(index) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        let ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        inner.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

impl TypedMetric for AtomicHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        let inner = &self.inner;
        let buckets: Vec<(f64, u64)> = inner
            .bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(inner.counts.iter().map(|c| c.load(Ordering::Relaxed)))
            .collect();
        // The count is the buckets' total, so a scrape racing an
        // observation never shows a count that disagrees with the buckets.
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = inner.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}
