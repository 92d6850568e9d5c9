//! From fleet load and policy to directives: the fair division of each
//! limited bucket ([`crate::control::fairness`]), the per-cell drop ratio
//! ([`DropPolicy`]), the directive fields, and the change detection that
//! decides what to push.
//!
//! Pure: no clock, no I/O, no locks. The control loop feeds it one
//! [`FleetLoad`] per control interval.
//!
//! What each directive field says:
//!
//! - `drop_ratio`: from the [`DropPolicy`], called once per cell with the
//!   cell's load and its admitted share as the target;
//! - `limit_rps`: the bucket's limit (absent = unlimited, 0 = blocked);
//! - `share_rps`: what the cell may send before it is dropped: its tenant's
//!   fair share in its priority class (plus the bucket's unused capacity
//!   when nothing in the bucket is dropped), split over the tenant's cells
//!   of that class by their offered rate; 0 when the bucket is unlimited;
//! - `reporting_proxies`: proxies that reported the bucket this interval;
//! - `burst`: the tenant's burst multiplier;
//! - `mode`: the bucket's mode when `modes.buckets` names it, else
//!   unspecified (the batch's [`sluice_proto::v1::ModePolicy`] decides);
//! - `reason`: set only when the ratio is above 0; see
//!   [`crate::control::fairness`] for how it is chosen;
//! - `retry_after_ms`: 0 when the ratio is 0; otherwise [`retry_after_ms`],
//!   and for a budget's cell in debt at least the time its balance takes
//!   to repay it ([`Balance::repaid_in_s`]);
//! - `counted_proxies` and `uncounted_admit`: the proxies whose claim the
//!   share cap cut, so they admit as if they offered their counted part
//!   ([`counted`]);
//! - `cost_unit` and `budget_period_s`: the bucket's budget, when its limit
//!   is one. The fleet then hands over the bucket's rates in cost per
//!   second ([`crate::fleet::Fleet::tick_with`]), so every rate above
//!   (`limit_rps`, `share_rps`, `offered_rps`) and the whole division,
//!   floors and priorities included, are in that unit per second; the
//!   drop policy is told so ([`Signal::Cost`]) to pick its horizon.
//!
//! A blocked bucket (limit 0) also keeps a standing bucket-wide directive
//! that drops everything, traffic or not ([`blocked`]): a cell the
//! filters meet before the control plane has seen it falls back on it. A
//! blocked bucket's floors are void: it admits nothing.
//!
//! Only cells with something to enforce get a directive: a limit (floors
//! and priorities only exist under one) or a bucket mode. A cell of an
//! unlimited bucket gets none, so a flood of one-off keys costs the proxies
//! no slot in their directive tables. Lifting a directive (the limit was
//! removed, or the cell's traffic stopped) pushes a [`lift`]: a directive
//! that enforces nothing, which the filter takes as "remove this cell".

use std::sync::Arc;

use sluice_proto::v1::Directive;

use crate::config::budget::{Budget, CostUnit};
use crate::config::limits::{Limit, LimitTable};
use crate::config::policy::{DEFAULT_TENANT, Mode, Modes, Policy, Tenants};
use crate::control::drop_policy::Signal;
use crate::control::fairness::{self, Allocation, Scratch, TenantDemand};
use crate::fleet::{BucketTraffic, CellCharges, CellLoad, FleetLoad};
use crate::types::{ControlInterval, LimitRps};
use balance::{Balance, Pool, Repayment};
use blocked::Blocks;
use charge_ratio::ChargeRatio;
use counted::CountedProxies;
use sluice_core::{CLASSES, DropRatio, Priority, Reason};

mod balance;
mod blocked;
mod charge_ratio;
#[cfg(test)]
mod cost_tests;
mod counted;
mod decision;
mod retry;
mod status;
#[cfg(test)]
mod tests;

pub use crate::control::drop_policy::{DropPolicy, Proportional};
pub(crate) use decision::{CHANGE_THRESHOLD, IntervalOutcome, RetiredCell, lift};
pub(crate) use retry::retry_after_ms;
use retry::with_debt;
pub(crate) use status::{BucketStatus, CellStatus, CostStatus};

/// What proxies were last told about a cell.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Pushed {
    drop_ratio: DropRatio,
    limit: Option<LimitRps>,
    share_rps: f64,
    reporting_proxies: u32,
    mode: Option<Mode>,
    reason: Option<Reason>,
    retry_after_ms: u64,
    burst: f64,
    /// The cell's fleet offered rate the ratio came from: proxies derive
    /// their local allowance from it. A reason to push on its own only
    /// when it grew by [`OFFERED_GROWTH`] under the limit.
    offered_rps: f64,
    /// Under a budget, the most one request's estimate counts
    /// ([`ESTIMATE_CAP_MEANS`] of the cell's mean cost; 0: no cap yet).
    /// A reason to push on its own only when it moved by a factor of
    /// [`ESTIMATE_CAP_MOVE`].
    estimate_cap: u64,
    /// Under a budget, the cell's charged cost per unit of estimate (0
    /// otherwise): proxies divide the budget's rates by it where they
    /// compare them with estimates. A reason to push on its own only when
    /// it moved by more than [`CHARGE_FACTOR_MOVE`] of itself.
    charge_factor: f64,
}

/// A cell's charge factor is pushed on its own when it moved by more than
/// this fraction of itself: it moves the proxies' 429 waits (in powers of
/// two), their stale-directive limit and their allowance under the limit,
/// none of which a few percent changes.
const CHARGE_FACTOR_MOVE: f64 = 0.05;

/// A cell's estimate cap, in mean costs per request of the cell.
///
/// A request's estimate is often the client's to state (a header), and
/// what it counts steers the cell: a claim let through is a debt the
/// cell's balance repays, a claim dropped is a credit its proxy's coin
/// admits in a burst, and either moves the mean cost. Costs of LLM
/// requests are heavy-tailed but not boundless: with log-normal tokens
/// of σ ≈ 1.2 (median 500, p99 8,000) one request in a few thousand is
/// beyond 16 means. A request beyond the cap is counted the rest, up to
/// its estimate, when its stream reports its usage, so honest heavy
/// requests still count whole (later), and a false claim counts as one
/// heavy request.
pub(crate) const ESTIMATE_CAP_MEANS: f64 = 16.0;
/// A cell's estimate cap is pushed on its own when it moved by more than
/// this factor either way: a cap a little stale bounds a claim as well.
const ESTIMATE_CAP_MOVE: f64 = 2.0;

