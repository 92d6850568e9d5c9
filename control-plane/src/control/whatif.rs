//! What-if: replays recorded fleet totals ([`super::history`]) through a
//! fresh controller running a proposed policy and tells, per bucket,
//! tenant and priority class, what would have been admitted and dropped.
//!
//! The replay is a counterfactual, not a re-reading: the ratio decided for
//! an interval governs the next one's admitted rate, and the controller
//! sees those admitted rates (not the ones the live policy produced), so
//! its tracking corrections follow the proposal. Offered rates are the
//! recorded ones: how clients would have reacted to other answers is not
//! modelled. A drop counts as dropped whatever the bucket's mode (shadow
//! mode would have let it through and counted it).
//!
//! Adaptive limits in the proposal move on the recorded upstream signals,
//! interval by interval, as the live ones would have: the replay tells
//! where each limit would have gone. The signals are the ones the live
//! limits produced: how the upstream would have answered the proposal's
//! traffic is not modelled either.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Serialize;

use crate::config::policy::Policy;
use crate::control::adaptive::AdaptiveLimits;
use crate::control::controller::Controller;
use crate::control::history::Recorded;
use crate::types::ControlInterval;
use sluice_core::Priority;

/// What a proposed policy would have done over the replayed intervals;
/// rates are means over them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct WhatIf {
    /// Control intervals replayed.
    pub(crate) intervals: usize,
    /// The time they cover, in seconds.
    pub(crate) seconds: f64,
    /// Whether any CRITICAL traffic would have been dropped.
    pub(crate) critical_dropped: bool,
    /// Per bucket, sorted by bucket.
    pub(crate) buckets: Vec<BucketWhatIf>,
}

/// One bucket under the proposal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct BucketWhatIf {
    /// The bucket key.
    pub(crate) bucket: Arc<str>,
    /// Its limit under the proposal at the end of the replay (`None`:
    /// unlimited).
    pub(crate) limit_rps: Option<f64>,
    /// Where the proposal's adaptive limit went (`None`: not adaptive).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) adaptive: Option<AdaptiveWhatIf>,
    /// Offered, as recorded.
    pub(crate) offered_rps: f64,
    /// Admitted, as recorded (under the policy in force).
    pub(crate) admitted_rps: f64,
    /// Admitted under the proposal.
    pub(crate) would_admit_rps: f64,
    /// Dropped under the proposal.
    pub(crate) would_drop_rps: f64,
    /// Per tenant and priority class.
    pub(crate) cells: Vec<CellWhatIf>,
}

/// Where a proposed adaptive limit went over the replay.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct AdaptiveWhatIf {
    /// Its limit after the first replayed interval.
    pub(crate) first_rps: f64,
    /// The lowest it reached.
    pub(crate) min_rps: f64,
    /// The highest it reached.
    pub(crate) max_rps: f64,
    /// Its limit after the last replayed interval.
    pub(crate) last_rps: f64,
}

impl AdaptiveWhatIf {
    fn at(limit: f64) -> Self {
        Self {
            first_rps: limit,
            min_rps: limit,
            max_rps: limit,
            last_rps: limit,
        }
    }

    fn then(&mut self, limit: f64) {
        self.min_rps = self.min_rps.min(limit);
        self.max_rps = self.max_rps.max(limit);
        self.last_rps = limit;
    }
}

/// One (tenant, priority) cell under the proposal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct CellWhatIf {
    /// The tenant (empty: none).
    pub(crate) tenant: Arc<str>,
    /// The priority class.
    pub(crate) priority: Priority,
    /// Offered, as recorded.
    pub(crate) offered_rps: f64,
    /// Admitted, as recorded.
    pub(crate) admitted_rps: f64,
    /// Admitted under the proposal.
    pub(crate) would_admit_rps: f64,
    /// Dropped under the proposal.
    pub(crate) would_drop_rps: f64,
}

type CellKey = (Arc<str>, Arc<str>, Priority);

#[derive(Debug, Default, Clone, Copy)]
struct Sums {
    offered: f64,
    admitted: f64,
    would_admit: f64,
}

