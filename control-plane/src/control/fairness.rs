//! How a limited bucket's capacity is divided among its cells.
//!
//! Two rules, applied in this order:
//!
//! 1. **Floors.** A tenant's `min_floor_rps` is reserved before anything
//!    else, covering its most important traffic first: a tenant offering
//!    less than its floor is never dropped. When the floors of the tenants
//!    present add up to more than the limit, every tenant still gets
//!    `min(offered, floor)` and nothing beyond it: the bucket then admits
//!    more than its limit (the sum of those floors), because a floor is a
//!    promise to that tenant while the limit is a target for the bucket.
//!    [`Allocation::floors_exceed_limit`] reports this.
//! 2. **Priorities, strictly.** What is left goes to CRITICAL traffic, then
//!    DEGRADED, then BEST_EFFORT (with unclassified traffic), then BULK. The
//!    first class whose demand does not fit is *constrained*: its tenants
//!    share what is left by weighted max-min fairness ([`water_fill_with`]); every
//!    class after it is *shed* down to its floors.
//!
//! Whenever the offered rate exceeds the limit (and the floors fit), the
//! admitted allocations add up to exactly the limit.
//!
//! A floor configured on the `default` tenant is one floor for all the
//! tenants not configured by name together ([`share_floor`]): clients
//! choose tenant names, and a floor per name would let them add floors
//! beyond the limit by inventing names.

use sluice_core::{CLASSES, Reason};

/// One tenant's claim in [`water_fill_with`]: it gets `clamp(weight · level, lo, hi)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Claim {
    /// Relative weight, `> 0`.
    pub(crate) weight: f64,
    /// Guaranteed minimum (its floor, capped at its demand).
    pub(crate) lo: f64,
    /// Its demand; `lo <= hi`.
    pub(crate) hi: f64,
}

/// Weighted max-min fair shares with bounds, by water-filling in
/// `O(n log n)`.
///
/// Finds the level `λ` at which `Σ clamp(wᵢ·λ, loᵢ, hiᵢ)` equals `capacity`
/// (clamped into `[Σlo, Σhi]`) and writes each claim's allocation to `out`.
/// Returns `λ`: infinite when every demand fits, 0 when only the minimums do.
///
/// The sum is piecewise linear in `λ`, with a kink where a claim starts
/// growing (`lo/w`) and one where it is satisfied (`hi/w`); the kinks are
/// sorted once and swept, tracking the total weight of the growing claims.
/// `kinks` is a caller-owned buffer for them, so that a caller dividing
/// many buckets allocates once.
pub(crate) fn water_fill_with(
    claims: &[Claim],
    capacity: f64,
    out: &mut Vec<f64>,
    kinks: &mut Vec<(f64, f64)>,
) -> f64 {
    out.clear();
    kinks.clear();
    let lo_sum: f64 = claims.iter().map(|c| c.lo).sum();
    let hi_sum: f64 = claims.iter().map(|c| c.hi).sum();
    if capacity >= hi_sum {
        out.extend(claims.iter().map(|c| c.hi));
        return f64::INFINITY;
    }
    if capacity <= lo_sum {
        out.extend(claims.iter().map(|c| c.lo));
        return 0.0;
    }
    // (level, change of the growing weight there)
    for claim in claims.iter().filter(|c| c.weight > 0.0) {
        kinks.push((claim.lo / claim.weight, claim.weight));
        kinks.push((claim.hi / claim.weight, -claim.weight));
    }
    kinks.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));

    let mut level = 0.0;
    let mut total = lo_sum;
    let mut growing = 0.0_f64;
    let mut solved = None;
    for &(at, change) in kinks.iter() {
        let reached = total + growing * (at - level);
        if growing > 0.0 && reached >= capacity {
            solved = Some(level + (capacity - total) / growing);
            break;
        }
        total = reached;
        level = at;
        growing += change;
    }
    // Past the last kink every claim is satisfied, and `capacity < hi_sum`
    // ruled that out; rounding can still land here, at the last kink.
    let level = solved.unwrap_or(level);
    out.extend(claims.iter().map(|c| (c.weight * level).clamp(c.lo, c.hi)));
    level
}

/// What a tenant brings to a bucket: its policy and its offered rate per
/// priority class.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TenantDemand {
    /// Weight in the fair share.
    pub weight: f64,
    /// Rate below which the tenant is never dropped.
    pub floor: f64,
    /// Offered rate per class ([`sluice_core::Priority::class`]).
    pub offered: [f64; CLASSES],
}

