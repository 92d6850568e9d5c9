//! Cells without any directive yet ("new buckets"): what the configured
//! `new_bucket` behaviour does with them until the control plane directs
//! them. `allow` lets them through; `local_limit` gives each cell a local
//! limit ([`sluice_core::gcra::Gcra::per_second`]) of the configured fleet
//! limit over the expected proxies,
//! split evenly between the VMs serving requests.
//!
//! The control plane directs only cells with something to enforce, so a
//! cell of an unlimited bucket never gets a directive. A cell is therefore
//! new only until the control plane has had time to direct it: once it was
//! first seen [`NEW_CELL_GRACE_MS`] ago while the directives are fresh, the
//! control plane knows it and chose to send nothing, and it passes.
//!
//! A new cell's state lives in its record ([`crate::cell_table`]), bounded
//! and evicted with it. A cell that finds no room in a full table shares
//! one limiter at the same rate with every other such cell, so a flood of
//! one-off keys cannot lift the new-cell limit by giving each key a fresh
//! burst.

use crate::cell::parse_key;
use crate::reject::{RejectFacts, RejectResponse, ResponseSettings};
use sluice_core::DropReason;
use sluice_core::gcra::Gcra;
use std::sync::Arc;

/// The configured behaviour for cells without a directive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NewBucketPolicy {
    /// Let every request through.
    Allow,
    /// Limit each cell locally.
    LocalLimit {
        /// The fleet-wide limit the operator assumes for a new cell.
        fleet_limit_rps: f64,
        /// How many proxies are expected to share it.
        expected_proxies: u32,
    },
}

/// How long after a cell is first seen, while the directives are fresh,
/// the control plane has had to direct it: a report interval, a control
/// interval and a push with room to spare (defaults 250 + 500 + a few ms).
pub const NEW_CELL_GRACE_MS: u64 = 5_000;

/// A new cell's limiter and prepared 429.
#[derive(Debug, Clone)]
pub struct NewCell {
    limiter: Gcra,
    /// The response of a drop (`None` for the shared limiter of cells
    /// without a record, whose responses are rendered per drop).
    response: Option<Arc<RejectResponse>>,
    /// When the cell was first seen.
    first_seen_ms: u64,
}

#[cfg(test)]
impl NewCell {
    /// A new cell first seen at 0, limited to 1 rps.
    pub fn for_tests() -> Self {
        Self {
            limiter: Gcra::per_second(1.0, 0),
            response: None,
            first_seen_ms: 0,
        }
    }
}

/// What one VM does with cells without a directive.
#[derive(Debug)]
pub struct NewCellRule {
    policy: NewBucketPolicy,
    responses: Arc<ResponseSettings>,
    /// The limiter shared by new cells that found no room for a record.
    overflow: Option<NewCell>,
    /// Whether the last decision treated its cell as new.
    last_new: bool,
}

impl NewCellRule {
    /// The rule `policy`, rendering its 429s with `responses`.
    pub fn new(policy: NewBucketPolicy, responses: Arc<ResponseSettings>) -> Self {
        Self {
            policy,
            responses,
            overflow: None,
            last_new: false,
        }
    }

    /// The decision for a request of the cell `cell_key`, which has no
    /// directive, with the state its record holds (`None`: it has no
    /// record): `Some` with the response to drop it. `directed`: the VM
    /// holds directives and they are fresh, so a cell seen long enough ago
    /// is known to the control plane. Allocates only for a cell seen first.
    pub fn decide(
        &mut self,
        state: Option<&mut Option<NewCell>>,
        cell_key: &str,
        now_ms: u64,
        workers: u32,
        directed: bool,
    ) -> Option<(DropReason, Arc<RejectResponse>)> {
        self.last_new = false;
        let NewBucketPolicy::LocalLimit {
            fleet_limit_rps,
            expected_proxies,
        } = self.policy
        else {
            return None;
        };
        let rate = fleet_limit_rps / f64::from(expected_proxies.max(1)) / f64::from(workers.max(1));
        let render = || {
            let (bucket, tenant, _) =
                parse_key(cell_key).unwrap_or((cell_key, "", Default::default()));
            Arc::new(self.responses.render(&RejectFacts {
                bucket,
                tenant,
                reason: DropReason::NewBucketLimit,
                limit_rps: fleet_limit_rps,
                retry_after_ms: 0,
            }))
        };
        let cell = match state {
            Some(state) => state.get_or_insert_with(|| NewCell {
                limiter: Gcra::per_second(rate, now_ms),
                response: Some(render()),
                first_seen_ms: now_ms,
            }),
            None => self.overflow.get_or_insert_with(|| NewCell {
                limiter: Gcra::per_second(rate, now_ms),
                response: None,
                first_seen_ms: now_ms,
            }),
        };
        if cell.response.is_some()
            && directed
            && now_ms.saturating_sub(cell.first_seen_ms) >= NEW_CELL_GRACE_MS
        {
            return None;
        }
        self.last_new = true;
        if !cell.limiter.has_rate(rate) {
            cell.limiter.set_rate_per_second(rate, now_ms);
        }
        if cell.limiter.admit(now_ms, 0) {
            return None;
        }
        let response = match &cell.response {
            Some(response) => Arc::clone(response),
            None => render(),
        };
        Some((DropReason::NewBucketLimit, response))
    }

