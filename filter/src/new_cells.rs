//! Cells without any directive yet ("new buckets"): what the configured
//! `new_bucket` behaviour does with them until the control plane directs
//! them. `allow` lets them through; `local_limit` gives each cell a local
//! token bucket of the configured fleet limit over the expected proxies,
//! split evenly between the VMs serving requests.
//!
//! At most `max_cells` cells are tracked; when full, the map is cleared (the
//! cells restart with a full bucket), so cells the control plane has since
//! directed do not pin memory.

use crate::cell::parse_key;
use crate::fast_map::{self, FastMap};
use crate::reject::{DropReason, RejectFacts, RejectResponse, ResponseSettings};
use crate::token_bucket::TokenBucket;
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

/// A new cell's limiter and prepared 429.
#[derive(Debug, Clone)]
pub struct NewCell {
    /// The local limiter.
    pub limiter: TokenBucket,
    /// The response of a drop.
    pub response: Arc<RejectResponse>,
}

/// The new cells of one VM.
#[derive(Debug)]
pub struct NewCells {
    policy: NewBucketPolicy,
    cells: FastMap<String, NewCell>,
    max_cells: usize,
    responses: Arc<ResponseSettings>,
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
        }
    }

    /// The decision for a request of the new cell `cell_key`: `Some` with
    /// the response to drop it. Allocates only for a cell seen first.
    pub fn decide(
        &mut self,
        cell_key: &str,
        now_ms: u64,
        workers: u32,
    ) -> Option<(DropReason, Arc<RejectResponse>)> {
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
                self.cells.clear();
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
                    limiter: TokenBucket::new(rate, now_ms),
                    response,
                },
            );
        }
        let cell = self.cells.get_mut(cell_key)?;
        if cell.limiter.rate_per_s() != rate {
            cell.limiter.set_rate(rate);
        }
        if cell.limiter.try_take(now_ms) {
            None
        } else {
            Some((DropReason::NewBucketLimit, Arc::clone(&cell.response)))
        }
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
    use sluice_proto::v1::Priority;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn allow_lets_everything_through_and_tracks_nothing() {
        let mut cells = NewCells::new(NewBucketPolicy::Allow, 10, Arc::default());
        for _ in 0..1000 {
            assert!(cells.decide("0000a", 0, 1).is_none());
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
            match cells.decide(&key, ms, 2) {
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
            cells.decide(&key_of(&format!("b{i}"), "", Priority::Unspecified), 0, 1);
            assert!(cells.len() <= 3);
        }
    }
}