/// How a class fared.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) enum ClassOutcome {
    /// Everything it offered is admitted (or it offered nothing).
    #[default]
    Admitted,
    /// It did not fit; its tenants share what was left at this level
    /// (allocation `clamp(weight · level, floor, offered)`).
    Constrained {
        /// The water level.
        level: f64,
    },
    /// A higher class took everything; only floors are admitted.
    Shed,
}

/// One tenant's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TenantAllocation {
    /// Admitted rate per class.
    pub admitted: [f64; CLASSES],
    /// Share per class: what the tenant may send in that class before it is
    /// dropped (at least `admitted`).
    pub(crate) share: [f64; CLASSES],
    /// Why the tenant is dropped in a class; `None` where it is not.
    pub(crate) reason: [Option<Reason>; CLASSES],
}

/// A bucket's division of its limit.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Allocation {
    /// Per tenant, in the order given.
    pub tenants: Vec<TenantAllocation>,
    /// Per class.
    pub(crate) classes: [ClassOutcome; CLASSES],
    /// The tenants' floors alone exceed the limit (see the module docs).
    pub(crate) floors_exceed_limit: bool,
}

/// A demand this close to the capacity counts as fitting: rates are
/// estimates, and dropping 1e-9 of a class would only add noise.
const EPSILON: f64 = 1e-9;

/// Buffers [`allocate_into`] reuses from one bucket to the next.
#[derive(Debug, Default)]
pub struct Scratch {
    guaranteed: Vec<[f64; CLASSES]>,
    claims: Vec<Claim>,
    fill: Vec<f64>,
    kinks: Vec<(f64, f64)>,
}

/// Divides `limit` among `tenants` (see the module docs).
pub fn allocate(limit: f64, tenants: &[TenantDemand]) -> Allocation {
    let mut result = Allocation::default();
    allocate_into(limit, tenants, &mut result, &mut Scratch::default());
    result
}

