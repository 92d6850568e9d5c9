//! The tracking drop policy: a smoothed offered-rate estimate with step
//! detection, and integral feedback on the admitted rate.
//!
//! The proportional formula `(offered − limit) / offered` is right only if
//! the offered estimate is right and the proxies admit exactly `1 − ratio`
//! of it. Neither holds exactly: the estimate is counting noise over half a
//! second, and proxies enforcing a local allowance lose a little to bursts.
//! [`Tracking`] therefore
//! - smooths the offered rate (exponentially, weight [`SMOOTHING`] on the
//!   newest interval) unless it moved by more than [`STEP`], which is taken
//!   as a real load step and followed at once, as is the interval after a
//!   step (the first to show the new load alone);
//! - corrects the admit share by a factor learned from the admitted rate
//!   the proxies report: while the bucket is shedding, each interval moves
//!   the factor by [`GAIN`] of the log ratio between the limit and the
//!   admitted rate, by at most [`MAX_STEP`] and within [`CORRECTION`];
//!   gaps beyond [`MAX_ERROR`] are transients (or proxies in shadow mode)
//!   and are ignored. Only the freshly reported part of the load moves it
//!   (`BucketLoad::stale_share`): a proxy that reports every 5 s must not
//!   have the same error corrected 25 times. The factor keeps its value when the bucket stops
//!   shedding, and is reset by a load step.
//!
//! A cell steered on cost (its bucket's limit is a budget), bucket-wide or
//! a tenant's or priority's, whose load says how many requests are behind
//! the cost is estimated as a request rate (the fast horizon above) times
//! a mean cost per request summed over [`MEAN_COST_HORIZON`], and
//! corrected on its admitted cost summed over the same horizon
//! ([`CostSplit`]); see there why. The controller divides a budget's
//! shares on these estimates ([`DropPolicy::offered_estimate`]), not on
//! each interval's raw cost rates: a light interval of one tenant would
//! otherwise hand its share to the others for that interval, and a heavy
//! one take it back, which admits more than the budget on average (the
//! admit share is convex in the rate). Without a request count the cost
//! rate itself is smoothed over [`COST_HORIZON`].
//!
//! [`Proportional`](crate::control::controller::Proportional) stays available as the
//! baseline.

use std::collections::HashMap;

use std::fmt::Write as _;

use crate::control::drop_policy::{DropPolicy, Signal};
use crate::fleet::BucketLoad;
use crate::types::LimitRps;
use sluice_core::{DropRatio, Priority};

/// Weight of the newest interval in the smoothed offered rate.
pub(crate) const SMOOTHING: f64 = 0.5;
/// A relative change of the offered rate beyond this is a load step.
pub(crate) const STEP: f64 = 0.25;

/// How the offered rate is smoothed and when a change is a step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Horizon {
    /// Weight of the newest interval.
    pub(crate) smoothing: f64,
    /// A relative change beyond this is a load step.
    pub(crate) step: f64,
    /// Whether the correction learns from the admitted rate smoothed over
    /// the same horizon instead of each interval's.
    pub(crate) smooth_admitted: bool,
    /// Whether a step must show in two intervals in a row: one heavy
    /// interval of a heavy-tailed signal is noise, and taking it (and the
    /// interval after) as the estimate would pull the estimate towards a
    /// single interval's typical value, below the mean.
    pub(crate) confirm_steps: bool,
}

/// Request counts: [`SMOOTHING`] and [`STEP`].
pub(crate) const REQUEST_HORIZON: Horizon = Horizon {
    smoothing: SMOOTHING,
    step: STEP,
    smooth_admitted: false,
    confirm_steps: false,
};

/// Offered cost: a longer horizon than for requests.
///
/// Requests arrive as a Poisson process: over an interval with `n`
/// requests the count's relative error is `1/√n`. The offered cost is a
/// compound Poisson sum `Σ Cᵢ`, whose relative error is
/// `√(E[C²] / E[C]²) / √n`: heavier-tailed costs make it larger for the
/// same `n`. For LLM tokens (log-normal, median 500, p99 8,000: σ ≈ 1.19)
/// `E[C²] / E[C]² = e^σ² ≈ 4`, twice the error of counting the requests.
/// An exponential average with weight `α` keeps `α / (2 − α)` of one
/// interval's variance: the requests' 0.5 keeps a third, 0.15 keeps a
/// twelfth, four times less, so the cost estimate is about as steady as
/// the request estimate on the same traffic (its mean age is about 6
/// intervals, 3 s at the default 500 ms).
///
/// The sum is also skewed: one long response makes an interval look like
/// twice the load. Taking such an interval (and the one after) as a step
/// would restart the average from single intervals, whose typical value
/// is below the mean, and admit too much; so a cost step is a change
/// beyond 100 % in two intervals in a row (a 3× surge is followed one
/// interval later than a request surge; a fall is smoothed, which drops
/// more meanwhile: the safe side). The correction learns from the
/// admitted cost averaged the same way, not from one interval's, whose
/// skew would pull it towards the median.
pub(crate) const COST_HORIZON: Horizon = Horizon {
    smoothing: 0.15,
    step: 1.0,
    smooth_admitted: true,
    confirm_steps: true,
};

