//! A budget cell's balance: the cost admitted beyond its share, repaid
//! over the next intervals.
//!
//! A drop ratio is decided before the costs it admits are known, so each
//! interval admits its share plus the noise of the costs that happened to
//! be let through; with heavy-tailed costs one second's noise is about
//! half the budget. A ratio alone never pays that noise back, so a 10 s
//! window strays by a third of one second's noise (`1/√10`). A central
//! token bucket pays it back at once: a large request leaves a debt that
//! holds the next ones off. The balance does the same at the fleet level,
//! one interval late: each interval adds the cell's share minus what its
//! proxies admitted, and the target of the next interval is the share
//! plus the balance over [`REPAY_S`]. A load step's first interval, which
//! is admitted at the old ratio, is repaid the same way.
//!
//! Bounds:
//! - a debt is kept up to [`DEBT_S`] of the share: about the largest
//!   request of a heavy-tailed mix at a tenant's share of a budget, so a
//!   large request is paid for whole rather than forgiven;
//! - budget left unused is kept only while the cell sheds, and only up
//!   to [`CREDIT_S`] of the share: a cell whose demand is below its share
//!   has nothing to make up, and a quiet period must not turn into a
//!   burst;
//! - the target moves by at most [`MAX_MOVE`] of the share;
//! - nothing is kept while any proxy shadows the cell: what it admits then
//!   is not what the ratio asked, and paying it back would fall on the
//!   proxies that enforce.

/// Seconds over which a balance is repaid: an interval repays its length
/// over this of it (a quarter at the default 500 ms). With the one
/// interval the reports lag, a shorter horizon would answer a large
/// request with a swing the other way.
pub(crate) const REPAY_S: f64 = 2.0;
/// Most debt kept, in seconds of the cell's share.
pub(crate) const DEBT_S: f64 = 10.0;
/// Most unused budget kept while shedding, in seconds of the share.
pub(crate) const CREDIT_S: f64 = 2.0;
/// Most the balance moves a target, as a fraction of the share, either
/// way. Proxies that admit more than they are asked (broken, or lying
/// about what they admit, within what the share cap lets one proxy
/// claim) run a debt that does not end; bounded, it can halve what the
/// others admit but never shut the cell. A large request's debt is repaid
/// over a few more intervals.
pub(crate) const MAX_MOVE: f64 = 0.5;
/// Most of the balance repaid in one interval: a long control interval
/// must not turn the repayment into an oscillation.
const MAX_REPAID_PER_INTERVAL: f64 = 0.5;

/// One cell's balance in cost units (tokens for a budget in tokens).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Balance(f64);

/// One interval of a cell, as the balance takes it in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Interval {
    /// The control interval in seconds.
    pub(crate) seconds: f64,
    /// The target the cell was given for it, in cost per second.
    pub(crate) target_per_s: f64,
    /// What its proxies admitted, in cost per second.
    pub(crate) admitted_per_s: f64,
    /// The part of the admitted rate reported afresh this interval
    /// (1 − `BucketLoad::stale_share`): a carried rate is counted once.
    pub(crate) fresh: f64,
    /// Whether the cell was shedding in it (a drop ratio above 0).
    pub(crate) shedding: bool,
    /// Whether any proxy shadows the cell.
    pub(crate) shadowed: bool,
}

