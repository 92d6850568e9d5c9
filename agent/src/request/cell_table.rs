//! The request path's one map of cells: per cell, this window's counts, the
//! directive its lookup found, the pacer's state and the new-cell state.
//!
//! A request probes this map once. Records are made on the request path
//! when a cell is first counted and outlive the report window while they
//! hold decision state (the pacer's, kept while capped or less than 10 s
//! idle; a new cell's limiter); a drain hands the counts on and zeroes
//! them.
//!
//! Bounds: at most `max_cells` records, of which cells without a directive
//! may take at most [`unlimited_cap`], so a flood of one-off keys leaves a
//! quarter for the cells the control plane needs counts of. When a new
//! cell meets a full map, one pass (at most one per report window) forgets
//! the records with nothing to report that were met at most once since the
//! last pass, and halves the others' hit counts, a cheap frequency filter:
//! a busy cell survives a flood, one-off keys do not. Records with counts
//! still to report or a cap that decides are never evicted. A request of a
//! cell that finds no room is tallied as untracked.
//!
//! The map itself ([`CellMap`], at the end of this file) hashes a cell key
//! so that a bucket-wide cell is found from the bare bucket name.

use crate::request::classify::key_of_count;
use crate::request::classify::parse_key;
use crate::request::classify::{BUCKET_WIDE_PREFIX, BUCKET_WIDE_PREFIX_BYTES};
use crate::request::reject::RejectResponse;
use crate::usage::Charge;
use foldhash::fast::RandomState;
use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use sluice_core::decision::CellState;
use sluice_core::decision::Outcome;
use sluice_proto::v1::BucketCount;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

/// Requests seen, let through and shadow-dropped for one cell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// All requests seen, dropped or not.
    pub offered: u64,
    /// Requests let through (shadow drops included).
    pub admitted: u64,
    /// Requests the decision would have dropped but shadow mode let through.
    pub shadow_dropped: u64,
    /// The estimated cost of the offered requests with a cost rule.
    pub offered_cost: u64,
    /// The estimated cost of those let through.
    pub admitted_cost: u64,
    /// The actual cost charged at the end of their streams.
    pub charged_cost: u64,
    /// The estimated cost counted for those streams (what the charges are
    /// compared with).
    pub settled_cost: u64,
}

impl Counts {
    pub(crate) fn one(outcome: Outcome) -> Self {
        Self::one_costing(outcome, 0)
    }

    /// One request of estimated cost `estimate` (0: no cost rule).
    pub(crate) fn one_costing(outcome: Outcome, estimate: u64) -> Self {
        let admitted = outcome != Outcome::Dropped;
        Self {
            offered: 1,
            admitted: u64::from(admitted),
            shadow_dropped: u64::from(outcome == Outcome::ShadowDropped),
            offered_cost: estimate,
            admitted_cost: if admitted { estimate } else { 0 },
            charged_cost: 0,
            settled_cost: 0,
        }
    }

    pub(crate) fn add(&mut self, other: Counts) {
        self.offered = self.offered.saturating_add(other.offered);
        self.admitted = self.admitted.saturating_add(other.admitted);
        self.shadow_dropped = self.shadow_dropped.saturating_add(other.shadow_dropped);
        self.offered_cost = self.offered_cost.saturating_add(other.offered_cost);
        self.admitted_cost = self.admitted_cost.saturating_add(other.admitted_cost);
        self.charged_cost = self.charged_cost.saturating_add(other.charged_cost);
        self.settled_cost = self.settled_cost.saturating_add(other.settled_cost);
    }

    /// Whether there is nothing to report: no request and no cost of any
    /// kind. A part of a split hand-off, or a stream charged nothing, can
    /// hold a cost without a request or a charge; it still has to reach
    /// the control plane.
    pub fn is_empty(&self) -> bool {
        *self == Counts::default()
    }

