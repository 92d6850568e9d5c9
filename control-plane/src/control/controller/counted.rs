//! Which proxies of a bucket counted only in part in the fleet sum, as the
//! bucket's directives tell them, so that each admits as if it offered
//! only its counted part ([`sluice_core::proxy_cap`]).
//!
//! The share cap ([`crate::fleet::ShareCap`]) keeps one proxy's claim from
//! raising everyone's drop ratio. Without this list a capped proxy would
//! apply the fleet's ratio to its whole rate, and a proxy that is busy
//! rather than lying (one client's long-lived connection, a skewed load
//! balancer) would lift the fleet over the limit by its uncounted rate.

use std::sync::Arc;

use sluice_proto::v1::CountedProxy;

use super::decision::CHANGE_THRESHOLD;
use crate::fleet::BucketTraffic;
use crate::types::LimitRps;

/// Most proxies listed per directive: the ones with the largest uncounted
/// rates. A proxy left out applies the fleet's ratio to its whole rate.
pub(crate) const MAX_LISTED: usize = 8;

/// A bucket's partly counted proxies and the room left for their
/// uncounted rates.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct CountedProxies {
    /// (proxy id, counted fraction in [0, 1)), sorted by proxy id.
    proxies: Vec<(Arc<str>, f64)>,
    /// The fraction of the listed proxies' uncounted rates the limit still
    /// has room for.
    uncounted_admit: f64,
}

impl CountedProxies {
    /// The list for a bucket with `limit` (none for an unlimited bucket:
    /// its ratios come from a mode alone, and there is no limit to keep).
    pub(super) fn of(traffic: &BucketTraffic, limit: Option<LimitRps>) -> Self {
        let (Some(limit), Some(cap)) = (limit, traffic.proxy_cap.as_ref()) else {
            return Self::default();
        };
        let mut cut: Vec<(Arc<str>, f64, f64)> = cap
            .capped
            .iter()
            .filter(|proxy| proxy.claimed_rps > 0.0 && proxy.counted_rps < proxy.claimed_rps)
            .map(|proxy| {
                (
                    Arc::clone(&proxy.proxy_id),
                    proxy.counted_rps.max(0.0) / proxy.claimed_rps,
                    proxy.claimed_rps - proxy.counted_rps.max(0.0),
                )
            })
            .collect();
        if cut.is_empty() {
            return Self::default();
        }
        let uncounted: f64 = cut.iter().map(|(_, _, uncounted)| uncounted).sum();
        // The counted traffic is what the ratios are computed from; room
        // under the limit beyond it (the bucket does not shed) goes to the
        // uncounted rates, so a busy capped proxy may use what nobody else
        // needs and no more.
        let room = (limit.get() - traffic.load.offered_rps).max(0.0);
        let uncounted_admit = if uncounted > 0.0 {
            (room / uncounted).min(1.0)
        } else {
            0.0
        };
        cut.sort_unstable_by(|a, b| b.2.total_cmp(&a.2));
        cut.truncate(MAX_LISTED);
        let mut proxies: Vec<(Arc<str>, f64)> = cut
            .into_iter()
            .map(|(proxy_id, fraction, _)| (proxy_id, fraction))
            .collect();
        proxies.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Self {
            proxies,
            uncounted_admit,
        }
    }

    /// Whether the proxies must be told again: the list changed, or a
    /// fraction moved by more than [`CHANGE_THRESHOLD`].
    pub(super) fn differs_from(&self, previous: &Self) -> bool {
        self.proxies.len() != previous.proxies.len()
            || (self.uncounted_admit - previous.uncounted_admit).abs() > CHANGE_THRESHOLD
            || self.proxies.iter().zip(&previous.proxies).any(
                |((id, fraction), (old_id, old_fraction))| {
                    id != old_id || (fraction - old_fraction).abs() > CHANGE_THRESHOLD
                },
            )
    }

