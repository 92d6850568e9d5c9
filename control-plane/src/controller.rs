//! From fleet load and policy to directives: the fair division of each
//! limited bucket ([`crate::fairness`]), the per-cell drop ratio
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
//! - `limit_rps`: the bucket's limit (0 = unlimited);
//! - `share_rps`: what the cell may send before it is dropped: its tenant's
//!   fair share in its priority class (plus the bucket's unused capacity
//!   when nothing in the bucket is dropped), split over the tenant's cells
//!   of that class by their offered rate; 0 when the bucket is unlimited;
//! - `reporting_proxies`: proxies that reported the bucket this interval;
//! - `burst`: the tenant's burst multiplier;
//! - `mode`: the bucket's mode when `modes.buckets` names it, else
//!   unspecified (the batch's [`sluice_proto::v1::ModePolicy`] decides);
//! - `reason`: set only when the ratio is above 0; see
//!   [`crate::fairness`] for how it is chosen;
//! - `retry_after_ms`: 0 when the ratio is 0; otherwise [`retry_after_ms`].

use std::sync::Arc;

use serde::Serialize;
use sluice_proto::v1::Directive;

use crate::cell::{CLASSES, Priority, Reason};
use crate::fairness::{self, Allocation, Scratch, TenantDemand};
use crate::fleet::{BucketLoad, BucketTraffic, CellLoad, FleetLoad};
use crate::limits::LimitTable;
use crate::policy::{Mode, Modes, Policy, Tenants};
use crate::types::{ControlInterval, DropRatio, LimitRps};

/// A drop ratio that moved by at most this much is not pushed again: the
/// estimate is noisy and every push goes to every proxy. A share moving by
/// at most this fraction of itself is not a change either.
pub const CHANGE_THRESHOLD: f64 = 0.001;

/// Longest `retry_after_ms` ever pushed.
pub const MAX_RETRY_AFTER_MS: u64 = 30_000;

/// The drop ratio that brings `offered_rps` down to `limit`:
/// `max(0, (offered − limit) / offered)`, and 0 when nothing is offered or
/// the bucket is unlimited.
pub fn drop_ratio(offered_rps: f64, limit: Option<LimitRps>) -> DropRatio {
    match limit {
        Some(limit) if offered_rps > 0.0 => {
            DropRatio::saturating((offered_rps - limit.get()) / offered_rps)
        }
        _ => DropRatio::ZERO,
    }
}

/// How long a rejected client should wait, from how long its bucket has
/// been over its limit: one second (or two control intervals, if longer)
/// at first, one more second for every ten seconds of overload, at most
/// [`MAX_RETRY_AFTER_MS`], rounded down to whole seconds (but never below
/// the start). Whole seconds, because `Retry-After` carries
/// seconds and because a value that moves every interval would be pushed
/// every interval.
pub fn retry_after_ms(interval: ControlInterval, overloaded_intervals: u32) -> u64 {
    let interval_ms = interval.as_millis();
    let base = (2 * interval_ms).max(1_000);
    let overloaded_ms = u64::from(overloaded_intervals).saturating_mul(interval_ms);
    let wait = base.saturating_add(overloaded_ms / 10);
    (wait / 1_000 * 1_000).clamp(base, MAX_RETRY_AFTER_MS)
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

/// One bucket as shown by `GET /v1/buckets`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BucketStatus {
    /// Bucket key.
    pub bucket: Arc<str>,
    /// Effective limit; `None` (JSON null) when unlimited.
    pub limit_rps: Option<LimitRps>,
    /// Fleet offered rate estimate.
    pub offered_rps: f64,
    /// Fleet admitted rate, as reported.
    pub admitted_rps: f64,
    /// The largest drop ratio pushed for a cell of the bucket.
    pub drop_ratio: DropRatio,
    /// Proxies with a non-zero offered rate for the bucket.
    pub proxies_reporting: u32,
    /// Fleet rate of requests the decision would have dropped but shadow
    /// mode let through.
    pub shadow_dropped_rps: f64,
    /// The floors of the bucket's tenants alone exceed its limit, so it
    /// admits more than the limit (see [`crate::fairness`]).
    pub floors_exceed_limit: bool,
    /// Per (tenant, priority) cell: load, fair share and drop ratio, sorted
    /// by tenant then priority.
    pub cells: Vec<CellStatus>,
}

/// One (tenant, priority) cell of a bucket as shown by `GET /v1/buckets`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CellStatus {
    /// Tenant; empty when the filter derives none.
    pub tenant: Arc<str>,
    /// Priority as reported.
    pub priority: Priority,
    /// Fleet offered rate of the cell.
    pub offered_rps: f64,
    /// Fleet admitted rate of the cell, as reported.
    pub admitted_rps: f64,
    /// Fleet shadow-dropped rate of the cell, as reported.
    pub shadow_dropped_rps: f64,
    /// The cell's share of the limit as pushed; `None` (JSON null) when the
    /// bucket is unlimited.
    pub share_rps: Option<f64>,
    /// The drop ratio pushed to proxies.
    pub drop_ratio: DropRatio,
    /// Why the cell is dropped; `None` (JSON null) when it is not.
    pub reason: Option<Reason>,
}

