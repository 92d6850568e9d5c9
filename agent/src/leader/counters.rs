//! Bounded per-cell request counts for one window: what the leader adds up
//! from its VMs' hand-offs before it reports (a VM's own counts live in its
//! cell records, [`crate::request::cell_table`]).
//!
//! Cells with a directive (limited cells) are never crowded out by cells
//! without one: those may fill only `max_cells` minus a reserved quarter, so
//! a flood of one-off unlimited keys leaves room for every limited cell the
//! control plane needs counts of. The limited cells are what the counts are
//! for; an unlimited cell that is not counted costs nothing but its rate in
//! the admin view.

use crate::request::cell_table::{CellMap, CellTable, Counts, unlimited_cap};
use crate::request::classify::{key_of, key_of_count, parse_key};
use sluice_core::Priority;
use sluice_core::decision::Outcome;
use sluice_proto::v1::BucketCount;

/// A cell's counts in this window.
#[derive(Debug, Clone, Copy, Default)]
struct CellSlot {
    counts: Counts,
    /// Whether the cell had a directive when it was first counted: it may
    /// use the reserved share.
    limited: bool,
}

impl CellSlot {
    fn of(counts: Counts, limited: bool) -> Self {
        Self { counts, limited }
    }
}

/// Counts per cell, holding at most `max_cells` cells, of which cells
/// without a directive may take at most [`unlimited_cap`]. Requests of a new
/// cell beyond its cap are not attributed; they are tallied in
/// [`BucketCounters::take_untracked`] so the caller can report the overflow.
#[derive(Debug, Clone)]
pub struct BucketCounters {
    /// By cell key ([`crate::request::classify`]).
    counts: CellMap<CellSlot>,
    max_cells: usize,
    untracked: u64,
}

impl BucketCounters {
    /// Moves every cell's counts out of `table` (a VM's own window) into
    /// these, as [`CellTable::drain`] does.
    pub fn take_from(&mut self, table: &mut CellTable) {
        table.take_counts(|key, taken, limited| self.add(key.to_owned(), taken, limited));
    }

    /// Empty counters for at most `max_cells` cells.
    pub fn new(max_cells: usize) -> Self {
        Self {
            counts: CellMap::default(),
            max_cells,
            untracked: 0,
        }
    }

    /// Counts one request of a bucket without tenant or priority.
    pub fn record(&mut self, bucket: &str, admitted: bool) {
        let outcome = if admitted {
            Outcome::Admitted
        } else {
            Outcome::Dropped
        };
        let one = Counts::one(outcome);
        if let Some(slot) = self.counts.get_bucket_wide_mut(bucket) {
            slot.counts.add(one);
        } else if self.has_room(false) {
            self.insert(key_of(bucket, "", Priority::Unspecified), one, false);
        } else {
            // Not even the key is built for a cell that does not fit.
            self.untracked = self.untracked.saturating_add(one.offered);
        }
    }

    /// Counts one request of the cell with key `cell_key`, `limited` if it
    /// has a directive. Allocates only for a cell not seen this window.
    pub fn record_cell(&mut self, cell_key: &str, outcome: Outcome, limited: bool) {
        let one = Counts::one(outcome);
        if let Some(slot) = self.counts.get_mut(cell_key) {
            slot.counts.add(one);
        } else if self.has_room(limited) {
            self.insert(cell_key.to_owned(), one, limited);
        } else {
            // Not even the key is copied for a cell that does not fit.
            self.untracked = self.untracked.saturating_add(one.offered);
        }
    }

    /// Adds counts for a cell key (saturating), `limited` if the cell has
    /// a directive.
    pub fn add(&mut self, cell_key: String, counts: Counts, limited: bool) {
        if let Some(existing) = self.counts.get_mut(&cell_key) {
            existing.counts.add(counts);
            existing.limited |= limited;
        } else {
            self.insert(cell_key, counts, limited);
        }
    }

    /// Adds counts drained elsewhere, for example from the shared queue;
    /// `limited` says which cell keys have a directive.
    pub fn merge(
        &mut self,
        counts: impl IntoIterator<Item = BucketCount>,
        mut limited: impl FnMut(&str) -> bool,
    ) {
        for count in counts {
            let key = key_of_count(&count);
            let is_limited = limited(&key);
            self.add(key, Counts::of(&count), is_limited);
        }
    }

    /// Moves every cell into `other`.
    pub fn move_into(&mut self, other: &mut BucketCounters) {
        for (key, slot) in self.counts.drain() {
            other.add(key, slot.counts, slot.limited);
        }
    }

    /// Takes every cell with traffic, leaving the counters empty (with
    /// their capacity kept for the next window).
    pub fn drain(&mut self) -> Vec<BucketCount> {
        self.counts
            .drain()
            .filter(|(_, slot)| !slot.counts.is_empty())
            .filter_map(|(key, CellSlot { counts, .. })| {
                let (bucket, tenant, priority) = parse_key(&key)?;
                Some(counts.into_count(BucketCount {
                    bucket: bucket.to_owned(),
                    tenant: tenant.to_owned(),
                    priority: priority as i32,
                    ..BucketCount::default()
                }))
            })
            .collect()
    }

