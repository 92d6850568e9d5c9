//! The simulator against its targets: the filter's agents and the real
//! controller hold the limits, the improvements beat the baseline, and the
//! same seed gives the same run.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use crate::metrics::{self, RunMetrics};
use crate::scenario::{self, Scenario};
use crate::sim::{self, SimError, Variant};

/// Runs `scenario` with `seed` and the baseline and measures it.
fn evaluate(scenario: &Scenario, seed: u64) -> Result<RunMetrics, SimError> {
    evaluate_variant(scenario, seed, Variant::BASELINE)
}

/// Runs `scenario` with `seed` and `variant` and measures it.
fn evaluate_variant(
    scenario: &Scenario,
    seed: u64,
    variant: Variant,
) -> Result<RunMetrics, SimError> {
    let trace = sim::run_variant(scenario, seed, variant)?;
    Ok(metrics::compute(scenario, &trace))
}

/// Runs `scenario` with `seed` and `variant` on proxies of `workers` VMs
/// each and measures it.
fn evaluate_workers(
    scenario: &Scenario,
    seed: u64,
    variant: Variant,
    workers: usize,
) -> Result<RunMetrics, SimError> {
    let trace = sim::run_workers(scenario, seed, variant, workers)?;
    Ok(metrics::compute(scenario, &trace))
}

fn scenario(name: &str) -> Scenario {
    scenario::by_name(name).unwrap()
}

#[test]
fn same_seed_same_result() {
    let steady = scenario("steady").truncated(6_000);
    assert_eq!(
        sim::run(&steady, 42).unwrap(),
        sim::run(&steady, 42).unwrap()
    );
    assert_ne!(
        sim::run(&steady, 42).unwrap(),
        sim::run(&steady, 43).unwrap(),
        "the seed matters"
    );
    let churn = scenario("churn");
    assert_eq!(evaluate(&churn, 1).unwrap(), evaluate(&churn, 1).unwrap());
}

#[test]
fn steady_over_limit_converges() {
    let steady = scenario("steady").truncated(15_000);
    let metrics = evaluate(&steady, 1).unwrap();
    assert!(metrics.admitted_within_offered);
    // Seeds 1-5 measured 4.9-6.5 %, almost all of it the coin flips'
    // and the arrivals' own noise at 1000 rps; 10 % leaves room for
    // other seeds without letting a real regression through.
    let error = metrics.error_p95_1s.unwrap();
    assert!(error <= 0.10, "p95 error {error}");
    let utilisation = metrics.utilisation.unwrap();
    assert!((0.9..=1.1).contains(&utilisation), "{utilisation}");
}

#[test]
fn improved_holds_a_step_that_the_baseline_overshoots() {
    let step = scenario("step-10x").truncated(14_000);
    let baseline = evaluate(&step, 1).unwrap();
    let improved = evaluate_variant(&step, 1, Variant::IMPROVED).unwrap();
    assert!(improved.admitted_within_offered);
    let (before, after) = (
        baseline.peak_overshoot_pct.unwrap(),
        improved.peak_overshoot_pct.unwrap(),
    );
    // Seeds 1-3: baseline above +200 %, improved below +10 %.
    assert!(before > 100.0, "{before}");
    assert!(after <= 10.0, "{after}");
}

#[test]
fn improved_steady_state_is_within_two_percent() {
    let steady = scenario("steady").truncated(15_000);
    let metrics = evaluate_variant(&steady, 1, Variant::IMPROVED).unwrap();
    let error = metrics.error_p95_1s.unwrap();
    // Seeds 1-3 measured 1.5-1.9 %; the baseline 4.8 %.
    assert!(error <= 0.025, "p95 error {error}");
    let utilisation = metrics.utilisation.unwrap();
    assert!((0.98..=1.02).contains(&utilisation), "{utilisation}");
}