/// The outcome of one control interval.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decision {
    /// Every bucket with traffic, sorted by bucket.
    pub buckets: Vec<BucketStatus>,
    /// Directives to push now: those that changed since they were last
    /// pushed, and a final 0 for dropping cells whose traffic stopped.
    pub changed: Vec<Directive>,
    /// Cells no longer tracked: take them out of the snapshot (after
    /// applying `changed`).
    pub retired: Vec<RetiredCell>,
}

/// A cell the controller stopped tracking.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RetiredCell {
    /// Bucket key.
    pub bucket: Arc<str>,
    /// Tenant.
    pub tenant: Arc<str>,
    /// Priority.
    pub priority: Priority,
}

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
}

impl Pushed {
    fn differs_from(&self, next: &Self) -> bool {
        let share_moved = (self.share_rps - next.share_rps).abs()
            > CHANGE_THRESHOLD * self.share_rps.abs().max(next.share_rps.abs());
        (self.drop_ratio.get() - next.drop_ratio.get()).abs() > CHANGE_THRESHOLD
            || share_moved
            || self.limit != next.limit
            || self.mode != next.mode
            || self.reason != next.reason
            || self.retry_after_ms != next.retry_after_ms
            || self.burst != next.burst
            || self.reporting_proxies != next.reporting_proxies
    }

    /// The directive lifting a cell whose traffic stopped.
    fn lifted(&self, limit: Option<LimitRps>) -> Self {
        Self {
            drop_ratio: DropRatio::ZERO,
            limit,
            reason: None,
            retry_after_ms: 0,
            reporting_proxies: 0,
            ..*self
        }
    }
}

/// What was pushed for one cell.
#[derive(Debug)]
struct CellState {
    tenant: Arc<str>,
    priority: Priority,
    /// `None` for a cell that appeared this tick and is not pushed yet.
    pushed: Option<Pushed>,
}

