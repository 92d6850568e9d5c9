//! Accuracy metrics computed from a [`Trace`].
//!
//! Rates are measured over sliding windows of 1 s and 10 s that advance one
//! [`SLOT_MS`] slot at a time. "Steady state" excludes the first
//! `settle_ms` after the start and after every disturbance (load step,
//! proxy joining or leaving). Error, utilisation and oscillation count only
//! windows where the offered rate exceeds the limit: below it, Sluice has
//! nothing to do.

use sluice_control_plane::control::fairness::{TenantDemand, allocate};
use sluice_core::{CLASSES, Priority};

use crate::scenario::{BucketSpec, Scenario};
use crate::sim::{BucketTrace, SLOT_MS, Trace};

/// Slots in a 1 s window.
const SHORT_SLOTS: usize = (1_000 / SLOT_MS) as usize;
/// Slots in a 10 s window.
const LONG_SLOTS: usize = (10_000 / SLOT_MS) as usize;
/// Converged means within this fraction of the target.
pub const CONVERGENCE_TOLERANCE: f64 = 0.02;
/// How far after a step its overshoot is looked for.
const OVERSHOOT_HORIZON_MS: u64 = 5_000;

/// The outcome of one scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct RunMetrics {
    /// p95 of |admitted − limit| / limit over 1 s steady-state windows above
    /// the limit; `None` when there is no such window.
    pub error_p95_1s: Option<f64>,
    /// The same over 10 s windows.
    pub error_p95_10s: Option<f64>,
    /// Largest (admitted − limit) / limit of a 1 s window ending within 5 s
    /// after a load step, in percent; `None` without load steps.
    pub peak_overshoot_pct: Option<f64>,
    /// Per disturbance, from the disturbance to the end of the first 1 s
    /// window lying wholly after it whose admitted rate is within ±2 % of
    /// min(offered, limit); `None` for a disturbance where that never
    /// happened. By construction at least 1000 ms.
    pub convergence_ms: Vec<Option<u64>>,
    /// Σ admitted / Σ min(offered, limit) over steady-state 1 s windows
    /// above the limit.
    pub utilisation: Option<f64>,
    /// Sign changes of (admitted − limit) per minute, over consecutive
    /// non-overlapping steady-state 1 s windows above the limit, ignoring
    /// windows within ±2 % of the limit (a dead band for counting noise).
    pub oscillations_per_min: Option<f64>,
    /// Whether admitted ≤ offered held in every slot of every bucket.
    pub admitted_within_offered: bool,
    /// Directive batches pushed during the run.
    pub batches_pushed: u64,
    /// Per tenant of every bucket with tenants, in scenario order.
    pub tenants: Vec<TenantShare>,
}

/// How one tenant of a bucket fared against its weighted max-min fair
/// share, over the steady-state slots of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantShare {
    /// Bucket key.
    pub bucket: String,
    /// Tenant name.
    pub tenant: String,
    /// Its weight.
    pub weight: f64,
    /// Mean offered rate.
    pub offered_rps: f64,
    /// Mean of its fair share of the bucket's limit, as the control plane's
    /// fairness code divides it at the rates the scenario offers.
    pub fair_share_rps: f64,
    /// Mean admitted rate.
    pub admitted_rps: f64,
}

impl TenantShare {
    /// (admitted − fair share) / fair share; `None` for a zero share.
    pub fn error(&self) -> Option<f64> {
        (self.fair_share_rps > 0.0)
            .then(|| (self.admitted_rps - self.fair_share_rps) / self.fair_share_rps)
    }
}

impl RunMetrics {
    /// The largest |admitted − fair share| / fair share over the tenants;
    /// `None` without tenants.
    pub fn worst_tenant_error(&self) -> Option<f64> {
        self.tenants
            .iter()
            .filter_map(TenantShare::error)
            .map(f64::abs)
            .reduce(f64::max)
    }

    /// The slowest convergence, or `None` if some disturbance never
    /// converged or there were none.
    pub fn worst_convergence_ms(&self) -> Option<u64> {
        self.convergence_ms
            .iter()
            .try_fold(None, |worst: Option<u64>, ms| {
                ms.map(|ms| Some(worst.map_or(ms, |w| w.max(ms))))
            })
            .flatten()
    }
}

/// One window of one bucket.
#[derive(Debug, Clone, Copy)]
struct Window {
    start_ms: u64,
    end_ms: u64,
    offered_rps: f64,
    admitted_rps: f64,
    limit_rps: f64,
}

impl Window {
    fn over_limit(&self) -> bool {
        self.offered_rps > self.limit_rps
    }

    fn error(&self) -> f64 {
        (self.admitted_rps - self.limit_rps).abs() / self.limit_rps
    }

    /// What an ideal limiter would admit.
    fn target_rps(&self) -> f64 {
        self.offered_rps.min(self.limit_rps)
    }
}

