//! The upstream's health per bucket, summed over the fleet for one control
//! interval: what every proxy's filter saw of the responses to the
//! requests it admitted (sampled), from the reports' `upstream` signals.

use std::collections::HashMap;
use std::time::Duration;

use sluice_core::histogram::LatencyHistogram;
use sluice_proto::v1::UpstreamSignal;

/// Most buckets with signals held per interval: a proxy naming more
/// (a flood of bucket keys) adds nothing past it.
pub(crate) const MAX_HEALTH_BUCKETS: usize = 4_096;

/// One bucket's upstream over one interval, fleet-wide.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamHealth {
    /// Sampled responses.
    pub responses: u64,
    /// Of them 5xx.
    pub errors: u64,
    /// Their latencies.
    pub latency: LatencyHistogram,
}

impl UpstreamHealth {
    /// Share of the responses that were 5xx; `None` without responses.
    pub fn error_ratio(&self) -> Option<f64> {
        (self.responses > 0).then(|| self.errors as f64 / self.responses as f64)
    }

    /// The latency quantile `q`, as the upper bound of its histogram
    /// bucket (within 19 % above the true one); `None` without samples.
    pub fn latency_quantile(&self, q: f64) -> Option<Duration> {
        self.latency
            .quantile_us(q)
            .map(|us| Duration::from_secs_f64(us / 1e6))
    }
}

impl UpstreamHealth {
    /// Adds `other`'s responses, errors and latencies.
    pub(crate) fn absorb(&mut self, other: &UpstreamHealth) {
        self.responses = self.responses.saturating_add(other.responses);
        self.errors = self.errors.saturating_add(other.errors);
        self.latency.merge(&other.latency);
    }
}

/// Adds `from` to `into` bucket by bucket; past [`MAX_HEALTH_BUCKETS`]
/// buckets, new ones add nothing.
pub(crate) fn merge_health(
    into: &mut HashMap<String, UpstreamHealth>,
    from: impl IntoIterator<Item = (String, UpstreamHealth)>,
) {
    for (bucket, health) in from {
        if let Some(existing) = into.get_mut(&bucket) {
            existing.absorb(&health);
        } else if into.len() < MAX_HEALTH_BUCKETS {
            into.insert(bucket, health);
        }
    }
}

/// Signals accumulating between two control intervals.
#[derive(Debug, Default)]
pub struct HealthWindow {
    buckets: HashMap<String, UpstreamHealth>,
}

impl HealthWindow {
    /// Adds one report's signals. Errors are capped at the responses.
    pub fn add(&mut self, signals: &[UpstreamSignal]) {
        for signal in signals {
            if !self.buckets.contains_key(&signal.bucket)
                && self.buckets.len() >= MAX_HEALTH_BUCKETS
            {
                continue;
            }
            let health = self.buckets.entry(signal.bucket.clone()).or_default();
            health.responses = health.responses.saturating_add(signal.responses);
            health.errors = health
                .errors
                .saturating_add(signal.errors.min(signal.responses));
            health.latency.merge_wire(&signal.latency);
        }
    }

    /// The interval's health per bucket; starts the next interval.
    pub fn take(&mut self) -> HashMap<String, UpstreamHealth> {
        std::mem::take(&mut self.buckets)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn signal(bucket: &str, responses: u64, errors: u64, latency_us: &[u64]) -> UpstreamSignal {
        let mut histogram = LatencyHistogram::default();
        for &us in latency_us {
            histogram.record(us);
        }
        UpstreamSignal {
            bucket: bucket.to_owned(),
            responses,
            errors,
            latency: histogram.to_wire(),
        }
    }

    #[test]
    fn proxies_add_up_per_bucket_and_the_window_starts_over() {
        let mut window = HealthWindow::default();
        window.add(&[signal("a", 10, 1, &[1_000; 9])]);
        window.add(&[signal("a", 10, 3, &[200_000]), signal("b", 4, 99, &[])]);
        let health = window.take();
        let a = &health["a"];
        assert_eq!((a.responses, a.errors), (20, 4));
        assert_eq!(a.error_ratio(), Some(0.2));
        let p99 = a.latency_quantile(0.99).unwrap();
        assert!(
            p99 >= Duration::from_millis(200) && p99 <= Duration::from_millis(240),
            "{p99:?}"
        );
        assert_eq!(health["b"].errors, 4, "capped at the responses");
        assert_eq!(health["b"].latency_quantile(0.99), None);
        assert!(window.take().is_empty());
    }

    #[test]
    fn a_flood_of_bucket_names_is_bounded() {
        let mut window = HealthWindow::default();
        let flood: Vec<_> = (0..MAX_HEALTH_BUCKETS + 100)
            .map(|n| signal(&format!("k{n}"), 1, 0, &[]))
            .collect();
        window.add(&flood);
        assert_eq!(window.take().len(), MAX_HEALTH_BUCKETS);
    }
}