/// Replays `recorded` (oldest first, one per `interval`) under `policy`.
pub(crate) fn replay(recorded: &[Recorded], policy: &Policy, interval: ControlInterval) -> WhatIf {
    let mut controller = Controller::tracking(interval);
    let mut adaptive = AdaptiveLimits::default();
    let mut adaptive_paths: BTreeMap<String, AdaptiveWhatIf> = BTreeMap::new();
    // The drop ratio in force per cell, as the proposal decided it.
    let mut in_force: HashMap<CellKey, f64> = HashMap::new();
    let mut sums: BTreeMap<CellKey, Sums> = BTreeMap::new();
    let mut limits: BTreeMap<Arc<str>, Option<f64>> = BTreeMap::new();
    for Recorded { load, health } in recorded {
        let mut counterfactual = load.clone();
        for bucket in &mut counterfactual.buckets {
            let mut bucket_admitted = 0.0;
            for cell in &mut bucket.cells {
                let key = (
                    Arc::clone(&bucket.bucket),
                    Arc::clone(&cell.tenant),
                    cell.priority,
                );
                let offered = cell.load.offered_rps;
                let recorded = cell.load.admitted_rps;
                // Before the proposal has decided on a cell, what was
                // recorded stands.
                let would = in_force
                    .get(&key)
                    .map_or(recorded, |ratio| offered * (1.0 - ratio));
                cell.load.admitted_rps = would;
                bucket_admitted += would;
                let entry = sums.entry(key).or_default();
                entry.offered += offered;
                entry.admitted += recorded;
                entry.would_admit += would;
            }
            bucket.load.admitted_rps = bucket_admitted;
        }
        let adapted = adaptive.adapt(policy, health, |bucket| {
            counterfactual
                .get(bucket)
                .map_or(0.0, |b| b.load.offered_rps)
        });
        for status in adaptive.status() {
            adaptive_paths
                .entry(status.bucket.clone())
                .and_modify(|path| path.then(status.limit_rps))
                .or_insert_with(|| AdaptiveWhatIf::at(status.limit_rps));
        }
        let decision = controller.decide(&counterfactual, adapted.as_ref().unwrap_or(policy));
        for directive in &decision.changed {
            let key = (
                Arc::from(directive.bucket.as_str()),
                Arc::from(directive.tenant.as_str()),
                Priority::from_wire(directive.priority),
            );
            in_force.insert(key, directive.drop_ratio.clamp(0.0, 1.0));
        }
        for retired in &decision.retired {
            in_force.remove(&(
                Arc::clone(&retired.bucket),
                Arc::clone(&retired.tenant),
                retired.priority,
            ));
        }
        for status in decision.buckets {
            limits.insert(status.bucket, status.limit_rps.map(|l| l.get()));
        }
    }
    summarize(recorded.len(), interval, sums, &limits, &adaptive_paths)
}

