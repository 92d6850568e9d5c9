//! From fleet load and limits to directives: the drop-ratio policy and the
//! change detection that decides what to push.
//!
//! Pure: no clock, no I/O, no locks. The control loop feeds it one
//! [`FleetLoad`] per control interval.

use std::collections::BTreeMap;

use serde::Serialize;
use sluice_proto::v1::Directive;

use crate::fleet::{BucketLoad, FleetLoad};
use crate::limits::LimitTable;
use crate::types::{DropRatio, LimitRps};

/// A drop ratio that moved by at most this much is not pushed again: the
/// estimate is noisy and every push goes to every proxy.
pub const CHANGE_THRESHOLD: f64 = 0.001;

/// The drop ratio that brings `offered_rps` down to `limit`:
/// `max(0, (offered − limit) / offered)`, and 0 when nothing is offered or
/// the bucket is unlimited.
pub fn drop_ratio(offered_rps: f64, limit: Option<LimitRps>) -> DropRatio {
    match limit {
        Some(limit) if offered_rps > 0.0 => {
            DropRatio::saturating((offered_rps - limit.get()) / offered_rps)
        }
        _ => DropRatio::ZERO,
    }
}

/// Decides a bucket's drop ratio each control interval.
///
/// The default, [`Proportional`], is stateless; the trait takes `&mut self`
/// and the full [`BucketLoad`] so that a feedback controller (one that also
/// looks at the admitted rate or smooths over time) can replace it without
/// touching the loop or the change detection.
pub trait DropPolicy: Send + 'static {
    /// The drop ratio for `bucket` given its fleet load and limit.
    fn drop_ratio(&mut self, bucket: &str, load: &BucketLoad, limit: Option<LimitRps>)
    -> DropRatio;
}

/// Drops exactly the excess of the offered rate over the limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct Proportional;

impl DropPolicy for Proportional {
    fn drop_ratio(
        &mut self,
        _bucket: &str,
        load: &BucketLoad,
        limit: Option<LimitRps>,
    ) -> DropRatio {
        drop_ratio(load.offered_rps, limit)
    }
}

/// One bucket as shown by `GET /v1/buckets`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BucketStatus {
    /// Bucket key.
    pub bucket: String,
    /// Effective limit; `None` (JSON null) when unlimited.
    pub limit_rps: Option<LimitRps>,
    /// Fleet offered rate estimate.
    pub offered_rps: f64,
    /// Fleet admitted rate, as reported.
    pub admitted_rps: f64,
    /// The drop ratio pushed to proxies.
    pub drop_ratio: DropRatio,
    /// Proxies with a non-zero offered rate for the bucket.
    pub proxies_reporting: u32,
}

/// The outcome of one control interval.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decision {
    /// Every bucket with traffic, sorted by bucket.
    pub buckets: Vec<BucketStatus>,
    /// Directives to push now: those that changed since they were last pushed.
    pub changed: Vec<Directive>,
    /// Everything currently pushed, for streams that connect later.
    pub snapshot: Vec<Directive>,
}

/// What proxies were last told about a bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Pushed {
    drop_ratio: DropRatio,
    limit: Option<LimitRps>,
    /// The fleet offered rate the ratio came from, for proxies' allowances.
    offered_rps: f64,
}

impl Pushed {
    fn differs_from(&self, drop_ratio: DropRatio, limit: Option<LimitRps>) -> bool {
        (self.drop_ratio.get() - drop_ratio.get()).abs() > CHANGE_THRESHOLD || self.limit != limit
    }
}

/// Runs a [`DropPolicy`] over the fleet load and tracks what was pushed.
pub struct Controller {
    policy: Box<dyn DropPolicy>,
    pushed: BTreeMap<String, Pushed>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("pushed", &self.pushed.len())
            .finish_non_exhaustive()
    }
}

impl Default for Controller {
    fn default() -> Self {
        Self::new(Proportional)
    }
}

impl Controller {
    /// A controller with nothing pushed yet.
    pub fn new(policy: impl DropPolicy) -> Self {
        Self {
            policy: Box::new(policy),
            pushed: BTreeMap::new(),
        }
    }