/// Weight of the newest interval in the sums of the mean cost per request
/// and of the cost correction: a mean age of 40 intervals (20 s at the
/// default 500 ms).
///
/// The admit share is `budget / estimated cost rate`, and `1/x` is convex:
/// a noisy estimate admits too much on average (`E[B/X] > B/E[X]`, by
/// about the estimate's squared relative error), and a skewed one more
/// so. Split as `rate × mean cost`, the request rate is a Poisson count
/// (relative error `1/√n`, symmetric) that may follow load steps at once,
/// while the mean cost per request, whose error is `√(E[C²]/E[C]² − 1)/√n`
/// (about 1.8/√n for LLM tokens), does not move with the load and can be
/// summed over many intervals: over 40, its error is a few percent and
/// its bias a fraction of one.
pub(crate) const MEAN_COST_HORIZON: f64 = 1.0 / 40.0;
/// Weight of the newest interval in the check that the mean cost per
/// request moved (a new mix of requests, not noise).
const MEAN_COST_CHECK: f64 = 0.15;
/// A mean cost per request that the check's average puts beyond this
/// factor of the long sums' in two intervals in a row has moved: the
/// sums restart from the check's average.
const MEAN_COST_SHIFT: f64 = 2.0;
/// Intervals summed before the cost correction applies: fewer say more
/// about the coin's luck than about the proxies.
const MIN_CORRECTED: u32 = 20;

/// The state of a cell steered on cost with its requests counted: a fast
/// request rate, long sums of cost and requests for the mean cost per
/// request, and long sums of the target and the admitted cost for the
/// correction.
#[derive(Debug, Clone, Copy, Default)]
struct CostSplit {
    requests_rps: f64,
    /// Whether the interval before raised the request rate beyond a step
    /// without being taken as one.
    unconfirmed: bool,
    /// Exponential sums (weight [`MEAN_COST_HORIZON`]) of the offered cost
    /// and requests per second; their ratio is the mean cost.
    cost_sum: f64,
    requests_sum: f64,
    /// The same over [`MEAN_COST_CHECK`], to notice a new mix.
    cost_check: f64,
    requests_check: f64,
    /// Whether the interval before saw the check beyond
    /// [`MEAN_COST_SHIFT`], and on which side.
    shifted: Option<bool>,
    /// Intervals summed so far (the sums are plain means until the horizon
    /// fills).
    intervals: u32,
    /// Exponential sums of the cost the ratio in force asked the proxies
    /// to admit and of what they admitted, while shedding.
    expected_sum: f64,
    admitted_sum: f64,
    /// Intervals summed into the correction's sums so far.
    corrected: u32,
    /// This interval's estimate and whether it was a step, when the
    /// controller asked for it before the ratio
    /// ([`DropPolicy::offered_estimate`]): the ratio uses it rather than
    /// counting the interval twice.
    pending: Option<(f64, bool)>,
}

impl Horizon {
    fn of(signal: Signal) -> Self {
        match signal {
            Signal::Requests => REQUEST_HORIZON,
            Signal::Cost => COST_HORIZON,
        }
    }
}
/// Fraction of the measured log error corrected per interval.
pub(crate) const GAIN: f64 = 0.4;
/// Bounds of the correction factor.
pub(crate) const CORRECTION: (f64, f64) = (0.8, 1.25);
/// Largest move of the correction in one interval (as a log ratio): one
/// late or bunched report makes an interval's admitted rate look several
/// percent off, which must not swing the whole fleet's ratio.
pub(crate) const MAX_STEP: f64 = 0.02;
/// Larger gaps between the limit and the admitted rate (as a log ratio) do
/// not move the correction.
pub(crate) const MAX_ERROR: f64 = 0.2;
/// Cells not decided in this many sweeps (one per round of calls over every
/// tracked cell, or per 1024 calls if fewer are tracked) are forgotten.
const FORGET_AFTER: u32 = 20;