    /// Fills the counts of a wire record.
    pub fn into_count(self, count: BucketCount) -> BucketCount {
        BucketCount {
            offered: self.offered,
            admitted: self.admitted,
            shadow_dropped: self.shadow_dropped,
            offered_cost: self.offered_cost as f64,
            admitted_cost: self.admitted_cost as f64,
            charged_cost: self.charged_cost as f64,
            settled_cost: self.settled_cost as f64,
            ..count
        }
    }

    /// Splits the counts into a `fraction` (clamped to `[0, 1]`) and the
    /// rest, rounding so the parts add up exactly and each part keeps
    /// `shadow_dropped <= admitted <= offered`. The requests' costs go with
    /// the requests (each part's mean cost is the whole's), and the settled
    /// cost with the charged: a part holding a cost without the requests
    /// it is the cost of would weigh one request of a window as a heavy one
    /// and hand the next window that request without its cost.
    pub fn split(self, fraction: f64) -> (Counts, Counts) {
        let f = if fraction.is_nan() {
            0.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        let part = |n: u64| ((n as f64) * f).round() as u64;
        let offered = part(self.offered).min(self.offered);
        let rest_offered = self.offered - offered;
        let admitted = part(self.admitted)
            .max(self.admitted.saturating_sub(rest_offered))
            .min(offered)
            .min(self.admitted);
        let rest_admitted = self.admitted - admitted;
        let shadow = part(self.shadow_dropped)
            .max(self.shadow_dropped.saturating_sub(rest_admitted))
            .min(admitted)
            .min(self.shadow_dropped);
        // `cost` in the time's fraction, and the rest.
        let by_time = |cost: u64| {
            let part = part(cost).min(cost);
            (part, cost - part)
        };
        // `cost` in the proportion `share` of `whole` (by time when there
        // is no whole to follow), and the rest.
        let along = |cost: u64, share: u64, whole: u64| {
            if whole == 0 {
                return by_time(cost);
            }
            let ratio = share as f64 / whole as f64;
            let part = (((cost as f64) * ratio).round() as u64).min(cost);
            (part, cost - part)
        };
        let (offered_cost, rest_offered_cost) = along(self.offered_cost, offered, self.offered);
        let (admitted_cost, rest_admitted_cost) =
            along(self.admitted_cost, admitted, self.admitted);
        let (charged_cost, rest_charged_cost) = by_time(self.charged_cost);
        let (settled_cost, rest_settled_cost) =
            along(self.settled_cost, charged_cost, self.charged_cost);
        (
            Counts {
                offered,
                admitted,
                shadow_dropped: shadow,
                offered_cost,
                admitted_cost,
                charged_cost,
                settled_cost,
            },
            Counts {
                offered: rest_offered,
                admitted: rest_admitted,
                shadow_dropped: self.shadow_dropped - shadow,
                offered_cost: rest_offered_cost,
                admitted_cost: rest_admitted_cost,
                charged_cost: rest_charged_cost,
                settled_cost: rest_settled_cost,
            },
        )
    }

    /// The counts of a wire record (costs rounded to whole units; a value
    /// that is not a finite non-negative number counts as 0).
    pub fn of(count: &BucketCount) -> Self {
        let cost = |value: f64| {
            if value.is_finite() && value > 0.0 {
                value.round() as u64
            } else {
                0
            }
        };
        Self {
            offered: count.offered,
            admitted: count.admitted,
            shadow_dropped: count.shadow_dropped,
            offered_cost: cost(count.offered_cost),
            admitted_cost: cost(count.admitted_cost),
            charged_cost: cost(count.charged_cost),
            settled_cost: cost(count.settled_cost),
        }
    }
}

/// How many of `max_cells` cells without a directive may take: all but a
/// quarter, which stays reserved for cells with one (at least one cell
/// each way once `max_cells` is 2 or more).
pub(crate) fn unlimited_cap(max_cells: usize) -> usize {
    max_cells
        .saturating_sub(max_cells.div_ceil(4))
        .max(usize::from(max_cells >= 2))
}

/// Everything the request path keeps of one cell.
#[derive(Debug, Clone)]
pub struct CellRecord {
    counts: Counts,
    /// (generation of the directive table, what its lookup returned).
    directive: Option<(u64, Option<usize>)>,
    /// Whether the cell has a directive (as of its last lookup): its
    /// counts may use the reserved quarter of the leader's window.
    limited: bool,
    /// Requests since the last eviction pass (saturating).
    hits: u32,
    /// The decision state: the directed strategies' (made on the tick,
    /// [`crate::tick::pacing`]) and a new cell's limit.
    pub state: CellState,
    /// A new cell's 429, rendered at its first drop.
    pub new_cell_response: Option<Arc<RejectResponse>>,
}

impl CellRecord {
    fn new(limited: bool) -> Self {
        Self {
            counts: Counts::default(),
            directive: None,
            limited,
            hits: 0,
            state: CellState::default(),
            new_cell_response: None,
        }
    }