    /// Decides the directives for one control interval.
    ///
    /// A bucket is tracked while it has traffic. A bucket seen for the first
    /// time is always pushed, even at drop ratio 0: after a control-plane
    /// restart the proxies may still hold an old non-zero directive for it.
    /// A bucket whose traffic stopped is dropped from tracking; if its last
    /// pushed ratio was non-zero, a final ratio of 0 is pushed to lift it.
    pub fn tick(&mut self, load: &FleetLoad, limits: &LimitTable) -> Decision {
        let mut pushed = BTreeMap::new();
        let mut decision = Decision::default();

        for (bucket, bucket_load) in load.iter().filter(|(_, l)| l.offered_rps > 0.0) {
            let limit = limits.limit_for(bucket);
            let ratio = self.policy.drop_ratio(bucket, bucket_load, limit);
            let current = match self.pushed.get(bucket) {
                Some(previous) if !previous.differs_from(ratio, limit) => *previous,
                _ => {
                    decision
                        .changed
                        .push(directive(bucket, ratio, limit, bucket_load.offered_rps));
                    Pushed {
                        drop_ratio: ratio,
                        limit,
                        offered_rps: bucket_load.offered_rps,
                    }
                }
            };
            pushed.insert(bucket.clone(), current);
            decision.buckets.push(BucketStatus {
                bucket: bucket.clone(),
                limit_rps: limit,
                offered_rps: bucket_load.offered_rps,
                admitted_rps: bucket_load.admitted_rps,
                drop_ratio: current.drop_ratio,
                proxies_reporting: bucket_load.proxies_reporting,
            });
        }

        for (bucket, previous) in &self.pushed {
            if !pushed.contains_key(bucket) && previous.drop_ratio != DropRatio::ZERO {
                decision.changed.push(directive(
                    bucket,
                    DropRatio::ZERO,
                    limits.limit_for(bucket),
                    0.0,
                ));
            }
        }

        decision.snapshot = pushed
            .iter()
            .map(|(bucket, p)| directive(bucket, p.drop_ratio, p.limit, p.offered_rps))
            .collect();
        self.pushed = pushed;
        decision
    }
}