/// [`allocate`] into `result`, reusing its and `scratch`'s memory.
pub fn allocate_into(
    limit: f64,
    tenants: &[TenantDemand],
    result: &mut Allocation,
    scratch: &mut Scratch,
) {
    result.tenants.clear();
    result.classes = [ClassOutcome::Admitted; CLASSES];
    result.floors_exceed_limit = false;
    // The common case: everything fits. Each tenant keeps what it offers
    // and may also use what is left.
    let offered: f64 = tenants.iter().flat_map(|t| t.offered.iter()).sum();
    if offered <= limit {
        let spare = limit - offered;
        result.tenants.extend(tenants.iter().map(|tenant| {
            let admitted = tenant.offered.map(|o| o.max(0.0));
            TenantAllocation {
                admitted,
                share: admitted.map(|a| (a + spare).min(limit)),
                reason: [None; CLASSES],
            }
        }));
        return;
    }
    result
        .tenants
        .resize(tenants.len(), TenantAllocation::default());
    let Scratch {
        guaranteed,
        claims,
        fill,
        kinks,
    } = scratch;
    // Floors, spread over each tenant's classes from the most important.
    guaranteed.clear();
    guaranteed.resize(tenants.len(), [0.0; CLASSES]);
    let mut guaranteed_total = 0.0;
    for (tenant, guaranteed) in tenants.iter().zip(guaranteed.iter_mut()) {
        let mut floor = tenant.floor.max(0.0);
        for (offered, g) in tenant.offered.iter().zip(guaranteed.iter_mut()) {
            *g = offered.max(0.0).min(floor);
            floor -= *g;
            guaranteed_total += *g;
        }
    }
    let mut spare = limit - guaranteed_total;
    result.floors_exceed_limit = spare < -EPSILON * limit.max(1.0);
    spare = spare.max(0.0);

    let mut higher_demand = false;
    // What each class that fits leaves for the classes after it: room it
    // could take from them, being served first.
    let mut room_after = [0.0; CLASSES];
    for class in 0..CLASSES {
        claims.clear();
        let mut extra = 0.0;
        let mut demand = 0.0;
        for (tenant, guaranteed) in tenants.iter().zip(guaranteed.iter()) {
            let offered = tenant.offered.get(class).copied().unwrap_or(0.0).max(0.0);
            let lo = guaranteed.get(class).copied().unwrap_or(0.0);
            demand += offered;
            extra += offered - lo;
            claims.push(Claim {
                weight: tenant.weight,
                lo,
                hi: offered,
            });
        }
        let outcome = if extra <= spare + EPSILON * spare.max(1.0) {
            spare = (spare - extra).max(0.0);
            set(&mut room_after, class, spare);
            ClassOutcome::Admitted
        } else if spare > 0.0 {
            let capacity = claims.iter().map(|c| c.lo).sum::<f64>() + spare;
            let level = water_fill_with(claims, capacity, fill, kinks);
            spare = 0.0;
            ClassOutcome::Constrained { level }
        } else {
            ClassOutcome::Shed
        };
        match outcome {
            ClassOutcome::Admitted => {
                for (allocation, claim) in result.tenants.iter_mut().zip(claims.iter()) {
                    set(&mut allocation.admitted, class, claim.hi);
                }
            }
            ClassOutcome::Constrained { .. } => {
                for (allocation, a) in result.tenants.iter_mut().zip(fill.iter()) {
                    set(&mut allocation.admitted, class, *a);
                }
            }
            ClassOutcome::Shed => {
                for (allocation, claim) in result.tenants.iter_mut().zip(claims.iter()) {
                    set(&mut allocation.admitted, class, claim.lo);
                }
            }
        }
        if let Some(slot) = result.classes.get_mut(class) {
            *slot = outcome;
        }
        // Reasons, now that the class's allocations are known.
        let someone_undropped = claims.iter().zip(&result.tenants).any(|(claim, a)| {
            claim.hi > 0.0 && get(&a.admitted, class) >= claim.hi * (1.0 - 1e-12)
        });
        for (allocation, claim) in result.tenants.iter_mut().zip(claims.iter()) {
            let dropped = get(&allocation.admitted, class) < claim.hi * (1.0 - 1e-12);
            let reason = match outcome {
                _ if !dropped => None,
                ClassOutcome::Constrained { .. } if someone_undropped => {
                    Some(Reason::TenantQuotaExceeded)
                }
                _ if higher_demand => Some(Reason::PriorityShed),
                _ => Some(Reason::ClusterOverload),
            };
            if let Some(slot) = allocation.reason.get_mut(class) {
                *slot = reason;
            }
        }
        higher_demand |= demand > 0.0;
    }

    // Shares: what each tenant could send in a class before being dropped.
    // A class that fits could also take what the classes after it got:
    // they are served from what it leaves. (The spare left after every
    // class is 0 once a later class is constrained; a share of exactly
    // what the class offers now would let a smoothing policy shed its
    // noise, CRITICAL traffic dropped while BULK is shed.) Likewise a
    // tenant offering less than its floor may send the rest of its floor
    // in any class.
    for (class, outcome) in result.classes.iter().enumerate() {
        for ((allocation, tenant), guaranteed) in result
            .tenants
            .iter_mut()
            .zip(tenants)
            .zip(guaranteed.iter())
        {
            let admitted = get(&allocation.admitted, class);
            let floor_left = (tenant.floor.max(0.0) - guaranteed.iter().sum::<f64>()).max(0.0);
            let share = match *outcome {
                ClassOutcome::Admitted => admitted + get(&room_after, class),
                ClassOutcome::Constrained { level } => admitted.max(tenant.weight * level),
                ClassOutcome::Shed => admitted,
            } + floor_left;
            set(&mut allocation.share, class, share.min(limit.max(admitted)));
        }
    }
}

/// Splits `floor` among the tenants at `members` (those the `default`
/// entry covers), replacing their own floors: max-min fairly by what each
/// offers, so together they are guaranteed `floor` at most, however many
/// names they come under.
pub(crate) fn share_floor(
    tenants: &mut [TenantDemand],
    members: &[usize],
    floor: f64,
    scratch: &mut Scratch,
) {
    let Scratch {
        claims,
        fill,
        kinks,
        ..
    } = scratch;
    claims.clear();
    for &index in members {
        let offered = tenants
            .get(index)
            .map_or(0.0, |t| t.offered.iter().map(|o| o.max(0.0)).sum());
        claims.push(Claim {
            weight: 1.0,
            lo: 0.0,
            hi: offered,
        });
    }
    water_fill_with(claims, floor.max(0.0), fill, kinks);
    for (&index, share) in members.iter().zip(fill.iter()) {
        if let Some(tenant) = tenants.get_mut(index) {
            tenant.floor = *share;
        }
    }
}