    /// The directive index remembered for the table of `generation`:
    /// `None` if the lookup has to run (nothing remembered, or for another
    /// table), `Some(None)` if the cell has no directive.
    pub fn directive(&self, generation: u64) -> Option<Option<usize>> {
        match self.directive {
            Some((remembered, index)) if remembered == generation => Some(index),
            _ => None,
        }
    }

    /// Remembers the lookup's result for the table of `generation`.
    pub fn remember(&mut self, generation: u64, index: Option<usize>) {
        self.directive = Some((generation, index));
    }

    /// Counts one request of estimated cost `estimate` (0: no cost rule).
    pub fn count(&mut self, outcome: Outcome, estimate: u64) {
        self.counts.add(Counts::one_costing(outcome, estimate));
        self.hits = self.hits.saturating_add(1);
    }

    /// The counts of this window.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Whether the record holds nothing a drain or a decision needs.
    fn is_spent(&self) -> bool {
        self.counts.is_empty() && self.state.pace.is_none() && self.state.new_cell.is_none()
    }

    /// Whether an eviction pass may forget it, halving its hits first.
    fn survives_a_pass(&mut self) -> bool {
        self.hits /= 2;
        !self.counts.is_empty()
            || self
                .state
                .pace
                .as_ref()
                .is_some_and(|pace| pace.is_capped())
            || self.hits > 0
    }
}

/// The cells of one VM's request path.
#[derive(Debug, Clone)]
pub struct CellTable {
    /// By cell key ([`crate::request::classify`]).
    records: CellMap<CellRecord>,
    max_cells: usize,
    /// Requests not attributed to a cell since the last
    /// [`Self::take_untracked`].
    untracked: u64,
    /// Whether any record has counts to hand on.
    counted: bool,
    /// Whether this window may still run an eviction pass.
    may_evict: bool,
    evictions: u64,
}

impl CellTable {
    /// No cells, room for `max_cells`.
    pub fn new(max_cells: usize) -> Self {
        Self {
            records: CellMap::default(),
            max_cells,
            untracked: 0,
            counted: false,
            may_evict: true,
            evictions: 0,
        }
    }

    /// The record of the cell `key` and the index of its directive in the
    /// table of `generation`: the index remembered by the record, or what
    /// `lookup` finds (then remembered). A cell met first gets a record if
    /// it fits (an eviction pass may make room); `None` if it does not.
    /// One probe for a cell already known. The caller counts the request
    /// ([`CellRecord::count`], or [`Self::count_untracked`] without a
    /// record).
    pub fn record(
        &mut self,
        key: &str,
        generation: u64,
        mut lookup: impl FnMut() -> Option<usize>,
    ) -> (Option<&mut CellRecord>, Option<usize>) {
        let len = self.records.len();
        if self.may_evict
            && len >= unlimited_cap(self.max_cells)
            && self.records.get_mut(key).is_none()
        {
            // The map may be full for this cell: make room before the probe
            // that inserts, so that probe can hand out the record.
            self.evict();
        }
        let len = self.records.len();
        let max_cells = self.max_cells;
        let mut found = None;
        let record = self.records.get_or_try_insert(key, || {
            let index = lookup();
            found = Some(index);
            has_room(len, max_cells, index.is_some()).then(|| CellRecord::new(index.is_some()))
        });
        match record {
            Some(record) => {
                self.counted = true;
                let index = match found {
                    // Made just now, with what the lookup found.
                    Some(index) => index,
                    None => match record.directive(generation) {
                        Some(index) => return (Some(record), index),
                        None => {
                            let index = lookup();
                            // A record outlives its window: a cell met
                            // before its first directive must use the
                            // reserved quarter once it has one, here and in
                            // the leader's window.
                            record.limited = index.is_some();
                            index
                        }
                    },
                };
                record.remember(generation, index);
                (Some(record), index)
            }
            None => (None, found.flatten()),
        }
    }