/// What the controller remembers about one bucket.
#[derive(Debug)]
struct BucketState {
    bucket: Arc<str>,
    /// Consecutive intervals with the offered rate above the limit.
    overloaded_intervals: u32,
    /// Sorted by tenant, then priority.
    cells: Vec<CellState>,
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
    buckets: Vec<BucketState>,
    scratch: Scratch,
    allocation: Allocation,
    tenants: Vec<TenantDemand>,
    /// Per cell of the bucket at hand: index into `tenants`.
    cell_tenant: Vec<usize>,
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
            cell_tenant: Vec::new(),
        }
    }

    /// The control interval it runs at (used for `retry_after_ms`).
    #[must_use]
    pub fn with_interval(mut self, interval: ControlInterval) -> Self {
        self.interval = interval;
        self
    }

    /// [`Controller::decide`] with limits only: no tenant policies, no
    /// per-bucket modes.
    pub fn tick(&mut self, load: &FleetLoad, limits: &LimitTable) -> Decision {
        self.decide_with(load, limits, &Tenants::default(), &Modes::default())
    }

    /// Decides the directives for one control interval.
    ///
    /// A cell is tracked while it has traffic. A cell seen for the first
    /// time is always pushed, even at drop ratio 0: after a control-plane
    /// restart the proxies may still hold an old non-zero directive for it.
    /// A cell whose traffic stopped is dropped from tracking; if its last
    /// pushed ratio was non-zero, a final ratio of 0 is pushed to lift it.
    pub fn decide(&mut self, load: &FleetLoad, policy: &Policy) -> Decision {
        self.decide_with(load, &policy.limits, &policy.tenants, &policy.modes)
    }

    fn decide_with(
        &mut self,
        load: &FleetLoad,
        limits: &LimitTable,
        tenants: &Tenants,
        modes: &Modes,
    ) -> Decision {
        let mut decision = Decision {
            buckets: Vec::with_capacity(load.buckets.len()),
            ..Decision::default()
        };
        let previous = std::mem::take(&mut self.buckets);
        let mut next = Vec::with_capacity(load.buckets.len());
        let mut previous = previous.into_iter().peekable();
        for traffic in load.buckets.iter().filter(|b| b.load.offered_rps > 0.0) {
            while let Some(gone) =
                previous.next_if(|state| compare(&state.bucket, &traffic.bucket).is_lt())
            {
                retire_bucket(gone, limits, &mut decision);
            }
            let state = previous
                .next_if(|state| compare(&state.bucket, &traffic.bucket).is_eq())
                .unwrap_or_else(|| BucketState {
                    bucket: Arc::clone(&traffic.bucket),
                    overloaded_intervals: 0,
                    cells: Vec::new(),
                });
            let limit = limits.limit_for(&traffic.bucket);
            let (state, status) =
                self.decide_bucket(traffic, state, limit, tenants, modes, &mut decision);
            next.push(state);
            decision.buckets.push(status);
        }
        for gone in previous {
            retire_bucket(gone, limits, &mut decision);
        }
        self.buckets = next;
        decision
    }

    fn decide_bucket(
        &mut self,
        traffic: &BucketTraffic,
        mut state: BucketState,
        limit: Option<LimitRps>,
        tenants: &Tenants,
        modes: &Modes,
        decision: &mut Decision,
    ) -> (BucketState, BucketStatus) {
        let bucket = &traffic.bucket;
        if let Some(limit) = limit {
            self.allocate(traffic, limit, tenants);
        }
        let overloaded = limit.is_some_and(|l| traffic.load.offered_rps > l.get());
        state.overloaded_intervals = if overloaded {
            state.overloaded_intervals.saturating_add(1)
        } else {
            0
        };
        let retry_after = retry_after_ms(self.interval, state.overloaded_intervals);
        let mode = modes.buckets.get(bucket.as_ref()).copied();

        // The steady case: the same cells as last time, updated in place.
        let same_cells = state.cells.len() == traffic.cells.len()
            && state.cells.iter().zip(&traffic.cells).all(|(old, new)| {
                old.priority == new.priority && compare(&old.tenant, &new.tenant).is_eq()
            });
        if !same_cells {
            state.cells = merge_cells(
                bucket,
                std::mem::take(&mut state.cells),
                &traffic.cells,
                limit,
                decision,
            );
        }

        let mut status = BucketStatus {
            bucket: Arc::clone(bucket),
            limit_rps: limit,
            offered_rps: traffic.load.offered_rps,
            admitted_rps: traffic.load.admitted_rps,
            drop_ratio: DropRatio::ZERO,
            proxies_reporting: traffic.load.proxies_reporting,
            shadow_dropped_rps: traffic.shadow_dropped_rps,
            floors_exceed_limit: limit.is_some() && self.allocation.floors_exceed_limit,
            cells: Vec::with_capacity(traffic.cells.len()),
        };
        for (index, (cell, cell_state)) in traffic.cells.iter().zip(&mut state.cells).enumerate() {
            let (target, share, reason) = match limit {
                Some(_) => cell_share(
                    &self.tenants,
                    &self.allocation,
                    &self.cell_tenant,
                    index,
                    cell,
                ),
                None => (None, 0.0, None),
            };
            let ratio = self.policy.cell_drop_ratio(
                bucket,
                &cell.tenant,
                cell.priority,
                &cell.load,
                target,
            );
            let dropping = ratio > DropRatio::ZERO;
            let next = Pushed {
                drop_ratio: ratio,
                limit,
                share_rps: share,
                reporting_proxies: traffic.load.proxies_reporting,
                mode,
                // A policy that still drops (smoothing) where the division
                // no longer would: the bucket as a whole is the reason.
                reason: dropping.then(|| reason.unwrap_or(Reason::ClusterOverload)),
                retry_after_ms: if dropping { retry_after } else { 0 },
                burst: tenants.policy_for(&cell.tenant).burst.get(),
            };
            // A cell new this tick is always pushed.
            let changed = cell_state
                .pushed
                .as_ref()
                .is_none_or(|pushed| pushed.differs_from(&next));
            if changed {
                cell_state.pushed = Some(next);
                decision
                    .changed
                    .push(directive(bucket, &cell.tenant, cell.priority, &next));
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
            });
        }
        (state, status)
    }

    /// Fills `self.allocation` with the bucket's division, and
    /// `self.cell_tenant` with each cell's tenant index.
    fn allocate(&mut self, traffic: &BucketTraffic, limit: LimitRps, tenants: &Tenants) {
        self.tenants.clear();
        self.cell_tenant.clear();
        let mut previous: Option<&str> = None;
        for cell in &traffic.cells {
            // Cells are sorted by tenant, so a tenant's cells are adjacent.
            if previous != Some(cell.tenant.as_ref()) {
                let policy = tenants.policy_for(&cell.tenant);
                self.tenants.push(TenantDemand {
                    weight: policy.weight.get(),
                    floor: policy.min_floor_rps.get(),
                    offered: [0.0; CLASSES],
                });
                previous = Some(cell.tenant.as_ref());
            }
            let index = self.tenants.len().saturating_sub(1);
            if let Some(offered) = self
                .tenants
                .last_mut()
                .and_then(|t| t.offered.get_mut(cell.priority.class()))
            {
                *offered += cell.load.offered_rps;
            }
            self.cell_tenant.push(index);
        }
        fairness::allocate_into(
            limit.get(),
            &self.tenants,
            &mut self.allocation,
            &mut self.scratch,
        );
    }

    /// Every directive currently in force, sorted by bucket, tenant and
    /// priority: what a proxy connecting now should receive.
    pub fn snapshot(&self) -> Vec<Directive> {
        self.buckets
            .iter()
            .flat_map(|state| {
                state.cells.iter().filter_map(move |cell| {
                    let pushed = cell.pushed.as_ref()?;
                    Some(directive(
                        &state.bucket,
                        &cell.tenant,
                        cell.priority,
                        pushed,
                    ))
                })
            })
            .collect()
    }
}