/// The estimate cap of a cell whose mean cost per request is `mean`.
fn estimate_cap(mean: Option<f64>) -> u64 {
    match mean {
        // The cast saturates; the mean is finite and positive.
        Some(mean) => ((mean * ESTIMATE_CAP_MEANS).ceil() as u64).max(1),
        None => 0,
    }
}

/// Under its limit (drop ratio 0) a cell's proxies cap themselves at their
/// rate at the last push times `limit / offered_rps`: an offered rate that
/// grew by more than this fraction since is pushed again, so the caps follow
/// a load climbing towards the limit instead of binding below it.
pub(crate) const OFFERED_GROWTH: f64 = 0.1;

impl Pushed {
    fn differs_from(&self, next: &Self) -> bool {
        let share_moved = (self.share_rps - next.share_rps).abs()
            > CHANGE_THRESHOLD * self.share_rps.abs().max(next.share_rps.abs());
        let offered_grew = next.drop_ratio.get() == 0.0
            && next.limit.is_some()
            && next.offered_rps > self.offered_rps * (1.0 + OFFERED_GROWTH);
        (self.drop_ratio.get() - next.drop_ratio.get()).abs() > CHANGE_THRESHOLD
            || share_moved
            || offered_grew
            || self.limit != next.limit
            || self.mode != next.mode
            || self.reason != next.reason
            || self.retry_after_ms != next.retry_after_ms
            || self.burst != next.burst
            || self.reporting_proxies != next.reporting_proxies
            || cap_moved(self.estimate_cap, next.estimate_cap)
            || (self.charge_factor - next.charge_factor).abs()
                > CHARGE_FACTOR_MOVE * self.charge_factor.abs().max(next.charge_factor.abs())
    }
}

/// Whether an estimate cap moved enough to be pushed on its own.
fn cap_moved(old: u64, new: u64) -> bool {
    let (old, new) = (old as f64, new as f64);
    (old == 0.0) != (new == 0.0) || new > old * ESTIMATE_CAP_MOVE || old > new * ESTIMATE_CAP_MOVE
}

/// What was pushed for one cell.
#[derive(Debug)]
struct CellState {
    tenant: Arc<str>,
    priority: Priority,
    /// `None` for a cell that appeared this tick and is not pushed yet.
    pushed: Option<Pushed>,
    /// For a cell of a budget: its cost admitted beyond or short of its
    /// share, repaid over the next intervals.
    balance: Balance,
    /// For a cell of a budget: how far its charges run from its estimates.
    charges: ChargeRatio,
    /// For a cell of a limited bucket: the offered rate it last counted
    /// for in the division. A quiet cell keeps counting for it while its
    /// directive is held.
    demand: f64,
}

/// A cell that shed and whose proxies offered nothing in the intervals
/// since, and for how long. Under a budget it keeps counting in the
/// division for what it last counted for, and what it leaves of its share
/// is credit to its balance (`Controller::settle_quiet`).
#[derive(Debug)]
struct QuietCell {
    state: CellState,
    quiet_s: f64,
}

/// How long a cell that sheds keeps its directive while its proxies offer
/// nothing. A cell of a few requests an interval (a small tenant, or any
/// cell at a short control interval) often has an interval without one:
/// lifting its ratio then let the next interval's requests through
/// unshed, and a budget's small tenants ran far over their shares. A cell
/// whose traffic stopped for good is lifted once this has passed.
pub(crate) const QUIET_HOLD_S: f64 = 2.0;

/// The budget a bucket's directives carry.
#[derive(Debug, Clone, PartialEq)]
struct CostTag {
    unit: CostUnit,
    period_s: u64,
}

impl CostTag {
    fn of(budget: &Budget) -> Self {
        Self {
            unit: budget.unit().clone(),
            period_s: budget.per().seconds(),
        }
    }
}

/// What the controller remembers about one bucket.
#[derive(Debug)]
struct ControlledBucket {
    /// The budget its directives last carried.
    cost: Option<CostTag>,
    bucket: Arc<str>,
    /// Consecutive intervals with the offered rate above the limit.
    overloaded_intervals: u32,
    /// Sorted by tenant, then priority.
    cells: Vec<CellState>,
    /// Cells that shed and whose proxies have offered nothing since: their
    /// directives stand for [`QUIET_HOLD_S`]. Sorted as `cells`.
    quiet: Vec<QuietCell>,
    /// What the bucket's directives last listed as counted in part.
    counted: CountedProxies,
    /// Under a budget, how far its charges run from its estimates.
    charges: ChargeRatio,
}

/// Orders keys that are usually the very same interned string: comparing
/// the pointers first skips reading the text.
fn compare(a: &Arc<str>, b: &Arc<str>) -> std::cmp::Ordering {
    if Arc::ptr_eq(a, b) {
        std::cmp::Ordering::Equal
    } else {
        a.as_ref().cmp(b.as_ref())
    }
}

/// Runs a [`DropPolicy`] over the fleet load and tracks what was pushed.
///
/// The state is a vector sorted like the fleet load (by bucket, then
/// tenant and priority), so each tick is a sequential merge of the two: no
/// hashing and no lookups scattered over memory, which is what dominated
/// the tick at 100k buckets.
pub struct Controller {
    policy: Box<dyn DropPolicy>,
    interval: ControlInterval,
    buckets: Vec<ControlledBucket>,
    scratch: Scratch,
    allocation: Allocation,
    tenants: Vec<TenantDemand>,
    /// Indexes into `tenants` of those the `default` entry covers.
    pooled: Vec<usize>,
    /// Per cell of the bucket at hand: index into `tenants`.
    cell_tenant: Vec<usize>,
    /// Per quiet cell of the bucket at hand (held, counted in the
    /// division): index into `tenants`.
    quiet_tenant: Vec<usize>,
    /// Per cell of the bucket at hand: the offered rate it counts for in
    /// the division ([`DropPolicy::offered_estimate`] for a budget's,
    /// weighed by `charge_factor`).
    division: Vec<f64>,
    /// For the bucket at hand under a budget, its charges per unit of
    /// admitted estimate ([`ChargeRatio`]): the shares are in the budget's
    /// unit, the targets the cells are steered to in estimates. 1 otherwise.
    charge_factor: f64,
    /// Per cell of the bucket at hand: its own charge factor
    /// ([`ChargeRatio::cell_factor`]), which weighs its demand and divides
    /// its target; a cell past its end (all of them in a bucket limited in
    /// requests) reads as 1.
    cell_factors: Vec<f64>,
    /// The blocked buckets' standing directives.
    blocks: Blocks,
    /// Control intervals decided so far.
    decided: u64,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("buckets", &self.buckets.len())
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl Default for Controller {
    fn default() -> Self {
        Self::new(Proportional)
    }
}

impl Controller {
    /// A controller with nothing pushed yet, for the default control
    /// interval.
    pub fn new(policy: impl DropPolicy) -> Self {
        Self {
            policy: Box::new(policy),
            interval: ControlInterval::default(),
            buckets: Vec::new(),
            scratch: Scratch::default(),
            allocation: Allocation::default(),
            tenants: Vec::new(),
            pooled: Vec::new(),
            cell_tenant: Vec::new(),
            quiet_tenant: Vec::new(),
            division: Vec::new(),
            charge_factor: 1.0,
            cell_factors: Vec::new(),
            blocks: Blocks::default(),
            decided: 0,
        }
    }

