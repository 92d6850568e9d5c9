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
//! A new cell's limit is part of its decision state
//! ([`sluice_core::decision`]), kept in the cell's record
//! ([`crate::request::cell_table`]) and bounded and evicted with it. Cells that find
//! no room in a full table share one state whose limit never expires, so a
//! flood of one-off keys cannot lift the new-cell limit by giving each key
//! a fresh burst.

use crate::request::classify::parse_key;
use crate::request::reject::{RejectFacts, RejectResponse, ResponseSettings};
use sluice_core::DropReason;
use std::sync::Arc;

pub use sluice_core::decision::NEW_CELL_GRACE_MS;

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

/// What one VM does with cells without a directive: their rate, and their
/// 429.
#[derive(Debug)]
pub struct NewCellRule {
    policy: NewBucketPolicy,
    responses: Arc<ResponseSettings>,
}

impl NewCellRule {
    /// The rule `policy`, rendering its 429s with `responses`.
    pub fn new(policy: NewBucketPolicy, responses: Arc<ResponseSettings>) -> Self {
        Self { policy, responses }
    }

    /// A new cell's local limit on one of `workers` VMs (`None`: new cells
    /// pass): the fleet limit over the expected proxies, split evenly.
    pub fn rate_rps(&self, workers: u32) -> Option<f64> {
        match self.policy {
            NewBucketPolicy::Allow => None,
            NewBucketPolicy::LocalLimit {
                fleet_limit_rps,
                expected_proxies,
            } => Some(
                fleet_limit_rps / f64::from(expected_proxies.max(1)) / f64::from(workers.max(1)),
            ),
        }
    }

    /// The 429 of a request of the new cell `cell_key`: `cached`, or
    /// rendered into it the first time.
    pub fn response(
        &self,
        cached: &mut Option<Arc<RejectResponse>>,
        cell_key: &str,
    ) -> Arc<RejectResponse> {
        let response = cached.get_or_insert_with(|| {
            let (bucket, tenant, _) =
                parse_key(cell_key).unwrap_or((cell_key, "", Default::default()));
            let fleet_limit_rps = match self.policy {
                NewBucketPolicy::LocalLimit {
                    fleet_limit_rps, ..
                } => fleet_limit_rps,
                NewBucketPolicy::Allow => 0.0,
            };
            Arc::new(self.responses.render(&RejectFacts {
                bucket,
                tenant,
                reason: DropReason::NewBucketLimit,
                limit_rps: fleet_limit_rps,
                retry_after_ms: 0,
                budget: None,
            }))
        });
        Arc::clone(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::cell_table::CellTable;
    use crate::request::classify::key_of;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;
    use sluice_core::Priority;
    use sluice_core::decision::Outcome;
    use sluice_core::decision::{CellState, DecisionMode, Now, Rules, decide};
    use sluice_core::regime::Regime;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// The rule with the cells it keeps state in, decided by the core as
    /// the request path decides them (no cell has a directive).
    struct Cells {
        rule: NewCellRule,
        table: CellTable,
        unrecorded: CellState,
    }

    impl Cells {
        fn new(policy: NewBucketPolicy, max_cells: usize) -> Self {
            Self {
                rule: NewCellRule::new(policy, Arc::default()),
                table: CellTable::new(max_cells),
                unrecorded: CellState {
                    shared: true,
                    ..CellState::default()
                },
            }
        }

        fn decide(
            &mut self,
            key: &str,
            now_ms: u64,
            workers: u32,
            directed: bool,
        ) -> Option<(DropReason, Arc<RejectResponse>)> {
            let rules = Rules {
                mode: DecisionMode::Credit,
                caps_engaged: false,
                new_cell_rps: self.rule.rate_rps(workers),
                regime: Regime::Fresh,
                has_directives: directed,
            };
            let now = Now {
                now_ms,
                last_step_ms: 0,
                workers,
            };
            let mut rng = SmallRng::seed_from_u64(0);
            let (record, _) = self.table.record(key, 0, || None);
            match record {
                Some(record) => {
                    let decision = decide(&mut record.state, None, &rules, now, &mut rng);
                    record.count(Outcome::Admitted, 0);
                    let response = &mut record.new_cell_response;
                    decision
                        .reason
                        .map(|reason| (reason, self.rule.response(response, key)))
                }
                None => {
                    let decision = decide(&mut self.unrecorded, None, &rules, now, &mut rng);
                    self.table.count_untracked();
                    decision
                        .reason
                        .map(|reason| (reason, self.rule.response(&mut None, key)))
                }
            }
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
