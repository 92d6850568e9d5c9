//! Bounded per-bucket request counts for one window.

use sluice_proto::v1::BucketCount;
use std::collections::HashMap;

/// Requests seen and let through for one bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// All requests seen, dropped or not.
    pub offered: u64,
    /// Requests let through.
    pub admitted: u64,
}

impl Counts {
    fn add(&mut self, other: Counts) {
        self.offered = self.offered.saturating_add(other.offered);
        self.admitted = self.admitted.saturating_add(other.admitted);
    }
}

/// Counts per bucket, holding at most `max_buckets` buckets. Requests of a
/// new bucket beyond the cap are not attributed; they are tallied in
/// [`BucketCounters::take_untracked`] so the caller can report the overflow.
#[derive(Debug, Clone)]
pub struct BucketCounters {
    counts: HashMap<String, Counts>,
    max_buckets: usize,
    untracked: u64,
}

impl BucketCounters {
    /// Empty counters for at most `max_buckets` buckets.
    pub fn new(max_buckets: usize) -> Self {
        Self {
            counts: HashMap::new(),
            max_buckets,
            untracked: 0,
        }
    }

    /// Counts one request. Allocates only for a bucket not seen this window.
    pub fn record(&mut self, bucket: &str, admitted: bool) {
        let one = Counts {
            offered: 1,
            admitted: u64::from(admitted),
        };
        if let Some(counts) = self.counts.get_mut(bucket) {
            counts.add(one);
        } else {
            self.insert(bucket.to_owned(), one);
        }
    }

    /// Adds counts for a bucket (saturating).
    pub fn add(&mut self, bucket: String, counts: Counts) {
        if let Some(existing) = self.counts.get_mut(&bucket) {
            existing.add(counts);
        } else {
            self.insert(bucket, counts);
        }
    }

    /// Adds counts drained elsewhere, for example from the shared queue.
    pub fn merge(&mut self, counts: impl IntoIterator<Item = BucketCount>) {
        for count in counts {
            let counts = Counts {
                offered: count.offered,
                admitted: count.admitted,
            };
            self.add(count.bucket, counts);
        }
    }

    /// Takes every bucket with traffic, leaving the counters empty (with
    /// their capacity kept for the next window).
    pub fn drain(&mut self) -> Vec<BucketCount> {
        self.counts
            .drain()
            .filter(|(_, counts)| counts.offered > 0)
            .map(|(bucket, counts)| BucketCount {
                bucket,
                offered: counts.offered,
                admitted: counts.admitted,
                ..Default::default()
            })
            .collect()
    }

    /// The buckets counted so far in this window.
    pub fn buckets(&self) -> impl Iterator<Item = &str> {
        self.counts.keys().map(String::as_str)
    }

    /// Whether nothing is counted.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Number of buckets held.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Requests not attributed because the cap was reached; resets to 0.
    pub fn take_untracked(&mut self) -> u64 {
        std::mem::take(&mut self.untracked)
    }

    fn insert(&mut self, bucket: String, counts: Counts) {
        if self.counts.len() < self.max_buckets {
            self.counts.insert(bucket, counts);
        } else {
            self.untracked = self.untracked.saturating_add(counts.offered);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn sorted(mut counts: Vec<BucketCount>) -> Vec<BucketCount> {
        counts.sort_by(|a, b| a.bucket.cmp(&b.bucket));
        counts
    }

    fn count(bucket: &str, offered: u64, admitted: u64) -> BucketCount {
        BucketCount {
            bucket: bucket.into(),
            offered,
            admitted,
            ..Default::default()
        }
    }

    #[test]
    fn records_offered_and_admitted() {
        let mut counters = BucketCounters::new(10);
        counters.record("a", true);
        counters.record("a", false);
        counters.record("b", true);
        assert_eq!(
            sorted(counters.drain()),
            vec![count("a", 2, 1), count("b", 1, 1)]
        );
        assert!(counters.is_empty());
        assert!(counters.drain().is_empty());
    }

    #[test]
    fn merge_adds_and_saturates() {
        let mut counters = BucketCounters::new(10);
        counters.merge([count("a", u64::MAX - 1, 5)]);
        counters.merge([count("a", 10, 10), count("b", 3, 0)]);
        assert_eq!(
            sorted(counters.drain()),
            vec![count("a", u64::MAX, 15), count("b", 3, 0)]
        );
    }

    #[test]
    fn new_buckets_beyond_the_cap_are_untracked() {
        let mut counters = BucketCounters::new(2);
        counters.record("a", true);
        counters.record("b", true);
        counters.record("c", true);
        counters.merge([count("d", 5, 5)]);
        counters.record("a", true);
        assert_eq!(counters.len(), 2);
        assert_eq!(counters.take_untracked(), 6);
        assert_eq!(counters.take_untracked(), 0);
        assert_eq!(
            sorted(counters.drain()),
            vec![count("a", 2, 2), count("b", 1, 1)]
        );
    }

    #[test]
    fn drain_skips_buckets_without_traffic() {
        let mut counters = BucketCounters::new(10);
        counters.merge([count("idle", 0, 0), count("busy", 1, 0)]);
        assert_eq!(counters.drain(), vec![count("busy", 1, 0)]);
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn counts_never_wrap(adds in proptest::collection::vec((0u8..4, any::<u64>(), any::<u64>()), 0..64)) {
            let mut counters = BucketCounters::new(8);
            let mut expected: HashMap<String, (u128, u128)> = HashMap::new();
            for (bucket, offered, admitted) in adds {
                let bucket = format!("b{bucket}");
                counters.add(bucket.clone(), Counts { offered, admitted });
                let entry = expected.entry(bucket).or_default();
                entry.0 += u128::from(offered);
                entry.1 += u128::from(admitted);
            }
            for count in counters.drain() {
                let (offered, admitted) = expected.get(&count.bucket).copied().unwrap_or_default();
                prop_assert_eq!(u128::from(count.offered), offered.min(u128::from(u64::MAX)));
                prop_assert_eq!(u128::from(count.admitted), admitted.min(u128::from(u64::MAX)));
            }
        }
    }
}