/// Sliding windows of `slots` slots over one bucket, one per slot offset.
fn windows(offered: &[u64], admitted: &[u64], limit_rps: f64, slots: usize) -> Vec<Window> {
    let seconds = (slots as u64 * SLOT_MS) as f64 / 1000.0;
    offered
        .windows(slots)
        .zip(admitted.windows(slots))
        .enumerate()
        .map(|(start, (offered, admitted))| {
            let start_ms = start as u64 * SLOT_MS;
            Window {
                start_ms,
                end_ms: start_ms + slots as u64 * SLOT_MS,
                offered_rps: offered.iter().sum::<u64>() as f64 / seconds,
                admitted_rps: admitted.iter().sum::<u64>() as f64 / seconds,
                limit_rps,
            }
        })
        .collect()
}

/// Whether `[start, end)` stays clear of every settling period.
fn is_steady(window: &Window, settle_from: &[u64], settle_ms: u64) -> bool {
    settle_from
        .iter()
        .all(|&from| window.end_ms <= from || window.start_ms >= from + settle_ms)
}

/// The `q` quantile (nearest rank) of `values`; `None` if empty.
fn quantile(mut values: Vec<f64>, q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values.get(rank - 1).copied()
}

/// Computes every metric of `scenario` from its `trace`.
pub fn compute(scenario: &Scenario, trace: &Trace) -> RunMetrics {
    let disturbances = scenario.disturbances();
    let mut settle_from = vec![0];
    settle_from.extend(&disturbances);
    let load_steps = scenario.load_steps();

    let mut short_errors = Vec::new();
    let mut long_errors = Vec::new();
    let mut admitted_sum = 0.0;
    let mut target_sum = 0.0;
    let mut sign_changes = 0_u64;
    let mut oscillation_windows = 0_u64;
    let mut peak_overshoot: Option<f64> = None;
    let mut convergence_ms: Vec<Option<u64>> = Vec::new();
    let mut admitted_within_offered = true;
    let mut tenants = Vec::new();

    for (spec, bucket) in scenario.buckets.iter().zip(&trace.buckets) {
        tenants.extend(tenant_shares(scenario, &settle_from, spec, bucket));
        if spec.limit_rps <= 0.0 {
            continue;
        }
        admitted_within_offered &= bucket
            .offered
            .iter()
            .zip(&bucket.admitted)
            .all(|(offered, admitted)| admitted <= offered);

        let short = windows(
            &bucket.offered,
            &bucket.admitted,
            spec.limit_rps,
            SHORT_SLOTS,
        );
        let long = windows(
            &bucket.offered,
            &bucket.admitted,
            spec.limit_rps,
            LONG_SLOTS,
        );
        let steady_over =
            |w: &&Window| w.over_limit() && is_steady(w, &settle_from, scenario.settle_ms);

        for window in short.iter().filter(steady_over) {
            short_errors.push(window.error());
            admitted_sum += window.admitted_rps;
            target_sum += window.target_rps();
        }
        long_errors.extend(long.iter().filter(steady_over).map(Window::error));

        // Non-overlapping windows, so that one excursion is not counted once
        // per slot it spans; a gap resets the sign. Windows within the ±2 %
        // band carry no sign: an unbiased limiter's counting noise flips the
        // sign of a tiny error every other second, which is not oscillation.
        let mut previous: Option<(u64, bool)> = None;
        for window in short.iter().step_by(SHORT_SLOTS) {
            if !steady_over(&window) {
                previous = None;
                continue;
            }
            oscillation_windows += 1;
            let error = (window.admitted_rps - window.limit_rps) / window.limit_rps;
            if error.abs() <= CONVERGENCE_TOLERANCE {
                previous = previous.map(|(_, above)| (window.end_ms, above));
                continue;
            }
            let above = error > 0.0;
            if let Some((end_ms, was_above)) = previous
                && end_ms == window.start_ms
                && was_above != above
            {
                sign_changes += 1;
            }
            previous = Some((window.end_ms, above));
        }

        for &step in &load_steps {
            let horizon = step + OVERSHOOT_HORIZON_MS;
            let peak = short
                .iter()
                .filter(|w| w.end_ms > step && w.end_ms <= horizon)
                .map(|w| (w.admitted_rps - w.limit_rps) / w.limit_rps * 100.0)
                .reduce(f64::max);
            if let Some(peak) = peak {
                peak_overshoot = Some(peak_overshoot.map_or(peak, |p| p.max(peak)));
            }
        }

        // Buckets that never go over their limit cannot show the controller
        // converging; including them would only measure counting noise.
        if short.iter().any(Window::over_limit) {
            for &disturbance in &disturbances {
                let converged = short
                    .iter()
                    .filter(|w| w.start_ms >= disturbance)
                    .find(|w| {
                        let target = w.target_rps();
                        target > 0.0
                            && (w.admitted_rps - target).abs() / target <= CONVERGENCE_TOLERANCE
                    })
                    .map(|w| w.end_ms - disturbance);
                convergence_ms.push(converged);
            }
        }
    }

    let utilisation = (target_sum > 0.0).then(|| admitted_sum / target_sum);
    let oscillations_per_min = (oscillation_windows > 0)
        .then(|| sign_changes as f64 / (oscillation_windows as f64 / 60.0));
    RunMetrics {
        error_p95_1s: quantile(short_errors, 0.95),
        error_p95_10s: quantile(long_errors, 0.95),
        peak_overshoot_pct: peak_overshoot,
        convergence_ms,
        utilisation,
        oscillations_per_min,
        admitted_within_offered,
        batches_pushed: trace.batches_pushed,
        tenants,
    }
}

