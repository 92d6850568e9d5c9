//! How far a budget's actual charges run from the estimates it is steered
//! on, over a long horizon: the factor that holds the budget in charged
//! cost while every decision is made on estimates.
//!
//! Decisions are made before a response's cost is known, on its estimate
//! (a constant, a header, the request's size), and the charge lands when
//! its stream ends. An estimate that runs low (a client stating fewer
//! tokens than it uses, an operator's constant set too low) would let the
//! actual spend exceed the budget by that factor; one that runs high would
//! leave budget unused. So the controller divides the budget on the
//! estimates' scale: a bucket whose charges run `k` times its admitted
//! estimates is steered to `budget / k` of estimates, and its demands are
//! weighed `k` times theirs in the fair division, so the shares stay in the
//! budget's unit.
//!
//! The factor is a ratio of exponential sums of the charged and admitted
//! cost rates (a mean age of [`HORIZON_S`]): a charge lands one response
//! time after its estimate, so the sums are long against that lag and a
//! load step moves them both alike. It is taken as 1 until
//! [`MIN_EVIDENCE_S`] of intervals that admitted and charged something,
//! is bounded by [`MAX_FACTOR`] either way, and is drawn towards 1 by
//! [`DEAD_BAND`] (in ratio), so that exact estimates are not steered on the
//! noise of when their charges land. Only the safe side counts once the
//! charges stop while the fleet still admits ([`QUIET_S`]): a fleet whose
//! charges went missing must not read that as estimates running high.

use crate::fleet::BucketCost;

/// The mean age of the sums, in seconds.
pub(crate) const HORIZON_S: f64 = 30.0;
/// Seconds of intervals that admitted and charged something before the
/// factor counts.
pub(crate) const MIN_EVIDENCE_S: f64 = 10.0;
/// The factor is at most this and at least its inverse: an estimate off by
/// more is a configuration to fix, not a noise to follow.
pub(crate) const MAX_FACTOR: f64 = 8.0;
/// Seconds of admitting without any charge after which the factor may only
/// tighten the budget.
pub(crate) const QUIET_S: f64 = 10.0;
/// A ratio within this of 1 (either way) counts as 1, and one beyond it is
/// drawn towards 1 by as much: the charges of one interval are those of
/// streams admitted seconds before, which makes even exact estimates
/// wander by a few percent over the horizon.
pub(crate) const DEAD_BAND: f64 = 0.02;

/// A budget's charged and admitted cost, summed over [`HORIZON_S`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct ChargeRatio {
    charged: f64,
    admitted: f64,
    evidence_s: f64,
    /// Seconds of admitting since the last interval that charged something.
    quiet_s: f64,
}

impl ChargeRatio {
    /// Takes an interval of `seconds` in which the fleet admitted and was
    /// charged `cost`'s rates. Rates that are not finite and non-negative,
    /// and an interval that admitted nothing, leave it as it was.
    pub(crate) fn observe(&mut self, cost: &BucketCost, seconds: f64) {
        let (charged, admitted) = (cost.charged_per_s, cost.admitted_per_s);
        let valid = |rate: f64| rate.is_finite() && rate >= 0.0;
        let usable = valid(charged) && valid(admitted) && admitted > 0.0;
        if !(usable && seconds.is_finite() && seconds > 0.0) {
            return;
        }
        let weight = (seconds / HORIZON_S).min(1.0);
        self.charged += weight * (charged - self.charged);
        self.admitted += weight * (admitted - self.admitted);
        if charged > 0.0 {
            self.evidence_s = (self.evidence_s + seconds).min(HORIZON_S);
            self.quiet_s = 0.0;
        } else {
            self.quiet_s = (self.quiet_s + seconds).min(HORIZON_S);
        }
    }