#[derive(Debug, Clone, Copy)]
struct CellEstimate {
    offered_rps: f64,
    /// The admitted rate smoothed like the offered one, for a signal whose
    /// correction learns from it ([`Horizon::smooth_admitted`]).
    admitted_rps: f64,
    correction: f64,
    /// The ratio decided last time, whose effect the admitted rate shows.
    last_ratio: f64,
    /// Whether the interval before was a step: its admitted rate mixes two
    /// regimes and says nothing about the correction.
    after_step: bool,
    /// Whether the interval before moved beyond a step without being
    /// taken as one ([`Horizon::confirm_steps`]), and in which direction.
    unconfirmed: Option<bool>,
    /// For a cell steered on cost with its requests counted.
    split: Option<CostSplit>,
    idle: u32,
}

/// Smoothed, feedback-corrected drop ratios; see the module docs.
///
/// State is kept per cell, so each cell's estimate and correction follow
/// that cell's own traffic: bucket-wide cells (the common case) by the
/// bucket's name, the cells of tenants or priorities in a second map by a
/// key naming all three.
#[derive(Debug, Default)]
pub struct Tracking {
    buckets: HashMap<String, CellEstimate>,
    cells: HashMap<String, CellEstimate>,
    decisions: u64,
    /// Reused buffer for cell keys.
    cell_key: String,
}

impl Tracking {
    /// A policy that knows no bucket yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The correction factor learned for `bucket`'s bucket-wide cell (1 if
    /// unknown).
    #[cfg(test)]
    pub(crate) fn correction(&self, bucket: &str) -> f64 {
        self.buckets.get(bucket).map_or(1.0, |s| s.correction)
    }

    /// The correction factor learned for a cell (1 if unknown).
    #[cfg(test)]
    pub(crate) fn cell_correction(&self, bucket: &str, tenant: &str, priority: Priority) -> f64 {
        if is_bucket_wide(tenant, priority) {
            return self.correction(bucket);
        }
        let mut key = String::new();
        write_cell_key(&mut key, bucket, tenant, priority);
        self.cells.get(&key).map_or(1.0, |s| s.correction)
    }

    fn forget_idle(&mut self) {
        self.decisions += 1;
        // One sweep per round of calls: the control loop calls once per cell
        // per interval, so states age by about an interval per sweep and a
        // sweep costs O(1) per call. (A sweep every fixed number of calls
        // made a tick quadratic in the number of cells.)
        let tracked = self.buckets.len().saturating_add(self.cells.len());
        if self.decisions >= u64::try_from(tracked.max(1024)).unwrap_or(u64::MAX) {
            self.decisions = 0;
            for states in [&mut self.buckets, &mut self.cells] {
                for state in states.values_mut() {
                    state.idle = state.idle.saturating_add(1);
                }
                states.retain(|_, s| s.idle < FORGET_AFTER);
            }
        }
    }
}

impl DropPolicy for Tracking {
    fn drop_ratio(
        &mut self,
        bucket: &str,
        load: &BucketLoad,
        limit: Option<LimitRps>,
    ) -> DropRatio {
        self.cell_drop_ratio(bucket, "", Priority::Unspecified, load, limit)
    }

    fn cell_drop_ratio(
        &mut self,
        bucket: &str,
        tenant: &str,
        priority: Priority,
        load: &BucketLoad,
        share: Option<LimitRps>,
    ) -> DropRatio {
        self.signal_drop_ratio(bucket, tenant, priority, load, share, Signal::Requests)
    }

    fn signal_drop_ratio(
        &mut self,
        bucket: &str,
        tenant: &str,
        priority: Priority,
        load: &BucketLoad,
        share: Option<LimitRps>,
        signal: Signal,
    ) -> DropRatio {
        self.forget_idle();
        let horizon = Horizon::of(signal);
        let (states, key) = self.states_of(bucket, tenant, priority);
        decide(states, key, load, share, horizon)
    }

    fn offered_estimate(
        &mut self,
        bucket: &str,
        tenant: &str,
        priority: Priority,
        load: &BucketLoad,
        signal: Signal,
    ) -> f64 {
        let offered = load.offered_rps;
        if signal != Signal::Cost
            || !(offered > 0.0 && offered.is_finite())
            || !splits(COST_HORIZON, load)
        {
            return offered;
        }
        let (states, key) = self.states_of(bucket, tenant, priority);
        let Some(state) = state_of(states, key, load) else {
            return offered;
        };
        let estimate = estimate_split(state, load);
        if let Some(split) = state.split.as_mut() {
            split.pending = Some(estimate);
        }
        estimate.0
    }

