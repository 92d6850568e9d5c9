//! What the control plane says about one cell, as a proxy may act on it:
//! the wire directive checked into a [`CellDirective`], the rule that a
//! directive enforcing nothing is a lift ([`is_lift`]), and how long
//! directives stay fresh ([`DirectiveTtl`]). One rule for the side that
//! sends them and the side that enforces them.

use std::num::NonZeroU64;

use serde::{Deserialize, Serialize};
use sluice_proto::v1::Directive;

use crate::{DropRatio, DropReason, DropThreshold, MAX_BUCKET_KEY_BYTES, MAX_TENANT_BYTES};

/// What a costed request counts when decided, and the most its stream's
/// usage may bring that to ([`CellDirective::count`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CountedCost {
    /// Counted in its cell's offered (and admitted) cost at the decision.
    pub counted: u64,
    /// Its estimate within the budget's bound, at least `counted`.
    pub claimed: u64,
}

impl CountedCost {
    /// An estimate counted whole (no directive bounds it).
    pub const fn whole(estimate: u64) -> Self {
        Self {
            counted: estimate,
            claimed: estimate,
        }
    }
}

/// A validated directive of one cell.
#[derive(Debug, Clone, PartialEq)]
pub struct CellDirective {
    /// Probability of dropping a request.
    pub drop_ratio: DropRatio,
    /// The same, in the form the coin flip compares against.
    pub threshold: DropThreshold,
    /// The bucket's fleet-wide limit (`None`: unlimited; 0: blocked).
    pub limit_rps: Option<f64>,
    /// The cell's admitted share (0: not given).
    pub share_rps: f64,
    /// Proxies that reported the bucket (0: unknown).
    pub reporting_proxies: u32,
    /// Wire mode (inherit, shadow, enforce).
    pub mode: i32,
    /// Why the cell drops.
    pub reason: DropReason,
    /// Retry hint for clients (0: configured default).
    pub retry_after_ms: u64,
    /// Burst multiplier of the tenant (>= 1).
    pub burst: f64,
    /// The cell's fleet offered rate the ratio came from (0: unknown);
    /// local allowances are derived from it.
    pub offered_rps: f64,
    /// The unit of a cost budget (`None`: a limit in requests). Then every
    /// rate here is that unit per second and a request weighs its
    /// estimated cost ([`crate::decision::Directed::weight`]).
    pub cost_unit: Option<Box<str>>,
    /// The period the budget was configured over, in seconds (at least 1);
    /// the 429's `RateLimit-Policy` window.
    pub budget_period_s: u64,
    /// Under a budget, the most one request's estimate counts and weighs
    /// when it is decided (`None`: only the budget's own bounds); see
    /// [`CellDirective::count`].
    pub estimate_cap: Option<NonZeroU64>,
    /// Under a budget, the charged cost of one unit of estimate (1 when
    /// not known), within [`CHARGE_FACTOR_BOUNDS`]: the rates above are in
    /// charged cost, what a request weighs is its estimate
    /// ([`CellDirective::limit_in_weight_rps`]).
    pub charge_factor: f64,
}

/// The charge factors a proxy acts on: one from the wire outside is
/// clamped into them. The control plane keeps its own far inside; the
/// bound only keeps a rate divided by the factor finite and non-zero.
pub const CHARGE_FACTOR_BOUNDS: (f64, f64) = (1.0 / 1024.0, 1024.0);

/// The most one estimate counts under a cost budget, in seconds of the
/// bucket's budget ([`CellDirective::count`]).
pub const COUNTED_BUDGET_S: f64 = 10.0;

