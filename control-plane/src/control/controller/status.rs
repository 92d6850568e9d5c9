//! The buckets view the admin API serves, one control interval old.

use std::sync::Arc;

use serde::Serialize;

use crate::config::budget::Budget;
use crate::fleet::{BucketCost, CellCharges, ProxyCap};
use crate::types::LimitRps;
use sluice_core::{DropRatio, Priority, Reason};

/// One bucket as shown by `GET /v1/buckets`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct BucketStatus {
    /// Bucket key.
    pub(crate) bucket: Arc<str>,
    /// Effective limit; `None` (JSON null) when unlimited.
    pub(crate) limit_rps: Option<LimitRps>,
    /// Fleet offered rate estimate.
    pub(crate) offered_rps: f64,
    /// Fleet admitted rate, as reported.
    pub(crate) admitted_rps: f64,
    /// The largest drop ratio pushed for a cell of the bucket.
    pub(crate) drop_ratio: DropRatio,
    /// Proxies with a non-zero offered rate for the bucket.
    pub(crate) proxies_reporting: u32,
    /// Fleet rate of requests the decision would have dropped but shadow
    /// mode let through.
    pub(crate) shadow_dropped_rps: f64,
    /// The floors of the bucket's tenants alone exceed its limit, so it
    /// admits more than the limit (see [`crate::control::fairness`]).
    pub(crate) floors_exceed_limit: bool,
    /// Per (tenant, priority) cell: load, fair share and drop ratio, sorted
    /// by tenant then priority.
    pub(crate) cells: Vec<CellStatus>,
    /// The cap on one proxy's share of the bucket's fleet sum and the
    /// proxies it cut; `None` (JSON null) while fewer proxies report the
    /// bucket than a cap needs.
    pub(crate) proxy_cap: Option<ProxyCap>,
    /// The bucket's cost, when its limit is a budget or its proxies count
    /// cost; `None` (JSON null) otherwise.
    pub(crate) cost: Option<CostStatus>,
}

/// A bucket's cost as shown by `GET /v1/buckets`. With a budget, the
/// bucket's and its cells' rates (`limit_rps`, `offered_rps`,
/// `admitted_rps`, `share_rps`) are in the budget's unit per second.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct CostStatus {
    /// The budget in force; `None` (JSON null) for a bucket limited in
    /// requests whose proxies count cost.
    pub(crate) budget: Option<Budget>,
    /// Fleet estimated cost offered per second (what the controller
    /// steers a budget on).
    pub(crate) offered_per_s: f64,
    /// Fleet estimated cost admitted per second.
    pub(crate) admitted_per_s: f64,
    /// Fleet actual cost charged per second at stream end.
    pub(crate) charged_per_s: f64,
    /// How far the actual cost runs from the estimates the decisions were
    /// made on, in the last interval (above 1: the estimates are low; the
    /// controller holds a budget by its average over the last half minute,
    /// `charge_factor`): the cells' charges over the estimates of the same
    /// streams (`settled`), else, from filters that report no settled
    /// estimates, `charged_per_s / admitted_per_s` (which compares charges
    /// with what was admitted while they ended, so read it over several
    /// intervals). `None` when neither has a denominator.
    pub(crate) charged_to_estimate: Option<f64>,
    /// Under a budget, the charged cost per unit of the same streams'
    /// estimates that the controller holds the budget by (over the last
    /// half minute; 1 until the charges say enough): the cells are
    /// steered to their shares divided by it (each by its own), in
    /// estimates.
    /// `None` (JSON null) for a bucket limited in requests.
    pub(crate) charge_factor: Option<f64>,
    /// Fleet requests offered per second.
    pub(crate) offered_requests_rps: f64,
    /// Fleet requests admitted per second.
    pub(crate) admitted_requests_rps: f64,
    /// Under a budget, its cells whose proxies report requests but count
    /// no cost (no cost rule of the filter applies to them): their
    /// requests are not steered, and a budget whose every cell is such is
    /// listed with no cells.
    pub(crate) cells_without_cost: u32,
}