fn get(values: &[f64; CLASSES], class: usize) -> f64 {
    values.get(class).copied().unwrap_or(0.0)
}

fn set(values: &mut [f64; CLASSES], class: usize, value: f64) {
    if let Some(slot) = values.get_mut(class) {
        *slot = value;
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const BE: usize = 2;

    fn tenant(weight: f64, floor: f64, offered: f64) -> TenantDemand {
        let mut demand = TenantDemand {
            weight,
            floor,
            offered: [0.0; CLASSES],
        };
        demand.offered[BE] = offered;
        demand
    }

    fn admitted(allocation: &Allocation, class: usize) -> Vec<f64> {
        allocation
            .tenants
            .iter()
            .map(|t| t.admitted[class])
            .collect()
    }

    fn total(allocation: &Allocation) -> f64 {
        allocation
            .tenants
            .iter()
            .flat_map(|t| t.admitted.iter())
            .sum()
    }

    /// Weighted max-min fairness by its definition: raise every unsatisfied
    /// tenant's allocation in proportion to its weight until the capacity is
    /// used, found by bisection (independent of the sweep in `water_fill_with`).
    fn reference(weights: &[f64], offered: &[f64], capacity: f64) -> Vec<f64> {
        let used = |level: f64| -> f64 {
            weights
                .iter()
                .zip(offered)
                .map(|(w, d)| (w * level).min(*d))
                .sum()
        };
        let (mut low, mut high) = (0.0, 1e12);
        for _ in 0..200 {
            let mid = (low + high) / 2.0;
            if used(mid) < capacity {
                low = mid;
            } else {
                high = mid;
            }
        }
        weights
            .iter()
            .zip(offered)
            .map(|(w, d)| (w * high).min(*d))
            .collect()
    }

    #[test]
    fn three_weighted_tenants_get_their_fair_shares() {
        // Weights 4 / 1 / 0.25 against a limit of 1000. `light` offers less
        // than its share, so what it leaves is split 4:1 between the others.
        let weights = [4.0, 1.0, 0.25];
        let offered = [2000.0, 900.0, 30.0];
        let tenants: Vec<_> = weights
            .iter()
            .zip(offered)
            .map(|(&w, d)| tenant(w, 0.0, d))
            .collect();
        let allocation = allocate(1000.0, &tenants);
        let expected = reference(&weights, &offered, 1000.0);
        // 30 fits (0.25 · 194 > 30); the other 970 is split 4:1.
        assert!((expected[0] - 776.0).abs() < 1e-6, "{expected:?}");
        assert!((expected[1] - 194.0).abs() < 1e-6);
        for (got, want) in admitted(&allocation, BE).iter().zip(&expected) {
            assert!((got - want).abs() <= 0.05 * want, "{got} vs {want}");
        }
        assert!((total(&allocation) - 1000.0).abs() < 1e-6);
        assert_eq!(
            allocation.tenants[2].reason[BE], None,
            "light is not dropped"
        );
        assert_eq!(
            allocation.tenants[0].reason[BE],
            Some(Reason::TenantQuotaExceeded)
        );
    }

    #[test]
    fn naive_weight_ratio_wastes_capacity_but_water_filling_does_not() {
        // The naive rule gives each tenant `limit · w / Σw` whatever it
        // offers: `mid` offers 100 of its 190.5 and the 90.5 it leaves is
        // lost, although `heavy` wants far more.
        let weights = [4.0, 1.0, 0.25];
        let offered = [2000.0, 100.0, 50.0];
        let limit = 1000.0;
        let weight_sum: f64 = weights.iter().sum();
        let naive: f64 = weights
            .iter()
            .zip(offered)
            .map(|(w, d)| (limit * w / weight_sum).min(d))
            .sum();
        assert!(naive < 0.95 * limit, "naive admits only {naive}");

        let tenants: Vec<_> = weights
            .iter()
            .zip(offered)
            .map(|(&w, d)| tenant(w, 0.0, d))
            .collect();
        let allocation = allocate(limit, &tenants);
        assert!((total(&allocation) - limit).abs() < 1e-6);
        assert_eq!(admitted(&allocation, BE)[1..], [100.0, 50.0]);
    }

    #[test]
    fn floors_hold_and_leave_the_rest_to_the_weights() {
        // `small` offers 30 under a floor of 50: never dropped, although its
        // weight alone would give it far less.
        let tenants = [tenant(100.0, 0.0, 1000.0), tenant(0.01, 50.0, 30.0)];
        let allocation = allocate(200.0, &tenants);
        assert_eq!(allocation.tenants[1].admitted[BE], 30.0);
        assert_eq!(allocation.tenants[1].reason[BE], None);
        assert!((allocation.tenants[0].admitted[BE] - 170.0).abs() < 1e-9);

        // Above its floor it gets at least the floor.
        let tenants = [tenant(100.0, 0.0, 1000.0), tenant(0.01, 50.0, 300.0)];
        let allocation = allocate(200.0, &tenants);
        assert!((allocation.tenants[1].admitted[BE] - 50.0).abs() < 1e-6);
        assert!((total(&allocation) - 200.0).abs() < 1e-6);
    }

    #[test]
    fn floors_above_the_limit_are_honoured_and_reported() {
        let tenants = [tenant(1.0, 80.0, 100.0), tenant(1.0, 80.0, 60.0)];
        let allocation = allocate(100.0, &tenants);
        assert!(allocation.floors_exceed_limit);
        assert_eq!(admitted(&allocation, BE), [80.0, 60.0]);
    }

    #[test]
    fn a_shared_floor_does_not_grow_with_invented_names() {
        // `min_floor_rps: 5` on `default` and 20 names nobody configured,
        // each offering 3 rps, against a limit of 10: 60 rps were admitted
        // when each name had a floor of its own.
        let mut tenants = vec![tenant(1.0, 5.0, 3.0); 20];
        let members: Vec<usize> = (0..20).collect();
        let mut scratch = Scratch::default();
        share_floor(&mut tenants, &members, 5.0, &mut scratch);
        let floors: f64 = tenants.iter().map(|t| t.floor).sum();
        assert!((floors - 5.0).abs() < 1e-9, "{floors}");
        let allocation = allocate(10.0, &tenants);
        assert!(!allocation.floors_exceed_limit);
        assert!(
            (total(&allocation) - 10.0).abs() < 1e-9,
            "{}",
            total(&allocation)
        );

        // A lone unconfigured tenant keeps the whole floor; one offering
        // less than its part leaves the rest to the others.
        let mut tenants = vec![
            tenant(1.0, 0.0, 100.0),
            tenant(1.0, 0.0, 1.0),
            tenant(1.0, 0.0, 100.0),
        ];
        share_floor(&mut tenants, &[0, 1], 30.0, &mut scratch);
        assert_eq!(
            [tenants[0].floor, tenants[1].floor, tenants[2].floor],
            [29.0, 1.0, 0.0]
        );
    }

    #[test]
    fn priorities_are_served_strictly_in_order() {
        // CRITICAL 300 and DEGRADED 400 fit into 1000; BEST_EFFORT gets the
        // remaining 300 of its 500; BULK is shed.
        let mixed = TenantDemand {
            weight: 1.0,
            floor: 0.0,
            offered: [300.0, 400.0, 500.0, 200.0],
        };
        let allocation = allocate(1000.0, &[mixed]);
        assert_eq!(allocation.tenants[0].admitted, [300.0, 400.0, 300.0, 0.0]);
        assert_eq!(allocation.classes[0], ClassOutcome::Admitted);
        assert!(matches!(
            allocation.classes[2],
            ClassOutcome::Constrained { .. }
        ));
        assert_eq!(allocation.classes[3], ClassOutcome::Shed);
        // The classes that fit may grow into the room the later ones take:
        // CRITICAL up to 1000 − 300 of its own, DEGRADED into BEST_EFFORT's
        // 300 (BULK took nothing).
        assert_eq!(allocation.tenants[0].share[0], 1000.0);
        assert_eq!(allocation.tenants[0].share[1], 700.0);
        assert_eq!(
            allocation.tenants[0].reason,
            [
                None,
                None,
                Some(Reason::PriorityShed),
                Some(Reason::PriorityShed)
            ]
        );

        // CRITICAL alone above the limit: only then is it dropped.
        let critical = TenantDemand {
            weight: 1.0,
            floor: 0.0,
            offered: [1500.0, 0.0, 0.0, 100.0],
        };
        let allocation = allocate(1000.0, &[critical]);
        assert_eq!(allocation.tenants[0].admitted, [1000.0, 0.0, 0.0, 0.0]);
        assert_eq!(
            allocation.tenants[0].reason[0],
            Some(Reason::ClusterOverload)
        );
    }

    #[test]
    fn a_tenants_floor_covers_its_most_important_traffic_first() {
        let busy = TenantDemand {
            weight: 1.0,
            floor: 0.0,
            offered: [1000.0, 0.0, 0.0, 0.0],
        };
        let floored = TenantDemand {
            weight: 1.0,
            floor: 40.0,
            offered: [0.0, 0.0, 0.0, 30.0],
        };
        let allocation = allocate(500.0, &[busy, floored]);
        assert_eq!(allocation.tenants[1].admitted[3], 30.0, "bulk within floor");
        // It may send the rest of its floor too, in any class.
        assert_eq!(allocation.tenants[1].share[3], 40.0);
        assert_eq!(allocation.tenants[0].admitted[0], 470.0);
    }

    #[test]
    fn under_the_limit_everything_passes_and_shares_include_the_spare() {
        let tenants = [tenant(1.0, 0.0, 100.0), tenant(1.0, 0.0, 50.0)];
        let allocation = allocate(1000.0, &tenants);
        assert_eq!(admitted(&allocation, BE), [100.0, 50.0]);
        assert_eq!(allocation.tenants[0].share[BE], 950.0);
        assert!(
            allocation
                .tenants
                .iter()
                .all(|t| t.reason == [None; CLASSES])
        );
    }

    #[test]
    fn ten_thousand_tenants_add_up() {
        let tenants: Vec<_> = (0..10_000)
            .map(|i| {
                tenant(
                    1.0 + f64::from(i % 7),
                    f64::from(i % 3),
                    f64::from(i % 100 + 1),
                )
            })
            .collect();
        let allocation = allocate(100_000.0, &tenants);
        assert!((total(&allocation) - 100_000.0).abs() < 1e-3);
    }

    proptest! {
        #[test]
        fn allocations_add_up_to_the_limit_and_respect_bounds(
            limit in 0.0..1e6f64,
            raw in prop::collection::vec((0.01..100.0f64, 0.0..500.0f64, prop::array::uniform4(0.0..1e5f64)), 1..40),
        ) {
            let tenants: Vec<TenantDemand> = raw
                .iter()
                .map(|&(weight, floor, offered)| TenantDemand { weight, floor, offered })
                .collect();
            let allocation = allocate(limit, &tenants);
            let offered: f64 = tenants.iter().flat_map(|t| t.offered.iter()).sum();
            let floors: f64 = tenants
                .iter()
                .map(|t| t.floor.min(t.offered.iter().sum()))
                .sum();
            let admitted = total(&allocation);
            let tolerance = 1e-6 * limit.max(offered).max(1.0);
            let expected = if floors > limit { floors } else { offered.min(limit) };
            prop_assert!((admitted - expected).abs() <= tolerance, "{admitted} vs {expected}");
            for (t, a) in tenants.iter().zip(&allocation.tenants) {
                let mut floor = t.floor;
                for class in 0..CLASSES {
                    let guaranteed = t.offered[class].min(floor);
                    floor -= guaranteed;
                    prop_assert!(a.admitted[class] <= t.offered[class] + tolerance);
                    prop_assert!(a.admitted[class] >= guaranteed - tolerance);
                    prop_assert!(a.share[class] >= a.admitted[class] - tolerance);
                }
            }
        }

        #[test]
        fn water_fill_matches_the_definition(
            capacity in 0.0..1e5f64,
            raw in prop::collection::vec((0.01..100.0f64, 0.0..1e4f64), 1..50),
        ) {
            let weights: Vec<f64> = raw.iter().map(|r| r.0).collect();
            let offered: Vec<f64> = raw.iter().map(|r| r.1).collect();
            let claims: Vec<Claim> = raw.iter().map(|&(weight, hi)| Claim { weight, lo: 0.0, hi }).collect();
            let mut out = Vec::new();
            water_fill_with(&claims, capacity, &mut out, &mut Vec::new());
            let want = reference(&weights, &offered, capacity);
            for (got, want) in out.iter().zip(&want) {
                prop_assert!((got - want).abs() <= 1e-6 * capacity.max(1.0), "{got} vs {want}");
            }
        }
    }
}
