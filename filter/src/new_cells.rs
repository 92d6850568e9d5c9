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
//! At most `max_cells` cells are tracked. When full, cells met only once
//! since the last pass are forgotten first and the others' hit counts
//! halved (a cheap frequency filter), so a flood of one-off keys cannot push
//! out a busy cell; only if nothing can go is the map cleared (the cells
//! restart with a full bucket).

use crate::cell::parse_key;
use crate::fast_map::{self, FastMap};
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
    /// The local limiter.
    pub limiter: Gcra,
    /// The response of a drop.
    pub response: Arc<RejectResponse>,
    /// When the cell was first seen.
    first_seen_ms: u64,
    /// Requests since the last eviction pass (saturating).
    hits: u32,
}

/// The new cells of one VM.
#[derive(Debug)]
pub struct NewCells {
    policy: NewBucketPolicy,
    cells: FastMap<String, NewCell>,
    max_cells: usize,
    responses: Arc<ResponseSettings>,
    evicted: u64,
    /// Whether the last decision treated its cell as new.
    last_new: bool,
}

impl NewCells {
    /// No cells yet.
    pub fn new(
        policy: NewBucketPolicy,
        max_cells: usize,
        responses: Arc<ResponseSettings>,
    ) -> Self {
        Self {
            policy,
            cells: fast_map::new(),
            max_cells,
            responses,
            evicted: 0,
            last_new: false,
        }
    }

    /// The decision for a request of the cell `cell_key`, which has no
    /// directive: `Some` with the response to drop it. `directed`: the VM
    /// holds directives and they are fresh, so a cell seen long enough ago
    /// is known to the control plane. Allocates only for a cell seen first.
    pub fn decide(
        &mut self,
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
        if !self.cells.contains_key(cell_key) {
            if self.cells.len() >= self.max_cells {
                self.evict();
            }
            let (bucket, tenant, _) =
                parse_key(cell_key).unwrap_or((cell_key, "", Default::default()));
            let response = Arc::new(self.responses.render(&RejectFacts {
                bucket,
                tenant,
                reason: DropReason::NewBucketLimit,
                limit_rps: fleet_limit_rps,
                retry_after_ms: 0,
            }));
            self.cells.insert(
                cell_key.to_owned(),
                NewCell {
                    limiter: Gcra::per_second(rate, now_ms),
                    response,
                    first_seen_ms: now_ms,
                    hits: 0,
                },
            );
        }
        let cell = self.cells.get_mut(cell_key)?;
        cell.hits = cell.hits.saturating_add(1);
        if directed && now_ms.saturating_sub(cell.first_seen_ms) >= NEW_CELL_GRACE_MS {
            return None;
        }
        self.last_new = true;
        if !cell.limiter.has_rate(rate) {
            cell.limiter.set_rate_per_second(rate, now_ms);
        }
        if cell.limiter.admit(now_ms, 0) {
            None
        } else {
            Some((DropReason::NewBucketLimit, Arc::clone(&cell.response)))
        }
    }

    /// Makes room: forgets the cells met once since the last pass and
    /// halves the others' counts; clears the map if that freed nothing.
    fn evict(&mut self) {
        self.evicted = self.evicted.saturating_add(1);
        self.cells.retain(|_, cell| {
            cell.hits /= 2;
            cell.hits > 0
        });
        if self.cells.len() >= self.max_cells {
            self.cells.clear();
        }
    }

    /// Whether the last [`Self::decide`] limited its cell as a new one
    /// (not with `allow`, which tracks nothing).
    pub fn last_was_new(&self) -> bool {
        self.last_new
    }

    /// Eviction passes so far (a full table met a new cell).
    pub fn evictions(&self) -> u64 {
        self.evicted
    }

    /// Cells tracked.
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// Whether no cell is tracked.
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cell::key_of;
    use sluice_core::Priority;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn allow_lets_everything_through_and_tracks_nothing() {
        let mut cells = NewCells::new(NewBucketPolicy::Allow, 10, Arc::default());
        for _ in 0..1000 {
            assert!(cells.decide("0000a", 0, 1, true).is_none());
        }
        assert!(cells.is_empty());
    }

    #[test]
    fn local_limit_is_the_fleet_limit_over_proxies_and_workers() {
        let policy = NewBucketPolicy::LocalLimit {
            fleet_limit_rps: 40.0,
            expected_proxies: 2,
        };
        let mut cells = NewCells::new(policy, 10, Arc::default());
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
    fn the_map_is_bounded() {
        let policy = NewBucketPolicy::LocalLimit {
            fleet_limit_rps: 1.0,
            expected_proxies: 1,
        };
        let mut cells = NewCells::new(policy, 3, Arc::default());
        for i in 0..10 {
            cells.decide(
                &key_of(&format!("b{i}"), "", Priority::Unspecified),
                0,
                1,
                false,
            );
            assert!(cells.len() <= 3);
        }
    }

    fn local_limit(fleet_limit_rps: f64) -> NewBucketPolicy {
        NewBucketPolicy::LocalLimit {
            fleet_limit_rps,
            expected_proxies: 1,
        }
    }

    #[test]
    fn a_cell_the_control_plane_left_undirected_passes_after_the_grace() {
        let mut cells = NewCells::new(local_limit(1.0), 10, Arc::default());
        let key = key_of("unlimited", "", Priority::Unspecified);
        let dropped = |from: u64, directed: bool, cells: &mut NewCells| {
            (from..from + 1_000)
                .step_by(10)
                .filter(|ms| cells.decide(&key, *ms, 1, directed).is_some())
                .count()
        };
        assert!(dropped(0, true, &mut cells) > 90, "limited while new");
        // Without fresh directives, nobody has looked at it: still new.
        assert!(dropped(NEW_CELL_GRACE_MS, false, &mut cells) > 90);
        assert_eq!(dropped(NEW_CELL_GRACE_MS, true, &mut cells), 0);
    }

    #[test]
    fn a_flood_of_one_off_cells_does_not_evict_a_busy_one() {
        let mut cells = NewCells::new(local_limit(1.0), 200, Arc::default());
        let busy = key_of("busy", "", Priority::Unspecified);
        let mut busy_dropped = 0;
        for i in 0..20_000u64 {
            let flood = key_of(&format!("flood-{i}"), "", Priority::Unspecified);
            cells.decide(&flood, i, 1, false);
            if i % 10 == 0 && cells.decide(&busy, i, 1, false).is_some() {
                busy_dropped += 1;
            }
            assert!(cells.len() <= 200);
        }
        // The busy cell keeps its limiter (1 rps plus its one-second
        // burst over 20 s), instead of restarting with a full bucket at
        // every clear.
        assert!(busy_dropped > 1_900, "{busy_dropped}");
        assert!(cells.evictions() > 0);
    }
}
