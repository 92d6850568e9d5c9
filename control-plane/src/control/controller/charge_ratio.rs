//! How far a budget's actual charges run from the estimates it is steered
//! on: the factor that holds the budget in charged cost while every
//! decision is made on estimates.
//!
//! Decisions are made before a response's cost is known, on its estimate
//! (a constant, a header, the request's size), and the charge lands when
//! its stream ends. An estimate that runs low (a client stating fewer
//! tokens than it uses, an operator's constant set too low) would let the
//! actual spend exceed the budget by that factor; one that runs high would
//! leave budget unused. So the controller divides the budget on the
//! estimates' scale: a bucket whose streams are charged `k` times what
//! they were counted is steered to `budget / k` of estimates, and its
//! demands are weighed `k` times theirs in the fair division, so the
//! shares stay in the budget's unit. Each cell (a tenant's, a priority's)
//! has its own `k` as far as its requests say, so a tenant whose estimates
//! alone run low is held to its own share; a cell with few requests
//! borrows the bucket's ([`ChargeRatio::cell_factor`]).
//!
//! The filters report, beside each window's charges, the estimates those
//! very streams were counted (`settled_cost`), so the ratio compares a
//! stream's charge with its own estimate whenever it ends: a charge that
//! lands seconds after its decision does not read as estimates running
//! high while the admissions grow (comparing with the cost admitted in the
//! same seconds did, and loosened a budget at every rise of its load).
//! The ratio is one of exponential sums of both (a mean age of
//! [`HORIZON_S`]), bounded by [`MAX_FACTOR`] either way; until
//! [`MIN_EVIDENCE_S`] of intervals settled something it may tighten the
//! budget but not loosen it (taken as 1 when below 1). Charges without
//! the settled estimates beside them (older proxies) count on the
//! charged side only, which can only tighten the budget.

use crate::fleet::{CellCharges, MAX_CHARGE_RATIO};

/// The mean age of the sums, in seconds.
pub(crate) const HORIZON_S: f64 = 30.0;
/// Seconds of intervals that settled something before a factor below 1
/// counts.
pub(crate) const MIN_EVIDENCE_S: f64 = 10.0;
/// The factor is at most this and at least its inverse: an estimate off by
/// more is a configuration to fix, not a noise to follow (one proxy's
/// charges count within as much of their estimates).
pub(crate) const MAX_FACTOR: f64 = MAX_CHARGE_RATIO;
/// A cell's own ratio counts as much as the bucket's when it rests on this
/// many admitted requests over the horizon, and more the more it rests on:
/// a ratio of a few requests is mostly the noise of their sizes (a
/// response's tokens against a constant estimate vary by about 1.7 times
/// their mean), while a cell whose estimates run consistently low must be
/// held to its own ratio, not the bucket's.
pub(crate) const CELL_PRIOR_REQUESTS: f64 = 10.0;

/// Charged cost and the estimates of the same streams, summed over
/// [`HORIZON_S`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct ChargeRatio {
    charged: f64,
    settled: f64,
    /// Requests admitted per second (0 when not known).
    requests: f64,
    evidence_s: f64,
}

impl ChargeRatio {
    /// Takes an interval of `seconds` in which streams were charged
    /// `charges` and `requests` were admitted per second.
    pub(crate) fn observe(&mut self, charges: CellCharges, requests: f64, seconds: f64) {
        self.observe_rates(
            (charges.charged_per_s, charges.settled_per_s),
            requests,
            seconds,
        );
    }

    /// Takes an interval of `seconds` in which streams were `charged` per
    /// second and had been counted `settled` per second of estimates, and
    /// `requests` were admitted per second (0 if not known). An interval
    /// with a rate that is not finite and non-negative leaves it as it was.
    pub(crate) fn observe_rates(
        &mut self,
        (charged, settled): (f64, f64),
        requests: f64,
        seconds: f64,
    ) {
        let valid = |rate: f64| rate.is_finite() && rate >= 0.0;
        if !(valid(charged) && valid(settled) && seconds.is_finite() && seconds > 0.0) {
            return;
        }
        let requests = if valid(requests) { requests } else { 0.0 };
        let weight = (seconds / HORIZON_S).min(1.0);
        self.charged += weight * (charged - self.charged);
        self.settled += weight * (settled - self.settled);
        self.requests += weight * (requests - self.requests);
        if settled > 0.0 {
            self.evidence_s = (self.evidence_s + seconds).min(HORIZON_S);
        }
    }

