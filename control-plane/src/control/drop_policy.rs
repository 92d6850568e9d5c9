//! The per-cell drop ratio: the [`DropPolicy`] trait and the default,
//! proportional policy.

use crate::fleet::BucketLoad;
use crate::types::LimitRps;
use sluice_core::{DropRatio, Priority};

/// The drop ratio that brings `offered_rps` down to `limit`:
/// `max(0, (offered − limit) / offered)`, and 0 when nothing is offered or
/// the bucket is unlimited.
pub(crate) fn drop_ratio(offered_rps: f64, limit: Option<LimitRps>) -> DropRatio {
    match limit {
        Some(limit) if offered_rps > 0.0 => {
            DropRatio::saturating((offered_rps - limit.get()) / offered_rps)
        }
        _ => DropRatio::NEVER,
    }
}

/// Decides a cell's drop ratio each control interval.
///
/// The default, [`Proportional`], is stateless; the trait takes `&mut self`
/// and the full [`BucketLoad`] so that a feedback controller (one that also
/// looks at the admitted rate or smooths over time) can replace it without
/// touching the loop or the change detection.
///
/// The controller calls it once per cell: `load` is the cell's fleet load
/// and `limit` the cell's admitted share (the target), or `None` when the
/// bucket is unlimited. A bucket without tenants or priorities has exactly
/// one cell, whose share is the bucket's limit.
pub trait DropPolicy: Send + 'static {
    /// The drop ratio for `bucket` given its fleet load and limit.
    fn drop_ratio(&mut self, bucket: &str, load: &BucketLoad, limit: Option<LimitRps>)
    -> DropRatio;

    /// The drop ratio of one cell; by default [`DropPolicy::drop_ratio`]
    /// with the cell's load and share. A policy that keeps state per key
    /// overrides this to key it by the whole cell.
    fn cell_drop_ratio(
        &mut self,
        bucket: &str,
        _tenant: &str,
        _priority: Priority,
        load: &BucketLoad,
        share: Option<LimitRps>,
    ) -> DropRatio {
        self.drop_ratio(bucket, load, share)
    }

    /// [`DropPolicy::cell_drop_ratio`] for a cell whose `load` and `share`
    /// are in `signal`'s units. By default the same as for requests; a
    /// policy that smooths picks its horizon by the signal's noise.
    fn signal_drop_ratio(
        &mut self,
        bucket: &str,
        tenant: &str,
        priority: Priority,
        load: &BucketLoad,
        share: Option<LimitRps>,
        _signal: Signal,
    ) -> DropRatio {
        self.cell_drop_ratio(bucket, tenant, priority, load, share)
    }

    /// The offered rate a cell of a limited bucket counts for in the fair
    /// division, called for each of the bucket's cells before their
    /// [`DropPolicy::signal_drop_ratio`] in the same interval. By default
    /// its load's; a policy that estimates a noisy signal returns its
    /// estimate, so the shares are divided on what the ratios are computed
    /// from, and takes that interval into its state here rather than again
    /// in the ratio.
    fn offered_estimate(
        &mut self,
        _bucket: &str,
        _tenant: &str,
        _priority: Priority,
        load: &BucketLoad,
        _signal: Signal,
    ) -> f64 {
        load.offered_rps
    }

    /// The mean cost per request of a cell steered on cost, as this policy
    /// estimates it over its long horizon, after the interval's
    /// [`DropPolicy::offered_estimate`]; `None` (the default) when it
    /// keeps none. The controller bounds what one request's estimate counts
    /// at a multiple of it.
    fn mean_cost(&mut self, _bucket: &str, _tenant: &str, _priority: Priority) -> Option<f64> {
        None
    }
}

/// What a cell's rates count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Signal {
    /// Requests per second: Poisson counts.
    #[default]
    Requests,
    /// Estimated cost per second (a budget): a compound Poisson sum, whose
    /// variance grows with the mean square of the cost.
    Cost,
}

/// Drops exactly the excess of the offered rate over the target.
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