    /// The controller the service runs: the tracking policy (it beats the
    /// proportional baseline in every simulated scenario,
    /// `sluice-simulate`; see `estimator`) at `interval`. The start-up hold's
    /// status and the what-if replays use a fresh one, so they show what
    /// the service would push.
    pub(crate) fn tracking(interval: ControlInterval) -> Self {
        Self::new(crate::control::estimator::Tracking::new()).with_interval(interval)
    }

    /// The control interval it runs at (used for `retry_after_ms`).
    #[must_use]
    pub(crate) fn with_interval(mut self, interval: ControlInterval) -> Self {
        self.interval = interval;
        self
    }

    /// [`Controller::decide`] with limits only: no tenant policies, no
    /// per-bucket modes.
    pub fn tick(&mut self, load: &FleetLoad, limits: &LimitTable) -> IntervalOutcome {
        self.decide_with(load, limits, &Tenants::default(), &Modes::default())
    }

    /// Decides the directives for one control interval.
    ///
    /// A cell is tracked while it has traffic. A cell seen for the first
    /// time is always pushed, even at drop ratio 0: after a control-plane
    /// restart the proxies may still hold an old non-zero directive for it.
    /// A cell whose traffic stopped is dropped from tracking; if its last
    /// pushed ratio was non-zero, it stands for [`QUIET_HOLD_S`] (traffic
    /// that comes back meanwhile is decided on as before), then a final
    /// ratio of 0 is pushed to lift it.
    pub fn decide(&mut self, load: &FleetLoad, policy: &Policy) -> IntervalOutcome {
        self.decide_with(load, &policy.limits, &policy.tenants, &policy.modes)
    }

    fn decide_with(
        &mut self,
        load: &FleetLoad,
        limits: &LimitTable,
        tenants: &Tenants,
        modes: &Modes,
    ) -> IntervalOutcome {
        let mut decision = IntervalOutcome {
            buckets: Vec::with_capacity(load.buckets.len()),
            ..IntervalOutcome::default()
        };
        let previous = std::mem::take(&mut self.buckets);
        let mut next = Vec::with_capacity(load.buckets.len());
        self.blocks.begin();
        let seconds = self.interval.as_duration().as_secs_f64();
        let mut previous = previous.into_iter().peekable();
        for traffic in load.buckets.iter().filter(|b| b.load.offered_rps > 0.0) {
            while let Some(gone) =
                previous.next_if(|state| compare(&state.bucket, &traffic.bucket).is_lt())
            {
                next.extend(quiet_bucket(gone, seconds, limits, &mut decision));
            }
            let state = previous
                .next_if(|state| compare(&state.bucket, &traffic.bucket).is_eq())
                .unwrap_or_else(|| ControlledBucket {
                    cost: None,
                    bucket: Arc::clone(&traffic.bucket),
                    overloaded_intervals: 0,
                    cells: Vec::new(),
                    quiet: Vec::new(),
                    counted: CountedProxies::default(),
                    charges: ChargeRatio::default(),
                });
            let rule = limits.rule_for(&traffic.bucket);
            let limit = rule.map(Limit::rate);
            if limit.is_some_and(LimitRps::is_blocked) {
                self.blocks.saw(&traffic.bucket);
            }
            let budget = rule.and_then(Limit::budget);
            let (state, status) = self.decide_bucket(
                traffic,
                state,
                (limit, budget),
                tenants,
                modes,
                &mut decision,
            );
            next.push(state);
            decision.buckets.push(status);
        }
        for gone in previous {
            next.extend(quiet_bucket(gone, seconds, limits, &mut decision));
        }
        for traffic in load.buckets.iter().filter(|b| b.load.offered_rps <= 0.0) {
            list_uncosted(traffic, limits, &mut decision.buckets);
        }
        self.blocks
            .finish(limits, modes, self.standing_retry_after_ms(), &mut decision);
        self.buckets = next;
        self.decided = self.decided.saturating_add(1);
        decision
    }