impl CellDirective {
    /// Checks a wire directive: a bucket of 1 to [`MAX_BUCKET_KEY_BYTES`]
    /// bytes, a tenant of at most [`MAX_TENANT_BYTES`], a drop ratio in
    /// `[0, 1]`, and finite, non-negative rates. `None` when it is not one a
    /// proxy may apply.
    pub fn from_wire(wire: &Directive) -> Option<Self> {
        if wire.bucket.is_empty()
            || wire.bucket.len() > MAX_BUCKET_KEY_BYTES
            || wire.tenant.len() > MAX_TENANT_BYTES
        {
            return None;
        }
        let drop_ratio = DropRatio::new(wire.drop_ratio).ok()?;
        let burst = finite_non_negative(wire.burst)?;
        Some(Self {
            drop_ratio,
            threshold: drop_ratio.threshold(),
            limit_rps: match wire.limit_rps {
                Some(limit) => Some(finite_non_negative(limit)?),
                None => None,
            },
            share_rps: finite_non_negative(wire.share_rps)?,
            reporting_proxies: wire.reporting_proxies,
            mode: wire.mode,
            reason: DropReason::of_directive(wire.reason),
            retry_after_ms: wire.retry_after_ms,
            burst: burst.max(1.0),
            offered_rps: finite_non_negative(wire.offered_rps)?,
            cost_unit: (!wire.cost_unit.is_empty()).then(|| wire.cost_unit.as_str().into()),
            budget_period_s: wire.budget_period_s.max(1),
            estimate_cap: NonZeroU64::new(wire.estimate_cap),
            charge_factor: charge_factor(wire.charge_factor)?,
        })
    }

    /// What a request of estimated cost `estimate` (`None`: no cost rule
    /// applies to it) weighs under this directive: 1 under a limit in
    /// requests; under a cost budget its estimate, at most a period of the
    /// cell's budget and at most the directive's estimate cap, and 1
    /// without one.
    #[inline]
    pub fn weight(&self, estimate: Option<u64>) -> u64 {
        match (&self.cost_unit, estimate) {
            (Some(_), Some(estimate)) => self.capped(estimate.min(self.max_weight())),
            _ => 1,
        }
    }

    /// What a request of estimated cost `estimate` counts in its cell's
    /// offered (and admitted) cost, and at most once its stream reports a
    /// usage ([`CountedCost`]).
    ///
    /// Under a cost budget the claim is its estimate, at most
    /// [`COUNTED_BUDGET_S`] of the bucket's budget; otherwise its
    /// estimate, which steers nothing. An estimate is often the client's
    /// to state, and the controller steers on these counts: one claim of a
    /// billion tokens counted whole would shut the cell for seconds. Ten
    /// seconds of the whole bucket's budget is beyond any honest request of
    /// a heavy tail (so no share is misjudged), and one such claim moves
    /// the cell's mean cost by a fraction.
    ///
    /// What is counted at the decision is the claim within the directive's
    /// estimate cap, a multiple of the cell's mean cost: ten seconds of a
    /// budget is still a debt that holds the cell's honest requests off
    /// for seconds, and a false claim let through is never shown false by
    /// a usage that counts less. A usage above the count adds the rest, up
    /// to the claim, when the stream ends, so an honest request above the
    /// cap is counted whole, only later.
    #[inline]
    pub fn count(&self, estimate: u64) -> CountedCost {
        let claimed = match (&self.cost_unit, self.limit_rps) {
            (Some(_), Some(limit)) => {
                // The cast saturates; the limit is finite and non-negative.
                let limit = limit / self.charge_factor;
                estimate.min(((limit * COUNTED_BUDGET_S).ceil() as u64).max(1))
            }
            _ => estimate,
        };
        CountedCost {
            counted: self.capped(claimed),
            claimed,
        }
    }

    /// `cost` within the estimate cap, under a cost budget.
    #[inline]
    fn capped(&self, cost: u64) -> u64 {
        match (&self.cost_unit, self.estimate_cap) {
            (Some(_), Some(cap)) => cost.min(cap.get()),
            _ => cost,
        }
    }

    /// The most one request weighs under a cost budget: the cell's whole
    /// budget of one period (at least 1). An estimate is often the
    /// client's to state (a header); one claiming more would put the
    /// cell's credit, or its cap, in a debt that shuts out every request
    /// of the cell for longer than the period the budget is written over.
    fn max_weight(&self) -> u64 {
        let per_period =
            self.limit_in_weight_rps().unwrap_or(f64::INFINITY) * self.budget_period_s as f64;
        // The cast saturates (infinity: no bound beyond u64's); NaN cannot
        // occur (rates are checked finite and non-negative).
        (per_period.ceil() as u64).max(1)
    }