    /// Charged cost per unit of settled estimate: the ratio of the sums
    /// within the bounds, at least 1 until there is evidence.
    pub(crate) fn factor(&self) -> f64 {
        self.log_ratio().map_or(1.0, bounded)
    }

    /// A cell's factor in a bucket whose sums are `bucket`'s: the log of
    /// its own ratio and the bucket's, weighed by the requests its own
    /// rests on against [`CELL_PRIOR_REQUESTS`] (none known, or no
    /// evidence of its own: the bucket's alone).
    pub(crate) fn cell_factor(&self, bucket: &Self) -> f64 {
        let Some(bucket_log) = bucket.log_ratio() else {
            return 1.0;
        };
        let log = match self.log_ratio() {
            Some(own) => {
                let rests_on = self.requests * HORIZON_S;
                let weight = rests_on / (rests_on + CELL_PRIOR_REQUESTS);
                weight * own + (1.0 - weight) * bucket_log
            }
            None => bucket_log,
        };
        bounded(log)
    }

    /// The log of charged over settled, once there is evidence; before
    /// it, only a ratio above 1: the first seconds of charges (after a
    /// start, a restart, a new budget) may tighten the budget at once but
    /// not loosen it, since a ratio of a few streams is mostly their
    /// sizes' noise, and waiting for the evidence to tighten let estimates
    /// that run `k` times low admit `k` times the budget until then.
    fn log_ratio(&self) -> Option<f64> {
        if !(self.settled > 0.0 && self.charged > 0.0) {
            return None;
        }
        let log = (self.charged / self.settled).ln();
        let enough = self.evidence_s >= MIN_EVIDENCE_S || log > 0.0;
        (enough && log.is_finite()).then_some(log)
    }
}