    /// Adds the actual cost of `charge`, a stream of the cell `key` that
    /// ended, to be reported with this window's counts, and `late` to its
    /// offered and admitted cost (the usage the request's count left
    /// out, [`crate::request::charge::PendingCharge::uncounted_usage`]);
    /// the stream's counted `estimate` and `late` are its settled cost,
    /// what the charge is compared with. A cell whose
    /// record went (drained and idle) gets one again if it fits
    /// (`limited` tells whether it has a directive); the cost is lost and
    /// `false` returned if it does not.
    pub fn charge(
        &mut self,
        key: &str,
        charge: Charge,
        (estimate, late): (u64, u64),
        limited: impl FnOnce() -> bool,
    ) -> bool {
        let len = self.records.len();
        let max_cells = self.max_cells;
        let record = self.records.get_or_try_insert(key, || {
            let limited = limited();
            has_room(len, max_cells, limited).then(|| CellRecord::new(limited))
        });
        match record {
            Some(record) => {
                let counts = &mut record.counts;
                counts.charged_cost = counts.charged_cost.saturating_add(charge.cost);
                counts.offered_cost = counts.offered_cost.saturating_add(late);
                counts.admitted_cost = counts.admitted_cost.saturating_add(late);
                counts.settled_cost = counts
                    .settled_cost
                    .saturating_add(estimate.saturating_add(late));
                self.counted = true;
                true
            }
            None => false,
        }
    }

    /// Tallies a request of a cell that found no room.
    pub fn count_untracked(&mut self) {
        self.untracked = self.untracked.saturating_add(1);
    }

    /// The record of `key`, if it has one.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut CellRecord> {
        self.records.get_mut(key)
    }

    /// Every record, mutably: the pacer's tick.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut CellRecord)> {
        self.records.iter_mut()
    }

    /// Keeps the records `keep` says to keep, and forgets any record left
    /// holding nothing.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &mut CellRecord) -> bool) {
        self.records
            .retain(|key, record| keep(key, record) && !record.is_spent());
    }

    /// Takes the counts of every cell with traffic, zeroing them; records
    /// that hold nothing else are forgotten. Opens a new window for
    /// eviction.
    pub fn drain(&mut self) -> Vec<BucketCount> {
        let mut counts = Vec::new();
        self.take_counts(|key, taken, _| {
            if let Some((bucket, tenant, priority)) = parse_key(key) {
                counts.push(taken.into_count(BucketCount {
                    bucket: bucket.to_owned(),
                    tenant: tenant.to_owned(),
                    priority: priority as i32,
                    ..BucketCount::default()
                }));
            }
        });
        counts
    }

    /// Takes every cell's counts, zeroing them, as [`Self::drain`] does;
    /// `take` gets the cell key, the counts and whether it has a directive.
    pub(crate) fn take_counts(&mut self, mut take: impl FnMut(&str, Counts, bool)) {
        self.records.retain(|key, record| {
            if !record.counts.is_empty() {
                take(key, std::mem::take(&mut record.counts), record.limited);
            }
            !record.is_spent()
        });
        self.counted = false;
        self.may_evict = true;
    }

    /// Adds counts drained earlier (a hand-off the queue refused);
    /// `limited` says which cell keys have a directive.
    pub fn merge(
        &mut self,
        counts: impl IntoIterator<Item = BucketCount>,
        mut limited: impl FnMut(&str) -> bool,
    ) {
        for count in counts {
            let key = key_of_count(&count);
            let is_limited = limited(&key);
            let len = self.records.len();
            let max_cells = self.max_cells;
            let added = Counts::of(&count);
            match self.records.get_or_try_insert(&key, || {
                has_room(len, max_cells, is_limited).then(|| CellRecord::new(is_limited))
            }) {
                Some(record) => {
                    record.counts.add(added);
                    record.limited |= is_limited;
                    self.counted = true;
                }
                None => self.untracked = self.untracked.saturating_add(added.offered),
            }
        }
    }

    /// The counts of every cell that offered requests this window, by
    /// cell key.
    pub fn offered_by_key(&self) -> impl Iterator<Item = (&str, &Counts)> {
        self.records
            .iter()
            .filter(|(_, record)| record.counts.offered > 0)
            .map(|(key, record)| (key, &record.counts))
    }

    /// Whether nothing was counted since the last drain.
    pub fn has_no_counts(&self) -> bool {
        !self.counted
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Requests not attributed because the map was full; resets to 0.
    pub fn take_untracked(&mut self) -> u64 {
        std::mem::take(&mut self.untracked)
    }

    /// Eviction passes so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    fn evict(&mut self) {
        self.may_evict = false;
        self.evictions = self.evictions.saturating_add(1);
        self.records.retain(|_, record| record.survives_a_pass());
    }
}

