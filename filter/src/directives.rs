//! The directive table: the drop ratio of every bucket that currently sheds
//! load, merged from `DirectiveBatch` messages and shared between VMs as one
//! encoded `DirectiveBatch`.

use crate::bucket_key::MAX_BUCKET_KEY_BYTES;
use crate::drop_ratio::{DropRatio, DropThreshold};
use prost::Message;
use sluice_proto::v1::{Directive, DirectiveBatch};
use std::collections::HashMap;
use thiserror::Error;

/// Where the directives came from: the control plane's process (`epoch`)
/// and its batch counter (`version`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Provenance {
    /// Random per control-plane process.
    pub epoch: u64,
    /// Batch counter within the epoch.
    pub version: u64,
    /// When the control plane computed the batch (Unix ms).
    pub issued_at_unix_ms: u64,
}

/// What merging a batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeOutcome {
    /// Directives applied (including lifted limits).
    pub applied: usize,
    /// Directives ignored: empty or oversized bucket, drop ratio not in
    /// `[0, 1]`, or table full.
    pub rejected: usize,
}

/// The rates a directive carried besides its ratio.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct BucketRates {
    limit_rps: f64,
    offered_rps: f64,
}

/// The shared blob could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("undecodable directive table: {0}")]
pub struct DecodeError(String);

/// Drop thresholds by bucket. Buckets not in the table are never dropped, so
/// a lifted limit (drop ratio 0) is removed rather than stored.
#[derive(Debug, Clone, PartialEq)]
pub struct DirectiveTable {
    ratios: HashMap<String, DropRatio>,
    /// Limit and fleet offered rate of every bucket with a limit, ratio 0
    /// included: what a local allowance is derived from.
    rates: HashMap<String, BucketRates>,
    thresholds: HashMap<String, DropThreshold>,
    provenance: Provenance,
    max_entries: usize,
}

impl DirectiveTable {
    /// An empty table of at most `max_entries` buckets.
    pub fn new(max_entries: usize) -> Self {
        Self {
            ratios: HashMap::new(),
            rates: HashMap::new(),
            thresholds: HashMap::new(),
            provenance: Provenance::default(),
            max_entries,
        }
    }

    /// The threshold for a bucket; [`DropThreshold::NEVER`] if it has none.
    /// This is the request-path lookup: one hash probe, no allocation.
    pub fn threshold(&self, bucket: &str) -> DropThreshold {
        self.thresholds
            .get(bucket)
            .copied()
            .unwrap_or(DropThreshold::NEVER)
    }

    /// The drop ratio of a bucket, if it has one.
    pub fn drop_ratio(&self, bucket: &str) -> Option<DropRatio> {
        self.ratios.get(bucket).copied()
    }

    /// Number of buckets with a non-zero drop ratio.
    pub fn len(&self) -> usize {
        self.ratios.len()
    }

    /// Whether no bucket is shedding.
    pub fn is_empty(&self) -> bool {
        self.ratios.is_empty()
    }

    /// The batch the table was last merged from.
    pub fn provenance(&self) -> Provenance {
        self.provenance
    }

    /// Merges a batch: named buckets take the new ratio, others keep theirs.
    /// Invalid directives are skipped and counted, never fatal.
    pub fn merge(&mut self, batch: DirectiveBatch) -> MergeOutcome {
        self.provenance = Provenance {
            epoch: batch.epoch,
            version: batch.version,
            issued_at_unix_ms: batch.issued_at_unix_ms,
        };
        let mut outcome = MergeOutcome::default();
        for directive in batch.directives {
            if self.apply(directive) {
                outcome.applied += 1;
            } else {
                outcome.rejected += 1;
            }
        }
        outcome
    }

    fn apply(&mut self, directive: Directive) -> bool {
        let bucket = directive.bucket;
        if bucket.is_empty() || bucket.len() > MAX_BUCKET_KEY_BYTES {
            return false;
        }
        let Ok(ratio) = DropRatio::new(directive.drop_ratio) else {
            return false;
        };
        let rates = BucketRates {
            limit_rps: directive.limit_rps,
            offered_rps: directive.offered_rps,
        };
        let limited = rates.limit_rps > 0.0
            && rates.limit_rps.is_finite()
            && rates.offered_rps >= 0.0
            && rates.offered_rps.is_finite();
        let known = self.ratios.contains_key(&bucket) || self.rates.contains_key(&bucket);
        if !known && (ratio != DropRatio::NEVER || limited) && self.len_held() >= self.max_entries {
            return false;
        }
        if limited {
            self.rates.insert(bucket.clone(), rates);
        } else {
            self.rates.remove(&bucket);
        }
        if ratio == DropRatio::NEVER {
            self.thresholds.remove(&bucket);
            self.ratios.remove(&bucket);
            return true;
        }
        self.thresholds.insert(bucket.clone(), ratio.threshold());
        self.ratios.insert(bucket, ratio);
        true
    }

