//! What the upstream answered, per bucket, as this filter saw it: sampled
//! responses, how many were 5xx, and a latency histogram. Mergeable (a
//! follower VM hands its signals to the leader, the control plane sums
//! the fleet's) and bounded (a flood of bucket keys cannot grow it).

use std::collections::HashMap;

use sluice_core::histogram::LatencyHistogram;
use sluice_proto::v1::UpstreamSignal;

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