/// Whether a cell met first (`limited` if it has a directive) fits beside
/// `len` records.
fn has_room(len: usize, max_cells: usize, limited: bool) -> bool {
    let cap = if limited {
        max_cells
    } else {
        unlimited_cap(max_cells)
    };
    len < cap
}

// The map from cell key to record.
//
// The map from cell key to a value that the request path probes on every
// request (the counters).
//
// A cell key ([`crate::request::classify`]) is hashed as its 4-byte prefix (one integer)
// and the rest of its bytes. That lets a bucket-wide cell be found from the
// bare bucket name, hashing and comparing `BUCKET_WIDE_PREFIX ‖ bucket`
// without first copying the two into a key buffer. The hasher is foldhash,
// seeded per map; [`crate::fast_map`] says why that bounds what clients
// choosing colliding keys can do (the map's owner caps its size).

/// Values by cell key, hashed in parts.
#[derive(Debug, Clone)]
pub(crate) struct CellMap<V> {
    table: HashTable<(String, V)>,
    hasher: RandomState,
}

impl<V> Default for CellMap<V> {
    fn default() -> Self {
        Self {
            table: HashTable::new(),
            hasher: RandomState::default(),
        }
    }
}

/// The bucket-wide prefix as the integer it is hashed as.
const BUCKET_WIDE: u32 = u32::from_le_bytes(BUCKET_WIDE_PREFIX_BYTES);

fn hash_parts(state: &RandomState, prefix: u32, rest: &[u8]) -> u64 {
    let mut hasher = state.build_hasher();
    hasher.write_u32(prefix);
    hasher.write(rest);
    hasher.finish()
}

/// The hash of a whole key: the same as [`hash_parts`] of its prefix and
/// rest, so both kinds of lookup find the same entries. A key too short to
/// have a prefix (not one [`crate::request::classify`] builds) hashes as prefix 0 and
/// all its bytes.
fn hash_key(state: &RandomState, key: &str) -> u64 {
    match key.as_bytes().split_first_chunk::<4>() {
        Some((head, rest)) => hash_parts(state, u32::from_le_bytes(*head), rest),
        None => hash_parts(state, 0, key.as_bytes()),
    }
}