/// The cells of a bucket whose set of cells changed: kept ones carry their
/// pushed state over, new ones start unpushed, gone ones are retired.
fn merge_cells(
    bucket: &Arc<str>,
    previous: Vec<CellState>,
    cells: &[CellLoad],
    limit: Option<LimitRps>,
    decision: &mut Decision,
) -> Vec<CellState> {
    let order = |state: &CellState, cell: &CellLoad| {
        compare(&state.tenant, &cell.tenant).then(state.priority.cmp(&cell.priority))
    };
    let mut merged = Vec::with_capacity(cells.len());
    let mut previous = previous.into_iter().peekable();
    for cell in cells {
        while let Some(gone) = previous.next_if(|state| order(state, cell).is_lt()) {
            retire(bucket, gone, limit, decision);
        }
        let state = previous
            .next_if(|state| order(state, cell).is_eq())
            .unwrap_or_else(|| CellState {
                tenant: Arc::clone(&cell.tenant),
                priority: cell.priority,
                pushed: None,
            });
        merged.push(state);
    }
    for gone in previous {
        retire(bucket, gone, limit, decision);
    }
    merged
}

/// Retires every cell of a bucket whose traffic stopped.
fn retire_bucket(state: BucketState, limits: &LimitTable, decision: &mut Decision) {
    let limit = limits.limit_for(&state.bucket);
    for cell in state.cells {
        retire(&state.bucket, cell, limit, decision);
    }
}

/// The cell's admitted target, share and reason from the division: its
/// tenant's allocation in its class, split over the tenant's cells of that
/// class by offered rate.
fn cell_share(
    demands: &[TenantDemand],
    allocation: &Allocation,
    cell_tenant: &[usize],
    index: usize,
    cell: &CellLoad,
) -> (Option<LimitRps>, f64, Option<Reason>) {
    let class = cell.priority.class();
    let tenant = cell_tenant.get(index).copied().unwrap_or(0);
    let (Some(demand), Some(allocation)) = (demands.get(tenant), allocation.tenants.get(tenant))
    else {
        return (None, 0.0, None);
    };
    let class_offered = demand.offered.get(class).copied().unwrap_or(0.0);
    let fraction = if class_offered > 0.0 {
        cell.load.offered_rps / class_offered
    } else {
        0.0
    };
    let admitted = allocation.admitted.get(class).copied().unwrap_or(0.0) * fraction;
    let share = allocation.share.get(class).copied().unwrap_or(0.0) * fraction;
    let reason = allocation.reason.get(class).copied().flatten();
    (LimitRps::new(admitted).ok(), share, reason)
}

/// Stops tracking a cell: lifts it if it was dropping, and names it for
/// removal from the snapshot.
fn retire(bucket: &Arc<str>, cell: CellState, limit: Option<LimitRps>, decision: &mut Decision) {
    if let Some(pushed) = cell.pushed.filter(|p| p.drop_ratio != DropRatio::ZERO) {
        let lifted = pushed.lifted(limit);
        decision
            .changed
            .push(directive(bucket, &cell.tenant, cell.priority, &lifted));
    }
    decision.retired.push(RetiredCell {
        bucket: Arc::clone(bucket),
        tenant: cell.tenant,
        priority: cell.priority,
    });
}

/// The wire form; on the wire `limit_rps` 0 stands for "unlimited".
fn directive(bucket: &str, tenant: &str, priority: Priority, pushed: &Pushed) -> Directive {
    Directive {
        bucket: bucket.to_owned(),
        drop_ratio: pushed.drop_ratio.get(),
        limit_rps: pushed.limit.map_or(0.0, LimitRps::get),
        tenant: tenant.to_owned(),
        priority: priority.to_wire() as i32,
        share_rps: pushed.share_rps,
        reporting_proxies: pushed.reporting_proxies,
        mode: pushed.mode.map_or(0, |mode| mode.to_wire() as i32),
        reason: pushed.reason.map_or(0, |reason| reason.to_wire() as i32),
        retry_after_ms: pushed.retry_after_ms,
        burst: pushed.burst,
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)]
mod tests {
    use proptest::prelude::*;

    use sluice_proto::v1;

    use super::*;
    use crate::limits::{LimitRule, Selector};
    use crate::policy::{BurstMultiplier, TenantPolicy, Weight};

    fn limit(rps: f64) -> LimitRps {
        LimitRps::new(rps).unwrap()
    }

    fn load(entries: &[(&str, f64)]) -> FleetLoad {
        FleetLoad::new(
            entries
                .iter()
                .map(|&(bucket, offered_rps)| {
                    let load = BucketLoad {
                        offered_rps,
                        admitted_rps: offered_rps / 2.0,
                        proxies_reporting: 1,
                    };
                    BucketTraffic::single(bucket, load)
                })
                .collect(),
        )
    }

    fn table(rules: &[(&str, f64)]) -> LimitTable {
        LimitTable::from_rules(
            None,
            rules.iter().map(|&(bucket, rps)| LimitRule {
                selector: Selector::Bucket(bucket.to_owned()),
                limit_rps: limit(rps),
            }),
        )
    }

    fn buckets(directives: &[Directive]) -> Vec<(&str, f64)> {
        directives
            .iter()
            .map(|d| (d.bucket.as_str(), d.drop_ratio))
            .collect()
    }

    fn tenant_cell(tenant: &str, priority: Priority, offered_rps: f64) -> CellLoad {
        CellLoad {
            tenant: Arc::from(tenant),
            priority,
            load: BucketLoad {
                offered_rps,
                admitted_rps: offered_rps,
                proxies_reporting: 2,
            },
            shadow_dropped_rps: 0.0,
        }
    }

