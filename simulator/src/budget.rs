//! How closely a cost budget is held: the cost charged against the budget
//! over consecutive 1 s and 10 s windows, each tenant's against its fair
//! share, and the first seconds after the load step.
//!
//! The windows are consecutive (not sliding) and count the cost the
//! filters charged by when each stream ended, as a provider bills it; the
//! estimates admitted are counted by when each request was decided.
//! "Steady" is from `settle_ms` after the last load step (or the start)
//! to the end of the run.

use sluice_control_plane::control::fairness::{TenantDemand, allocate};
use sluice_core::{CLASSES, Priority};

use crate::scenario::Scenario;
use crate::sim::{CostTrace, SLOT_MS, Trace};

/// A budget run's metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetMetrics {
    /// The budget's unit.
    pub unit: String,
    /// The budget, in its unit a second.
    pub budget_per_s: f64,
    /// The steady span measured: from, to.
    pub steady_ms: (u64, u64),
    /// Estimates offered a second over the steady span.
    pub offered_per_s: f64,
    /// Estimates admitted a second over it, by decision.
    pub admitted_per_s: f64,
    /// Cost charged a second over it, by stream end.
    pub charged_per_s: f64,
    /// Consecutive 10 s windows of the cost charged over the steady span
    /// against ±5 %.
    pub windows_10s: Windows,
    /// Consecutive 1 s windows of it against ±10 %.
    pub windows_1s: Windows,
    /// Consecutive 10 s windows of the estimates admitted, by decision.
    pub admitted_10s: Windows,
    /// Consecutive 1 s windows of them.
    pub admitted_1s: Windows,
    /// Per tenant, in scenario order.
    pub tenants: Vec<TenantCost>,
    /// After the load step, when the run has one.
    pub step: Option<StepOvershoot>,
    /// Streams the filters charged over the run.
    pub charges: u64,
    /// Of them, those charged their estimate (no usage read).
    pub charged_estimate: u64,
    /// The cost they were charged.
    pub charged_total: u64,
    /// The charged cost the proxies' reports carried to the control plane
    /// (the charges of the last, unfinished report windows are missing).
    pub charged_reported: f64,
    /// The run's length, in seconds.
    pub run_s: f64,
    /// Directive batches the controller pushed over the run.
    pub batches_pushed: u64,
    /// Directives those batches carried.
    pub directives_pushed: u64,
}

/// How many consecutive windows of a length were within a tolerance of
/// the budget, and the spread of their errors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Windows {
    /// Their length.
    pub seconds: u64,
    /// The tolerance, as a fraction of the budget.
    pub tolerance: f64,
    /// Windows within it.
    pub within: usize,
    /// Windows in all.
    pub count: usize,
    /// Mean relative error.
    pub mean: f64,
    /// Root mean square of the relative errors.
    pub rms: f64,
}

impl Windows {
    /// The fraction of windows within the tolerance; `None` without
    /// windows.
    pub fn fraction(&self) -> Option<f64> {
        (self.count > 0).then(|| self.within as f64 / self.count as f64)
    }
}

/// One tenant's cost over the steady span.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantCost {
    /// Tenant name.
    pub tenant: String,
    /// Its weight.
    pub weight: f64,
    /// Estimates it offered a second.
    pub offered_per_s: f64,
    /// Its weighted max-min fair share of the budget at what the tenants
    /// offered.
    pub fair_share_per_s: f64,
    /// Cost charged to it a second.
    pub charged_per_s: f64,
}

impl TenantCost {
    /// Charged over fair share, minus 1; `None` without a share.
    pub fn error(&self) -> Option<f64> {
        (self.fair_share_per_s > 0.0).then(|| self.charged_per_s / self.fair_share_per_s - 1.0)
    }
}

/// The first seconds after the load step, against the budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepOvershoot {
    /// When the load stepped.
    pub at_ms: u64,
    /// Estimates admitted over the first second, over the budget's, − 1.
    pub admitted_1s: f64,
    /// Estimates admitted over the first 10 s, over the budget's, − 1.
    pub admitted_10s: f64,
    /// Cost charged over the first 10 s, over the budget's, − 1.
    pub charged_10s: f64,
}

/// The tolerance of 10 s windows.
const TOLERANCE_10S: f64 = 0.05;
/// The tolerance of 1 s windows.
const TOLERANCE_1S: f64 = 0.10;