impl<V> CellMap<V> {
    /// The value of the cell key `key`.
    pub(crate) fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        let hash = hash_key(&self.hasher, key);
        self.table.find_mut(hash, |(k, _)| k == key).map(|(_, v)| v)
    }

    /// The value of the bucket-wide cell of `bucket`, without building its
    /// key.
    pub(crate) fn get_bucket_wide_mut(&mut self, bucket: &str) -> Option<&mut V> {
        let hash = hash_parts(&self.hasher, BUCKET_WIDE, bucket.as_bytes());
        self.table
            .find_mut(hash, |(k, _)| {
                k.strip_prefix(BUCKET_WIDE_PREFIX) == Some(bucket)
            })
            .map(|(_, v)| v)
    }

    /// Inserts `value` for `key`, replacing any value it had.
    pub(crate) fn insert(&mut self, key: String, value: V) {
        let hash = hash_key(&self.hasher, &key);
        match self.table.find_mut(hash, |(k, _)| *k == key) {
            Some((_, existing)) => *existing = value,
            None => {
                let hasher = &self.hasher;
                self.table
                    .insert_unique(hash, (key, value), |(k, _)| hash_key(hasher, k));
            }
        }
    }

    /// The value of `key`, or the value `make` returns inserted for it;
    /// `None` if the key is absent and `make` returns `None`. One hash of
    /// the key either way, and a copy of it only when inserting.
    pub(crate) fn get_or_try_insert(
        &mut self,
        key: &str,
        make: impl FnOnce() -> Option<V>,
    ) -> Option<&mut V> {
        let hash = hash_key(&self.hasher, key);
        let hasher = &self.hasher;
        match self
            .table
            .entry(hash, |(k, _)| k == key, |(k, _)| hash_key(hasher, k))
        {
            Entry::Occupied(entry) => Some(&mut entry.into_mut().1),
            Entry::Vacant(entry) => {
                let value = make()?;
                Some(&mut entry.insert((key.to_owned(), value)).into_mut().1)
            }
        }
    }

    /// Keeps the entries `keep` says to keep (it may change them).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&str, &mut V) -> bool) {
        self.table.retain(|(k, v)| keep(k, v));
    }

    /// Every entry, mutably.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut V)> {
        self.table.iter_mut().map(|(k, v)| (k.as_str(), v))
    }

    /// Takes every entry, keeping the capacity.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = (String, V)> + '_ {
        self.table.drain()
    }

    /// Every entry.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        self.table.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether there is no entry.
    pub(crate) fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::classify::key_of;
    use sluice_core::Priority;
    use sluice_core::decision::NewCellLimit;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn key(bucket: &str) -> String {
        key_of(bucket, "", Priority::Unspecified)
    }

    /// Counts one admitted request of `bucket`, whose directive (in the
    /// table of `generation`) is `directive`; whether it found a record.
    fn count(
        cells: &mut CellTable,
        bucket: &str,
        generation: u64,
        directive: Option<usize>,
    ) -> bool {
        match cells.record(&key(bucket), generation, || directive).0 {
            Some(record) => {
                record.count(Outcome::Admitted, 0);
                true
            }
            None => {
                cells.count_untracked();
                false
            }
        }
    }

    #[test]
    fn a_cell_remembers_its_directive_until_the_table_changes() {
        let mut cells = CellTable::new(10);
        let mut lookups = 0;
        for _ in 0..3 {
            let (_, index) = cells.record(&key("a"), 1, || {
                lookups += 1;
                Some(4)
            });
            assert_eq!(index, Some(4));
        }
        assert_eq!(lookups, 1);
        // Across a drain too: the record holds nothing else, so it goes,
        // and the next request looks the directive up again.
        cells.drain();
        let (_, index) = cells.record(&key("a"), 2, || {
            lookups += 1;
            None
        });
        assert_eq!((index, lookups), (None, 2));
    }

    #[test]
    fn a_drain_hands_the_counts_on_and_keeps_records_with_state() {
        let mut cells = CellTable::new(10);
        count(&mut cells, "paced", 0, None);
        count(&mut cells, "paced", 0, None);
        count(&mut cells, "counted", 0, None);
        if let Some(record) = cells.get_mut(&key("paced")) {
            record.state.new_cell = Some(NewCellLimit::new(1.0, 0));
        }
        assert!(!cells.has_no_counts());
        let mut drained = cells.drain();
        drained.sort_by(|a, b| a.bucket.cmp(&b.bucket));
        let offered: Vec<(&str, u64)> = drained
            .iter()
            .map(|count| (count.bucket.as_str(), count.offered))
            .collect();
        assert_eq!(offered, [("counted", 1), ("paced", 2)]);
        assert!(cells.has_no_counts());
        assert_eq!(cells.len(), 1);
        assert!(cells.get_mut(&key("paced")).is_some());
        assert!(cells.drain().is_empty());
    }

    #[test]
    fn a_flood_leaves_a_quarter_for_cells_with_a_directive() {
        let mut cells = CellTable::new(8);
        for i in 0..20 {
            count(&mut cells, &format!("flood-{i}"), 0, None);
        }
        assert_eq!(cells.len(), unlimited_cap(8));
        assert_eq!(cells.take_untracked(), 20 - unlimited_cap(8) as u64);
        assert!(count(&mut cells, "limited", 0, Some(0)));
        assert!(count(&mut cells, "limited-too", 0, Some(1)));
    }

    #[test]
    fn one_pass_a_window_forgets_one_off_cells_and_keeps_busy_and_counted_ones() {
        let mut cells = CellTable::new(8);
        for _ in 0..4 {
            count(&mut cells, "busy", 0, None);
        }
        for i in 0..5 {
            count(&mut cells, &format!("once-{i}"), 0, None);
        }
        // Full with counts to report: nothing can go.
        assert!(!count(&mut cells, "late", 0, None));
        assert_eq!(cells.evictions(), 1);
        // Still full, and no second pass in this window.
        assert!(!count(&mut cells, "later", 0, None));
        assert_eq!(cells.evictions(), 1);
        // Records need state to outlive a drain: the pacer's, here faked
        // with a new cell's.
        for (_, record) in cells.iter_mut() {
            record.state.new_cell = Some(NewCellLimit::new(1.0, 0));
        }
        cells.drain();
        assert_eq!(cells.len(), 6);
        // The next window's first new cell makes room: the one-off cells
        // go, the busy one stays.
        assert!(count(&mut cells, "new", 0, None));
        assert_eq!(cells.evictions(), 2);
        assert!(cells.get_mut(&key("busy")).is_some());
        assert!(cells.get_mut(&key("once-0")).is_none());
        assert_eq!(cells.len(), 2);
    }
}