    fn decide_bucket(
        &mut self,
        traffic: &BucketTraffic,
        mut state: ControlledBucket,
        (limit, budget): (Option<LimitRps>, Option<&Budget>),
        tenants: &Tenants,
        modes: &Modes,
        decision: &mut IntervalOutcome,
    ) -> (ControlledBucket, BucketStatus) {
        let bucket = &traffic.bucket;
        // A budget is steered on cost: the fleet handed its rates over in
        // cost per second. A budget's unit or period that changed is
        // pushed with every cell.
        let signal = if budget.is_some() {
            Signal::Cost
        } else {
            Signal::Requests
        };
        let cost = budget.map(CostTag::of);
        let cost_moved = state.cost != cost;
        state.cost = cost;
        // The steady case: the same cells as last time, updated in place.
        let same_cells = state.cells.len() == traffic.cells.len()
            && state.cells.iter().zip(&traffic.cells).all(|(old, new)| {
                old.priority == new.priority && compare(&old.tenant, &new.tenant).is_eq()
            });
        if !same_cells {
            state.cells = merge_cells(
                bucket,
                std::mem::take(&mut state.cells),
                &mut state.quiet,
                &traffic.cells,
                decision,
            );
        }
        let seconds = self.interval.as_duration().as_secs_f64();
        let hold = limit.is_some_and(|limit| !limit.is_blocked());
        age_quiet(bucket, &mut state.quiet, (seconds, hold), decision);
        if signal != Signal::Cost || cost_moved {
            // What a held quiet cell counted for is in the old unit.
            for held in &mut state.quiet {
                held.state.demand = 0.0;
            }
        }
        let charges = self.weigh_charges(traffic, &mut state, signal);
        if let Some(limit) = limit {
            // A budget is divided on the policy's estimates of the cells'
            // cost rates: each interval's raw cost rates are noisy and
            // skewed enough to move the tenants' shares on their own.
            self.division.clear();
            for (index, cell) in traffic.cells.iter().enumerate() {
                let charge_factor = self.cell_factors.get(index).copied().unwrap_or(1.0);
                self.division.push(match signal {
                    Signal::Cost => {
                        self.policy.offered_estimate(
                            bucket,
                            &cell.tenant,
                            cell.priority,
                            &cell.load,
                            signal,
                        ) * charge_factor
                    }
                    Signal::Requests => cell.load.offered_rps,
                });
            }
            // A budget's held quiet cells keep counting for what they
            // last counted for (`settle_quiet` credits what they leave);
            // a request limit's count for nothing (reset above).
            if signal == Signal::Cost {
                for (cell_state, &demand) in state.cells.iter_mut().zip(&self.division) {
                    cell_state.demand = demand;
                }
            }
            self.allocate(traffic, &state.quiet, limit, tenants);
        }
        let blocked = limit.is_some_and(LimitRps::is_blocked);
        let overloaded =
            limit.is_some_and(|l| traffic.load.offered_rps * self.charge_factor > l.get());
        state.overloaded_intervals = if overloaded {
            state.overloaded_intervals.saturating_add(1)
        } else {
            0
        };
        let retry_after = retry_after_ms(self.interval, state.overloaded_intervals);
        // The proxies' room under the limit is counted in estimates.
        let counted = CountedProxies::of(
            traffic,
            limit.and_then(|l| LimitRps::new(l.get() / self.charge_factor).ok()),
        );
        // A moved list is pushed with every cell of the bucket: the filters
        // resolve it into each cell's ratio.
        let counted_moved = counted.differs_from(&state.counted);
        state.counted = counted;
        let mode = modes.buckets.get(bucket.as_ref()).copied();

        let mut status = BucketStatus {
            bucket: Arc::clone(bucket),
            limit_rps: limit,
            offered_rps: traffic.load.offered_rps,
            admitted_rps: traffic.load.admitted_rps,
            drop_ratio: DropRatio::NEVER,
            proxies_reporting: traffic.load.proxies_reporting,
            shadow_dropped_rps: traffic.shadow_dropped_rps,
            floors_exceed_limit: limit.is_some() && self.allocation.floors_exceed_limit,
            cells: Vec::with_capacity(traffic.cells.len()),
            proxy_cap: traffic.proxy_cap.clone(),
            cost: traffic.cost.as_ref().map(|cost| {
                CostStatus::of(
                    cost,
                    charges,
                    budget,
                    (signal == Signal::Cost).then_some(self.charge_factor),
                )
            }),
        };
        // A first interval lifts what a previous process may have left on
        // the proxies for cells that no longer enforce anything.
        let first_interval = self.decided == 0;
        let repayment = match (signal, limit) {
            (Signal::Cost, Some(_)) => {
                self.settle_quiet(&mut state, modes, mode);
                self.settle(traffic, &mut state.cells, modes, mode)
            }
            _ => Repayment::default(),
        };
        for (index, (cell, cell_state)) in traffic.cells.iter().zip(&mut state.cells).enumerate() {
            if limit.is_none() && mode.is_none() {
                if cell_state.pushed.take().is_some() || first_interval {
                    decision
                        .changed
                        .push(lift(bucket, &cell.tenant, cell.priority));
                }
                status.cells.push(CellStatus {
                    tenant: Arc::clone(&cell.tenant),
                    priority: cell.priority,
                    offered_rps: cell.load.offered_rps,
                    admitted_rps: cell.load.admitted_rps,
                    shadow_dropped_rps: cell.shadow_dropped_rps,
                    share_rps: None,
                    drop_ratio: DropRatio::NEVER,
                    reason: None,
                    balance: None,
                    charge_factor: None,
                    quiet_s: None,
                });
                continue;
            }
            let (target, share, reason) = match limit {
                Some(_) => self.share_of(index, cell),
                None => (None, 0.0, None),
            };
            // A budget cell's clients wait at least until its debt is
            // repaid at the most the balance moves its target.
            let wait = match (signal, target) {
                (Signal::Cost, Some(target)) => {
                    with_debt(retry_after, cell_state.balance.repaid_in_s(target.get()))
                }
                _ => retry_after,
            };
            let target = match (signal, target) {
                (Signal::Cost, Some(target)) => {
                    LimitRps::new(repayment.target(cell_state.balance, target.get())).ok()
                }
                _ => {
                    cell_state.balance = Balance::default();
                    target
                }
            };
            let ratio = self.policy.signal_drop_ratio(
                bucket,
                &cell.tenant,
                cell.priority,
                &cell.load,
                target,
                signal,
            );
            let dropping = ratio > DropRatio::NEVER;
            let mean_cost = match (signal, limit) {
                (Signal::Cost, Some(_)) => {
                    self.policy.mean_cost(bucket, &cell.tenant, cell.priority)
                }
                _ => None,
            };
            let charge_factor = match (signal, limit) {
                (Signal::Cost, Some(_)) => self.cell_factors.get(index).copied().unwrap_or(1.0),
                _ => 0.0,
            };
            let next = Pushed {
                estimate_cap: estimate_cap(mean_cost),
                charge_factor,
                drop_ratio: ratio,
                limit,
                offered_rps: cell.load.offered_rps,
                share_rps: share,
                reporting_proxies: traffic.load.proxies_reporting,
                mode,
                // A policy that still drops (smoothing) where the division
                // no longer would: the bucket as a whole is the reason.
                reason: dropping.then(|| reason.unwrap_or(Reason::ClusterOverload)),
                retry_after_ms: if dropping { wait } else { 0 },
                burst: tenants.policy_for(&cell.tenant).burst.get(),
            };
            // A cell new this tick is always pushed.
            let changed = counted_moved
                || cost_moved
                || cell_state
                    .pushed
                    .as_ref()
                    .is_none_or(|pushed| pushed.differs_from(&next));
            if blocked && cell.tenant.is_empty() && cell.priority == Priority::Unspecified {
                // The bucket's standing block is this cell's directive.
                cell_state.pushed = None;
            } else if changed {
                cell_state.pushed = Some(next);
                decision.changed.push(directive(
                    bucket,
                    &cell.tenant,
                    cell.priority,
                    &next,
                    &state.counted,
                    state.cost.as_ref(),
                ));
            }
            let current = cell_state.pushed.unwrap_or(next);
            if current.drop_ratio > status.drop_ratio {
                status.drop_ratio = current.drop_ratio;
            }
            status.cells.push(CellStatus {
                tenant: Arc::clone(&cell.tenant),
                priority: cell.priority,
                offered_rps: cell.load.offered_rps,
                admitted_rps: cell.load.admitted_rps,
                shadow_dropped_rps: cell.shadow_dropped_rps,
                share_rps: limit.map(|_| current.share_rps),
                drop_ratio: current.drop_ratio,
                reason: current.reason,
                balance: (signal == Signal::Cost && limit.is_some())
                    .then(|| cell_state.balance.get()),
                charge_factor: (charge_factor > 0.0).then_some(charge_factor),
                quiet_s: None,
            });
        }
        if !state.quiet.is_empty() {
            let budget = signal == Signal::Cost && limit.is_some();
            status.cells = with_held(std::mem::take(&mut status.cells), &state.quiet, budget);
            status.drop_ratio = largest_drop_ratio(status.drop_ratio, &status.cells);
        }
        (state, status)
    }

