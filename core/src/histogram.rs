//! A fixed log-scale latency histogram: what a proxy counts of its
//! upstream's answers and the control plane sums over the fleet. Mergeable
//! and of constant size, so a report of it is bounded.

/// Histogram buckets: bucket `k` counts latencies up to
/// `250 µs · 2^(k/4)`; the last also counts everything longer (about 14 s
/// and more). Four buckets per doubling: a quantile read from the
/// histogram is within 19 % of the true one.
pub const LATENCY_BUCKETS: usize = 64;
/// Upper bound of bucket 0, in microseconds.
const FIRST_BOUND_US: f64 = 250.0;

/// A fixed log-scale latency histogram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyHistogram {
    counts: [u32; LATENCY_BUCKETS],
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            counts: [0; LATENCY_BUCKETS],
        }
    }
}

/// The upper bound of bucket `k`, in microseconds.
pub fn bucket_bound_us(k: usize) -> f64 {
    FIRST_BOUND_US * 2f64.powf(k as f64 / 4.0)
}

/// The bucket a latency falls in.
pub fn bucket_of(latency_us: u64) -> usize {
    let us = latency_us as f64;
    if us <= FIRST_BOUND_US {
        return 0;
    }
    let k = (4.0 * (us / FIRST_BOUND_US).log2()).ceil();
    if k.is_finite() {
        (k as usize).min(LATENCY_BUCKETS - 1)
    } else {
        LATENCY_BUCKETS - 1
    }
}

impl LatencyHistogram {
    /// Counts one latency.
    pub fn record(&mut self, latency_us: u64) {
        if let Some(count) = self.counts.get_mut(bucket_of(latency_us)) {
            *count = count.saturating_add(1);
        }
    }

    /// Adds another histogram's counts.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (into, from) in self.counts.iter_mut().zip(other.counts) {
            *into = into.saturating_add(from);
        }
    }

    /// Adds counts in wire form (extra buckets are ignored).
    pub fn merge_wire(&mut self, wire: &[u32]) {
        for (into, from) in self.counts.iter_mut().zip(wire) {
            *into = into.saturating_add(*from);
        }
    }

    /// Latencies counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|&c| u64::from(c)).sum()
    }

    /// The `q` quantile (0..=1) as the upper bound of its bucket, in
    /// microseconds; `None` when empty.
    pub fn quantile_us(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (k, &count) in self.counts.iter().enumerate() {
            seen += u64::from(count);
            if seen >= rank {
                return Some(bucket_bound_us(k));
            }
        }
        Some(bucket_bound_us(LATENCY_BUCKETS - 1))
    }

    /// The counts without trailing empty buckets.
    pub fn to_wire(&self) -> Vec<u32> {
        let used = self
            .counts
            .iter()
            .rposition(|&c| c > 0)
            .map_or(0, |last| last + 1);
        self.counts.get(..used).unwrap_or_default().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn buckets_are_log_scale_and_bounded() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(250), 0);
        assert_eq!(bucket_of(251), 1);
        assert_eq!(bucket_of(500), 4, "one doubling, four buckets");
        assert_eq!(bucket_of(1_000), 8);
        assert_eq!(bucket_of(u64::MAX), LATENCY_BUCKETS - 1);
        for k in 0..LATENCY_BUCKETS - 1 {
            assert_eq!(
                bucket_of(bucket_bound_us(k).floor() as u64),
                k,
                "bound of {k}"
            );
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod proptests {
    #![allow(clippy::indexing_slicing)]

    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Merging histograms is recording the union, in any order, and
        /// survives the wire form.
        #[test]
        fn merge_is_recording_the_union(
            a in prop::collection::vec(0u64..20_000_000, 0..50),
            b in prop::collection::vec(0u64..20_000_000, 0..50),
        ) {
            let of = |values: &[u64]| {
                let mut h = LatencyHistogram::default();
                for &v in values {
                    h.record(v);
                }
                h
            };
            let (ha, hb) = (of(&a), of(&b));
            let mut ab = ha.clone();
            ab.merge(&hb);
            let mut ba = hb.clone();
            ba.merge_wire(&ha.to_wire());
            let union: Vec<u64> = a.iter().chain(&b).copied().collect();
            prop_assert_eq!(&ab, &of(&union));
            prop_assert_eq!(&ab, &ba);
        }

        /// A quantile read from the histogram is the bound of the bucket
        /// holding the exact quantile: at most 19 % above it (and never
        /// below it), except below the first bound.
        #[test]
        fn quantiles_are_within_a_bucket(
            values in prop::collection::vec(300u64..10_000_000, 1..200),
            q in 0.01f64..1.0,
        ) {
            let mut h = LatencyHistogram::default();
            for &v in &values {
                h.record(v);
            }
            let mut sorted = values.clone();
            sorted.sort_unstable();
            let rank = ((q * sorted.len() as f64).ceil() as usize).max(1);
            let exact = sorted[rank - 1] as f64;
            let read = h.quantile_us(q).unwrap();
            prop_assert!(read >= exact, "{read} < {exact}");
            prop_assert!(read <= exact * 2f64.powf(0.25) + 1.0, "{read} vs {exact}");
        }
    }
}