#[cfg(test)]
mod cell_map_tests {
    use super::*;
    use crate::request::classify::key_of;
    use sluice_core::Priority;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_bucket_wide_cell_is_found_by_key_and_by_bucket() {
        let mut map = CellMap::default();
        map.insert(key_of("acme", "", Priority::Unspecified), 1);
        map.insert(key_of("acme", "t", Priority::Unspecified), 2);
        map.insert(key_of("acme", "", Priority::Bulk), 3);
        map.insert("x".to_owned(), 4);
        assert_eq!(map.get_bucket_wide_mut("acme"), Some(&mut 1));
        assert_eq!(
            map.get_mut(&key_of("acme", "", Priority::Unspecified)),
            Some(&mut 1)
        );
        assert_eq!(
            map.get_mut(&key_of("acme", "t", Priority::Unspecified)),
            Some(&mut 2)
        );
        assert_eq!(
            map.get_mut(&key_of("acme", "", Priority::Bulk)),
            Some(&mut 3)
        );
        assert_eq!(map.get_mut("x"), Some(&mut 4));
        assert_eq!(map.get_bucket_wide_mut("acm"), None);
        assert_eq!(map.get_bucket_wide_mut("t"), None);
        map.insert(key_of("acme", "", Priority::Unspecified), 5);
        assert_eq!(map.get_bucket_wide_mut("acme"), Some(&mut 5));
        assert_eq!(map.len(), 4);
    }

    #[test]
    fn many_cells_stay_findable_across_growth() {
        let mut map = CellMap::default();
        for i in 0..1000 {
            map.insert(key_of(&format!("b{i}"), "", Priority::Unspecified), i);
        }
        for i in 0..1000 {
            assert_eq!(map.get_bucket_wide_mut(&format!("b{i}")).copied(), Some(i));
        }
        assert_eq!(map.drain().count(), 1000);
        assert!(map.is_empty());
    }
}