    /// The limit a client is told: the share, else the bucket limit
    /// (`None`: unlimited; 0: blocked).
    pub fn stated_limit_rps(&self) -> Option<f64> {
        if self.share_rps > 0.0 {
            Some(self.share_rps)
        } else {
            self.limit_rps
        }
    }

    /// The stated limit in what a request weighs ([`Self::weight`]):
    /// under a budget, estimated cost per second (the stated limit over
    /// the charge factor), so an estimate compares with it; otherwise
    /// requests per second, the stated limit itself.
    pub fn limit_in_weight_rps(&self) -> Option<f64> {
        let stated = self.stated_limit_rps()?;
        Some(match self.cost_unit {
            Some(_) => stated / self.charge_factor,
            None => stated,
        })
    }

    /// This proxy's part of the cell's limit when it limits locally, in
    /// what a request weighs: [`Self::limit_in_weight_rps`] over the
    /// reporting proxies; `None` when unlimited.
    pub fn per_proxy_rps(&self) -> Option<f64> {
        self.limit_in_weight_rps()
            .map(|limit| limit / f64::from(self.reporting_proxies.max(1)))
    }
}

/// Whether a directive enforces nothing (no ratio, no limit, no share, no
/// mode): the control plane's way of lifting a cell, which removes it from
/// a proxy's table. A limit of 0 is a block, not the absence of a limit.
pub fn is_lift(wire: &Directive) -> bool {
    wire.drop_ratio == 0.0 && wire.limit_rps.is_none() && wire.share_rps == 0.0 && wire.mode == 0
}

/// A wire charge factor as a proxy acts on it: 0 (absent) is 1, a finite
/// positive one is clamped into [`CHARGE_FACTOR_BOUNDS`], anything else
/// (negative, NaN, infinite) makes the directive one not to apply.
fn charge_factor(wire: f64) -> Option<f64> {
    let (low, high) = CHARGE_FACTOR_BOUNDS;
    let factor = finite_non_negative(wire)?;
    Some(if factor == 0.0 {
        1.0
    } else {
        factor.clamp(low, high)
    })
}

fn finite_non_negative(value: f64) -> Option<f64> {
    (value.is_finite() && value >= 0.0).then_some(value + 0.0)
}

/// How long proxies keep enforcing directives after the last batch from the
/// control plane arrived, before their configured fallback applies:
/// `1000 ..= 86400000` ms. The control plane names it in every batch; a
/// proxy's configuration names the one it applies to batches that name
/// none. At least a second: the control plane sends a heartbeat every
/// second, and a shorter TTL would have proxies fall back between two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct DirectiveTtl(u64);

impl DirectiveTtl {
    /// Shortest accepted TTL in milliseconds.
    pub const MIN_MS: u64 = 1_000;
    /// Longest accepted TTL in milliseconds (one day).
    pub const MAX_MS: u64 = 86_400_000;
    /// Long enough to ride out a control-plane restart or a minute-long
    /// outage on the last-known directives.
    pub const DEFAULT: Self = Self(90_000);

    /// Validates a TTL in milliseconds.
    pub fn from_millis(ms: u64) -> Result<Self, InvalidDirectiveTtl> {
        if (Self::MIN_MS..=Self::MAX_MS).contains(&ms) {
            Ok(Self(ms))
        } else {
            Err(InvalidDirectiveTtl)
        }
    }

    /// The TTL in milliseconds.
    pub fn as_millis(self) -> u64 {
        self.0
    }
}

impl Default for DirectiveTtl {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl TryFrom<u64> for DirectiveTtl {
    type Error = InvalidDirectiveTtl;

    fn try_from(ms: u64) -> Result<Self, Self::Error> {
        Self::from_millis(ms)
    }
}

impl From<DirectiveTtl> for u64 {
    fn from(ttl: DirectiveTtl) -> Self {
        ttl.0
    }
}

/// A TTL outside `1000 ..= 86400000` ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("must be between 1000 and 86400000 (milliseconds)")]
pub struct InvalidDirectiveTtl;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn wire(bucket: &str) -> Directive {
        Directive {
            bucket: bucket.to_owned(),
            drop_ratio: 0.25,
            limit_rps: Some(100.0),
            ..Default::default()
        }
    }