    /// Buckets held: shedding, or limited at ratio 0.
    fn len_held(&self) -> usize {
        self.ratios.len()
            + self
                .rates
                .keys()
                .filter(|b| !self.ratios.contains_key(*b))
                .count()
    }

    /// Every entry as a directive, sorted by bucket.
    pub fn entries(&self) -> Vec<Directive> {
        let mut directives: Vec<Directive> = self
            .ratios
            .keys()
            .chain(self.rates.keys().filter(|b| !self.ratios.contains_key(*b)))
            .map(|bucket| {
                let rates = self.rates.get(bucket).copied().unwrap_or_default();
                Directive {
                    bucket: bucket.clone(),
                    drop_ratio: self.ratios.get(bucket).map_or(0.0, |r| r.get()),
                    limit_rps: rates.limit_rps,
                    offered_rps: rates.offered_rps,
                    ..Default::default()
                }
            })
            .collect();
        directives.sort_by(|a, b| a.bucket.cmp(&b.bucket));
        directives
    }

    /// Entries of this table that `older` does not hold as they are here.
    pub fn changed_since(&self, older: &Self) -> Vec<Directive> {
        let before = older.entries();
        self.entries()
            .into_iter()
            .filter(|entry| !before.contains(entry))
            .collect()
    }

    /// The shared form: a `DirectiveBatch` holding the whole table, buckets
    /// sorted so equal tables encode to equal bytes.
    pub fn encode(&self) -> Vec<u8> {
        let directives = self.entries();
        DirectiveBatch {
            epoch: self.provenance.epoch,
            version: self.provenance.version,
            issued_at_unix_ms: self.provenance.issued_at_unix_ms,
            directives,
            ..Default::default()
        }
        .encode_to_vec()
    }

