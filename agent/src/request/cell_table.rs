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

use crate::leader::counters::{BucketCounters, Counts, key_of_count, unlimited_cap};
use crate::request::cell::parse_key;
use crate::request::cell_map::CellMap;
use crate::request::reject::RejectResponse;
use sluice_core::decision::CellState;
use sluice_core::decision::Outcome;
use sluice_proto::v1::BucketCount;
use std::sync::Arc;

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

    /// Counts one request.
    pub fn count(&mut self, outcome: Outcome) {
        self.counts.add(Counts::one(outcome));
        self.hits = self.hits.saturating_add(1);
    }

    /// The counts of this window.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Whether the record holds nothing a drain or a decision needs.
    fn is_spent(&self) -> bool {
        self.counts.offered == 0 && self.state.pace.is_none() && self.state.new_cell.is_none()
    }

    /// Whether an eviction pass may forget it, halving its hits first.
    fn survives_a_pass(&mut self) -> bool {
        self.hits /= 2;
        self.counts.offered > 0
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
    /// By cell key ([`crate::request::cell`]).
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
                counts.push(BucketCount {
                    bucket: bucket.to_owned(),
                    offered: taken.offered,
                    admitted: taken.admitted,
                    tenant: tenant.to_owned(),
                    priority: priority as i32,
                    shadow_dropped: taken.shadow_dropped,
                    ..BucketCount::default()
                });
            }
        });
        counts
    }

    /// Moves every cell's counts into `other` (the leader's own window), as
    /// [`Self::drain`] does.
    pub fn move_counts_into(&mut self, other: &mut BucketCounters) {
        self.take_counts(|key, taken, limited| other.add(key.to_owned(), taken, limited));
    }

    fn take_counts(&mut self, mut take: impl FnMut(&str, Counts, bool)) {
        self.records.retain(|key, record| {
            if record.counts.offered > 0 {
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

    /// The offered count of every cell counted this window, by cell key.
    pub fn offered_by_key(&self) -> impl Iterator<Item = (&str, u64)> {
        self.records
            .iter()
            .filter(|(_, record)| record.counts.offered > 0)
            .map(|(key, record)| (key, record.counts.offered))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::cell::key_of;
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
                record.count(Outcome::Admitted);
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
    fn a_cell_that_gets_its_directive_later_keeps_the_reserved_quarter() {
        // Met before its first directive, the cell's record outlives the
        // window; once the directive arrives its counts must still reach
        // a leader's window that one-off keys have filled.
        let mut cells = CellTable::new(8);
        count(&mut cells, "limited", 0, None);
        // State (the pacer's, here faked with a new cell's) keeps the
        // record past the drain.
        if let Some(record) = cells.get_mut(&key("limited")) {
            record.state.new_cell = Some(NewCellLimit::new(1.0, 0));
        }
        cells.drain();
        let mut window = BucketCounters::new(8);
        for i in 0..10 {
            window.record_cell(&key(&format!("flood-{i}")), Outcome::Admitted, false);
        }
        count(&mut cells, "limited", 1, Some(0));
        cells.move_counts_into(&mut window);
        let counted: u64 = window
            .drain()
            .iter()
            .filter(|count| count.bucket == "limited")
            .map(|count| count.offered)
            .sum();
        assert_eq!(counted, 1);
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