/// The wire form; on the wire `limit_rps` 0 stands for "unlimited".
fn directive(
    bucket: &str,
    drop_ratio: DropRatio,
    limit: Option<LimitRps>,
    offered_rps: f64,
) -> Directive {
    Directive {
        bucket: bucket.to_owned(),
        drop_ratio: drop_ratio.get(),
        limit_rps: limit.map_or(0.0, LimitRps::get),
        offered_rps,
        ..Default::default()
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::limits::{LimitRule, Selector};

    fn limit(rps: f64) -> LimitRps {
        LimitRps::new(rps).unwrap()
    }

    fn load(entries: &[(&str, f64)]) -> FleetLoad {
        entries
            .iter()
            .map(|&(bucket, offered_rps)| {
                let load = BucketLoad {
                    offered_rps,
                    admitted_rps: offered_rps / 2.0,
                    proxies_reporting: 1,
                };
                (bucket.to_owned(), load)
            })
            .collect()
    }

    fn table(rules: &[(&str, f64)]) -> LimitTable {
        LimitTable::from_rules(
            None,
            rules.iter().map(|&(bucket, rps)| LimitRule {
                selector: Selector::Bucket(bucket.to_owned()),
                limit_rps: limit(rps),
            }),
        )
    }

    fn buckets(directives: &[Directive]) -> Vec<(&str, f64)> {
        directives
            .iter()
            .map(|d| (d.bucket.as_str(), d.drop_ratio))
            .collect()
    }

    #[test]
    fn formula() {
        assert_eq!(drop_ratio(600.0, Some(limit(200.0))).get(), 2.0 / 3.0);
        assert_eq!(drop_ratio(200.0, Some(limit(200.0))).get(), 0.0);
        assert_eq!(drop_ratio(100.0, Some(limit(200.0))).get(), 0.0);
        assert_eq!(drop_ratio(0.0, Some(limit(200.0))).get(), 0.0);
        assert_eq!(drop_ratio(600.0, None).get(), 0.0);
        assert_eq!(drop_ratio(5.0, Some(limit(0.0))).get(), 1.0);
        assert_eq!(drop_ratio(0.0, Some(limit(0.0))).get(), 0.0);
    }

    proptest! {
        #[test]
        fn ratio_is_a_probability(offered in 0.0..1e12f64, rps in 0.0..=1e9f64) {
            let ratio = drop_ratio(offered, Some(limit(rps))).get();
            prop_assert!((0.0..=1.0).contains(&ratio));
        }

        #[test]
        fn admitted_share_respects_the_limit(offered in 0.0..1e12f64, rps in 0.0..=1e9f64) {
            let ratio = drop_ratio(offered, Some(limit(rps))).get();
            let admitted = offered * (1.0 - ratio);
            if offered > rps {
                prop_assert!(admitted <= rps + 1e-6 * rps.max(1.0), "{admitted} > {rps}");
            } else {
                prop_assert_eq!(ratio, 0.0);
                prop_assert_eq!(admitted, offered);
            }
        }

        #[test]
        fn unlimited_never_drops(offered in 0.0..1e12f64) {
            prop_assert_eq!(drop_ratio(offered, None), DropRatio::ZERO);
        }
    }

    #[test]
    fn new_buckets_are_pushed_even_at_zero() {
        let mut controller = Controller::default();
        let decision = controller.tick(
            &load(&[("acme", 600.0), ("free", 10.0)]),
            &table(&[("acme", 200.0)]),
        );
        assert_eq!(
            buckets(&decision.changed),
            [("acme", 2.0 / 3.0), ("free", 0.0)]
        );
        assert_eq!(decision.changed[0].limit_rps, 200.0);
        assert_eq!(decision.changed[1].limit_rps, 0.0, "unlimited on the wire");
        assert_eq!(decision.snapshot, decision.changed);
        assert_eq!(decision.buckets.len(), 2);
        assert_eq!(decision.buckets[0].limit_rps, Some(limit(200.0)));
        assert_eq!(decision.buckets[1].limit_rps, None);
    }

    #[test]
    fn small_changes_are_not_pushed_but_accumulate() {
        let limits = table(&[("acme", 200.0)]);
        let mut controller = Controller::default();
        controller.tick(&load(&[("acme", 400.0)]), &limits); // 0.5
        // 0.5 → 0.5006: below the threshold, nothing to push, view keeps 0.5.
        let decision = controller.tick(&load(&[("acme", 400.48)]), &limits);
        assert!(decision.changed.is_empty());
        assert_eq!(decision.buckets[0].drop_ratio.get(), 0.5);
        // Compared against what was pushed, not the previous tick: drifting
        // in small steps still ends up pushed.
        let decision = controller.tick(&load(&[("acme", 401.0)]), &limits);
        assert_eq!(decision.changed.len(), 1);
        assert!((decision.changed[0].drop_ratio - (1.0 - 200.0 / 401.0)).abs() < 1e-12);
    }

    #[test]
    fn limit_change_is_pushed_even_without_ratio_change() {
        let mut controller = Controller::default();
        controller.tick(&load(&[("acme", 100.0)]), &table(&[("acme", 200.0)]));
        let decision = controller.tick(&load(&[("acme", 100.0)]), &table(&[("acme", 300.0)]));
        assert_eq!(buckets(&decision.changed), [("acme", 0.0)]);
        assert_eq!(decision.changed[0].limit_rps, 300.0);
        let decision = controller.tick(&load(&[("acme", 100.0)]), &table(&[]));
        assert_eq!(decision.changed[0].limit_rps, 0.0, "limit removed");
    }

    #[test]
    fn limit_change_that_changes_the_ratio() {
        let mut controller = Controller::default();
        controller.tick(&load(&[("acme", 600.0)]), &table(&[("acme", 200.0)]));
        let decision = controller.tick(&load(&[("acme", 600.0)]), &table(&[("acme", 300.0)]));
        assert_eq!(buckets(&decision.changed), [("acme", 0.5)]);
    }

    #[test]
    fn stopped_bucket_is_lifted_once_then_forgotten() {
        let limits = table(&[("acme", 200.0), ("calm", 200.0)]);
        let mut controller = Controller::default();
        controller.tick(&load(&[("acme", 400.0), ("calm", 100.0)]), &limits);
        let decision = controller.tick(&load(&[]), &limits);
        assert_eq!(
            buckets(&decision.changed),
            [("acme", 0.0)],
            "calm was already at 0"
        );
        assert!(decision.snapshot.is_empty());
        assert!(decision.buckets.is_empty());
        assert!(controller.tick(&load(&[]), &limits).changed.is_empty());
    }

    #[test]
    fn unchanged_state_pushes_nothing() {
        let limits = table(&[("acme", 200.0)]);
        let mut controller = Controller::default();
        controller.tick(&load(&[("acme", 600.0)]), &limits);
        let decision = controller.tick(&load(&[("acme", 600.0)]), &limits);
        assert!(decision.changed.is_empty());
        assert_eq!(buckets(&decision.snapshot), [("acme", 2.0 / 3.0)]);
    }

    #[test]
    fn policy_can_be_swapped() {
        struct Halve;
        impl DropPolicy for Halve {
            fn drop_ratio(&mut self, _: &str, _: &BucketLoad, _: Option<LimitRps>) -> DropRatio {
                DropRatio::new(0.5).unwrap()
            }
        }
        let mut controller = Controller::new(Halve);
        let decision = controller.tick(&load(&[("x", 1.0)]), &table(&[]));
        assert_eq!(buckets(&decision.changed), [("x", 0.5)]);
    }
}