    /// Rebuilds a table from its shared form, validating every entry again
    /// (the blob is written by another VM, possibly another module version).
    pub fn decode(bytes: &[u8], max_entries: usize) -> Result<(Self, MergeOutcome), DecodeError> {
        let batch = DirectiveBatch::decode(bytes).map_err(|err| DecodeError(err.to_string()))?;
        let mut table = Self::new(max_entries);
        let outcome = table.merge(batch);
        Ok((table, outcome))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    pub(crate) fn directive(bucket: &str, drop_ratio: f64) -> Directive {
        Directive {
            bucket: bucket.into(),
            drop_ratio,
            limit_rps: 10.0,
            ..Default::default()
        }
    }

    fn batch(epoch: u64, version: u64, directives: Vec<Directive>) -> DirectiveBatch {
        DirectiveBatch {
            epoch,
            version,
            issued_at_unix_ms: 1,
            directives,
            ..Default::default()
        }
    }

    #[test]
    fn merge_keeps_unnamed_buckets() {
        let mut table = DirectiveTable::new(100);
        table.merge(batch(1, 1, vec![directive("a", 0.5), directive("b", 0.25)]));
        let outcome = table.merge(batch(1, 2, vec![directive("a", 0.75)]));
        assert_eq!(
            outcome,
            MergeOutcome {
                applied: 1,
                rejected: 0
            }
        );
        assert_eq!(table.drop_ratio("a").map(DropRatio::get), Some(0.75));
        assert_eq!(table.drop_ratio("b").map(DropRatio::get), Some(0.25));
        assert_eq!(table.provenance().version, 2);
    }

    #[test]
    fn zero_lifts_the_limit() {
        let mut table = DirectiveTable::new(100);
        table.merge(batch(1, 1, vec![directive("a", 1.0)]));
        assert_eq!(table.threshold("a"), DropRatio::ALWAYS.threshold());
        table.merge(batch(1, 2, vec![directive("a", 0.0)]));
        assert_eq!(table.threshold("a"), DropThreshold::NEVER);
        assert!(table.is_empty());
    }

    #[test]
    fn a_new_epoch_is_merged_not_rejected() {
        let mut table = DirectiveTable::new(100);
        table.merge(batch(7, 40, vec![directive("a", 0.5), directive("b", 0.5)]));
        // A restarted control plane starts at version 1 and knows only "b".
        table.merge(batch(8, 1, vec![directive("b", 0.1)]));
        assert_eq!(table.drop_ratio("a").map(DropRatio::get), Some(0.5));
        assert_eq!(table.drop_ratio("b").map(DropRatio::get), Some(0.1));
        assert_eq!(table.provenance().epoch, 8);
    }

    #[test]
    fn invalid_directives_are_counted_and_skipped() {
        let mut table = DirectiveTable::new(100);
        let outcome = table.merge(batch(
            1,
            1,
            vec![
                directive("", 0.5),
                directive(&"x".repeat(MAX_BUCKET_KEY_BYTES + 1), 0.5),
                directive("nan", f64::NAN),
                directive("neg", -0.1),
                directive("big", 1.5),
                directive("inf", f64::INFINITY),
                directive("ok", 0.5),
            ],
        ));
        assert_eq!(
            outcome,
            MergeOutcome {
                applied: 1,
                rejected: 6
            }
        );
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn the_table_is_bounded() {
        let mut table = DirectiveTable::new(2);
        let outcome = table.merge(batch(
            1,
            1,
            vec![
                directive("a", 0.5),
                directive("b", 0.5),
                directive("c", 0.5),
            ],
        ));
        assert_eq!(
            outcome,
            MergeOutcome {
                applied: 2,
                rejected: 1
            }
        );
        // Updating a held bucket still works when full.
        let outcome = table.merge(batch(1, 2, vec![directive("a", 0.9)]));
        assert_eq!(outcome.applied, 1);
    }

    #[test]
    fn encode_decode_round_trips() {
        let mut table = DirectiveTable::new(100);
        table.merge(batch(
            3,
            9,
            vec![directive("b", 0.5), directive("a", 0.125)],
        ));
        let bytes = table.encode();
        let (decoded, outcome) = DirectiveTable::decode(&bytes, 100).unwrap();
        assert_eq!(decoded, table);
        assert_eq!(
            outcome,
            MergeOutcome {
                applied: 2,
                rejected: 0
            }
        );
        assert_eq!(decoded.encode(), bytes);
    }

    #[test]
    fn limits_and_offered_rates_survive_the_shared_form() {
        let mut table = DirectiveTable::new(100);
        let below = Directive {
            offered_rps: 80.0,
            ..directive("below", 0.0)
        };
        let over = Directive {
            offered_rps: 30.0,
            ..directive("over", 0.5)
        };
        table.merge(batch(1, 1, vec![below.clone(), over.clone()]));
        assert_eq!(table.threshold("below"), DropThreshold::NEVER);
        let (decoded, _) = DirectiveTable::decode(&table.encode(), 100).unwrap();
        assert_eq!(decoded.entries(), vec![below, over.clone()]);
        let mut newer = decoded.clone();
        newer.merge(batch(1, 2, vec![directive("over", 0.75)]));
        let changed = newer.changed_since(&decoded);
        assert_eq!(changed.len(), 1);
        assert_eq!(changed[0].drop_ratio, 0.75);
        // Unlimited at ratio 0 is not held at all.
        newer.merge(batch(
            1,
            3,
            vec![Directive {
                limit_rps: 0.0,
                ..directive("below", 0.0)
            }],
        ));
        assert_eq!(newer.entries().len(), 1);
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(DirectiveTable::decode(&[0xff, 0xff, 0xff], 100).is_err());
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok((table, _)) = DirectiveTable::decode(&bytes, 16) {
                prop_assert!(table.len() <= 16);
            }
        }

        #[test]
        fn decoded_ratios_are_always_valid(ratios in proptest::collection::vec(any::<f64>(), 0..32)) {
            let directives = ratios
                .iter()
                .enumerate()
                .map(|(i, r)| Directive { bucket: format!("b{i}"), drop_ratio: *r, limit_rps: 0.0, ..Default::default() })
                .collect();
            let bytes = DirectiveBatch { epoch: 1, version: 1, issued_at_unix_ms: 0, directives, ..Default::default() }.encode_to_vec();
            let (table, outcome) = DirectiveTable::decode(&bytes, 1000)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(outcome.applied + outcome.rejected, ratios.len());
            for i in 0..ratios.len() {
                if let Some(ratio) = table.drop_ratio(&format!("b{i}")) {
                    prop_assert!(ratio.get() > 0.0 && ratio.get() <= 1.0);
                }
            }
        }
    }
}