    /// Fills `self.allocation` with the bucket's division of the cells'
    /// offered rates in `self.division` and of the held `quiet` cells'
    /// last demands (a budget's: their shares are theirs while held, not
    /// the others'), `self.cell_tenant` with each cell's tenant index and
    /// `self.quiet_tenant` with each quiet cell's.
    fn allocate(
        &mut self,
        traffic: &BucketTraffic,
        quiet: &[QuietCell],
        limit: LimitRps,
        tenants: &Tenants,
    ) {
        self.tenants.clear();
        self.cell_tenant.clear();
        self.quiet_tenant.clear();
        self.pooled.clear();
        let mut previous: Option<&str> = None;
        let mut quiet = quiet.iter().peekable();
        let order = |q: &QuietCell, cell: &CellLoad| {
            compare(&q.state.tenant, &cell.tenant).then(q.state.priority.cmp(&cell.priority))
        };
        // The cells, then an end that every held cell left sorts before.
        let cells = traffic.cells.iter().zip(&self.division).map(Some);
        for next in cells.chain([None]) {
            while let Some(held) =
                quiet.next_if(|q| next.is_none_or(|(cell, _)| order(q, cell).is_lt()))
            {
                let index = add_quiet_demand(
                    (&mut self.tenants, &mut self.pooled),
                    held,
                    tenants,
                    &mut previous,
                );
                self.quiet_tenant.push(index);
            }
            let Some((cell, &offered)) = next else {
                break;
            };
            let index = add_demand(
                (&mut self.tenants, &mut self.pooled),
                (&cell.tenant, cell.priority, offered),
                tenants,
                &mut previous,
            );
            self.cell_tenant.push(index);
        }
        if limit.is_blocked() {
            // A blocked bucket admits nothing: no floor holds in it.
            for tenant in &mut self.tenants {
                tenant.floor = 0.0;
            }
        }
        let shared_floor = tenants.policy_for(DEFAULT_TENANT).min_floor_rps.get();
        if shared_floor > 0.0 && !self.pooled.is_empty() && !limit.is_blocked() {
            fairness::share_floor(
                &mut self.tenants,
                &self.pooled,
                shared_floor,
                &mut self.scratch,
            );
        }
        fairness::allocate_into(
            limit.get(),
            &self.tenants,
            &mut self.allocation,
            &mut self.scratch,
        );
    }

    /// The target, share and reason of the bucket's cell `index` in the
    /// division last allocated ([`cell_share`]).
    ///
    /// The share is in the limit's unit; under a budget whose charges run
    /// from its estimates, the target is in estimates (the share over the
    /// bucket's `charge_factor`), which is what the cell's proxies count.
    fn share_of(&self, index: usize, cell: &CellLoad) -> (Option<LimitRps>, f64, Option<Reason>) {
        let (target, share, reason) = cell_share(
            &self.tenants,
            &self.allocation,
            &self.cell_tenant,
            index,
            (
                cell.priority,
                self.division.get(index).copied().unwrap_or(0.0),
            ),
        );
        let charge_factor = self.cell_factors.get(index).copied().unwrap_or(1.0);
        let target = match target {
            Some(target) if charge_factor != 1.0 => {
                LimitRps::new(target.get() / charge_factor).ok()
            }
            target => target,
        };
        (target, share, reason)
    }

    /// Takes the interval's charges into the bucket's and its cells'
    /// [`ChargeRatio`]s and sets `charge_factor` and `cell_factors` for the
    /// bucket at hand (all 1 for a bucket limited in requests). Returns
    /// the cells' charges it took (none for a bucket limited in requests:
    /// only a budget's cells carry charges).
    fn weigh_charges(
        &mut self,
        traffic: &BucketTraffic,
        state: &mut ControlledBucket,
        signal: Signal,
    ) -> CellCharges {
        self.cell_factors.clear();
        let cost = match (signal, &traffic.cost) {
            (Signal::Cost, Some(cost)) => cost,
            _ => {
                // Only a bucket that was a budget has sums to forget: the
                // many limited in requests pass without touching their
                // cells (no factor reads as 1).
                if state.charges != ChargeRatio::default() {
                    state.charges = ChargeRatio::default();
                    for cell in &mut state.cells {
                        cell.charges = ChargeRatio::default();
                    }
                }
                self.charge_factor = 1.0;
                return CellCharges::default();
            }
        };
        let seconds = self.interval.as_duration().as_secs_f64();
        // The bucket's ratio is its cells' where they are known.
        let bucket_charges = traffic.cell_charges();
        state
            .charges
            .observe(bucket_charges, cost.admitted_rps, seconds);
        self.charge_factor = state.charges.factor();
        for (cell, cell_state) in traffic.cells.iter().zip(&mut state.cells) {
            // The requests behind the admitted cost, as a share of those
            // behind the offered cost (0 when not known).
            let load = &cell.load;
            let admitted_requests = if load.offered_rps > 0.0 {
                load.requests_rps * load.admitted_rps / load.offered_rps
            } else {
                0.0
            };
            match cell.charges.map(|charges| charges.window) {
                Some(charges) => cell_state.charges.observe_rates(
                    (charges.charged_per_s, charges.settled_per_s),
                    admitted_requests,
                    seconds,
                ),
                // Not known: the cell goes by the bucket's.
                None => cell_state.charges = ChargeRatio::default(),
            }
            self.cell_factors
                .push(cell_state.charges.cell_factor(&state.charges));
        }
        bucket_charges
    }