fn summarize(
    intervals: usize,
    interval: ControlInterval,
    sums: BTreeMap<CellKey, Sums>,
    limits: &BTreeMap<Arc<str>, Option<f64>>,
    adaptive: &BTreeMap<String, AdaptiveWhatIf>,
) -> WhatIf {
    let mean = |total: f64| {
        if intervals == 0 {
            0.0
        } else {
            total / intervals as f64
        }
    };
    let mut buckets: Vec<BucketWhatIf> = Vec::new();
    let mut critical_dropped = false;
    for ((bucket, tenant, priority), sum) in sums {
        let cell = CellWhatIf {
            tenant,
            priority,
            offered_rps: mean(sum.offered),
            admitted_rps: mean(sum.admitted),
            would_admit_rps: mean(sum.would_admit),
            would_drop_rps: mean((sum.offered - sum.would_admit).max(0.0)),
        };
        // A hundredth of a request per second is noise, not a drop.
        critical_dropped |= priority == Priority::Critical && cell.would_drop_rps > 0.01;
        match buckets.last_mut() {
            Some(last) if last.bucket == bucket => {
                last.offered_rps += cell.offered_rps;
                last.admitted_rps += cell.admitted_rps;
                last.would_admit_rps += cell.would_admit_rps;
                last.would_drop_rps += cell.would_drop_rps;
                last.cells.push(cell);
            }
            _ => buckets.push(BucketWhatIf {
                limit_rps: limits.get(&bucket).copied().flatten(),
                adaptive: adaptive.get(&*bucket).copied(),
                bucket,
                offered_rps: cell.offered_rps,
                admitted_rps: cell.admitted_rps,
                would_admit_rps: cell.would_admit_rps,
                would_drop_rps: cell.would_drop_rps,
                cells: vec![cell],
            }),
        }
    }
    WhatIf {
        intervals,
        seconds: intervals as f64 * interval.as_duration().as_secs_f64(),
        critical_dropped,
        buckets,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use std::collections::HashMap;

    use super::*;
    use crate::config::Config;
    use crate::fleet::health::UpstreamHealth;
    use crate::fleet::{BucketLoad, BucketTraffic, CellLoad, FleetLoad};
    use sluice_core::histogram::LatencyHistogram;

    fn cell(tenant: &str, priority: Priority, offered: f64) -> CellLoad {
        CellLoad {
            tenant: Arc::from(tenant),
            priority,
            load: BucketLoad {
                offered_rps: offered,
                admitted_rps: offered,
                proxies_reporting: 2,
                stale_share: 0.0,
                requests_rps: 0.0,
            },
            shadow_dropped_rps: 0.0,
            charges: None,
        }
    }

    /// 300 rps offered to `acme` for 20 s, all admitted (no limit then):
    /// 100 CRITICAL, 200 BULK; no upstream signals.
    fn unlimited_history() -> Vec<Recorded> {
        history_with(HashMap::new())
    }

    /// [`unlimited_history`], every interval with `health`.
    fn history_with(health: HashMap<String, UpstreamHealth>) -> Vec<Recorded> {
        (0..40)
            .map(|_| {
                let mut bucket = BucketTraffic::from_cells(
                    "acme",
                    vec![
                        cell("", Priority::Critical, 100.0),
                        cell("", Priority::Bulk, 200.0),
                    ],
                );
                bucket.load.proxies_reporting = 2;
                Recorded {
                    load: FleetLoad::new(vec![bucket]),
                    health: health.clone(),
                }
            })
            .collect()
    }

    /// `acme`'s upstream answering 100 sampled responses at `p99_ms`.
    fn acme_at(p99_ms: u64) -> HashMap<String, UpstreamHealth> {
        let mut latency = LatencyHistogram::default();
        for _ in 0..100 {
            latency.record(p99_ms * 1_000);
        }
        let health = UpstreamHealth {
            responses: 100,
            errors: 0,
            latency,
        };
        HashMap::from([("acme".to_owned(), health)])
    }

    #[test]
    fn a_proposed_adaptive_limit_moves_on_the_recorded_signals() {
        let adaptive = "limits:\n  - bucket: acme\n    limit_rps: 1000\n\
             adaptive:\n  - bucket: acme\n    target_p99_ms: 100\n    \
             min_rps: 60\n    max_rps: 1000\n    algorithm: aimd\n";
        let interval = ControlInterval::default();
        // The upstream answered in 300 ms all along: the limit falls from
        // the configured 1000 towards its floor, BULK shed first.
        let slow = replay(&history_with(acme_at(300)), &policy(adaptive), interval);
        let acme = &slow.buckets[0];
        let path = acme.adaptive.unwrap();
        assert!(path.last_rps < path.first_rps, "{path:?}");
        assert!(path.min_rps >= 60.0 && path.max_rps <= 1000.0, "{path:?}");
        assert_eq!(acme.limit_rps, Some(path.last_rps));
        assert!(acme.would_drop_rps > 0.0, "{acme:?}");
        let bulk = &acme.cells[1];
        assert_eq!(bulk.priority, Priority::Bulk);
        assert!(bulk.would_drop_rps > acme.cells[0].would_drop_rps);
        // Answering in 20 ms: the limit holds where it was, nothing drops.
        let fast = replay(&history_with(acme_at(20)), &policy(adaptive), interval);
        let path = fast.buckets[0].adaptive.unwrap();
        assert_eq!((path.min_rps, path.last_rps), (1000.0, 1000.0), "{path:?}");
        assert!(fast.buckets[0].would_drop_rps < 1e-9);
        // Not adaptive in the proposal: no path.
        let fixed = replay(
            &history_with(acme_at(300)),
            &policy("limits:\n  - bucket: acme\n    limit_rps: 150\n"),
            interval,
        );
        assert_eq!(fixed.buckets[0].adaptive, None);
    }

    fn policy(yaml: &str) -> Policy {
        Config::from_yaml(yaml, "whatif.yaml").unwrap().policy()
    }

    #[test]
    fn a_proposed_limit_sheds_bulk_first_and_spares_critical() {
        let loads = unlimited_history();
        let interval = ControlInterval::default();
        let proposal = policy("limits:\n  - bucket: acme\n    limit_rps: 150\n");
        let whatif = replay(&loads, &proposal, interval);
        assert_eq!(whatif.intervals, 40);
        let acme = &whatif.buckets[0];
        assert_eq!(acme.limit_rps, Some(150.0));
        assert!((acme.offered_rps - 300.0).abs() < 1e-9);
        assert!((acme.admitted_rps - 300.0).abs() < 1e-9, "as recorded");
        // The first interval stands as recorded; the rest converge on 150.
        assert!(
            (acme.would_admit_rps - 150.0).abs() < 0.1 * 150.0,
            "{acme:?}"
        );
        let critical = &acme.cells[0];
        assert_eq!(critical.priority, Priority::Critical);
        assert!(critical.would_drop_rps < 0.01, "{critical:?}");
        assert!(!whatif.critical_dropped);

        // Below the critical traffic itself, CRITICAL drops are flagged.
        let tight = policy("limits:\n  - bucket: acme\n    limit_rps: 50\n");
        let whatif = replay(&loads, &tight, interval);
        assert!(whatif.critical_dropped, "{whatif:?}");
    }

    #[test]
    fn no_limit_drops_nothing_and_no_history_answers_empty() {
        let loads = unlimited_history();
        let whatif = replay(&loads, &policy("limits: []\n"), ControlInterval::default());
        assert!(whatif.buckets[0].would_drop_rps < 1e-9);
        assert_eq!(whatif.buckets[0].limit_rps, None);
        let empty = replay(&[], &policy("limits: []\n"), ControlInterval::default());
        assert_eq!(empty.intervals, 0);
        assert!(empty.buckets.is_empty());
    }
}