    fn policy(limit_rps: f64, tenants: &[(&str, f64, f64, f64)]) -> Policy {
        let mut table = Tenants::default();
        for &(name, weight, burst, floor) in tenants {
            table.insert(
                name.to_owned(),
                TenantPolicy {
                    weight: Weight::new(weight).unwrap(),
                    burst: BurstMultiplier::new(burst).unwrap(),
                    min_floor_rps: limit(floor),
                },
            );
        }
        Policy {
            limits: table_for("api", limit_rps),
            tenants: table,
            modes: Modes::default(),
        }
    }

    fn table_for(bucket: &str, rps: f64) -> LimitTable {
        table(&[(bucket, rps)])
    }

    fn find<'a>(directives: &'a [Directive], tenant: &str, priority: Priority) -> &'a Directive {
        directives
            .iter()
            .find(|d| d.tenant == tenant && d.priority == priority.to_wire() as i32)
            .unwrap_or_else(|| panic!("no directive for {tenant} {priority:?}: {directives:?}"))
    }

    fn admitted(d: &Directive, offered: f64) -> f64 {
        offered * (1.0 - d.drop_ratio)
    }

    #[test]
    fn weighted_tenants_are_admitted_within_five_percent_of_their_fair_share() {
        // Limit 1000, weights 4 / 1 / 0.25. `light` offers 30, under its
        // share, so the other 970 is split 4:1: 776 and 194.
        let policy = policy(
            1000.0,
            &[
                ("gold", 4.0, 2.0, 0.0),
                ("silver", 1.0, 1.0, 0.0),
                ("light", 0.25, 1.0, 0.0),
            ],
        );
        let offered = [("gold", 2000.0), ("silver", 900.0), ("light", 30.0)];
        let load = FleetLoad::new(vec![BucketTraffic::from_cells(
            "api",
            offered
                .iter()
                .map(|&(t, rps)| tenant_cell(t, Priority::Unspecified, rps))
                .collect(),
        )]);
        let mut controller = Controller::default();
        let decision = controller.decide(&load, &policy);
        let fair = [("gold", 776.0), ("silver", 194.0), ("light", 30.0)];
        let mut total = 0.0;
        for ((tenant, offered), (_, fair)) in offered.iter().zip(fair) {
            let d = find(&decision.changed, tenant, Priority::Unspecified);
            let got = admitted(d, *offered);
            assert!(
                (got - fair).abs() <= 0.05 * fair,
                "{tenant}: {got} vs {fair}"
            );
            total += got;
            assert_eq!(d.limit_rps, 1000.0);
            assert_eq!(d.reporting_proxies, 2);
        }
        assert!(
            (total - 1000.0).abs() < 1e-6,
            "the limit is used exactly: {total}"
        );
        let gold = find(&decision.changed, "gold", Priority::Unspecified);
        assert!((gold.share_rps - 776.0).abs() < 1e-6);
        assert_eq!(gold.burst, 2.0);
        assert_eq!(gold.reason, v1::Reason::TenantQuotaExceeded as i32);
        assert!(gold.retry_after_ms >= 1_000);
        let light = find(&decision.changed, "light", Priority::Unspecified);
        assert_eq!(light.drop_ratio, 0.0);
        assert_eq!(light.reason, 0);
        assert_eq!(light.retry_after_ms, 0);
        assert!(light.share_rps >= 30.0);

        let api = &decision.buckets[0];
        assert_eq!(api.cells.len(), 3);
        assert_eq!(api.cells[0].tenant.as_ref(), "gold", "sorted by tenant");
        assert_eq!(api.cells[0].reason, Some(Reason::TenantQuotaExceeded));
    }

    #[test]
    fn priorities_shed_bulk_first_with_priority_shed_as_the_reason() {
        let policy = policy(500.0, &[]);
        let load = FleetLoad::new(vec![BucketTraffic::from_cells(
            "api",
            vec![
                tenant_cell("a", Priority::Critical, 300.0),
                tenant_cell("a", Priority::Unspecified, 100.0),
                tenant_cell("b", Priority::BestEffort, 300.0),
                tenant_cell("b", Priority::Bulk, 400.0),
            ],
        )]);
        let mut controller = Controller::default();
        let decision = controller.decide(&load, &policy);
        let critical = find(&decision.changed, "a", Priority::Critical);
        assert_eq!(critical.drop_ratio, 0.0);
        // 200 left for BEST_EFFORT + unclassified (400 offered, equal
        // weights: 100 for `a`, 100 for `b`'s 300); BULK gets nothing.
        let unclassified = find(&decision.changed, "a", Priority::Unspecified);
        assert_eq!(unclassified.drop_ratio, 0.0);
        let best_effort = find(&decision.changed, "b", Priority::BestEffort);
        assert!((admitted(best_effort, 300.0) - 100.0).abs() < 1e-6);
        assert_eq!(best_effort.reason, v1::Reason::TenantQuotaExceeded as i32);
        let bulk = find(&decision.changed, "b", Priority::Bulk);
        assert_eq!(bulk.drop_ratio, 1.0);
        assert_eq!(bulk.reason, v1::Reason::PriorityShed as i32);
        assert_eq!(bulk.share_rps, 0.0);
    }

    #[test]
    fn critical_is_dropped_only_when_nothing_else_covers_the_excess() {
        let policy = policy(100.0, &[]);
        let load = FleetLoad::new(vec![BucketTraffic::from_cells(
            "api",
            vec![
                tenant_cell("", Priority::Critical, 200.0),
                tenant_cell("", Priority::Bulk, 50.0),
            ],
        )]);
        let decision = Controller::default().decide(&load, &policy);
        let critical = find(&decision.changed, "", Priority::Critical);
        assert!((critical.drop_ratio - 0.5).abs() < 1e-12);
        assert_eq!(critical.reason, v1::Reason::ClusterOverload as i32);
        assert_eq!(find(&decision.changed, "", Priority::Bulk).drop_ratio, 1.0);
    }

    #[test]
    fn floors_are_never_dropped() {
        let policy = policy(100.0, &[("small", 0.01, 1.0, 40.0)]);
        let load = FleetLoad::new(vec![BucketTraffic::from_cells(
            "api",
            vec![
                tenant_cell("big", Priority::Unspecified, 1000.0),
                tenant_cell("small", Priority::Bulk, 35.0),
            ],
        )]);
        let decision = Controller::default().decide(&load, &policy);
        assert_eq!(
            find(&decision.changed, "small", Priority::Bulk).drop_ratio,
            0.0
        );
        let big = find(&decision.changed, "big", Priority::Unspecified);
        assert!((admitted(big, 1000.0) - 65.0).abs() < 1e-6);
    }

    #[test]
    fn a_bucket_mode_reaches_its_directives_and_a_mode_change_is_pushed() {
        let mut policy = policy(100.0, &[]);
        let load = load(&[("api", 50.0)]);
        let mut controller = Controller::default();
        let first = controller.decide(&load, &policy);
        assert_eq!(
            first.changed[0].mode,
            v1::Mode::Unspecified as i32,
            "inherits"
        );
        policy.modes.buckets.insert("api".into(), Mode::Shadow);
        let decision = controller.decide(&load, &policy);
        assert_eq!(decision.changed.len(), 1);
        assert_eq!(decision.changed[0].mode, v1::Mode::Shadow as i32);
        assert!(controller.decide(&load, &policy).changed.is_empty());
    }

    #[test]
    fn share_reason_and_burst_changes_are_pushed() {
        let mut policy = policy(1000.0, &[("gold", 1.0, 1.0, 0.0)]);
        let two = |gold: f64, other: f64| {
            FleetLoad::new(vec![BucketTraffic::from_cells(
                "api",
                vec![
                    tenant_cell("gold", Priority::Unspecified, gold),
                    tenant_cell("other", Priority::Unspecified, other),
                ],
            )])
        };
        let mut controller = Controller::default();
        controller.decide(&two(800.0, 100.0), &policy);
        // Still under the limit, but `other` takes more: gold's share (what
        // it may send) shrinks, although no ratio moves.
        let decision = controller.decide(&two(800.0, 150.0), &policy);
        let gold = find(&decision.changed, "gold", Priority::Unspecified);
        assert_eq!(gold.drop_ratio, 0.0);
        assert!((gold.share_rps - 850.0).abs() < 1e-6);
        policy.tenants.insert(
            "gold".into(),
            TenantPolicy {
                burst: BurstMultiplier::new(3.0).unwrap(),
                ..TenantPolicy::default()
            },
        );
        let decision = controller.decide(&two(800.0, 150.0), &policy);
        assert_eq!(decision.changed.len(), 1);
        assert_eq!(decision.changed[0].burst, 3.0);
    }

    #[test]
    fn a_stopped_cell_is_lifted_and_retired_while_its_bucket_stays() {
        let policy = policy(100.0, &[]);
        let mut controller = Controller::default();
        controller.decide(
            &FleetLoad::new(vec![BucketTraffic::from_cells(
                "api",
                vec![
                    tenant_cell("a", Priority::Unspecified, 300.0),
                    tenant_cell("b", Priority::Unspecified, 10.0),
                ],
            )]),
            &policy,
        );
        let decision = controller.decide(
            &FleetLoad::new(vec![BucketTraffic::from_cells(
                "api",
                vec![tenant_cell("b", Priority::Unspecified, 10.0)],
            )]),
            &policy,
        );
        let lifted = find(&decision.changed, "a", Priority::Unspecified);
        assert_eq!(lifted.drop_ratio, 0.0);
        assert_eq!(lifted.reason, 0);
        assert_eq!(decision.retired.len(), 1);
        assert_eq!(decision.retired[0].tenant.as_ref(), "a");
        assert_eq!(controller.snapshot().len(), 1);
    }

    #[test]
    fn retry_after_grows_with_the_overload_and_is_capped() {
        let interval = ControlInterval::from_millis(500).unwrap();
        assert_eq!(retry_after_ms(interval, 0), 1_000);
        assert_eq!(retry_after_ms(interval, 1), 1_000, "whole seconds");
        assert_eq!(retry_after_ms(interval, 19), 1_000);
        assert_eq!(
            retry_after_ms(interval, 20),
            2_000,
            "10 s of overload: +1 s"
        );
        assert_eq!(retry_after_ms(interval, 1_000), MAX_RETRY_AFTER_MS);
        let slow = ControlInterval::from_millis(5_000).unwrap();
        assert_eq!(retry_after_ms(slow, 0), 10_000, "two control intervals");

        // Through the controller: the same bucket, longer overloaded.
        let limits = table(&[("acme", 100.0)]);
        let mut controller = Controller::default().with_interval(interval);
        let first = controller.tick(&load(&[("acme", 200.0)]), &limits);
        let first_wait = first.changed[0].retry_after_ms;
        let mut later = first_wait;
        for _ in 0..60 {
            if let Some(d) = controller
                .tick(&load(&[("acme", 200.0)]), &limits)
                .changed
                .first()
            {
                later = d.retry_after_ms;
            }
        }
        assert!(later > first_wait, "{later} after {first_wait}");
        let calm = controller.tick(&load(&[("acme", 50.0)]), &limits);
        assert_eq!(calm.changed[0].retry_after_ms, 0);
    }

    #[test]
    fn formula() {
        assert_eq!(drop_ratio(600.0, Some(limit(200.0))).get(), 2.0 / 3.0);
        assert_eq!(drop_ratio(200.0, Some(limit(200.0))).get(), 0.0);
        assert_eq!(drop_ratio(100.0, Some(limit(200.0))).get(), 0.0);
        assert_eq!(drop_ratio(0.0, Some(limit(200.0))).get(), 0.0);
        assert_eq!(drop_ratio(600.0, None).get(), 0.0);
        assert_eq!(drop_ratio(5.0, Some(limit(0.0))).get(), 1.0);
        assert_eq!(drop_ratio(0.0, Some(limit(0.0))).get(), 0.0);
    }

    fn arbitrary_load(cells: &[(u8, u8, u8, u16)]) -> FleetLoad {
        let mut buckets: std::collections::BTreeMap<String, Vec<CellLoad>> = Default::default();
        for &(bucket, tenant, priority, offered) in cells {
            let cells = buckets.entry(format!("b{}", bucket % 6)).or_default();
            let tenant = format!("t{}", tenant % 4);
            let priority = Priority::ALL[usize::from(priority) % Priority::ALL.len()];
            if cells
                .iter()
                .any(|c| c.tenant.as_ref() == tenant && c.priority == priority)
            {
                continue;
            }
            cells.push(tenant_cell(&tenant, priority, f64::from(offered) + 1.0));
        }
        FleetLoad::new(
            buckets
                .into_iter()
                .map(|(bucket, cells)| BucketTraffic::from_cells(&bucket, cells))
                .collect(),
        )
    }

    proptest! {
        /// Applying each tick's `changed` and `retired` to what proxies hold
        /// always yields the controller's snapshot, and a limited bucket
        /// with more offered than its limit admits its limit.
        #[test]
        fn deltas_reproduce_the_snapshot_and_shares_use_the_limit(
            ticks in prop::collection::vec(
                prop::collection::vec((0u8..6, 0u8..4, 0u8..5, 0u16..500), 0..20),
                1..8,
            ),
        ) {
            let policy = Policy {
                limits: LimitTable::new(Some(limit(300.0))),
                tenants: Tenants::default(),
                modes: Modes::default(),
            };
            let mut controller = Controller::default();
            let mut held: std::collections::BTreeMap<(String, String, i32), Directive> =
                Default::default();
            for cells in &ticks {
                let load = arbitrary_load(cells);
                let decision = controller.decide(&load, &policy);
                for d in decision.changed {
                    held.insert((d.bucket.clone(), d.tenant.clone(), d.priority), d);
                }
                for r in decision.retired {
                    held.remove(&(r.bucket.to_string(), r.tenant.to_string(), r.priority.to_wire() as i32));
                }
                let held_now: Vec<Directive> = held.values().cloned().collect();
                prop_assert_eq!(held_now, controller.snapshot());
                for traffic in &load.buckets {
                    let admitted: f64 = traffic
                        .cells
                        .iter()
                        .map(|c| {
                            let d = held
                                .get(&(traffic.bucket.to_string(), c.tenant.to_string(), c.priority.to_wire() as i32))
                                .unwrap();
                            c.load.offered_rps * (1.0 - d.drop_ratio)
                        })
                        .sum();
                    let expected = traffic.load.offered_rps.min(300.0);
                    // Pushed ratios lag by at most the change threshold.
                    prop_assert!(
                        (admitted - expected).abs() <= CHANGE_THRESHOLD * traffic.load.offered_rps + 1e-6,
                        "{}: {} vs {}", traffic.bucket, admitted, expected
                    );
                }
            }
        }

        #[test]
        fn ratio_is_a_probability(offered in 0.0..1e12f64, rps in 0.0..=1e9f64) {
            let ratio = drop_ratio(offered, Some(limit(rps))).get();
            prop_assert!((0.0..=1.0).contains(&ratio));
        }

        #[test]
        fn admitted_share_respects_the_limit(offered in 0.0..1e12f64, rps in 0.0..=1e9f64) {
            let ratio = drop_ratio(offered, Some(limit(rps))).get();
            let admitted = offered * (1.0 - ratio);
            if offered > rps {
                prop_assert!(admitted <= rps + 1e-6 * rps.max(1.0), "{admitted} > {rps}");
            } else {
                prop_assert_eq!(ratio, 0.0);
                prop_assert_eq!(admitted, offered);
            }
        }

        #[test]
        fn unlimited_never_drops(offered in 0.0..1e12f64) {
            prop_assert_eq!(drop_ratio(offered, None), DropRatio::ZERO);
        }
    }

    #[test]
    fn new_buckets_are_pushed_even_at_zero() {
        let mut controller = Controller::default();
        let decision = controller.tick(
            &load(&[("acme", 600.0), ("free", 10.0)]),
            &table(&[("acme", 200.0)]),
        );
        assert_eq!(
            buckets(&decision.changed),
            [("acme", 2.0 / 3.0), ("free", 0.0)]
        );
        assert_eq!(decision.changed[0].limit_rps, 200.0);
        assert_eq!(decision.changed[1].limit_rps, 0.0, "unlimited on the wire");
        assert_eq!(controller.snapshot(), decision.changed);
        assert_eq!(decision.buckets.len(), 2);
        assert_eq!(decision.buckets[0].limit_rps, Some(limit(200.0)));
        assert_eq!(decision.buckets[1].limit_rps, None);
    }

    #[test]
    fn small_changes_are_not_pushed_but_accumulate() {
        let limits = table(&[("acme", 200.0)]);
        let mut controller = Controller::default();
        controller.tick(&load(&[("acme", 400.0)]), &limits); // 0.5
        // 0.5 → 0.5006: below the threshold, nothing to push, view keeps 0.5.
        let decision = controller.tick(&load(&[("acme", 400.48)]), &limits);
        assert!(decision.changed.is_empty());
        assert_eq!(decision.buckets[0].drop_ratio.get(), 0.5);
        // Compared against what was pushed, not the previous tick: drifting
        // in small steps still ends up pushed.
        let decision = controller.tick(&load(&[("acme", 401.0)]), &limits);
        assert_eq!(decision.changed.len(), 1);
        assert!((decision.changed[0].drop_ratio - (1.0 - 200.0 / 401.0)).abs() < 1e-12);
    }

    #[test]
    fn limit_change_is_pushed_even_without_ratio_change() {
        let mut controller = Controller::default();
        controller.tick(&load(&[("acme", 100.0)]), &table(&[("acme", 200.0)]));
        let decision = controller.tick(&load(&[("acme", 100.0)]), &table(&[("acme", 300.0)]));
        assert_eq!(buckets(&decision.changed), [("acme", 0.0)]);
        assert_eq!(decision.changed[0].limit_rps, 300.0);
        let decision = controller.tick(&load(&[("acme", 100.0)]), &table(&[]));
        assert_eq!(decision.changed[0].limit_rps, 0.0, "limit removed");
    }

    #[test]
    fn limit_change_that_changes_the_ratio() {
        let mut controller = Controller::default();
        controller.tick(&load(&[("acme", 600.0)]), &table(&[("acme", 200.0)]));
        let decision = controller.tick(&load(&[("acme", 600.0)]), &table(&[("acme", 300.0)]));
        assert_eq!(buckets(&decision.changed), [("acme", 0.5)]);
    }

    #[test]
    fn stopped_bucket_is_lifted_once_then_forgotten() {
        let limits = table(&[("acme", 200.0), ("calm", 200.0)]);
        let mut controller = Controller::default();
        controller.tick(&load(&[("acme", 400.0), ("calm", 100.0)]), &limits);
        let decision = controller.tick(&load(&[]), &limits);
        assert_eq!(
            buckets(&decision.changed),
            [("acme", 0.0)],
            "calm was already at 0"
        );
        assert!(controller.snapshot().is_empty());
        assert_eq!(decision.retired.len(), 2);
        assert!(decision.buckets.is_empty());
        assert!(controller.tick(&load(&[]), &limits).changed.is_empty());
    }

    #[test]
    fn unchanged_state_pushes_nothing() {
        let limits = table(&[("acme", 200.0)]);
        let mut controller = Controller::default();
        controller.tick(&load(&[("acme", 600.0)]), &limits);
        let decision = controller.tick(&load(&[("acme", 600.0)]), &limits);
        assert!(decision.changed.is_empty());
        assert_eq!(buckets(&controller.snapshot()), [("acme", 2.0 / 3.0)]);
    }

    #[test]
    fn policy_can_be_swapped() {
        struct Halve;
        impl DropPolicy for Halve {
            fn drop_ratio(&mut self, _: &str, _: &BucketLoad, _: Option<LimitRps>) -> DropRatio {
                DropRatio::new(0.5).unwrap()
            }
        }
        let mut controller = Controller::new(Halve);
        let decision = controller.tick(&load(&[("x", 1.0)]), &table(&[]));
        assert_eq!(buckets(&decision.changed), [("x", 0.5)]);
    }
}