/// The metrics of a budget run; `None` unless `scenario` has costs and
/// `trace` recorded them.
pub fn compute(scenario: &Scenario, trace: &Trace) -> Option<BudgetMetrics> {
    let costs = scenario.costs.as_ref()?;
    let spec = scenario.buckets.first()?;
    let bucket = trace.buckets.first()?;
    let cost = bucket.cost.as_ref()?;
    let budget = spec.limit_rps;
    let steps = scenario.load_steps();
    let settled_from = steps.last().copied().unwrap_or(0) + scenario.settle_ms;
    let from = slot_of(settled_from).min(cost.charged.len());
    let to = cost.charged.len();
    let seconds = ((to - from) as u64 * SLOT_MS) as f64 / 1000.0;
    let rate = |counts: &[u64]| {
        let sum: u64 = counts.get(from..to).unwrap_or(&[]).iter().sum();
        if seconds > 0.0 {
            sum as f64 / seconds
        } else {
            0.0
        }
    };
    let steady = cost.charged.get(from..to).unwrap_or(&[]);
    let admitted = cost.admitted.get(from..to).unwrap_or(&[]);
    let offered: Vec<f64> = bucket
        .tenants
        .iter()
        .map(|t| t.cost.as_ref().map_or(0.0, |c| rate(&c.offered)))
        .collect();
    let demands: Vec<TenantDemand> = spec
        .tenants
        .iter()
        .zip(&offered)
        .map(|(tenant, &rps)| {
            let mut by_class = [0.0; CLASSES];
            if let Some(o) = by_class.get_mut(Priority::Unspecified.class()) {
                *o = rps;
            }
            TenantDemand {
                weight: tenant.weight,
                floor: tenant.min_floor_rps,
                offered: by_class,
            }
        })
        .collect();
    let allocation = allocate(budget, &demands);
    let tenants = spec
        .tenants
        .iter()
        .zip(&bucket.tenants)
        .zip(offered)
        .zip(&allocation.tenants)
        .map(|(((tenant, recorded), offered), share)| TenantCost {
            tenant: tenant.name.clone(),
            weight: tenant.weight,
            offered_per_s: offered,
            fair_share_per_s: share.admitted.iter().sum(),
            charged_per_s: recorded.cost.as_ref().map_or(0.0, |c| rate(&c.charged)),
        })
        .collect();
    Some(BudgetMetrics {
        unit: costs.unit.clone(),
        budget_per_s: budget,
        steady_ms: (from as u64 * SLOT_MS, to as u64 * SLOT_MS),
        offered_per_s: rate(&cost.offered),
        admitted_per_s: rate(&cost.admitted),
        charged_per_s: rate(&cost.charged),
        windows_10s: windows(steady, 10, TOLERANCE_10S, budget),
        windows_1s: windows(steady, 1, TOLERANCE_1S, budget),
        admitted_10s: windows(admitted, 10, TOLERANCE_10S, budget),
        admitted_1s: windows(admitted, 1, TOLERANCE_1S, budget),
        tenants,
        step: steps.last().map(|&at_ms| step(cost, at_ms, budget)),
        charges: cost.charges,
        charged_estimate: cost.charged_estimate,
        charged_total: cost.charged.iter().sum(),
        charged_reported: trace.charged_reported,
        run_s: scenario.duration_ms as f64 / 1000.0,
        batches_pushed: trace.batches_pushed,
        directives_pushed: trace.directives_pushed,
    })
}

fn slot_of(t_ms: u64) -> usize {
    usize::try_from(t_ms / SLOT_MS).unwrap_or(usize::MAX)
}

/// The relative errors of consecutive windows of `seconds` of `slots`
/// against `budget` a second (a last, partial window is left out).
pub fn window_errors(slots: &[u64], seconds: u64, budget: f64) -> Vec<f64> {
    let per_window = slot_of(seconds * 1_000).max(1);
    slots
        .chunks_exact(per_window)
        .map(|window| window.iter().sum::<u64>() as f64 / seconds as f64 / budget - 1.0)
        .collect()
}

fn windows(slots: &[u64], seconds: u64, tolerance: f64, budget: f64) -> Windows {
    let errors = window_errors(slots, seconds, budget);
    let count = errors.len();
    let n = count.max(1) as f64;
    Windows {
        seconds,
        tolerance,
        within: errors.iter().filter(|e| e.abs() <= tolerance).count(),
        count,
        mean: errors.iter().sum::<f64>() / n,
        rms: (errors.iter().map(|e| e * e).sum::<f64>() / n).sqrt(),
    }
}

fn step(cost: &CostTrace, at_ms: u64, budget: f64) -> StepOvershoot {
    let over = |counts: &[u64], seconds: u64| {
        let from = slot_of(at_ms);
        let to = slot_of(at_ms + seconds * 1_000);
        let window = counts.get(from..to.min(counts.len())).unwrap_or(&[]);
        let spanned = (window.len() as u64 * SLOT_MS) as f64 / 1000.0;
        if spanned > 0.0 {
            window.iter().sum::<u64>() as f64 / spanned / budget - 1.0
        } else {
            0.0
        }
    };
    StepOvershoot {
        at_ms,
        admitted_1s: over(&cost.admitted, 1),
        admitted_10s: over(&cost.admitted, 10),
        charged_10s: over(&cost.charged, 10),
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_consecutive_and_leave_out_a_partial_one() {
        // 25 slots of 2,000 units: 2 whole seconds at 20,000 a second.
        let errors = window_errors(&[2_000; 25], 1, 20_000.0);
        assert_eq!(errors, [0.0, 0.0]);
        let mut slots = vec![2_000; 20];
        slots[3] = 4_000;
        let spread = windows(&slots, 1, 0.10, 20_000.0);
        assert_eq!((spread.within, spread.count), (1, 2));
        assert!((spread.mean - 0.05).abs() < 1e-12);
        assert!((spread.rms - 0.1 / 2f64.sqrt()).abs() < 1e-12);
        assert_eq!(spread.fraction(), Some(0.5));
    }
}
