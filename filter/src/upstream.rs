//! What the upstream answered, per bucket, as this filter saw it: sampled
//! responses, how many were 5xx, and a latency histogram. Mergeable (a
//! follower VM hands its signals to the leader, the control plane sums
//! the fleet's) and bounded (a flood of bucket keys cannot grow it).

use std::collections::HashMap;

use sluice_proto::v1::UpstreamSignal;

/// Histogram buckets: bucket `k` counts latencies up to
/// `250 µs · 2^(k/4)`; the last also counts everything longer (about 14 s
/// and more). Four buckets per doubling: a quantile read from the
/// histogram is within 19 % of the true one.
pub const LATENCY_BUCKETS: usize = 64;
/// Upper bound of bucket 0, in microseconds.
const FIRST_BOUND_US: f64 = 250.0;
/// Most buckets with signals held between two reports; responses of
/// further buckets are not followed (and counted as such).
pub const MAX_SIGNAL_BUCKETS: usize = 1_024;

/// The HTTP status in a `:status` header's bytes, as the host hands them
/// over; 0 when absent or unreadable, which counts as a response but not as
/// an error.
pub fn status_of(status: Option<&[u8]>) -> u32 {
    status
        .and_then(|bytes| std::str::from_utf8(bytes).ok())
        .and_then(|text| text.parse::<u32>().ok())
        .unwrap_or(0)
}

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

/// Picks the admitted requests to follow to their responses (every
/// `every`-th) and holds what the responses said until they are reported.
#[derive(Debug, Default)]
pub struct ResponseSampler {
    every: u32,
    since_pick: u32,
    /// Signals not yet handed on.
    pub signals: UpstreamSignals,
}

impl ResponseSampler {
    /// Follows one admitted request in `every` (0: none).
    pub fn new(every: u32) -> Self {
        Self {
            every,
            ..Self::default()
        }
    }

    /// One more admitted request: whether to follow it.
    pub fn pick(&mut self) -> bool {
        if self.every == 0 {
            return false;
        }
        self.since_pick += 1;
        if self.since_pick >= self.every {
            self.since_pick = 0;
            true
        } else {
            false
        }
    }
}

/// One bucket's signals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Signal {
    /// Responses seen.
    pub responses: u64,
    /// Of them 5xx.
    pub errors: u64,
    /// Their latencies (those measured).
    pub latency: LatencyHistogram,
}

/// Signals per bucket since they were last drained.
#[derive(Debug, Default)]
pub struct UpstreamSignals {
    buckets: HashMap<String, Signal>,
    /// Responses not followed because the map was full.
    untracked: u64,
}

impl UpstreamSignals {
    /// One response of `bucket` with HTTP `status`, `latency_us` after its
    /// request (`None` if it could not be measured).
    pub fn observe(&mut self, bucket: &str, status: u32, latency_us: Option<u64>) {
        let Some(signal) = self.entry(bucket) else {
            return;
        };
        signal.responses = signal.responses.saturating_add(1);
        if (500..600).contains(&status) {
            signal.errors = signal.errors.saturating_add(1);
        }
        if let Some(latency) = latency_us {
            signal.latency.record(latency);
        }
    }

    fn entry(&mut self, bucket: &str) -> Option<&mut Signal> {
        if !self.buckets.contains_key(bucket) && self.buckets.len() >= MAX_SIGNAL_BUCKETS {
            self.untracked = self.untracked.saturating_add(1);
            return None;
        }
        Some(self.buckets.entry(bucket.to_owned()).or_default())
    }

    /// Adds signals in wire form (a follower's hand-off).
    pub fn merge_wire(&mut self, signals: Vec<UpstreamSignal>) {
        for wire in signals {
            let Some(signal) = self.entry(&wire.bucket) else {
                continue;
            };
            signal.responses = signal.responses.saturating_add(wire.responses);
            signal.errors = signal
                .errors
                .saturating_add(wire.errors.min(wire.responses));
            signal.latency.merge_wire(&wire.latency);
        }
    }

    /// Moves everything of `other` into this one.
    pub fn absorb(&mut self, other: &mut UpstreamSignals) {
        self.merge_wire(other.drain());
    }

    /// Everything held, in wire form; empties it.
    pub fn drain(&mut self) -> Vec<UpstreamSignal> {
        self.buckets
            .drain()
            .map(|(bucket, signal)| UpstreamSignal {
                bucket,
                responses: signal.responses,
                errors: signal.errors,
                latency: signal.latency.to_wire(),
            })
            .collect()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Responses not followed because the map was full, since the last
    /// call.
    pub fn take_untracked(&mut self) -> u64 {
        std::mem::take(&mut self.untracked)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

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

    #[test]
    fn a_status_is_read_from_bytes_without_trusting_them() {
        assert_eq!(status_of(Some(b"503")), 503);
        assert_eq!(status_of(Some(b"5x3")), 0);
        assert_eq!(status_of(Some(b"\xff\xfe")), 0);
        assert_eq!(status_of(Some(b"")), 0);
        assert_eq!(status_of(None), 0);
    }

    #[test]
    fn signals_count_errors_and_stay_bounded() {
        let mut signals = UpstreamSignals::default();
        signals.observe("a", 200, Some(1_000));
        signals.observe("a", 503, Some(90_000));
        signals.observe("a", 404, None);
        for n in 0..MAX_SIGNAL_BUCKETS + 10 {
            signals.observe(&format!("flood-{n}"), 200, None);
        }
        assert_eq!(signals.take_untracked(), 11, "a and 1,023 flood keys fit");
        let drained = signals.drain();
        let a = drained.iter().find(|s| s.bucket == "a").unwrap();
        assert_eq!((a.responses, a.errors), (3, 1));
        let mut histogram = LatencyHistogram::default();
        histogram.merge_wire(&a.latency);
        assert_eq!(histogram.count(), 2);
        assert!(signals.is_empty());
        // A wire record claiming more errors than responses is clamped.
        let mut merged = UpstreamSignals::default();
        merged.merge_wire(vec![UpstreamSignal {
            bucket: "b".to_owned(),
            responses: 2,
            errors: 9,
            latency: vec![0; 200],
        }]);
        let b = merged.drain().pop().unwrap();
        assert_eq!((b.responses, b.errors), (2, 2));
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