    /// The wire list.
    pub(super) fn wire(&self) -> Vec<CountedProxy> {
        self.proxies
            .iter()
            .map(|(proxy_id, counted_fraction)| CountedProxy {
                proxy_id: proxy_id.to_string(),
                counted_fraction: *counted_fraction,
            })
            .collect()
    }

    /// The wire `uncounted_admit`.
    pub(super) fn uncounted_admit(&self) -> f64 {
        if self.proxies.is_empty() {
            0.0
        } else {
            self.uncounted_admit
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;
    use crate::fleet::{BucketLoad, CappedProxy, ProxyCap};

    fn traffic(offered_rps: f64, capped: &[(&str, f64, f64)]) -> BucketTraffic {
        let mut traffic = BucketTraffic::single(
            "b",
            BucketLoad {
                offered_rps,
                ..BucketLoad::default()
            },
        );
        traffic.proxy_cap = Some(ProxyCap {
            cap_rps: 100.0,
            capped: capped
                .iter()
                .map(|&(id, claimed_rps, counted_rps)| CappedProxy {
                    proxy_id: Arc::from(id),
                    claimed_rps,
                    counted_rps,
                })
                .collect(),
        });
        traffic
    }

    fn limit(rps: f64) -> Option<LimitRps> {
        Some(LimitRps::new(rps).unwrap())
    }

    #[test]
    fn a_shedding_bucket_lists_each_cut_proxy_with_no_room() {
        // The simulator's hot proxy: 1,500 claimed, 667 counted, 2,167
        // counted in all against 1,000.
        let counted = CountedProxies::of(
            &traffic(2_167.0, &[("hot", 1_500.0, 667.0)]),
            limit(1_000.0),
        );
        let wire = counted.wire();
        assert_eq!(wire.len(), 1);
        assert_eq!(wire[0].proxy_id, "hot");
        assert!((wire[0].counted_fraction - 667.0 / 1_500.0).abs() < 1e-12);
        assert_eq!(counted.uncounted_admit(), 0.0);
    }

    #[test]
    fn room_under_the_limit_goes_to_the_uncounted_rates() {
        // 800 counted against 1,000: 200 of room for 400 uncounted.
        let counted = CountedProxies::of(
            &traffic(800.0, &[("a", 300.0, 100.0), ("b", 300.0, 100.0)]),
            limit(1_000.0),
        );
        assert!((counted.uncounted_admit() - 0.5).abs() < 1e-12);
        // No limit, nothing to keep.
        assert_eq!(
            CountedProxies::of(&traffic(800.0, &[("a", 300.0, 100.0)]), None),
            CountedProxies::default()
        );
    }

    #[test]
    fn the_list_keeps_the_largest_uncounted_rates() {
        let capped: Vec<(String, f64, f64)> = (0..20)
            .map(|i| (format!("p{i:02}"), 100.0 + f64::from(i), 50.0))
            .collect();
        let capped: Vec<(&str, f64, f64)> = capped
            .iter()
            .map(|(id, a, b)| (id.as_str(), *a, *b))
            .collect();
        let wire = CountedProxies::of(&traffic(5_000.0, &capped), limit(1_000.0)).wire();
        assert_eq!(wire.len(), MAX_LISTED);
        assert_eq!(wire[0].proxy_id, "p12");
        assert_eq!(wire[MAX_LISTED - 1].proxy_id, "p19");
    }

    #[test]
    fn small_moves_are_not_a_change() {
        let a = CountedProxies::of(
            &traffic(2_000.0, &[("hot", 1_000.0, 500.0)]),
            limit(1_000.0),
        );
        let b = CountedProxies::of(
            &traffic(2_000.0, &[("hot", 1_000.0, 500.5)]),
            limit(1_000.0),
        );
        let c = CountedProxies::of(
            &traffic(2_000.0, &[("hot", 1_000.0, 520.0)]),
            limit(1_000.0),
        );
        assert!(!b.differs_from(&a));
        assert!(c.differs_from(&a));
        assert!(CountedProxies::default().differs_from(&a));
    }
}