    /// Charged cost per unit of admitted estimate: 1 until there is
    /// evidence, else the ratio of the sums within the dead band and the
    /// bounds.
    pub(crate) fn factor(&self) -> f64 {
        if self.evidence_s < MIN_EVIDENCE_S || self.admitted <= 0.0 || self.charged <= 0.0 {
            return 1.0;
        }
        let log = (self.charged / self.admitted).ln();
        let band = (1.0 + DEAD_BAND).ln();
        let drawn = log.signum() * (log.abs() - band).max(0.0);
        let bound = MAX_FACTOR.ln();
        let factor = drawn.clamp(-bound, bound).exp();
        match (factor.is_finite(), self.quiet_s > QUIET_S) {
            (false, _) => 1.0,
            (true, true) => factor.max(1.0),
            (true, false) => factor,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(admitted_per_s: f64, charged_per_s: f64) -> BucketCost {
        BucketCost {
            steered: true,
            admitted_per_s,
            charged_per_s,
            ..BucketCost::default()
        }
    }

    fn after(seconds: f64, admitted: f64, charged: f64) -> ChargeRatio {
        let mut ratio = ChargeRatio::default();
        for _ in 0..(seconds / 0.5) as usize {
            ratio.observe(&cost(admitted, charged), 0.5);
        }
        ratio
    }

    #[test]
    fn estimates_that_run_low_or_high_are_followed_after_the_evidence() {
        assert_eq!(after(9.5, 10_000.0, 15_000.0).factor(), 1.0);
        let low = after(10.0, 10_000.0, 15_000.0).factor();
        assert!((low - 1.5 / 1.02).abs() < 1e-9, "{low}");
        let high = after(60.0, 10_000.0, 5_000.0).factor();
        assert!((high - 0.5 * 1.02).abs() < 1e-9, "{high}");
    }

    #[test]
    fn exact_estimates_and_their_noise_count_as_exact() {
        assert_eq!(after(60.0, 10_000.0, 10_000.0).factor(), 1.0);
        assert_eq!(after(60.0, 10_000.0, 10_150.0).factor(), 1.0);
        assert_eq!(after(60.0, 10_000.0, 9_850.0).factor(), 1.0);
        // Drawn towards 1, not cut: no step at the band's edge.
        let past = after(60.0, 10_000.0, 10_300.0).factor();
        assert!(past > 1.0 && past < 1.01, "{past}");
    }

    #[test]
    fn the_factor_is_bounded_and_follows_a_change_over_the_horizon() {
        let near = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(near(after(60.0, 1.0, 1_000.0).factor(), MAX_FACTOR));
        assert!(near(after(60.0, 1_000.0, 1.0).factor(), 1.0 / MAX_FACTOR));
        let mut ratio = after(120.0, 10_000.0, 20_000.0);
        for _ in 0..20 {
            ratio.observe(&cost(10_000.0, 10_000.0), 0.5);
        }
        // Ten seconds of exact charges move it a third of the way back.
        let moved = ratio.factor();
        assert!(moved > 1.5 && moved < 1.8, "{moved}");
    }

    #[test]
    fn nothing_charged_or_nonsense_leaves_the_budget_as_written() {
        // A fleet whose filters report no charges (no cost rule's usage,
        // an older filter) is steered on its estimates alone.
        assert_eq!(after(60.0, 10_000.0, 0.0).factor(), 1.0);
        let mut ratio = after(60.0, 10_000.0, 12_000.0);
        let before = ratio;
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            ratio.observe(&cost(bad, 1.0), 0.5);
            ratio.observe(&cost(1.0, bad), 0.5);
            ratio.observe(&cost(10_000.0, 12_000.0), bad);
        }
        // An interval that admitted nothing says nothing either.
        ratio.observe(&cost(0.0, 50_000.0), 0.5);
        assert_eq!(ratio, before);
        assert_eq!(ChargeRatio::default().factor(), 1.0);
    }

    #[test]
    fn charges_that_stop_never_loosen_the_budget() {
        // Estimates running high, then the charges stop while the fleet
        // still admits: the falling sum would read as estimates running
        // ever higher.
        let mut ratio = after(60.0, 10_000.0, 5_000.0);
        assert!(ratio.factor() < 0.6);
        for _ in 0..20 {
            ratio.observe(&cost(10_000.0, 0.0), 0.5);
        }
        assert!(ratio.factor() < 0.6, "quiet for 10 s: {}", ratio.factor());
        ratio.observe(&cost(10_000.0, 0.0), 0.5);
        assert_eq!(ratio.factor(), 1.0);
        // Estimates running low still tighten it while quiet.
        let mut low = after(60.0, 10_000.0, 20_000.0);
        for _ in 0..30 {
            low.observe(&cost(10_000.0, 0.0), 0.5);
        }
        assert!(low.factor() > 1.0, "{}", low.factor());
        // A charge again restores the ratio.
        ratio.observe(&cost(10_000.0, 5_000.0), 0.5);
        assert!(ratio.factor() < 1.0);
    }
}