    fn mean_cost(&mut self, bucket: &str, tenant: &str, priority: Priority) -> Option<f64> {
        let (states, key) = self.states_of(bucket, tenant, priority);
        let split = states.get(key)?.split.as_ref()?;
        let mean = split.cost_sum / split.requests_sum;
        (split.requests_sum > 0.0 && mean.is_finite() && mean > 0.0).then_some(mean)
    }
}

impl Tracking {
    /// The map and key of a cell's state: bucket-wide cells by the
    /// bucket's name, others by [`write_cell_key`].
    fn states_of<'a>(
        &'a mut self,
        bucket: &'a str,
        tenant: &str,
        priority: Priority,
    ) -> (&'a mut HashMap<String, CellEstimate>, &'a str) {
        if is_bucket_wide(tenant, priority) {
            return (&mut self.buckets, bucket);
        }
        write_cell_key(&mut self.cell_key, bucket, tenant, priority);
        (&mut self.cells, &self.cell_key)
    }
}

/// Whether a cell with `load` on `horizon` is estimated as a request rate
/// times a mean cost ([`decide_split`]): a cost signal whose requests are
/// counted.
fn splits(horizon: Horizon, load: &BucketLoad) -> bool {
    let requests = load.requests_rps;
    horizon == COST_HORIZON && requests > 0.0 && requests.is_finite()
}

/// The state kept under `key`, new if there is none.
fn state_of<'a>(
    states: &'a mut HashMap<String, CellEstimate>,
    key: &str,
    load: &BucketLoad,
) -> Option<&'a mut CellEstimate> {
    // Looked up first: the key is copied only for a new cell.
    if !states.contains_key(key) {
        states.insert(
            key.to_owned(),
            CellEstimate {
                offered_rps: load.offered_rps,
                admitted_rps: load.admitted_rps,
                correction: 1.0,
                last_ratio: 0.0,
                after_step: true,
                unconfirmed: None,
                split: None,
                idle: 0,
            },
        );
    }
    let state = states.get_mut(key)?;
    state.idle = 0;
    Some(state)
}

/// The drop ratio of the cell whose state `states` keeps under `key`.
fn decide(
    states: &mut HashMap<String, CellEstimate>,
    key: &str,
    load: &BucketLoad,
    limit: Option<LimitRps>,
    horizon: Horizon,
) -> DropRatio {
    let offered = load.offered_rps;
    let Some(limit) = limit.map(LimitRps::get) else {
        states.remove(key);
        return DropRatio::NEVER;
    };
    if !(offered > 0.0 && offered.is_finite()) {
        return DropRatio::NEVER;
    }
    let Some(state) = state_of(states, key, load) else {
        return DropRatio::NEVER;
    };
    if splits(horizon, load) {
        return decide_split(state, load, limit);
    }
    state.split = None;

    let beyond = (offered - state.offered_rps).abs() > horizon.step * state.offered_rps;
    let up = offered > state.offered_rps;
    let step = beyond && (!horizon.confirm_steps || state.unconfirmed == Some(up));
    state.unconfirmed = (beyond && !step).then_some(up);
    if step || state.after_step {
        // The interval after a step is the first whose reports show the
        // new load alone; smoothing it with the step's mixed interval
        // would hold the estimate below the new load for several
        // intervals, admitting too much meanwhile.
        state.offered_rps = offered;
        state.admitted_rps = load.admitted_rps;
    } else {
        state.offered_rps += horizon.smoothing * (offered - state.offered_rps);
        state.admitted_rps += horizon.smoothing * (load.admitted_rps - state.admitted_rps);
        let admitted = if horizon.smooth_admitted {
            state.admitted_rps
        } else {
            load.admitted_rps
        };
        let error = (limit / admitted).ln();
        // Only a small, persistent gap is the proxies' systematic loss;
        // a large one is a transient, or proxies that do not enforce
        // (shadow mode counts would-be drops as admitted).
        if state.last_ratio > 0.0 && admitted > 0.0 && limit > 0.0 && error.abs() <= MAX_ERROR {
            let (low, high) = CORRECTION;
            // Rates carried from earlier ticks were learned from already.
            let fresh = 1.0 - load.stale_share.clamp(0.0, 1.0);
            let step = (GAIN * fresh * error).clamp(-MAX_STEP, MAX_STEP);
            state.correction = (state.correction * step.exp()).clamp(low, high);
        }
    }
    state.after_step = step;

    let admit_share = state.correction * limit / state.offered_rps;
    let ratio = DropRatio::saturating(1.0 - admit_share);
    state.last_ratio = ratio.get();
    ratio
}