    /// Takes the interval just reported into the balances of a budget's
    /// cells ([`Balance`]) and returns what they repay together in the
    /// next interval ([`Pool`]).
    fn settle(
        &self,
        traffic: &BucketTraffic,
        cells: &mut [CellState],
        modes: &Modes,
        mode: Option<Mode>,
    ) -> Repayment {
        let seconds = self.interval.as_duration().as_secs_f64();
        let mut pool = Pool::default();
        for (index, (cell, state)) in traffic.cells.iter().zip(cells).enumerate() {
            let (Some(target), _, _) = self.share_of(index, cell) else {
                continue;
            };
            // The interval just reported ran under the mode pushed before;
            // shadow drops show any proxy shadowing it.
            let shadowed = cell.shadow_dropped_rps > 0.0 || shadows(state, modes, mode);
            state.balance = state.balance.after(&balance::Interval {
                seconds,
                target_per_s: target.get(),
                admitted_per_s: cell.load.admitted_rps,
                fresh: 1.0 - cell.load.stale_share,
                shedding: sheds(state),
                shadowed,
            });
            pool.add(state.balance, target.get(), seconds);
        }
        pool.repayment(seconds)
    }

    /// Takes an interval without traffic into the balances of a budget's
    /// held quiet cells: the share they were counted for and did not use
    /// is credit. Without it a cell that has no request in some intervals
    /// (a small tenant, or any cell at a short control interval) would
    /// admit its share's worth in the others only, run a debt in each, and
    /// repay it below its share.
    fn settle_quiet(&self, state: &mut ControlledBucket, modes: &Modes, mode: Option<Mode>) {
        let seconds = self.interval.as_duration().as_secs_f64();
        for (index, held) in state.quiet.iter_mut().enumerate() {
            let (Some(target), _, _) = cell_share(
                &self.tenants,
                &self.allocation,
                &self.quiet_tenant,
                index,
                (held.state.priority, held.state.demand),
            ) else {
                continue;
            };
            let factor = held.state.charges.cell_factor(&state.charges);
            let target = if factor > 0.0 {
                target.get() / factor
            } else {
                target.get()
            };
            held.state.balance = held.state.balance.after(&balance::Interval {
                seconds,
                target_per_s: target,
                admitted_per_s: 0.0,
                fresh: 1.0,
                shedding: sheds(&held.state),
                shadowed: shadows(&held.state, modes, mode),
            });
        }
    }

    /// The retry hint of the standing blocks: the shortest one.
    fn standing_retry_after_ms(&self) -> u64 {
        retry_after_ms(self.interval, 0)
    }

