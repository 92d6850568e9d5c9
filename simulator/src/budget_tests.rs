//! The token budget through the filter's agents and the real controller:
//! the charged tokens hold the budget, each tenant its share.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use crate::budget::{self, BudgetMetrics};
use crate::load::Load;
use crate::scenario::{self, BUDGET_STEP_MS, BUDGET_TOKENS_PER_S, Scenario};
use crate::sim::{self, Variant};

fn token_budget(duration_ms: u64) -> Scenario {
    scenario::by_name("token-budget")
        .unwrap()
        .truncated(duration_ms)
}

fn measure(scenario: &Scenario, variant: Variant) -> BudgetMetrics {
    let trace = sim::run_variant(scenario, 1, variant).unwrap();
    budget::compute(scenario, &trace).unwrap()
}

fn within(value: f64, target: f64, tolerance: f64) -> bool {
    (value / target - 1.0).abs() <= tolerance
}

/// 60 s at 3x the budget after the step and its settling: the tokens the
/// filters charged at stream end are the budget's, and each tenant's its
/// weighted share. Were the costs not charged, nothing would be; were the
/// controller steering on requests (20,000 a second, for some 60
/// offered), all of the 3x would pass. Seed 1 measured +1.3 % (baseline)
/// and +1.5 % (improved) charged over the budget, every tenant within
/// 2.5 % of its share, the first 10 s after the step +9.8 % and −4.9 %.
#[test]
fn charged_tokens_hold_the_budget_and_the_tenants_their_shares() {
    let scenario = token_budget(100_000);
    for variant in [Variant::BASELINE, Variant::IMPROVED] {
        let metrics = measure(&scenario, variant);
        let name = variant.name;
        assert_eq!(metrics.steady_ms, (40_000, 100_000));
        assert!(
            within(metrics.offered_per_s, 3.0 * BUDGET_TOKENS_PER_S, 0.10),
            "{name}: offered {:.0}",
            metrics.offered_per_s
        );
        assert!(
            within(metrics.charged_per_s, BUDGET_TOKENS_PER_S, 0.10),
            "{name}: charged {:.0}",
            metrics.charged_per_s
        );
        assert!(
            within(metrics.admitted_per_s, BUDGET_TOKENS_PER_S, 0.10),
            "{name}: admitted {:.0}",
            metrics.admitted_per_s
        );
        // Every stream's usage was read from its response.
        assert!(metrics.charges > 1_000, "{name}: {}", metrics.charges);
        assert_eq!(metrics.charged_estimate, 0, "{name}");
        // And reached the control plane in the reports.
        let reported = metrics.charged_reported;
        assert!(
            within(reported, metrics.charged_total as f64, 0.02),
            "{name}: reported {reported:.0} of {}",
            metrics.charged_total
        );
        // At most one batch a control interval, each carrying what moved.
        let intervals = scenario.duration_ms / scenario.control_interval_ms;
        assert!(
            metrics.batches_pushed > 0 && metrics.batches_pushed <= intervals,
            "{name}: {} batches",
            metrics.batches_pushed
        );
        assert!(
            metrics.directives_pushed >= metrics.batches_pushed,
            "{name}: {} directives",
            metrics.directives_pushed
        );
        let shares: Vec<f64> = metrics.tenants.iter().map(|t| t.fair_share_per_s).collect();
        let expected = [10_000.0, 20_000.0 / 3.0, 10_000.0 / 3.0];
        for (share, want) in shares.iter().zip(expected) {
            assert!(within(*share, want, 0.01), "{name}: {shares:?}");
        }
        for tenant in &metrics.tenants {
            let error = tenant.error().unwrap();
            assert!(
                error.abs() <= 0.15,
                "{name}: {} {:+.1} % off its share",
                tenant.tenant,
                error * 100.0
            );
        }
        let step = metrics.step.unwrap();
        assert_eq!(step.at_ms, scenario::BUDGET_STEP_MS);
        assert!(step.admitted_10s.abs() <= 0.5, "{name}: {step:?}");
    }
}

/// The benchmark's tenants with the allowance's caps always engaged: each
/// tenant within 7 % of its share, with one VM a proxy and with two.
/// Bronze, at about a request a second per VM, came 12.8 % (one VM, seed
/// 37) and 12.0 % (two, seed 38) short while a cap's burst floor was six
/// tokens rather than six requests' worth: the allowance of each gap
/// between its requests longer than the tick was lost. Then 8.1 % (one VM,
/// seed 37) and 7.6 % (two, seed 38) while the process's budget of a cell
/// was derived from its estimates of the last second rather than its
/// requests times their mean estimate (at most 5.2 % since).
#[test]
fn the_caps_keep_a_small_tenant_near_its_share() {
    let scenario = scenario::by_name("token-budget-bench")
        .unwrap()
        .truncated(130_000);
    for workers in [1, 2] {
        for seed in 37..=39 {
            let trace = sim::run_workers(&scenario, seed, Variant::IMPROVED, workers).unwrap();
            let metrics = budget::compute(&scenario, &trace).unwrap();
            let shares: Vec<f64> = metrics.tenants.iter().map(|t| t.fair_share_per_s).collect();
            assert!(
                within(shares[1], 5_000.0, 0.01) && within(shares[2], 5_000.0, 0.01),
                "{shares:?}"
            );
            for tenant in &metrics.tenants {
                let error = tenant.error().unwrap();
                assert!(
                    error.abs() <= 0.07,
                    "{workers} VMs, seed {seed}: {} {:+.1} % off its share",
                    tenant.tenant,
                    error * 100.0
                );
            }
        }
    }
}

#[test]
fn the_token_budget_is_reproducible() {
    let scenario = token_budget(12_000);
    let run = |seed| sim::run_variant(&scenario, seed, Variant::IMPROVED).unwrap();
    let first = run(7);
    assert_eq!(first, run(7));
    assert_ne!(first, run(8), "the seed matters");
    let cost = first.buckets[0].cost.as_ref().unwrap();
    assert!(cost.charged.iter().sum::<u64>() > 0);
}

/// Two workers a proxy, so the counts of one reach the leader through
/// hand-offs it splits at its report windows' ends: over a run whose
/// load stops long enough before its end for every stream to settle, the
/// reports carry as much admitted estimate as settled estimate (exact
/// estimates, and the usage counted late with its stream). A split that
/// left a part with a cost and no request lost it, and the budget ran
/// over by what the controller never saw.
#[test]
fn the_reports_carry_every_admitted_estimate_through_hand_offs() {
    let mut scenario = token_budget(70_000);
    let rps = scenario.buckets[0].load.rps_at(BUDGET_STEP_MS + 1);
    scenario.buckets[0].load = Load::Steps(vec![(0, rps), (40_000, 0.0)]);
    let trace =
        sim::run_workers(&scenario, 1, Variant::by_name("tracking-coin").unwrap(), 2).unwrap();
    let (admitted, settled) = (trace.admitted_reported, trace.settled_reported);
    assert!(settled > 500_000.0, "settled {settled:.0}");
    // Not a token of what was admitted is lost on the way (the split that
    // lost costs lost about 0.3 % here), and the streams settled before
    // the end (one still running would leave its estimate unsettled).
    assert!(
        settled - admitted < 0.5 && admitted - settled < 0.01 * settled,
        "admitted {admitted:.0}, settled {settled:.0}"
    );
    assert!(
        (trace.charged_reported - settled).abs() < 0.5,
        "charged {:.0}, settled {settled:.0}",
        trace.charged_reported
    );
}