/// A log ratio within the bounds, as a factor.
fn bounded(log: f64) -> f64 {
    let bound = MAX_FACTOR.ln();
    let factor = log.clamp(-bound, bound).exp();
    if factor.is_finite() { factor } else { 1.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streams settled and charged per second, in requests of 1,000.
    fn observe(ratio: &mut ChargeRatio, settled_per_s: f64, charged_per_s: f64, seconds: f64) {
        let charges = CellCharges {
            charged_per_s,
            settled_per_s,
        };
        ratio.observe(charges, settled_per_s / 1_000.0, seconds);
    }

    fn after(seconds: f64, settled: f64, charged: f64) -> ChargeRatio {
        let mut ratio = ChargeRatio::default();
        for _ in 0..(seconds / 0.5) as usize {
            observe(&mut ratio, settled, charged, 0.5);
        }
        ratio
    }

    fn near(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn estimates_that_run_low_tighten_at_once_and_high_ones_loosen_after_the_evidence() {
        // Charged more than estimated: from the first interval.
        assert!(near(after(0.5, 10_000.0, 15_000.0).factor(), 1.5));
        assert!(near(after(10.0, 10_000.0, 15_000.0).factor(), 1.5));
        // Charged less: only after 10 s of intervals settled something.
        assert_eq!(after(9.5, 10_000.0, 5_000.0).factor(), 1.0);
        assert!(near(after(10.0, 10_000.0, 5_000.0).factor(), 0.5));
        assert!(near(after(60.0, 10_000.0, 5_000.0).factor(), 0.5));
        assert!(near(after(60.0, 10_000.0, 10_000.0).factor(), 1.0));
    }

    #[test]
    fn the_factor_is_bounded_and_follows_a_change_over_the_horizon() {
        assert!(near(after(60.0, 1.0, 1_000.0).factor(), MAX_FACTOR));
        assert!(near(after(60.0, 1_000.0, 1.0).factor(), 1.0 / MAX_FACTOR));
        let mut ratio = after(120.0, 10_000.0, 20_000.0);
        for _ in 0..20 {
            observe(&mut ratio, 10_000.0, 10_000.0, 0.5);
        }
        // Ten seconds of exact charges move it a third of the way back.
        let moved = ratio.factor();
        assert!(moved > 1.5 && moved < 1.8, "{moved}");
    }

    #[test]
    fn a_pause_in_the_charges_keeps_the_ratio() {
        // Nothing ends for a while (long responses, or no traffic): both
        // sums fade alike and the ratio stays what the streams said.
        let mut ratio = after(60.0, 10_000.0, 5_000.0);
        for _ in 0..60 {
            observe(&mut ratio, 0.0, 0.0, 0.5);
        }
        assert!(near(ratio.factor(), 0.5), "{}", ratio.factor());
    }

    #[test]
    fn charges_without_their_estimates_only_tighten() {
        // Older proxies report charges without the settled estimates: a
        // fleet of them says nothing, and mixed in they raise the ratio.
        assert_eq!(after(60.0, 0.0, 10_000.0).factor(), 1.0);
        let mut mixed = ChargeRatio::default();
        for _ in 0..120 {
            observe(&mut mixed, 5_000.0, 10_000.0, 0.5);
        }
        assert!(mixed.factor() > 1.0);
    }

    #[test]
    fn nothing_charged_or_nonsense_leaves_the_budget_as_written() {
        assert_eq!(after(60.0, 10_000.0, 0.0).factor(), 1.0);
        assert_eq!(ChargeRatio::default().factor(), 1.0);
        let mut ratio = after(60.0, 10_000.0, 12_000.0);
        let before = ratio;
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            observe(&mut ratio, bad, 1.0, 0.5);
            observe(&mut ratio, 1.0, bad, 0.5);
            observe(&mut ratio, 10_000.0, 12_000.0, bad);
        }
        assert_eq!(ratio, before);
    }

    #[test]
    fn a_cell_goes_by_its_own_ratio_as_far_as_its_requests_say() {
        // The bucket: charged 1.5x its estimates.
        let bucket = after(60.0, 20_000.0, 30_000.0);
        let bucket_factor = bucket.factor();
        // The sums after 60 s have filled to 1 - e^-2 of the rates.
        let filled = 1.0 - (1.0 - 0.5 / HORIZON_S).powi(120);
        let weight = |rps: f64| {
            let rests_on = rps * filled * HORIZON_S;
            rests_on / (rests_on + CELL_PRIOR_REQUESTS)
        };
        let blend = |weight: f64| (weight * 3f64.ln() + (1.0 - weight) * 1.5f64.ln()).exp();
        // A busy cell charged 3x: 5 requests a second, about 130 over the
        // horizon, counts almost alone.
        let busy = after(60.0, 5_000.0, 15_000.0).cell_factor(&bucket);
        assert!(weight(5.0) > 0.9);
        assert!((busy - blend(weight(5.0))).abs() < 1e-6, "{busy}");
        // A sparse one, a request every 10 s, mostly goes by the bucket.
        let sparse = after(60.0, 100.0, 300.0).cell_factor(&bucket);
        assert!(weight(0.1) < 0.25);
        assert!((sparse - blend(weight(0.1))).abs() < 1e-6, "{sparse}");
        // A cell without evidence of its own, or with no request rate,
        // goes by the bucket alone.
        let new = ChargeRatio::default().cell_factor(&bucket);
        assert!(near(new, bucket_factor), "{new}");
        let mut unknown = ChargeRatio::default();
        for _ in 0..120 {
            unknown.observe_rates((15_000.0, 5_000.0), f64::NAN, 0.5);
        }
        let unknown = unknown.cell_factor(&bucket);
        assert!(near(unknown, bucket_factor), "{unknown}");
        // A bucket without evidence: 1 for every cell.
        let cell = after(60.0, 5_000.0, 15_000.0);
        assert_eq!(cell.cell_factor(&ChargeRatio::default()), 1.0);
    }
}