    /// Every directive currently in force, sorted by bucket, tenant and
    /// priority: what a proxy connecting now should receive.
    pub fn snapshot(&self) -> Vec<Directive> {
        let mut directives: Vec<Directive> = self
            .buckets
            .iter()
            .flat_map(|state| {
                let quiet = state.quiet.iter().map(|quiet| &quiet.state);
                state.cells.iter().chain(quiet).filter_map(move |cell| {
                    let pushed = cell.pushed.as_ref()?;
                    Some(directive(
                        &state.bucket,
                        &cell.tenant,
                        cell.priority,
                        pushed,
                        &state.counted,
                        state.cost.as_ref(),
                    ))
                })
            })
            .collect();
        directives.extend(self.blocks.directives(self.standing_retry_after_ms()));
        // Blocked buckets and quiet cells come after the others.
        directives.sort_by(|a, b| {
            (&a.bucket, &a.tenant, a.priority).cmp(&(&b.bucket, &b.tenant, b.priority))
        });
        directives
    }
}

/// The cells of a bucket whose set of cells changed: kept ones carry their
/// pushed state over, as do quiet ones that came back, new ones start
/// unpushed, gone ones are parked ([`park`]).
fn merge_cells(
    bucket: &Arc<str>,
    previous: Vec<CellState>,
    quiet: &mut Vec<QuietCell>,
    cells: &[CellLoad],
    decision: &mut IntervalOutcome,
) -> Vec<CellState> {
    let order = |state: &CellState, cell: &CellLoad| {
        compare(&state.tenant, &cell.tenant).then(state.priority.cmp(&cell.priority))
    };
    let mut merged = Vec::with_capacity(cells.len());
    let mut previous = previous.into_iter().peekable();
    // Every list is sorted, so one pass over each: a flood of new cells
    // costs what the cells cost, not their product.
    let mut waiting = std::mem::take(quiet).into_iter().peekable();
    let mut still_quiet = Vec::new();
    let mut parked = Vec::new();
    let mut room = MAX_QUIET_CELLS.saturating_sub(waiting.len());
    for cell in cells {
        while let Some(gone) = previous.next_if(|state| order(state, cell).is_lt()) {
            park(bucket, gone, (&mut parked, &mut room), decision);
        }
        while let Some(kept) = waiting.next_if(|q| order(&q.state, cell).is_lt()) {
            still_quiet.push(kept);
        }
        let back = waiting.next_if(|q| order(&q.state, cell).is_eq());
        let state = match (previous.next_if(|state| order(state, cell).is_eq()), back) {
            (Some(state), _) => state,
            (None, Some(back)) => {
                room = room.saturating_add(1);
                back.state
            }
            (None, None) => CellState {
                tenant: Arc::clone(&cell.tenant),
                priority: cell.priority,
                pushed: None,
                balance: Balance::default(),
                charges: ChargeRatio::default(),
                demand: 0.0,
            },
        };
        merged.push(state);
    }
    for gone in previous {
        park(bucket, gone, (&mut parked, &mut room), decision);
    }
    still_quiet.extend(waiting);
    *quiet = merge_quiet(still_quiet, parked);
    merged
}

/// Most quiet cells a bucket keeps: beyond them (a flood of new keys that
/// each shed once), a gone cell is lifted at once.
const MAX_QUIET_CELLS: usize = 4_096;

/// A cell absent from this interval's traffic: one that sheds keeps its
/// directive (quiet, see [`QUIET_HOLD_S`]) while `room` is left, any
/// other is retired.
fn park(
    bucket: &Arc<str>,
    cell: CellState,
    (quiet, room): (&mut Vec<QuietCell>, &mut usize),
    decision: &mut IntervalOutcome,
) {
    if *room > 0 && sheds(&cell) {
        *room -= 1;
        quiet.push(QuietCell {
            state: cell,
            quiet_s: 0.0,
        });
    } else {
        retire(bucket, cell, decision);
    }
}

/// Two lists of quiet cells, each sorted by tenant and priority, as one.
fn merge_quiet(a: Vec<QuietCell>, b: Vec<QuietCell>) -> Vec<QuietCell> {
    if b.is_empty() {
        return a;
    }
    merge_by_cell(a, b, |q| (&q.state.tenant, q.state.priority))
}

/// Two lists of a bucket's cells, each sorted by tenant and priority
/// (`key`), as one.
fn merge_by_cell<T>(
    a: Vec<T>,
    b: impl IntoIterator<Item = T>,
    key: impl Fn(&T) -> (&Arc<str>, Priority),
) -> Vec<T> {
    let order = |x: &T, y: &T| {
        let ((x_tenant, x_priority), (y_tenant, y_priority)) = (key(x), key(y));
        compare(x_tenant, y_tenant).then(x_priority.cmp(&y_priority))
    };
    let mut b = b.into_iter().peekable();
    let mut merged = Vec::with_capacity(a.len().saturating_add(b.size_hint().0));
    for item in a {
        while let Some(first) = b.next_if(|other| order(other, &item).is_lt()) {
            merged.push(first);
        }
        merged.push(item);
    }
    merged.extend(b);
    merged
}

/// Whether the quiet cells of a bucket with `rule` keep their
/// directives: while it has a limit that is not a block (a block stands on its own, see `blocked`;
/// a bucket without a limit has nothing to hold).
fn holds_quiet(rule: Option<&Limit>) -> bool {
    rule.is_some_and(|rule| !rule.rate().is_blocked())
}

/// Ages the quiet cells by an interval of `seconds`; those quiet for
/// [`QUIET_HOLD_S`] are retired, and all of them unless `hold`.
fn age_quiet(
    bucket: &Arc<str>,
    quiet: &mut Vec<QuietCell>,
    (seconds, hold): (f64, bool),
    decision: &mut IntervalOutcome,
) {
    if quiet.is_empty() {
        return;
    }
    for cell in std::mem::take(quiet) {
        let quiet_s = cell.quiet_s + seconds;
        if !hold || quiet_s >= QUIET_HOLD_S {
            retire(bucket, cell.state, decision);
        } else {
            quiet.push(QuietCell {
                state: cell.state,
                quiet_s,
            });
        }
    }
}

/// Retires every cell of a bucket whose traffic stopped.
/// A bucket absent from this interval's traffic: its cells are parked
/// ([`park`]); kept, and shown with its held cells, while any of them is
/// quiet.
fn quiet_bucket(
    mut state: ControlledBucket,
    seconds: f64,
    limits: &LimitTable,
    decision: &mut IntervalOutcome,
) -> Option<ControlledBucket> {
    let rule = limits.rule_for(&state.bucket);
    let hold = holds_quiet(rule);
    let mut parked = Vec::new();
    let mut room = MAX_QUIET_CELLS.saturating_sub(state.quiet.len());
    for cell in std::mem::take(&mut state.cells) {
        park(&state.bucket, cell, (&mut parked, &mut room), decision);
    }
    state.quiet = merge_quiet(std::mem::take(&mut state.quiet), parked);
    age_quiet(&state.bucket, &mut state.quiet, (seconds, hold), decision);
    if state.quiet.is_empty() {
        return None;
    }
    decision.buckets.push(held_status(&state, rule));
    Some(state)
}

/// The status of a bucket without traffic whose `held` cells' directives
/// stand: what its proxies hold, with nothing offered.
fn held_status(held: &ControlledBucket, rule: Option<&Limit>) -> BucketStatus {
    let budget = rule.and_then(Limit::budget);
    let cells = with_held(Vec::new(), &held.quiet, budget.is_some());
    let drop_ratio = largest_drop_ratio(DropRatio::NEVER, &cells);
    BucketStatus {
        bucket: Arc::clone(&held.bucket),
        limit_rps: rule.map(Limit::rate),
        offered_rps: 0.0,
        admitted_rps: 0.0,
        drop_ratio,
        proxies_reporting: 0,
        shadow_dropped_rps: 0.0,
        floors_exceed_limit: false,
        cells,
        proxy_cap: None,
        cost: budget.map(|budget| CostStatus::held(budget, held.charges.factor())),
    }
}

/// Lists a budget whose proxies report requests but count no cost in any
/// cell (nothing to steer, so the loop above passed it over) among the
/// `statuses`, sorted by bucket: beside its held cells' status if it has
/// one, else on its own with no cells.
fn list_uncosted(traffic: &BucketTraffic, limits: &LimitTable, statuses: &mut Vec<BucketStatus>) {
    let Some(cost) = traffic.cost.filter(|cost| cost.cells_without_cost > 0) else {
        return;
    };
    let rule = limits.rule_for(&traffic.bucket);
    let Some(budget) = rule.and_then(Limit::budget) else {
        return;
    };
    let at = statuses.binary_search_by(|status| compare(&status.bucket, &traffic.bucket));
    match at {
        Ok(at) => {
            if let Some(status) = statuses.get_mut(at) {
                status.proxies_reporting = traffic.load.proxies_reporting;
                if let Some(held) = &mut status.cost {
                    held.cells_without_cost = cost.cells_without_cost;
                    held.offered_requests_rps = cost.offered_rps;
                    held.admitted_requests_rps = cost.admitted_rps;
                }
            }
        }
        Err(at) => statuses.insert(
            at,
            BucketStatus {
                bucket: Arc::clone(&traffic.bucket),
                limit_rps: rule.map(Limit::rate),
                offered_rps: 0.0,
                admitted_rps: 0.0,
                drop_ratio: DropRatio::NEVER,
                proxies_reporting: traffic.load.proxies_reporting,
                shadow_dropped_rps: 0.0,
                floors_exceed_limit: false,
                cells: Vec::new(),
                proxy_cap: None,
                cost: Some(CostStatus::of(
                    &cost,
                    CellCharges::default(),
                    Some(budget),
                    Some(1.0),
                )),
            },
        ),
    }
}

/// The largest of `from` and the `cells`' drop ratios: a bucket's.
fn largest_drop_ratio(from: DropRatio, cells: &[CellStatus]) -> DropRatio {
    cells.iter().map(|cell| cell.drop_ratio).fold(
        from,
        |most, ratio| {
            if ratio > most { ratio } else { most }
        },
    )
}

/// A bucket's cell statuses (sorted by tenant and priority) with those of
/// its held `quiet` cells merged in: what their proxies hold, and for how
/// long they have offered nothing. `budget`: the bucket's limit is a
/// budget (the cells show their balances).
fn with_held(cells: Vec<CellStatus>, quiet: &[QuietCell], budget: bool) -> Vec<CellStatus> {
    let held = quiet.iter().filter_map(|held| {
        let cell = &held.state;
        let pushed = cell.pushed?;
        Some(CellStatus {
            tenant: Arc::clone(&cell.tenant),
            priority: cell.priority,
            offered_rps: 0.0,
            admitted_rps: 0.0,
            shadow_dropped_rps: 0.0,
            share_rps: pushed.limit.map(|_| pushed.share_rps),
            drop_ratio: pushed.drop_ratio,
            reason: pushed.reason,
            balance: budget.then(|| cell.balance.get()),
            charge_factor: (pushed.charge_factor > 0.0).then_some(pushed.charge_factor),
            quiet_s: Some(held.quiet_s),
        })
    });
    merge_by_cell(cells, held, |c| (&c.tenant, c.priority))
}

/// Whether the cell was last told to shed.
fn sheds(cell: &CellState) -> bool {
    cell.pushed
        .is_some_and(|pushed| pushed.drop_ratio > DropRatio::NEVER)
}

/// Whether the bucket's mode, or what the cell was last told, shadows it.
fn shadows(cell: &CellState, modes: &Modes, mode: Option<Mode>) -> bool {
    modes.shadow_any(mode)
        || cell
            .pushed
            .is_some_and(|pushed| pushed.mode == Some(Mode::Shadow))
}

/// [`add_demand`] for a held quiet cell; one that counts for nothing
/// (a bucket limited in requests) is left out, and its index is past the
/// end.
fn add_quiet_demand<'a>(
    lists: (&mut Vec<TenantDemand>, &mut Vec<usize>),
    held: &'a QuietCell,
    tenants: &Tenants,
    previous: &mut Option<&'a str>,
) -> usize {
    let cell = &held.state;
    if cell.demand > 0.0 {
        add_demand(
            lists,
            (&cell.tenant, cell.priority, cell.demand),
            tenants,
            previous,
        )
    } else {
        usize::MAX
    }
}