impl Balance {
    /// The balance after `interval`.
    pub(crate) fn after(self, interval: &Interval) -> Self {
        let target = interval.target_per_s;
        let valid = |x: f64| x.is_finite() && x >= 0.0;
        if interval.shadowed
            || !valid(target)
            || !valid(interval.admitted_per_s)
            || !valid(interval.seconds)
        {
            return Self::default();
        }
        // A rate carried from an earlier tick was taken in then.
        let fresh = if interval.fresh.is_finite() {
            interval.fresh.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let moved = fresh * (target - interval.admitted_per_s) * interval.seconds;
        let credit = if interval.shedding {
            CREDIT_S * target
        } else {
            0.0
        };
        Self((self.0 + moved).clamp(-DEBT_S * target, credit))
    }

    /// The target for the next interval of `seconds`: the share plus the
    /// part of the balance repaid in it, within [`MAX_MOVE`] of the share.
    pub(crate) fn target(self, share_per_s: f64, seconds: f64) -> f64 {
        let repaid = (seconds / REPAY_S).clamp(0.0, MAX_REPAID_PER_INTERVAL);
        let moved = self.0 * repaid / seconds.max(f64::MIN_POSITIVE);
        let most = MAX_MOVE * share_per_s;
        (share_per_s + moved.clamp(-most, most)).max(0.0)
    }

    /// The balance in cost units: negative for a debt.
    pub(crate) fn get(self) -> f64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interval(target: f64, admitted: f64) -> Interval {
        Interval {
            seconds: 0.5,
            target_per_s: target,
            admitted_per_s: admitted,
            fresh: 1.0,
            shedding: true,
            shadowed: false,
        }
    }

    #[test]
    fn a_large_request_is_repaid_over_the_next_intervals() {
        // 1,000/s: one interval admitted 5,000 tokens instead of 500.
        let mut balance = Balance::default().after(&interval(1_000.0, 10_000.0));
        assert_eq!(balance.get(), -4_500.0);
        let mut admitted = 0.0;
        for _ in 0..40 {
            let target = balance.target(1_000.0, 0.5);
            assert!(target >= 500.0, "{target}");
            admitted += target * 0.5;
            balance = balance.after(&interval(1_000.0, target));
        }
        // 20 s at the share, less the debt.
        assert!((admitted - (20_000.0 - 4_500.0)).abs() < 1.0, "{admitted}");
        assert!(balance.get().abs() < 1.0, "{balance:?}");
    }

    #[test]
    fn at_the_default_interval_a_quarter_is_repaid_per_interval() {
        assert_eq!(Balance(-400.0).target(1_000.0, 0.5), 800.0);
        assert_eq!(Balance(400.0).target(1_000.0, 0.5), 1_200.0);
        // A long interval repays at most half per interval.
        assert_eq!(Balance(-4_000.0).target(1_000.0, 10.0), 800.0);
    }

    #[test]
    fn no_balance_moves_the_target_beyond_half_the_share() {
        assert_eq!(Balance(-1e12).target(1_000.0, 0.5), 500.0);
        assert_eq!(Balance(1e12).target(1_000.0, 0.5), 1_500.0);
        assert_eq!(Balance(-1e12).target(0.0, 0.5), 0.0);
    }

    #[test]
    fn debt_is_bounded_and_credit_kept_only_while_shedding() {
        let deep = Balance::default().after(&interval(1_000.0, 1e9));
        assert_eq!(deep.get(), -DEBT_S * 1_000.0);
        let mut credit = Balance::default();
        for _ in 0..10 {
            credit = credit.after(&interval(1_000.0, 0.0));
        }
        assert_eq!(credit.get(), CREDIT_S * 1_000.0);
        let mut idle = interval(1_000.0, 0.0);
        idle.shedding = false;
        assert_eq!(credit.after(&idle).get(), 0.0);
    }

    #[test]
    fn shadowing_carried_and_bad_numbers_keep_nothing() {
        let mut shadowed = interval(1_000.0, 5_000.0);
        shadowed.shadowed = true;
        assert_eq!(Balance(-300.0).after(&shadowed), Balance::default());
        let mut carried = interval(1_000.0, 5_000.0);
        carried.fresh = 0.0;
        assert_eq!(Balance(-300.0).after(&carried).get(), -300.0);
        let mut unknown = interval(1_000.0, 5_000.0);
        unknown.fresh = f64::NAN;
        assert_eq!(Balance(-300.0).after(&unknown).get(), -300.0);
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            assert_eq!(
                Balance(-300.0).after(&interval(1_000.0, bad)),
                Balance::default()
            );
            assert_eq!(
                Balance(-300.0).after(&interval(bad, 1.0)),
                Balance::default()
            );
        }
    }
}