#[test]
fn every_tenant_gets_its_weighted_fair_share() {
    let tenants = scenario("tenants").truncated(15_000);
    // Seeds 1-3 (30 s runs) measured every tenant within ±3.4 % with
    // coin flips, ±0.6 % with the credit decision and ±0.4 % with the
    // local allowance under the per-cell tracking policy. This 15 s
    // run measures 12 s: coin flips on bronze's 300 rps at a ratio of
    // 0.84 leave about ±4 % of noise (one standard deviation) in its
    // admitted count, so they get 10 % (seed 1: +6.0 %).
    let credit = Variant::by_name("credit").unwrap();
    for (variant, bound) in [
        (Variant::BASELINE, 0.10),
        (credit, 0.05),
        (Variant::IMPROVED, 0.05),
    ] {
        let metrics = evaluate_variant(&tenants, 1, variant).unwrap();
        assert!(metrics.admitted_within_offered);
        let shares: Vec<(&str, f64)> = metrics
            .tenants
            .iter()
            .map(|t| (t.tenant.as_str(), t.fair_share_rps))
            .collect();
        // 1000 rps by weights 4 : 1 : 0.25 (all three want more).
        let level = 1_000.0 / 5.25;
        let expected = [
            ("gold", 4.0 * level),
            ("silver", level),
            ("bronze", 0.25 * level),
        ];
        assert_eq!(shares.len(), 3);
        for ((tenant, share), (name, want)) in shares.iter().zip(expected) {
            assert_eq!(*tenant, name);
            assert!((share - want).abs() < 1e-6, "{tenant}: {share} vs {want}");
        }
        for tenant in &metrics.tenants {
            let error = tenant.error().unwrap();
            assert!(
                error.abs() <= bound,
                "{}: {tenant:?} is {:+.1}% off its fair share",
                variant.name,
                error * 100.0
            );
            assert!(
                tenant.offered_rps > tenant.fair_share_rps * 1.1,
                "{tenant:?}"
            );
        }
    }
}

#[test]
fn step_overshoots() {
    let step = scenario("step-2x").truncated(14_000);
    let metrics = evaluate(&step, 1).unwrap();
    assert!(metrics.admitted_within_offered);
    // The proxies admit all of the doubled load until the next
    // directive lands (report, control tick and push later); seeds 1-5
    // measured 35-42 %.
    let overshoot = metrics.peak_overshoot_pct.unwrap();
    assert!(overshoot > 10.0, "{overshoot}");
    assert_eq!(metrics.convergence_ms.len(), 1, "only the step up ran");
    assert!(metrics.convergence_ms[0].is_some());
}

/// The filter's whole agent on every simulated proxy (its own ticks,
/// report windows, lease, stream and allowances) holds the limits on
/// the published scenarios at full length; the bounds are what it
/// measured on seed 1 with some margin (docs/accuracy.md, "The
/// model").
#[test]
fn the_filters_agent_holds_the_limits() {
    let steady = evaluate_workers(&scenario("steady"), 1, Variant::IMPROVED, 1).unwrap();
    assert!(steady.admitted_within_offered);
    let error = steady.error_p95_1s.unwrap();
    assert!(error <= 0.03, "steady: p95 error {error}");
    let utilisation = steady.utilisation.unwrap();
    assert!((0.98..=1.02).contains(&utilisation), "{utilisation}");
    assert!(steady.batches_pushed > 0);

    let step = evaluate_workers(&scenario("step-10x"), 1, Variant::IMPROVED, 1).unwrap();
    let overshoot = step.peak_overshoot_pct.unwrap();
    assert!(overshoot <= 10.0, "10x step: overshoot {overshoot} %");

    let tenants = evaluate_workers(&scenario("tenants"), 1, Variant::IMPROVED, 1).unwrap();
    for tenant in &tenants.tenants {
        let error = tenant.admitted_rps / tenant.fair_share_rps - 1.0;
        assert!(error.abs() <= 0.10, "{}: {error:+.3}", tenant.tenant);
    }
}

/// Several workers per Envoy: every VM an agent, requests spread over
/// connections that move between workers. The bounds are what seed 1
/// measured with some margin; they keep the model running, not the
/// accuracy the issue asks for with four workers (docs/accuracy.md,
/// "Several workers per Envoy").
#[test]
fn the_filters_agents_on_several_workers_hold_the_limit() {
    let steady = scenario("steady");
    for (workers, bound) in [(2, 0.05), (4, 0.10)] {
        let metrics = evaluate_workers(&steady, 1, Variant::IMPROVED, workers).unwrap();
        assert!(metrics.admitted_within_offered);
        let error = metrics.error_p95_1s.unwrap();
        assert!(error <= bound, "{workers} workers: p95 error {error}");
        let utilisation = metrics.utilisation.unwrap();
        assert!((0.97..=1.03).contains(&utilisation), "{utilisation}");
    }
}

#[test]
fn the_agent_model_is_reproducible() {
    let steady = scenario("steady").truncated(6_000);
    let run = |seed| sim::run_workers(&steady, seed, Variant::IMPROVED, 1).unwrap();
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43), "the seed matters");
}