impl CostStatus {
    /// The status of a bucket under `budget` whose proxies offer nothing
    /// while its held cells' directives stand, held by `charge_factor`.
    pub(crate) fn held(budget: &Budget, charge_factor: f64) -> Self {
        Self {
            budget: Some(budget.clone()),
            offered_per_s: 0.0,
            admitted_per_s: 0.0,
            charged_per_s: 0.0,
            charged_to_estimate: None,
            charge_factor: Some(charge_factor),
            offered_requests_rps: 0.0,
            admitted_requests_rps: 0.0,
            cells_without_cost: 0,
        }
    }

    /// The status of `cost` under `budget`; `charges` are its cells'.
    pub(crate) fn of(
        cost: &BucketCost,
        charges: CellCharges,
        budget: Option<&Budget>,
        charge_factor: Option<f64>,
    ) -> Self {
        let charged_to_estimate = charges.ratio().or_else(|| {
            (cost.admitted_per_s > 0.0).then(|| cost.charged_per_s / cost.admitted_per_s)
        });
        Self {
            budget: budget.cloned(),
            offered_per_s: cost.offered_per_s,
            admitted_per_s: cost.admitted_per_s,
            charged_per_s: cost.charged_per_s,
            charged_to_estimate,
            charge_factor,
            offered_requests_rps: cost.offered_rps,
            admitted_requests_rps: cost.admitted_rps,
            cells_without_cost: cost.cells_without_cost,
        }
    }
}

/// One (tenant, priority) cell of a bucket as shown by `GET /v1/buckets`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct CellStatus {
    /// Tenant; empty when the filter derives none.
    pub(crate) tenant: Arc<str>,
    /// Priority as reported.
    pub(crate) priority: Priority,
    /// Fleet offered rate of the cell.
    pub(crate) offered_rps: f64,
    /// Fleet admitted rate of the cell, as reported.
    pub(crate) admitted_rps: f64,
    /// Fleet shadow-dropped rate of the cell, as reported.
    pub(crate) shadow_dropped_rps: f64,
    /// The cell's share of the limit as pushed; `None` (JSON null) when the
    /// bucket is unlimited.
    pub(crate) share_rps: Option<f64>,
    /// The drop ratio pushed to proxies.
    pub(crate) drop_ratio: DropRatio,
    /// Why the cell is dropped; `None` (JSON null) when it is not.
    pub(crate) reason: Option<Reason>,
    /// A budget cell's balance in the budget's unit: negative, cost its
    /// proxies admitted beyond its share, which the next intervals' targets
    /// repay; positive, budget left unused while it shed, made up the same
    /// way. `None` (JSON null) for a cell not limited by a budget.
    pub(crate) balance: Option<f64>,
    /// A budget cell's charged cost per unit of admitted estimate that its
    /// share is held by (its own ratio as far as its requests say, else
    /// its bucket's). `None` (JSON null) for a cell not limited by a budget.
    pub(crate) charge_factor: Option<f64>,
    /// Seconds a cell that was shedding has offered nothing while its
    /// proxies keep its directive (up to 2 s, then it is lifted); `None`
    /// (JSON null) for a cell with traffic in the interval.
    pub(crate) quiet_s: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charged_to_estimate_compares_charges_with_their_own_estimates() {
        // Streams admitted as the load rose: 30,000 tokens/s of estimates
        // admitted this interval, 24,000 charged for streams whose
        // estimates were 20,000.
        let cost = BucketCost {
            steered: true,
            offered_per_s: 60_000.0,
            admitted_per_s: 30_000.0,
            charged_per_s: 24_000.0,
            offered_rps: 60.0,
            admitted_rps: 30.0,
            cells_without_cost: 0,
        };
        let settled = CellCharges {
            charged_per_s: 24_000.0,
            settled_per_s: 20_000.0,
        };
        let status = CostStatus::of(&cost, settled, None, None);
        assert_eq!(status.charged_to_estimate, Some(1.2));
        // Filters that report no settled estimates: against the admitted.
        let status = CostStatus::of(&cost, CellCharges::default(), None, None);
        assert_eq!(status.charged_to_estimate, Some(0.8));
        let idle = BucketCost {
            admitted_per_s: 0.0,
            ..cost
        };
        let status = CostStatus::of(&idle, CellCharges::default(), None, None);
        assert_eq!(status.charged_to_estimate, None);
    }
}