    #[test]
    fn a_valid_directive_is_kept_with_its_threshold() {
        let directive = CellDirective::from_wire(&wire("acme")).unwrap();
        assert_eq!(directive.drop_ratio.get(), 0.25);
        assert_eq!(directive.threshold, directive.drop_ratio.threshold());
        assert_eq!(directive.stated_limit_rps(), Some(100.0));
        assert_eq!(directive.burst, 1.0);
    }

    #[test]
    fn a_request_weighs_its_estimate_only_under_a_cost_budget() {
        let requests = CellDirective::from_wire(&wire("acme")).unwrap();
        assert_eq!(
            (requests.cost_unit.as_deref(), requests.budget_period_s),
            (None, 1)
        );
        for estimate in [None, Some(0), Some(7), Some(u64::MAX)] {
            assert_eq!(requests.weight(estimate), 1, "{estimate:?}");
        }
        let budget = CellDirective::from_wire(&Directive {
            cost_unit: "tokens".into(),
            budget_period_s: 60,
            ..wire("acme")
        })
        .unwrap();
        assert_eq!(budget.cost_unit.as_deref(), Some("tokens"));
        assert_eq!(budget.budget_period_s, 60);
        assert_eq!(budget.weight(Some(800)), 800);
        assert_eq!(budget.weight(Some(0)), 0);
        assert_eq!(budget.weight(None), 1, "a request without a cost rule");
    }

    #[test]
    fn no_request_weighs_more_than_a_period_of_its_cells_budget() {
        // 100 tokens a second written per minute: 6,000 a period.
        let per_minute = Directive {
            cost_unit: "tokens".into(),
            budget_period_s: 60,
            limit_rps: Some(100.0),
            ..wire("acme")
        };
        let budget = CellDirective::from_wire(&per_minute).unwrap();
        assert_eq!(budget.weight(Some(5_999)), 5_999);
        assert_eq!(budget.weight(Some(1_000_000_000)), 6_000);
        // A tenant's share bounds its cells; a blocked cell weighs 1.
        let share = CellDirective::from_wire(&Directive {
            share_rps: 10.0,
            ..per_minute.clone()
        });
        assert_eq!(share.unwrap().weight(Some(u64::MAX)), 600);
        let blocked = CellDirective::from_wire(&Directive {
            limit_rps: Some(0.0),
            ..per_minute
        });
        assert_eq!(blocked.unwrap().weight(Some(u64::MAX)), 1);
    }

    #[test]
    fn the_estimate_cap_bounds_the_count_and_weight_not_what_a_usage_may_add() {
        // 20,000 tokens a second written per minute, a cap of 16,000.
        let budget = CellDirective::from_wire(&Directive {
            estimate_cap: 16_000,
            ..budget_wire()
        })
        .unwrap();
        assert_eq!(budget.estimate_cap.map(NonZeroU64::get), Some(16_000));
        for (estimate, counted, claimed) in [
            (800, 800, 800),
            (16_000, 16_000, 16_000),
            (50_000, 16_000, 50_000),
            (1_000_000_000, 16_000, 200_000),
        ] {
            assert_eq!(
                budget.count(estimate),
                CountedCost { counted, claimed },
                "{estimate}"
            );
            assert_eq!(budget.weight(Some(estimate)), counted, "{estimate}");
        }
        // 0 is no cap; a limit in requests ignores it.
        let uncapped = CellDirective::from_wire(&Directive {
            estimate_cap: 0,
            ..budget_wire()
        })
        .unwrap();
        assert_eq!(uncapped.estimate_cap, None);
        assert_eq!(uncapped.count(1_000_000_000).counted, 200_000);
        let requests = CellDirective::from_wire(&Directive {
            estimate_cap: 5,
            ..wire("llm")
        })
        .unwrap();
        assert_eq!(requests.weight(Some(1_000)), 1);
        assert_eq!(requests.count(1_000), CountedCost::whole(1_000));
    }