    /// Whether the last [`Self::decide`] limited its cell as a new one
    /// (not with `allow`, which tracks nothing).
    pub fn last_was_new(&self) -> bool {
        self.last_new
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cell::key_of;
    use crate::cell_table::CellTable;
    use crate::counters::Outcome;
    use sluice_core::Priority;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// The rule with the cells it keeps state in, as the request path
    /// drives them (no cell has a directive).
    struct Cells {
        rule: NewCellRule,
        table: CellTable,
    }

    impl Cells {
        fn new(policy: NewBucketPolicy, max_cells: usize) -> Self {
            Self {
                rule: NewCellRule::new(policy, Arc::default()),
                table: CellTable::new(max_cells),
            }
        }

        fn decide(
            &mut self,
            key: &str,
            now_ms: u64,
            workers: u32,
            directed: bool,
        ) -> Option<(DropReason, Arc<RejectResponse>)> {
            let (mut record, _) = self.table.record(key, 0, || None);
            let state = record.as_deref_mut().map(|record| &mut record.new_cell);
            let verdict = self.rule.decide(state, key, now_ms, workers, directed);
            match record {
                Some(record) => record.count(Outcome::Admitted),
                None => self.table.count_untracked(),
            }
            verdict
        }
    }

    fn local_limit(fleet_limit_rps: f64) -> NewBucketPolicy {
        NewBucketPolicy::LocalLimit {
            fleet_limit_rps,
            expected_proxies: 1,
        }
    }

    #[test]
    fn allow_lets_everything_through_and_keeps_no_state() {
        let mut cells = Cells::new(NewBucketPolicy::Allow, 10);
        for _ in 0..1000 {
            assert!(cells.decide("0000a", 0, 1, true).is_none());
        }
        assert!(!cells.rule.last_was_new());
        cells.table.drain();
        assert!(cells.table.is_empty());
    }

    #[test]
    fn local_limit_is_the_fleet_limit_over_proxies_and_workers() {
        let policy = NewBucketPolicy::LocalLimit {
            fleet_limit_rps: 40.0,
            expected_proxies: 2,
        };
        let mut cells = Cells::new(policy, 10);
        let key = key_of("fresh", "acme", Priority::Bulk);
        let mut admitted = 0;
        let mut response = None;
        for ms in (0..5_000u64).step_by(10) {
            match cells.decide(&key, ms, 2, false) {
                None => admitted += 1,
                Some((reason, r)) => {
                    assert_eq!(reason, DropReason::NewBucketLimit);
                    response = Some(r);
                }
            }
        }
        // 10 rps on this VM for 5 s, plus a one-second burst.
        assert!((50..=61).contains(&admitted), "{admitted}");
        let body: serde_json::Value = serde_json::from_slice(&response.unwrap().body).unwrap();
        assert_eq!(body["bucket"], "fresh");
        assert_eq!(body["tenant"], "acme");
        assert_eq!(body["reason"], "new_bucket_limit");
    }

    #[test]
    fn a_cell_the_control_plane_left_undirected_passes_after_the_grace() {
        let mut cells = Cells::new(local_limit(1.0), 10);
        let key = key_of("unlimited", "", Priority::Unspecified);
        let dropped = |from: u64, directed: bool, cells: &mut Cells| {
            (from..from + 1_000)
                .step_by(10)
                .filter(|ms| cells.decide(&key, *ms, 1, directed).is_some())
                .count()
        };
        assert!(dropped(0, true, &mut cells) > 90, "limited while new");
        // Without fresh directives, nobody has looked at it: still new.
        assert!(dropped(NEW_CELL_GRACE_MS, false, &mut cells) > 90);
        // A report window later the record still holds when it was first
        // seen.
        cells.table.drain();
        assert_eq!(dropped(NEW_CELL_GRACE_MS, true, &mut cells), 0);
    }

    #[test]
    fn a_flood_of_one_off_cells_does_not_evict_a_busy_one() {
        let mut cells = Cells::new(local_limit(1.0), 200);
        let busy = key_of("busy", "", Priority::Unspecified);
        let mut busy_dropped = 0;
        for i in 0..20_000u64 {
            let flood = key_of(&format!("flood-{i}"), "", Priority::Unspecified);
            cells.decide(&flood, i, 1, false);
            if i % 10 == 0 && cells.decide(&busy, i, 1, false).is_some() {
                busy_dropped += 1;
            }
            assert!(cells.table.len() <= 200);
            // A report window of 100 ms.
            if i % 100 == 99 {
                cells.table.drain();
            }
        }
        // The busy cell keeps its limiter (1 rps plus its one-second
        // burst over 20 s), instead of restarting with a full bucket.
        assert!(busy_dropped > 1_900, "{busy_dropped}");
        assert!(cells.table.evictions() > 0);
    }

    #[test]
    fn cells_that_find_no_room_share_one_limit() {
        // Room for three cells without a directive, all counted in this
        // window; then 100 one-off keys at once. Each with a limiter of its
        // own would pass with its burst; sharing one, about a second of
        // the 10 rps passes.
        let mut cells = Cells::new(local_limit(10.0), 4);
        for i in 0..3 {
            cells.decide(
                &key_of(&format!("held-{i}"), "", Priority::Unspecified),
                0,
                1,
                false,
            );
        }
        let admitted = (0..100)
            .filter(|i| {
                let key = key_of(&format!("flood-{i}"), "", Priority::Unspecified);
                cells.decide(&key, 0, 1, false).is_none()
            })
            .count();
        assert!((9..=11).contains(&admitted), "{admitted}");
        assert_eq!(cells.table.len(), 3);
        assert_eq!(cells.table.take_untracked(), 100);
        // A dropped one names its own cell.
        let (_, response) = cells
            .decide(&key_of("named", "t", Priority::Unspecified), 0, 1, false)
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
        assert_eq!(
            (body["bucket"].as_str(), body["tenant"].as_str()),
            (Some("named"), Some("t"))
        );
    }
}
