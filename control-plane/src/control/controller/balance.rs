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
//!
//! A tenant's cell repays alone within [`MAX_MOVE`] of its share, so a
//! large request of a small tenant would take many intervals to repay
//! while the bucket as a whole runs over. A central bucket repays any
//! request with the whole budget; [`Pool`] does the same: the cells of a
//! bucket lend one another what their own bounded moves leave of the
//! bucket's repayment, spread by share and bounded by [`LEND`]. A lender
//! admits less than its share for it, which its own balance counts as
//! credit and reclaims over the next intervals, so a loan is settled
//! between the tenants and no tenant keeps less than its share for long.

/// Seconds over which a balance is repaid: an interval repays its length
/// over this of it (half at the default 500 ms, the most
/// [`MAX_REPAID_PER_INTERVAL`] lets one interval repay). What is left of
/// a debt when a 10 s window ends falls in the next window, so the
/// shorter the better while it stays stable: the debt is learnt one
/// interval late, and repaying half of it an interval leaves room for
/// that. The filter applies a budget's ratio by the coin, so nothing else
/// repays the same debt (with the credit, which repaid it again on its
/// VM, repaying this fast swung the other way, and a horizon of 2 s was
/// the better of the two).
pub(crate) const REPAY_S: f64 = 1.0;
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
/// Most the cells of a bucket lend one another in one interval, as a
/// fraction of each cell's share. A proxy that never enforces runs a
/// debt that does not end; lending bounded below [`MAX_MOVE`] leaves the
/// other tenants' own credit room to reclaim what they lend it.
pub(crate) const LEND: f64 = 0.25;
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
        (share_per_s + self.moved(share_per_s, seconds)).max(0.0)
    }

    /// What the balance moves a target of `share_per_s` in an interval of
    /// `seconds`, within [`MAX_MOVE`] of the share.
    fn moved(self, share_per_s: f64, seconds: f64) -> f64 {
        let most = MAX_MOVE * share_per_s;
        repaid_per_s(self.0, seconds).clamp(-most, most)
    }

    /// The balance in cost units: negative for a debt.
    pub(crate) fn get(self) -> f64 {
        self.0
    }

    /// Seconds its debt takes to repay at the most the balance moves a
    /// target of `share_per_s` ([`MAX_MOVE`] of it a second); 0 without a
    /// debt or a share.
    pub(crate) fn repaid_in_s(self, share_per_s: f64) -> f64 {
        let most = MAX_MOVE * share_per_s;
        if self.0 < 0.0 && most > 0.0 && most.is_finite() {
            -self.0 / most
        } else {
            0.0
        }
    }
}

/// The part of `balance` repaid per second in an interval of `seconds`.
fn repaid_per_s(balance: f64, seconds: f64) -> f64 {
    let repaid = (seconds / REPAY_S).clamp(0.0, MAX_REPAID_PER_INTERVAL);
    balance * repaid / seconds.max(f64::MIN_POSITIVE)
}

/// The balances of one bucket's cells in an interval: what they repay
/// together beyond each cell's own bounded move.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pool {
    shares: f64,
    balances: f64,
    moved: f64,
}

impl Pool {
    /// Takes in a cell of `share_per_s` with `balance`.
    pub(crate) fn add(&mut self, balance: Balance, share_per_s: f64, seconds: f64) {
        let valid = |x: f64| x.is_finite() && x >= 0.0;
        if !valid(share_per_s) || !valid(seconds) {
            return;
        }
        self.shares += share_per_s;
        self.balances += balance.0;
        self.moved += balance.moved(share_per_s, seconds);
    }

    /// What each unit of a cell's share is lent (negative: lends) in the
    /// next interval of `seconds`: the bucket's repayment, within
    /// [`MAX_MOVE`] of its shares, less the cells' own moves, within
    /// [`LEND`] of the shares.
    pub(crate) fn lent_per_share(&self, seconds: f64) -> f64 {
        if self.shares <= 0.0 || !self.shares.is_finite() {
            return 0.0;
        }
        let most = MAX_MOVE * self.shares;
        let bucket = repaid_per_s(self.balances, seconds).clamp(-most, most);
        let lent = (bucket - self.moved).clamp(-LEND * self.shares, LEND * self.shares);
        lent / self.shares
    }

    /// What the cells repay together in the next interval of `seconds`.
    pub(crate) fn repayment(&self, seconds: f64) -> Repayment {
        Repayment {
            seconds,
            lent_per_share: self.lent_per_share(seconds),
        }
    }
}

/// A bucket's repayment for one interval, computed once for its cells.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Repayment {
    seconds: f64,
    lent_per_share: f64,
}