    fn budget_wire() -> Directive {
        Directive {
            cost_unit: "tokens".into(),
            budget_period_s: 60,
            limit_rps: Some(20_000.0),
            ..wire("llm")
        }
    }

    #[test]
    fn a_budget_s_rates_reach_estimates_over_its_charge_factor() {
        // Streams charged 4 tokens for each estimated: 20,000 charged
        // tokens a second are 5,000 of estimates.
        let budget = CellDirective::from_wire(&Directive {
            charge_factor: 4.0,
            reporting_proxies: 2,
            ..budget_wire()
        })
        .unwrap();
        assert_eq!(
            budget.stated_limit_rps(),
            Some(20_000.0),
            "told in its unit"
        );
        assert_eq!(budget.limit_in_weight_rps(), Some(5_000.0));
        assert_eq!(budget.per_proxy_rps(), Some(2_500.0));
        assert_eq!(budget.weight(Some(u64::MAX)), 300_000, "a period of it");
        assert_eq!(budget.count(u64::MAX).claimed, 50_000, "ten seconds of it");
        // Absent (an older control plane) is 1; a limit in requests
        // ignores it; factors beyond reason are clamped.
        let absent = CellDirective::from_wire(&budget_wire()).unwrap();
        assert_eq!(absent.charge_factor, 1.0);
        assert_eq!(absent.limit_in_weight_rps(), Some(20_000.0));
        let requests = CellDirective::from_wire(&Directive {
            charge_factor: 4.0,
            ..wire("acme")
        })
        .unwrap();
        assert_eq!(requests.per_proxy_rps(), Some(100.0));
        for (wire_factor, kept) in [(1e-300, 1.0 / 1024.0), (f64::MAX, 1024.0)] {
            let directive = CellDirective::from_wire(&Directive {
                charge_factor: wire_factor,
                ..budget_wire()
            })
            .unwrap();
            assert_eq!(directive.charge_factor, kept);
            let limit = directive.limit_in_weight_rps().unwrap();
            assert!(limit.is_finite() && limit > 0.0, "{limit}");
        }
    }

    #[test]
    fn out_of_range_directives_are_refused() {
        let bad = [
            wire(""),
            wire(&"b".repeat(MAX_BUCKET_KEY_BYTES + 1)),
            Directive {
                tenant: "t".repeat(MAX_TENANT_BYTES + 1),
                ..wire("acme")
            },
            Directive {
                drop_ratio: 1.5,
                ..wire("acme")
            },
            Directive {
                limit_rps: Some(f64::NAN),
                ..wire("acme")
            },
            Directive {
                share_rps: -1.0,
                ..wire("acme")
            },
            Directive {
                burst: f64::INFINITY,
                ..wire("acme")
            },
            Directive {
                charge_factor: -2.0,
                ..budget_wire()
            },
            Directive {
                charge_factor: f64::NAN,
                ..budget_wire()
            },
        ];
        for directive in bad {
            assert_eq!(CellDirective::from_wire(&directive), None, "{directive:?}");
        }
    }

    #[test]
    fn a_directive_that_enforces_nothing_is_a_lift() {
        let lift = Directive {
            bucket: "acme".to_owned(),
            ..Default::default()
        };
        assert!(is_lift(&lift));
        // A limit of 0 blocks the bucket: not a lift.
        assert!(!is_lift(&Directive {
            limit_rps: Some(0.0),
            ..lift.clone()
        }));
        assert!(!is_lift(&Directive {
            mode: 1,
            ..lift.clone()
        }));
        assert!(!is_lift(&Directive {
            share_rps: 5.0,
            ..lift
        }));
    }

    #[test]
    fn the_ttl_is_a_second_to_a_day() {
        assert_eq!(DirectiveTtl::from_millis(999), Err(InvalidDirectiveTtl));
        assert_eq!(DirectiveTtl::from_millis(1_000).unwrap().as_millis(), 1_000);
        assert_eq!(
            DirectiveTtl::from_millis(86_400_000).unwrap().as_millis(),
            86_400_000
        );
        assert!(DirectiveTtl::from_millis(86_400_001).is_err());
        assert_eq!(DirectiveTtl::default().as_millis(), 90_000);
    }
}