/// The drop ratio of a cell steered on cost whose requests are counted:
/// `limit / (request rate × mean cost)`, corrected over the long sums.
fn decide_split(state: &mut CellEstimate, load: &BucketLoad, limit: f64) -> DropRatio {
    let pending = state.split.as_mut().and_then(|split| split.pending.take());
    let (estimate, step) = pending.unwrap_or_else(|| estimate_split(state, load));
    let offered = load.offered_rps;
    let fresh = 1.0 - load.stale_share.clamp(0.0, 1.0);
    let split = state.split.get_or_insert_with(CostSplit::default);

    // The correction: what the proxies admitted against what the ratio in
    // force asked of the same offered cost, both summed over the horizon
    // while shedding, outside a step's interval and the one after (they
    // mix two regimes). It depends on the proxies alone, not on the
    // estimate, so it is a ratio of sums, not a feedback loop.
    if state.last_ratio > 0.0 && !step && !state.after_step && fresh > 0.0 {
        split.corrected = split.corrected.saturating_add(1);
        let weight = (1.0 / f64::from(split.corrected)).max(MEAN_COST_HORIZON) * fresh;
        let expected = (1.0 - state.last_ratio) * offered;
        split.expected_sum += weight * (expected - split.expected_sum);
        split.admitted_sum += weight * (load.admitted_rps - split.admitted_sum);
        let gap = split.expected_sum / split.admitted_sum;
        // A gap beyond MAX_ERROR is a transient or proxies that do not
        // enforce (shadow mode): no correction.
        state.correction = if split.corrected >= MIN_CORRECTED
            && split.admitted_sum > 0.0
            && gap.ln().abs() <= MAX_ERROR
        {
            let (low, high) = CORRECTION;
            gap.clamp(low, high)
        } else {
            1.0
        };
    }
    state.after_step = step;

    let admit_share = if estimate > 0.0 {
        state.correction * limit / estimate
    } else {
        1.0
    };
    let ratio = DropRatio::saturating(1.0 - admit_share);
    state.last_ratio = ratio.get();
    ratio
}

/// Takes one interval into a cost-split cell's request rate and mean cost
/// per request: its offered cost estimate, and whether the interval was a
/// load step.
fn estimate_split(state: &mut CellEstimate, load: &BucketLoad) -> (f64, bool) {
    let offered = load.offered_rps;
    let requests = load.requests_rps;
    let fresh = 1.0 - load.stale_share.clamp(0.0, 1.0);
    let split = state.split.get_or_insert_with(CostSplit::default);
    // The request rate: the request horizon. A rise is a step when it
    // shows in two intervals in a row (at a few tens of requests an
    // interval, a quarter is within the counting noise) or more than
    // doubles the rate, and is then followed at once. A fall is smoothed:
    // taking a short count whole would admit too much on counting noise
    // alone, while smoothing it drops more for a few intervals (the safe
    // side).
    let first = split.intervals == 0;
    let beyond = requests > (1.0 + STEP) * split.requests_rps;
    let step = !first && beyond && (split.unconfirmed || requests > 2.0 * split.requests_rps);
    split.unconfirmed = beyond && !step;
    if first || step || state.after_step {
        split.requests_rps = requests;
    } else {
        split.requests_rps += SMOOTHING * (requests - split.requests_rps);
    }
    // The mean cost per request: plain means until the horizon fills, then
    // exponential sums. A carried (stale) rate is summed once only.
    split.intervals = split.intervals.saturating_add(1);
    let weight = (1.0 / f64::from(split.intervals)).max(MEAN_COST_HORIZON) * fresh.max(0.0);
    let check = (1.0 / f64::from(split.intervals)).max(MEAN_COST_CHECK) * fresh.max(0.0);
    if weight > 0.0 {
        split.cost_sum += weight * (offered - split.cost_sum);
        split.requests_sum += weight * (requests - split.requests_sum);
        split.cost_check += check * (offered - split.cost_check);
        split.requests_check += check * (requests - split.requests_check);
    }
    let mean = |cost: f64, requests: f64| (requests > 0.0).then(|| cost / requests);
    if let (Some(long), Some(recent)) = (
        mean(split.cost_sum, split.requests_sum),
        mean(split.cost_check, split.requests_check),
    ) {
        let beyond = recent > long * MEAN_COST_SHIFT || recent * MEAN_COST_SHIFT < long;
        let up = recent > long;
        if beyond && split.shifted == Some(up) {
            // A new mix of requests: the long sums restart from the recent
            // average, and the correction learnt on the old mix goes.
            split.cost_sum = split.cost_check;
            split.requests_sum = split.requests_check;
            split.shifted = None;
            split.expected_sum = 0.0;
            split.admitted_sum = 0.0;
            split.corrected = 0;
            state.correction = 1.0;
        } else {
            split.shifted = beyond.then_some(up);
        }
    }
    let mean_cost = mean(split.cost_sum, split.requests_sum).unwrap_or(offered / requests);
    let estimate = split.requests_rps * mean_cost;
    state.offered_rps = estimate;
    state.admitted_rps = load.admitted_rps;
    (estimate, step)
}