    /// Whether nothing is counted.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Number of cells held.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Requests not attributed because the cap was reached; resets to 0.
    pub fn take_untracked(&mut self) -> u64 {
        std::mem::take(&mut self.untracked)
    }

    /// Whether a new cell (`limited` if it has a directive) fits.
    fn has_room(&self, limited: bool) -> bool {
        let cap = if limited {
            self.max_cells
        } else {
            unlimited_cap(self.max_cells)
        };
        self.counts.len() < cap
    }

    fn insert(&mut self, key: String, counts: Counts, limited: bool) {
        if self.has_room(limited) {
            self.counts.insert(key, CellSlot::of(counts, limited));
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
        counts.sort_by(|a, b| {
            (&a.bucket, &a.tenant, a.priority).cmp(&(&b.bucket, &b.tenant, b.priority))
        });
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
    fn a_cell_that_gets_its_directive_later_keeps_the_reserved_quarter() {
        use crate::request::cell_table::CellTable;
        use sluice_core::decision::NewCellLimit;
        let key = |bucket: &str| key_of(bucket, "", Priority::Unspecified);
        // Counts one admitted request of "limited" whose directive (in the
        // table of `generation`) is `directive`.
        let count_limited = |cells: &mut CellTable, generation: u64, directive: Option<usize>| {
            if let Some(record) = cells.record(&key("limited"), generation, || directive).0 {
                record.count(Outcome::Admitted, 0);
            }
        };
        // Met before its first directive, the cell's record outlives the
        // window; once the directive arrives its counts must still reach
        // a leader's window that one-off keys have filled.
        let mut cells = CellTable::new(8);
        count_limited(&mut cells, 0, None);
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
        count_limited(&mut cells, 1, Some(0));
        window.take_from(&mut cells);
        let counted: u64 = window
            .drain()
            .iter()
            .filter(|count| count.bucket == "limited")
            .map(|count| count.offered)
            .sum();
        assert_eq!(counted, 1);
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
    fn cells_are_counted_apart_with_shadow_drops() {
        let mut counters = BucketCounters::new(10);
        let acme = key_of("api", "acme", Priority::Bulk);
        let globex = key_of("api", "globex", Priority::Critical);
        counters.record_cell(&acme, Outcome::Admitted, false);
        counters.record_cell(&acme, Outcome::ShadowDropped, false);
        counters.record_cell(&acme, Outcome::Dropped, true);
        counters.record_cell(&globex, Outcome::Admitted, false);
        counters.record("api", true);
        assert_eq!(
            sorted(counters.drain()),
            vec![
                count("api", 1, 1),
                BucketCount {
                    tenant: "acme".into(),
                    priority: Priority::Bulk as i32,
                    shadow_dropped: 1,
                    ..count("api", 3, 2)
                },
                BucketCount {
                    tenant: "globex".into(),
                    priority: Priority::Critical as i32,
                    ..count("api", 1, 1)
                },
            ]
        );
    }

    #[test]
    fn merge_adds_and_saturates() {
        let mut counters = BucketCounters::new(10);
        counters.merge([count("a", u64::MAX - 1, 5)], |_| false);
        counters.merge([count("a", 10, 10), count("b", 3, 0)], |_| true);
        assert_eq!(
            sorted(counters.drain()),
            vec![count("a", u64::MAX, 15), count("b", 3, 0)]
        );
    }

    #[test]
    fn new_cells_beyond_the_cap_are_untracked() {
        // Three cells, one of them reserved for cells with a directive.
        let mut counters = BucketCounters::new(3);
        counters.record("a", true);
        counters.record("b", true);
        counters.record("c", true);
        counters.merge([count("d", 5, 5)], |_| false);
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
    fn a_flood_of_unlimited_cells_leaves_room_for_limited_ones() {
        let mut counters = BucketCounters::new(200);
        for i in 0..2_000 {
            counters.record_cell(
                &key_of(&format!("flood-{i}"), "", Priority::Unspecified),
                Outcome::Admitted,
                false,
            );
        }
        assert_eq!(counters.len(), unlimited_cap(200));
        assert_eq!(counters.take_untracked(), 2_000 - 150);
        for i in 0..50 {
            let key = key_of(&format!("limited-{i}"), "", Priority::Unspecified);
            counters.record_cell(&key, Outcome::Dropped, true);
        }
        assert_eq!(counters.len(), 200);
        assert_eq!(counters.take_untracked(), 0);
        // Moving them on (the leader's window) keeps the reservation.
        let mut window = BucketCounters::new(200);
        for i in 0..500 {
            window.add(
                key_of(&format!("other-{i}"), "", Priority::Unspecified),
                Counts::one(Outcome::Admitted),
                false,
            );
        }
        counters.move_into(&mut window);
        let limited = window
            .drain()
            .into_iter()
            .filter(|c| c.bucket.starts_with("limited-"))
            .count();
        assert_eq!(limited, 50);
    }

    #[test]
    fn the_reserve_leaves_small_tables_usable() {
        assert_eq!(unlimited_cap(0), 0);
        assert_eq!(unlimited_cap(1), 0);
        assert_eq!(unlimited_cap(2), 1);
        assert_eq!(unlimited_cap(4), 3);
        assert_eq!(unlimited_cap(10_000), 7_500);
    }

    #[test]
    fn drain_skips_cells_without_traffic() {
        let mut counters = BucketCounters::new(10);
        counters.merge([count("idle", 0, 0), count("busy", 1, 0)], |_| false);
        assert_eq!(counters.drain(), vec![count("busy", 1, 0)]);
    }

    #[test]
    fn drain_keeps_a_cell_that_holds_only_a_cost() {
        // The settled estimate of a stream charged nothing, counted when it
        // ends, in a window without the cell's requests; and an offered cost
        // without its requests, which no split produces but a drain must
        // still not drop.
        let settled = BucketCount {
            settled_cost: 700.0,
            ..count("settled", 0, 0)
        };
        let admitted = BucketCount {
            offered_cost: 300.0,
            admitted_cost: 300.0,
            ..count("admitted", 0, 0)
        };
        let mut counters = BucketCounters::new(10);
        counters.merge([settled.clone(), admitted.clone()], |_| false);
        assert_eq!(sorted(counters.drain()), vec![admitted, settled]);
    }

    #[test]
    fn split_examples() {
        let c = Counts {
            offered: 10,
            admitted: 6,
            shadow_dropped: 2,
            ..Counts::default()
        };
        let (a, b) = c.split(0.25);
        assert_eq!(a.offered + b.offered, 10);
        assert_eq!(a.offered, 3);
        assert_eq!(c.split(0.0).0, Counts::default());
        assert_eq!(c.split(1.0).0, c);
        assert_eq!(c.split(f64::NAN).1, c);
    }

    #[test]
    fn a_split_keeps_each_cost_with_what_it_is_the_cost_of() {
        // One heavy request admitted, a stream charged: three tenths of the
        // span before the boundary round the request into the rest, and
        // its cost goes with it.
        let c = Counts {
            offered: 1,
            admitted: 1,
            offered_cost: 8_000,
            admitted_cost: 8_000,
            charged_cost: 1_000,
            settled_cost: 900,
            ..Counts::default()
        };
        let (before, after) = c.split(0.3);
        assert_eq!((before.offered, before.offered_cost), (0, 0));
        assert_eq!((before.admitted, before.admitted_cost), (0, 0));
        assert_eq!((after.offered_cost, after.admitted_cost), (8_000, 8_000));
        // The charges by the time, the settled estimates with them.
        assert_eq!((before.charged_cost, before.settled_cost), (300, 270));
        assert_eq!((after.charged_cost, after.settled_cost), (700, 630));
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
            let mut expected: std::collections::HashMap<String, (u128, u128)> =
                std::collections::HashMap::new();
            for (bucket, offered, admitted) in adds {
                let bucket = format!("b{bucket}");
                counters.merge([BucketCount { bucket: bucket.clone(), offered, admitted, ..Default::default() }], |_| false);
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

        #[test]
        fn split_preserves_totals_and_invariants(
            offered in prop_oneof![0u64..4, 0u64..1_000_000],
            a in prop_oneof![0u64..4, 0u64..1_000_000],
            s in prop_oneof![0u64..4, 0u64..1_000_000],
            costs in proptest::array::uniform4(0u64..1_000_000_000),
            f in 0.0f64..=1.0,
        ) {
            let admitted = a.min(offered);
            let shadow = s.min(admitted);
            let [offered_cost, admitted_cost, charged_cost, settled_cost] = costs;
            let c = Counts {
                offered,
                admitted,
                shadow_dropped: shadow,
                offered_cost,
                admitted_cost,
                charged_cost,
                settled_cost,
            };
            let (x, y) = c.split(f);
            let mut sum = x;
            sum.add(y);
            prop_assert_eq!(sum, c);
            for part in [x, y] {
                prop_assert!(part.shadow_dropped <= part.admitted && part.admitted <= part.offered);
                // No part holds the cost of requests (or charges) it does
                // not hold.
                prop_assert!(part.offered > 0 || offered == 0 || part.offered_cost == 0);
                prop_assert!(part.admitted > 0 || admitted == 0 || part.admitted_cost == 0);
                prop_assert!(part.charged_cost > 0 || charged_cost == 0 || part.settled_cost == 0);
            }
            prop_assert!((x.offered as f64 - offered as f64 * f).abs() <= 1.0);
        }
    }
}