impl Repayment {
    /// The target of a cell of `share_per_s` with `balance`: its own move
    /// plus its part of the loan.
    pub(crate) fn target(&self, balance: Balance, share_per_s: f64) -> f64 {
        let lent = self.lent_per_share * share_per_s;
        (balance.target(share_per_s, self.seconds) + lent).max(0.0)
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
    fn at_the_default_interval_half_is_repaid_per_interval() {
        assert_eq!(Balance(-400.0).target(1_000.0, 0.5), 600.0);
        assert_eq!(Balance(400.0).target(1_000.0, 0.5), 1_400.0);
        // A long interval repays at most half per interval.
        assert_eq!(Balance(-4_000.0).target(1_000.0, 10.0), 800.0);
    }

    #[test]
    fn no_balance_moves_the_target_beyond_half_the_share() {
        assert_eq!(Balance(-1e12).target(1_000.0, 0.5), 500.0);
        assert_eq!(Balance(1e12).target(1_000.0, 0.5), 1_500.0);
        assert_eq!(Balance(-1e12).target(0.0, 0.5), 0.0);
    }

    /// Two cells of a bucket, both shedding: each interval they admit
    /// their targets; `debts` adds a cost admitted beyond the target of
    /// each, per interval.
    fn settle(
        balances: &mut [Balance; 2],
        shares: [f64; 2],
        debts: impl Fn(usize) -> [f64; 2],
        intervals: usize,
    ) -> [f64; 2] {
        let mut admitted = [0.0; 2];
        for i in 0..intervals {
            let mut pool = Pool::default();
            for (balance, share) in balances.iter().zip(shares) {
                pool.add(*balance, share, 0.5);
            }
            for (cell, (balance, share)) in balances.iter_mut().zip(shares).enumerate() {
                let rate = pool.repayment(0.5).target(*balance, share) + debts(i)[cell] / 0.5;
                admitted[cell] += rate * 0.5;
                *balance = balance.after(&interval(share, rate));
            }
        }
        admitted
    }

    #[test]
    fn a_small_cells_large_request_is_repaid_by_the_bucket() {
        // A tenant of 1,000/s beside one of 9,000/s: one request of
        // 4,000 beyond its target. Alone it repays at most 500/s; the
        // bucket repays half the debt an interval, as one cell does
        // within its bound, the lender within a quarter of its share.
        let shares = [1_000.0, 9_000.0];
        let mut balances = [Balance(-4_000.0), Balance::default()];
        let mut pool = Pool::default();
        for (balance, share) in balances.iter().zip(shares) {
            pool.add(*balance, share, 0.5);
        }
        assert_eq!(pool.repayment(0.5).target(balances[0], 1_000.0), 250.0);
        assert_eq!(pool.repayment(0.5).target(balances[1], 9_000.0), 6_750.0);
        // Over 2 s the bucket repays more than the debtor could alone
        // (at most 500/s), and over 40 s each cell admits its share: the
        // debtor less its debt, the lender all it lent.
        let early = settle(&mut balances.clone(), shares, |_| [0.0; 2], 4);
        assert!(early[0] + early[1] < 20_000.0 - 2_000.0, "{early:?}");
        let whole = settle(&mut balances, shares, |_| [0.0; 2], 80);
        assert!((whole[0] - (40_000.0 - 4_000.0)).abs() < 1.0, "{whole:?}");
        assert!((whole[1] - 360_000.0).abs() < 1.0, "{whole:?}");
    }

    #[test]
    fn a_debt_that_never_ends_borrows_at_most_the_bound() {
        // A cell that overruns its target by 1,000/s every interval: its
        // debt stays at the bound; the lender lends at most `LEND` of its
        // share and reclaims it from its own credit, so it still admits
        // its share.
        let shares = [1_000.0, 9_000.0];
        let mut balances = [Balance::default(); 2];
        let admitted = settle(&mut balances, shares, |_| [500.0, 0.0], 400);
        assert_eq!(balances[0].get(), -DEBT_S * 1_000.0);
        let mut pool = Pool::default();
        for (balance, share) in balances.iter().zip(shares) {
            pool.add(*balance, share, 0.5);
        }
        assert!(pool.lent_per_share(0.5) >= -LEND, "{pool:?}");
        assert!(balances[1].get() > 0.0, "{balances:?}");
        assert!(admitted[1] >= 9_000.0 * 200.0 * 0.99, "{admitted:?}");
    }

    #[test]
    fn an_empty_or_invalid_pool_lends_nothing() {
        assert_eq!(Pool::default().lent_per_share(0.5), 0.0);
        let mut pool = Pool::default();
        pool.add(Balance(-1_000.0), f64::NAN, 0.5);
        pool.add(Balance(-1_000.0), -1.0, 0.5);
        pool.add(Balance(-1_000.0), 1_000.0, f64::INFINITY);
        assert_eq!(pool.lent_per_share(0.5), 0.0);
        assert_eq!(
            pool.repayment(0.5).target(Balance::default(), 1_000.0),
            1_000.0
        );
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