fn is_bucket_wide(tenant: &str, priority: Priority) -> bool {
    tenant.is_empty() && priority == Priority::Unspecified
}

/// Writes the state key of a cell into `out`: the priority's wire number,
/// the bucket's length, the bucket and the tenant, so no two cells share a
/// key whatever bytes their names hold.
fn write_cell_key(out: &mut String, bucket: &str, tenant: &str, priority: Priority) {
    out.clear();
    out.push(char::from(
        b'0' + u8::try_from(priority.to_wire() as i32).unwrap_or(0),
    ));
    // Writing to a String cannot fail.
    let _ = write!(out, "{}:", bucket.len());
    out.push_str(bucket);
    out.push_str(tenant);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn load(offered_rps: f64, admitted_rps: f64) -> BucketLoad {
        BucketLoad {
            offered_rps,
            admitted_rps,
            proxies_reporting: 3,
            stale_share: 0.0,
            requests_rps: 0.0,
        }
    }

    #[test]
    fn carried_rates_do_not_move_the_correction() {
        // A proxy reporting every 5 s: its admitted rate is short of the
        // limit, but the same report is seen again at every tick.
        let mut policy = Tracking::new();
        let stale = BucketLoad {
            stale_share: 1.0,
            ..load(600.0, 140.0)
        };
        let first = policy.drop_ratio("a", &load(600.0, 600.0), limit(150.0));
        for _ in 0..50 {
            assert_eq!(policy.drop_ratio("a", &stale, limit(150.0)), first);
        }
        // A fresh report with the same gap moves it.
        assert!(policy.drop_ratio("a", &load(600.0, 140.0), limit(150.0)) < first);
    }

    fn limit(rps: f64) -> Option<LimitRps> {
        Some(LimitRps::new(rps).unwrap())
    }

    #[test]
    fn starts_at_the_proportional_ratio() {
        let mut policy = Tracking::new();
        let ratio = policy.drop_ratio("a", &load(3_000.0, 3_000.0), limit(1_000.0));
        assert!((ratio.get() - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(
            policy.drop_ratio("b", &load(500.0, 500.0), limit(1_000.0)),
            DropRatio::NEVER
        );
        assert_eq!(
            policy.drop_ratio("c", &load(500.0, 500.0), None),
            DropRatio::NEVER
        );
    }

    #[test]
    fn smooths_noise_and_follows_steps() {
        let mut policy = Tracking::new();
        let l = limit(1_000.0);
        policy.drop_ratio("a", &load(3_000.0, 1_000.0), l);
        // +10 %: noise, half of it taken.
        let ratio = policy.drop_ratio("a", &load(3_300.0, 1_000.0), l).get();
        assert!((ratio - (1.0 - 1_000.0 / 3_150.0)).abs() < 1e-9, "{ratio}");
        // ×2: a step, taken at once.
        let ratio = policy.drop_ratio("a", &load(6_300.0, 1_900.0), l).get();
        assert!((ratio - (1.0 - 1_000.0 / 6_300.0)).abs() < 1e-9, "{ratio}");
    }

    #[test]
    fn the_interval_after_a_step_is_taken_whole() {
        let mut policy = Tracking::new();
        let l = limit(1_000.0);
        policy.drop_ratio("a", &load(500.0, 500.0), l);
        // The step's interval mixes old and new load: 4200 of a 5000 step.
        policy.drop_ratio("a", &load(4_200.0, 1_000.0), l);
        // The next one shows the new load alone (+19 %, within noise of the
        // mixed estimate): taken whole, not halfway.
        let ratio = policy.drop_ratio("a", &load(5_000.0, 1_000.0), l).get();
        assert!((ratio - 0.8).abs() < 1e-9, "{ratio}");
        // From then on, noise is smoothed again.
        let ratio = policy.drop_ratio("a", &load(5_500.0, 1_000.0), l).get();
        assert!((ratio - (1.0 - 1_000.0 / 5_250.0)).abs() < 1e-9, "{ratio}");
    }

    #[test]
    fn proxies_that_do_not_enforce_do_not_move_it() {
        let mut policy = Tracking::new();
        let l = limit(200.0);
        for _ in 0..10 {
            let ratio = policy.drop_ratio("a", &load(600.0, 600.0), l).get();
            assert!((ratio - 2.0 / 3.0).abs() < 1e-12, "{ratio}");
        }
    }

    #[test]
    fn one_noisy_interval_moves_the_ratio_only_a_little() {
        let mut policy = Tracking::new();
        let l = limit(1_000.0);
        policy.drop_ratio("a", &load(2_000.0, 2_000.0), l);
        policy.drop_ratio("a", &load(2_000.0, 1_000.0), l);
        let steady = policy.drop_ratio("a", &load(2_000.0, 1_000.0), l).get();
        // A late report: the interval's admitted rate reads 15 % high.
        let after = policy.drop_ratio("a", &load(2_000.0, 1_150.0), l).get();
        let admit_share = |ratio: f64| 1.0 - ratio;
        let moved = (admit_share(after) / admit_share(steady)).ln();
        assert!((-MAX_STEP - 1e-12..0.0).contains(&moved), "{moved}");
    }

    #[test]
    fn feedback_closes_a_persistent_gap() {
        // Proxies that admit 10 % less than the share they are given.
        let mut policy = Tracking::new();
        let l = limit(1_000.0);
        let mut ratio = policy.drop_ratio("a", &load(3_000.0, 3_000.0), l).get();
        for _ in 0..30 {
            let admitted = 3_000.0 * (1.0 - ratio) * 0.9;
            ratio = policy.drop_ratio("a", &load(3_000.0, admitted), l).get();
        }
        let admitted = 3_000.0 * (1.0 - ratio) * 0.9;
        assert!((admitted - 1_000.0).abs() < 5.0, "{admitted}");
        assert!(policy.correction("a") > 1.1);
    }

    #[test]
    fn each_cell_of_a_bucket_keeps_its_own_state() {
        // Two tenants of one bucket: gold's proxies admit 5 % less than
        // their share, bronze's 10 % more. Interleaved calls must not mix
        // their estimates or corrections.
        let mut policy = Tracking::new();
        let gold_share = limit(800.0);
        let bronze_share = limit(50.0);
        let (mut gold, mut bronze) = (0.0, 0.0);
        for _ in 0..40 {
            let gold_admitted = 900.0 * (1.0 - gold) * 0.95;
            let bronze_admitted = 300.0 * (1.0 - bronze) * 1.1;
            gold = policy
                .cell_drop_ratio(
                    "acme",
                    "gold",
                    Priority::Unspecified,
                    &load(900.0, gold_admitted),
                    gold_share,
                )
                .get();
            bronze = policy
                .cell_drop_ratio(
                    "acme",
                    "bronze",
                    Priority::Unspecified,
                    &load(300.0, bronze_admitted),
                    bronze_share,
                )
                .get();
        }
        let gold_admitted = 900.0 * (1.0 - gold) * 0.95;
        let bronze_admitted = 300.0 * (1.0 - bronze) * 1.1;
        assert!((gold_admitted - 800.0).abs() < 4.0, "{gold_admitted}");
        assert!((bronze_admitted - 50.0).abs() < 0.5, "{bronze_admitted}");
        assert!(policy.cell_correction("acme", "gold", Priority::Unspecified) > 1.04);
        assert!(policy.cell_correction("acme", "bronze", Priority::Unspecified) < 0.92);
        // The bucket-wide cell is a third, untouched cell.
        assert_eq!(policy.correction("acme"), 1.0);
    }

    #[test]
    fn cells_no_longer_decided_are_forgotten() {
        let mut policy = Tracking::new();
        let l = limit(1_000.0);
        // A persistent gap moves gold's correction.
        for _ in 0..10 {
            policy.cell_drop_ratio("acme", "gold", Priority::Bulk, &load(3_000.0, 900.0), l);
        }
        assert!(policy.cell_correction("acme", "gold", Priority::Bulk) > 1.0);
        // Then only another bucket is decided, for more than the sweeps it
        // takes to forget.
        for _ in 0..(FORGET_AFTER as usize + 1) * 1_024 {
            policy.drop_ratio("other", &load(3_000.0, 1_000.0), l);
        }
        assert_eq!(policy.cell_correction("acme", "gold", Priority::Bulk), 1.0);
        assert!(policy.buckets.contains_key("other"));
    }

    fn cost_load(offered_rps: f64, admitted_rps: f64, requests_rps: f64) -> BucketLoad {
        BucketLoad {
            requests_rps,
            ..load(offered_rps, admitted_rps)
        }
    }

    #[test]
    fn a_tenants_cost_is_estimated_as_requests_times_mean_cost() {
        // A tenant's cell: one heavy interval (a few long responses)
        // between ordinary ones with the same request count.
        let mut policy = Tracking::new();
        let share = limit(5_000.0);
        let mut estimate = 0.0;
        for offered in [30_000.0, 30_000.0, 90_000.0] {
            estimate = policy.offered_estimate(
                "llm",
                "free",
                Priority::Unspecified,
                &cost_load(offered, 5_000.0, 30.0),
                Signal::Cost,
            );
            policy.signal_drop_ratio(
                "llm",
                "free",
                Priority::Unspecified,
                &cost_load(offered, 5_000.0, 30.0),
                share,
                Signal::Cost,
            );
        }
        // The mean cost summed over three intervals: 50,000 / 30 a request,
        // not the heavy interval's 3,000 (the smoothed cost rate took
        // 0.15 of it: 39,000).
        assert!((estimate - 50_000.0).abs() < 1e-6, "{estimate}");
    }

    #[test]
    fn an_estimate_asked_before_the_ratio_is_not_counted_twice() {
        let loads = [
            cost_load(60_000.0, 60_000.0, 60.0),
            cost_load(55_000.0, 20_000.0, 58.0),
            cost_load(150_000.0, 21_000.0, 62.0),
            cost_load(40_000.0, 14_000.0, 61.0),
        ];
        let share = limit(20_000.0);
        let (mut asked, mut not_asked) = (Tracking::new(), Tracking::new());
        for load in &loads {
            let estimate =
                asked.offered_estimate("llm", "gold", Priority::Critical, load, Signal::Cost);
            assert!(estimate > 0.0);
            let with = asked.signal_drop_ratio(
                "llm",
                "gold",
                Priority::Critical,
                load,
                share,
                Signal::Cost,
            );
            let without = not_asked.signal_drop_ratio(
                "llm",
                "gold",
                Priority::Critical,
                load,
                share,
                Signal::Cost,
            );
            assert_eq!(with, without);
        }
        // Requests, or cost without a request count: the load as it is.
        let plain = load(600.0, 200.0);
        assert_eq!(
            asked.offered_estimate("a", "t", Priority::Bulk, &plain, Signal::Cost),
            600.0
        );
        assert_eq!(
            asked.offered_estimate("a", "t", Priority::Bulk, &loads[0], Signal::Requests),
            60_000.0
        );
    }

    proptest! {
        #[test]
        fn ratios_are_probabilities(
            steps in proptest::collection::vec((0.0f64..1e9, 0.0f64..1e9), 1..50),
            rps in 0.0f64..=1e9,
        ) {
            let mut policy = Tracking::new();
            for (offered, admitted) in steps {
                let ratio = policy.drop_ratio("a", &load(offered, admitted), limit(rps)).get();
                prop_assert!((0.0..=1.0).contains(&ratio));
            }
        }

        /// With a fresh directive, the expected admitted rate
        /// `offered × (1 − ratio)` is at most the limit times the largest
        /// correction, and exactly the limit before any correction.
        #[test]
        fn expected_admitted_is_bounded(offered in 1.0f64..1e9, rps in 0.0f64..1e9) {
            let mut policy = Tracking::new();
            let ratio = policy.drop_ratio("a", &load(offered, offered), limit(rps)).get();
            let admitted = offered * (1.0 - ratio);
            prop_assert!(admitted <= rps.max(0.0) + 1e-6 * rps.max(1.0) || offered <= rps);
            prop_assert!(admitted <= offered * (1.0 + 1e-12));
        }
    }
}