/// Counts one cell's `offered` rate for its tenant and class in the
/// division being built (`demands`, and `pooled` for the tenants the
/// `default` entry covers); returns the tenant's index. Cells come sorted
/// by tenant, so a tenant's cells are adjacent.
fn add_demand<'a>(
    (demands, pooled): (&mut Vec<TenantDemand>, &mut Vec<usize>),
    (tenant, priority, offered): (&'a Arc<str>, Priority, f64),
    tenants: &Tenants,
    previous: &mut Option<&'a str>,
) -> usize {
    if *previous != Some(tenant.as_ref()) {
        // The `default` entry covers the tenants not named, and the one
        // named `default` (the filters' name for requests without a
        // tenant): its floor is theirs together.
        if tenant.as_ref() == DEFAULT_TENANT || tenants.get(tenant).is_none() {
            pooled.push(demands.len());
        }
        let policy = tenants.policy_for(tenant);
        demands.push(TenantDemand {
            weight: policy.weight.get(),
            floor: policy.min_floor_rps.get(),
            offered: [0.0; CLASSES],
        });
        *previous = Some(tenant.as_ref());
    }
    let index = demands.len().saturating_sub(1);
    if let Some(class_offered) = demands
        .last_mut()
        .and_then(|t| t.offered.get_mut(priority.class()))
    {
        *class_offered += offered;
    }
    index
}

/// The cell's admitted target, share and reason from the division: its
/// tenant's allocation in its class, split over the tenant's cells of that
/// class by the offered rate each counted for in the division.
fn cell_share(
    demands: &[TenantDemand],
    allocation: &Allocation,
    cell_tenant: &[usize],
    index: usize,
    (priority, offered): (Priority, f64),
) -> (Option<LimitRps>, f64, Option<Reason>) {
    let class = priority.class();
    let tenant = cell_tenant.get(index).copied().unwrap_or(0);
    let (Some(demand), Some(allocation)) = (demands.get(tenant), allocation.tenants.get(tenant))
    else {
        return (None, 0.0, None);
    };
    let class_offered = demand.offered.get(class).copied().unwrap_or(0.0);
    let fraction = if class_offered > 0.0 {
        offered / class_offered
    } else {
        0.0
    };
    let admitted = allocation.admitted.get(class).copied().unwrap_or(0.0) * fraction;
    let share = allocation.share.get(class).copied().unwrap_or(0.0) * fraction;
    let reason = allocation.reason.get(class).copied().flatten();
    // A cell whose whole offered load is admitted is not to be dropped: its
    // target is its share (the room it has), not its current rate, or a
    // smoothing policy would shed the noise of a bucket far below its
    // limit.
    let fully_admitted = admitted >= offered * (1.0 - 1e-9);
    let target = if fully_admitted {
        admitted.max(share)
    } else {
        admitted
    };
    (LimitRps::new(target).ok(), share, reason)
}

/// Stops tracking a cell: lifts it if it had a directive (so the proxies
/// free its slot), and names it for removal from the snapshot.
fn retire(bucket: &Arc<str>, cell: CellState, decision: &mut IntervalOutcome) {
    if cell.pushed.is_some() {
        decision
            .changed
            .push(lift(bucket, &cell.tenant, cell.priority));
    }
    decision.retired.push(RetiredCell {
        bucket: Arc::clone(bucket),
        tenant: cell.tenant,
        priority: cell.priority,
    });
}

/// The wire form: `limit_rps` is absent for an unlimited bucket and 0 for
/// a blocked one, as in the limits file; with a budget, the rates are in
/// its unit per second and `cost_unit` names it.
fn directive(
    bucket: &str,
    tenant: &str,
    priority: Priority,
    pushed: &Pushed,
    counted: &CountedProxies,
    cost: Option<&CostTag>,
) -> Directive {
    Directive {
        bucket: bucket.to_owned(),
        drop_ratio: pushed.drop_ratio.get(),
        limit_rps: pushed.limit.map(LimitRps::get),
        tenant: tenant.to_owned(),
        priority: priority.to_wire() as i32,
        share_rps: pushed.share_rps,
        reporting_proxies: pushed.reporting_proxies,
        mode: pushed.mode.map_or(0, |mode| mode.to_wire() as i32),
        reason: pushed.reason.map_or(0, |reason| reason.to_wire() as i32),
        retry_after_ms: pushed.retry_after_ms,
        burst: pushed.burst,
        offered_rps: pushed.offered_rps,
        counted_proxies: counted.wire(),
        uncounted_admit: counted.uncounted_admit(),
        cost_unit: cost.map_or_else(String::new, |c| c.unit.as_str().to_owned()),
        budget_period_s: cost.map_or(0, |c| c.period_s),
        estimate_cap: pushed.estimate_cap,
        charge_factor: pushed.charge_factor,
    }
}