/// Each tenant's mean offered, fair-share and admitted rates over the
/// steady-state slots. The fair share of a slot is what
/// [`sluice_control_plane::control::fairness::allocate`] gives the tenant at the offered rates the
/// scenario sets for that slot (unclassified traffic, as the simulated
/// filter derives no priority).
fn tenant_shares(
    scenario: &Scenario,
    settle_from: &[u64],
    spec: &BucketSpec,
    bucket: &BucketTrace,
) -> Vec<TenantShare> {
    let class = Priority::Unspecified.class();
    let slots = bucket.offered.len();
    let steady: Vec<usize> = (0..slots)
        .filter(|&slot| {
            let start_ms = slot as u64 * SLOT_MS;
            let window = Window {
                start_ms,
                end_ms: start_ms + SLOT_MS,
                offered_rps: 0.0,
                admitted_rps: 0.0,
                limit_rps: spec.limit_rps,
            };
            is_steady(&window, settle_from, scenario.settle_ms)
        })
        .collect();
    let mut fair_sums = vec![0.0; spec.tenants.len()];
    for &slot in &steady {
        let demands: Vec<TenantDemand> = spec
            .tenants
            .iter()
            .zip(spec.tenant_rps_at(slot as u64 * SLOT_MS))
            .map(|(tenant, rps)| {
                let mut offered = [0.0; CLASSES];
                if let Some(o) = offered.get_mut(class) {
                    *o = rps;
                }
                TenantDemand {
                    weight: tenant.weight,
                    floor: tenant.min_floor_rps,
                    offered,
                }
            })
            .collect();
        let allocation = allocate(spec.limit_rps, &demands);
        for (sum, tenant) in fair_sums.iter_mut().zip(&allocation.tenants) {
            *sum += tenant.admitted.iter().sum::<f64>();
        }
    }
    let seconds = (steady.len() as u64 * SLOT_MS) as f64 / 1000.0;
    let per_second = |sum: f64| if seconds > 0.0 { sum / seconds } else { 0.0 };
    let count = |counts: &[u64]| {
        per_second(
            steady
                .iter()
                .filter_map(|&slot| counts.get(slot))
                .sum::<u64>() as f64,
        )
    };
    spec.tenants
        .iter()
        .zip(&bucket.tenants)
        .zip(fair_sums)
        .map(|((tenant, recorded), fair_sum)| TenantShare {
            bucket: spec.name.clone(),
            tenant: tenant.name.clone(),
            weight: tenant.weight,
            offered_rps: count(&recorded.offered),
            fair_share_rps: if steady.is_empty() {
                0.0
            } else {
                fair_sum / steady.len() as f64
            },
            admitted_rps: count(&recorded.admitted),
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;

    #[test]
    fn quantile_is_nearest_rank() {
        assert_eq!(quantile(vec![], 0.95), None);
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(values, 0.95), Some(95.0));
        assert_eq!(quantile(vec![3.0], 0.95), Some(3.0));
    }

    #[test]
    fn windows_are_rates() {
        let offered = vec![200; 20];
        let admitted = vec![100; 20];
        let short = windows(&offered, &admitted, 1_000.0, SHORT_SLOTS);
        assert_eq!(short.len(), 11);
        assert_eq!(short[0].offered_rps, 2_000.0);
        assert_eq!(short[0].admitted_rps, 1_000.0);
        assert_eq!(short[0].error(), 0.0);
        assert_eq!(short[10].end_ms, 2_000);
    }

    #[test]
    fn settling_periods_are_excluded() {
        let window = Window {
            start_ms: 2_000,
            end_ms: 3_000,
            offered_rps: 0.0,
            admitted_rps: 0.0,
            limit_rps: 1.0,
        };
        assert!(!is_steady(&window, &[0], 3_000));
        assert!(is_steady(&window, &[0], 2_000));
        assert!(!is_steady(&window, &[0, 2_500], 100));
    }
}
