//! The controller on cost budgets: simulated proxies report log-normal
//! costs through the real fleet, the tracking controller decides, and the
//! proxies flip their coins with the ratios it pushed.

#![allow(clippy::float_cmp)]

use std::collections::HashMap;

use sluice_integration_tests::llm_upstream::{TokenDistribution, TokenSampler};
use sluice_proto::v1::{BucketCount, Report};

use super::*;
use crate::config::Config;
use crate::fleet::{Fleet, StreamId};

/// The control interval and report window of the simulation.
const WINDOW_MS: u64 = 500;

fn policy(yaml: &str) -> Policy {
    Config::from_yaml(yaml, "limits.yaml").unwrap().policy_at(0)
}

/// One tenant's demand: its name and its part of the offered cost.
struct Demand {
    tenant: &'static str,
    fraction: f64,
}

/// The benchmark's tenants (`just bench-tokens`): 50/30/20 % of the
/// demand.
const BENCHMARK_DEMANDS: [Demand; 3] = [
    Demand {
        tenant: "gold",
        fraction: 0.5,
    },
    Demand {
        tenant: "silver",
        fraction: 0.3,
    },
    Demand {
        tenant: "bronze",
        fraction: 0.2,
    },
];

/// The benchmark's tenants' fair shares of its budget, tokens a second.
const BENCHMARK_SHARES: [(&str, f64); 3] =
    [("gold", 10_000.0), ("silver", 5_000.0), ("bronze", 5_000.0)];

/// The benchmark's budget: 20,000 tokens a second for `llm`, its
/// tenants weighted 2:1:1.
fn benchmark_policy() -> Policy {
    policy(
        "limits:\n  - bucket: llm\n    budget: {amount: 20000, unit: tokens, per: second}\n\
         tenants:\n  gold: {weight: 2}\n  silver: {weight: 1}\n  bronze: {weight: 1}\n",
    )
}

/// Two tenants offering half the demand each.
fn halves(a: &'static str, b: &'static str) -> [Demand; 2] {
    [a, b].map(|tenant| Demand {
        tenant,
        fraction: 0.5,
    })
}

/// How the simulated proxies decide each request.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Admission {
    /// An independent coin per request with the pushed drop ratio.
    Coin,
    /// The deterministic credit in cost: each request adds `1 − drop` of
    /// its cost to a balance and is admitted while the balance is
    /// positive, which it is then charged: the admitted cost stays within
    /// one request's cost of `1 − drop` of the offered cost.
    Credit,
    /// The credit with this drop ratio per tenant instead of the pushed
    /// one: the best any controller could do (the floor the traffic's own
    /// noise sets).
    Oracle(&'static [(&'static str, f64)]),
}

/// A simulated run: what is offered when and how it is admitted.
struct Scenario<'a> {
    demands: &'a [Demand],
    /// The offered cost per second up to `step_at`, and from then on.
    offered_cost_per_s: (f64, f64),
    step_at: usize,
    charge_factor: f64,
    /// Tenants charged another factor than `charge_factor`.
    tenant_charge_factors: &'a [(&'a str, f64)],
    /// Every request's estimate, when not its cost (a route's constant):
    /// the cost drawn is then only what it is charged.
    constant_estimate: Option<f64>,
    /// The interval at which the control plane restarts: a fresh fleet
    /// and controller, the proxies keeping the directives they hold.
    restart_at: Option<usize>,
    admission: Admission,
    /// Demands that are priorities rather than tenants: each named demand
    /// is offered in the tenant-less cell of its priority (its directives
    /// are kept under the demand's name).
    priorities: &'a [(&'a str, Priority)],
    /// VMs (Envoy's workers) per proxy, each with its own credit; a
    /// request lands on one of them at random, as Envoy hands each
    /// connection to one worker.
    vms: usize,
    seed: u64,
    /// Intervals not measured, and intervals in all.
    warm_up: usize,
    intervals: usize,
    /// The control interval and report window, milliseconds.
    interval_ms: u64,
}

impl Default for Scenario<'_> {
    fn default() -> Self {
        Self {
            demands: &[Demand {
                tenant: "",
                fraction: 1.0,
            }],
            offered_cost_per_s: (60_000.0, 60_000.0),
            step_at: 0,
            charge_factor: 1.0,
            tenant_charge_factors: &[],
            constant_estimate: None,
            restart_at: None,
            priorities: &[],
            admission: Admission::Coin,
            vms: 1,
            seed: 37,
            warm_up: 40,
            intervals: 2040,
            interval_ms: WINDOW_MS,
        }
    }
}

impl Scenario<'_> {
    /// The priority a demand is offered in, when it names one.
    fn priority_of(&self, demand: &str) -> Option<Priority> {
        self.priorities
            .iter()
            .find(|(name, _)| *name == demand)
            .map(|(_, priority)| *priority)
    }
}

/// What a run measured after its warm-up.
#[derive(Debug, Default)]
struct Outcome {
    /// Estimated cost admitted per tenant, per second.
    admitted_cost_per_s: HashMap<String, f64>,
    /// Estimated cost admitted per tenant in each measured interval.
    admitted_per_interval: HashMap<String, Vec<f64>>,
    /// Cost charged at stream end, per second, all tenants.
    charged_cost_per_s: f64,
    /// Cost charged at stream end per tenant, per second.
    charged_per_tenant_per_s: HashMap<String, f64>,
    /// Cost charged at stream end in each measured interval, all tenants.
    charged_per_interval: Vec<f64>,
    /// Offered cost per second, all tenants.
    offered_cost_per_s: f64,
    /// Offered cost per tenant (or named priority), per second.
    offered_per_tenant_per_s: HashMap<String, f64>,
    /// Mean of the bucket-wide cell's pushed drop ratio.
    mean_drop_ratio: f64,
    /// The last directive of each tenant's cell.
    directives: HashMap<String, Directive>,
    /// The last status of the bucket.
    status: Option<BucketStatus>,
}

impl Outcome {
    /// The cost all tenants admitted in each measured interval.
    fn admitted_total_per_interval(&self) -> Vec<f64> {
        let mut total: Vec<f64> = Vec::new();
        for series in self.admitted_per_interval.values() {
            total.resize(series.len(), 0.0);
            for (sum, cost) in total.iter_mut().zip(series) {
                *sum += cost;
            }
        }
        total
    }
}

/// The relative errors of the admitted cost per second over consecutive
/// windows of `seconds` against `target` per second.
fn window_errors(per_interval: &[f64], seconds: f64, target: f64) -> Vec<f64> {
    window_errors_at(per_interval, (seconds, WINDOW_MS), target)
}

/// [`window_errors`] of intervals of `interval_ms`.
fn window_errors_at(
    per_interval: &[f64],
    (seconds, interval_ms): (f64, u64),
    target: f64,
) -> Vec<f64> {
    let per_window = (seconds * 1000.0 / interval_ms as f64).round() as usize;
    per_interval
        .chunks_exact(per_window)
        .map(|window| window.iter().sum::<f64>() / seconds / target - 1.0)
        .collect()
}

/// Mean and root mean square of relative errors.
#[derive(Debug, Clone, Copy)]
struct Spread {
    mean: f64,
    rms: f64,
}

fn spread(errors: &[f64]) -> Spread {
    let n = errors.len() as f64;
    Spread {
        mean: errors.iter().sum::<f64>() / n,
        rms: (errors.iter().map(|e| e * e).sum::<f64>() / n).sqrt(),
    }
}

/// Runs the scenario's control intervals of three proxies carrying 60, 30
/// and 10 % of the offered cost (its demands split it over tenants) on
/// `bucket`, with costs drawn from median 500, p99 8,000 tokens and
/// charged at its charge factor times their estimate.
fn simulate(policy: &Policy, bucket: &str, scenario: &Scenario<'_>) -> Outcome {
    let distribution = TokenDistribution::median_500_p99_8000();
    let mut sampler = TokenSampler::new(distribution, scenario.seed);
    // E[C] of the log-normal: median · e^(σ²/2).
    let sigma = (distribution.p99() / distribution.median()).ln() / 2.326_347_874;
    let mean_cost = distribution.median() * (sigma * sigma / 2.0).exp();
    let proxies = [("envoy-a", 0.6), ("envoy-b", 0.3), ("envoy-c", 0.1)];
    let start = || {
        let mut fleet = Fleet::new(Fleet::DEFAULT_CARRY_TICKS);
        for (index, (proxy, _)) in proxies.iter().enumerate() {
            fleet.connect(proxy, 1, StreamId(index as u64));
        }
        let interval = ControlInterval::from_millis(scenario.interval_ms).unwrap();
        (fleet, Controller::tracking(interval))
    };
    let (mut fleet, mut controller) = start();
    let mut pushed: HashMap<String, Directive> = HashMap::new();
    let mut credit: HashMap<(usize, &str, usize), f64> = HashMap::new();
    let mut outcome = Outcome::default();
    let mut ratio_sum = 0.0;
    let costed = |name: &str| policy.limits.budget_rate(name);
    let (warm_up, intervals) = (scenario.warm_up, scenario.intervals);
    for interval in 0..intervals {
        if scenario.restart_at == Some(interval) {
            (fleet, controller) = start();
        }
        let measured = interval >= warm_up;
        let mut charged_now = 0.0;
        let offered_cost_per_s = if interval < scenario.step_at {
            scenario.offered_cost_per_s.0
        } else {
            scenario.offered_cost_per_s.1
        };
        let requests_per_s = offered_cost_per_s / mean_cost;
        let mut admitted_now: HashMap<&str, f64> = HashMap::new();
        for (index, (proxy, share)) in proxies.iter().enumerate() {
            let mut counts = Vec::new();
            for demand in scenario.demands {
                let drop = match scenario.admission {
                    Admission::Oracle(drops) => drops
                        .iter()
                        .find(|(tenant, _)| *tenant == demand.tenant)
                        .map_or(0.0, |(_, drop)| *drop),
                    _ => pushed.get(demand.tenant).map_or(0.0, |d| d.drop_ratio),
                };
                // Poisson arrivals, one chance per millisecond.
                let per_ms = requests_per_s * share * demand.fraction / 1000.0;
                let charge_factor = scenario
                    .tenant_charge_factors
                    .iter()
                    .find(|(tenant, _)| *tenant == demand.tenant)
                    .map_or(scenario.charge_factor, |(_, factor)| *factor);
                let priority = scenario.priority_of(demand.tenant);
                let mut count = BucketCount {
                    bucket: bucket.to_owned(),
                    tenant: if priority.is_some() {
                        ""
                    } else {
                        demand.tenant
                    }
                    .to_owned(),
                    priority: priority.map_or(0, |priority| priority.to_wire() as i32),
                    ..BucketCount::default()
                };
                for _ in 0..scenario.interval_ms {
                    if !sampler.chance(per_ms) {
                        continue;
                    }
                    // One VM of `vms` at random (no draw for one VM, so the
                    // sequence of a single VM's runs does not change).
                    let vm = (1..scenario.vms)
                        .find(|v| sampler.chance(1.0 / (scenario.vms - v + 1) as f64))
                        .unwrap_or(0);
                    let balance = credit.entry((index, demand.tenant, vm)).or_default();
                    let charged = sampler.tokens() as f64;
                    let cost = scenario.constant_estimate.unwrap_or(charged);
                    count.offered += 1;
                    count.offered_cost += cost;
                    let admitted = if scenario.admission == Admission::Coin {
                        !sampler.chance(drop)
                    } else {
                        *balance += (1.0 - drop) * cost;
                        *balance > 0.0
                    };
                    if admitted {
                        if scenario.admission != Admission::Coin {
                            *balance -= cost;
                        }
                        count.admitted += 1;
                        count.admitted_cost += cost;
                        count.charged_cost += charged * charge_factor;
                        count.settled_cost += cost;
                    }
                }
                if measured {
                    outcome.offered_cost_per_s += count.offered_cost;
                    *outcome
                        .offered_per_tenant_per_s
                        .entry(demand.tenant.to_owned())
                        .or_default() += count.offered_cost;
                    *outcome
                        .admitted_cost_per_s
                        .entry(demand.tenant.to_owned())
                        .or_default() += count.admitted_cost;
                    *admitted_now.entry(demand.tenant).or_default() += count.admitted_cost;
                    outcome.charged_cost_per_s += count.charged_cost;
                    charged_now += count.charged_cost;
                    *outcome
                        .charged_per_tenant_per_s
                        .entry(demand.tenant.to_owned())
                        .or_default() += count.charged_cost;
                }
                counts.push(count);
            }
            report_window(&mut fleet, (proxy, index), counts, scenario.interval_ms);
        }
        for (tenant, cost) in admitted_now {
            outcome
                .admitted_per_interval
                .entry(tenant.to_owned())
                .or_default()
                .push(cost);
        }
        if measured {
            outcome.charged_per_interval.push(charged_now);
        }
        let load = fleet.tick_with(&costed);
        let decision = controller.decide(&load, policy);
        for directive in decision.changed {
            let priority = Priority::from_wire(directive.priority);
            let name = scenario
                .priorities
                .iter()
                .find(|(_, p)| directive.tenant.is_empty() && *p == priority)
                .map_or_else(|| directive.tenant.clone(), |(name, _)| (*name).to_owned());
            pushed.insert(name, directive);
        }
        if measured {
            ratio_sum += pushed.values().map(|d| d.drop_ratio).fold(0.0, f64::max);
        }
        outcome.status = decision.buckets.into_iter().find(|b| &*b.bucket == bucket);
    }
    let seconds = (intervals - warm_up) as f64 * scenario.interval_ms as f64 / 1000.0;
    for admitted in outcome.admitted_cost_per_s.values_mut() {
        *admitted /= seconds;
    }
    outcome.charged_cost_per_s /= seconds;
    for charged in outcome.charged_per_tenant_per_s.values_mut() {
        *charged /= seconds;
    }
    outcome.offered_cost_per_s /= seconds;
    for offered in outcome.offered_per_tenant_per_s.values_mut() {
        *offered /= seconds;
    }
    outcome.mean_drop_ratio = ratio_sum / (intervals - warm_up) as f64;
    outcome.directives = pushed;
    outcome
}

/// [`simulate`] with the default scenario but for `demands`, the offered
/// cost, the charge factor and the intervals.
fn run(
    policy: &Policy,
    bucket: &str,
    demands: &[Demand],
    offered_cost_per_s: f64,
    charge_factor: f64,
    (warm_up, intervals): (usize, usize),
) -> Outcome {
    simulate(
        policy,
        bucket,
        &Scenario {
            demands,
            offered_cost_per_s: (offered_cost_per_s, offered_cost_per_s),
            charge_factor,
            warm_up,
            intervals,
            ..Scenario::default()
        },
    )
}

fn within(value: f64, target: f64, tolerance: f64) -> bool {
    (value - target).abs() <= tolerance * target
}

#[test]
fn a_token_budget_offered_three_times_drops_two_thirds_and_admits_the_budget() {
    let policy = policy(
        "limits:\n  - bucket: llm\n    budget: {amount: 1200000, unit: tokens, per: minute}\n",
    );
    let outcome = run(
        &policy,
        "llm",
        &[Demand {
            tenant: "",
            fraction: 1.0,
        }],
        60_000.0,
        1.0,
        (40, 2040),
    );
    assert!(
        within(outcome.offered_cost_per_s, 60_000.0, 0.02),
        "{outcome:?}"
    );
    // Over 1,000 simulated seconds, the issue's ±5 % (a cost rate
    // smoothed whole admitted 5 to 15 % over: the admit share is convex in
    // a noisy, skewed estimate).
    let admitted = outcome.admitted_cost_per_s[""];
    assert!(
        within(admitted, 20_000.0, 0.05),
        "admitted {admitted:.0} tokens/s for a budget of 20,000"
    );
    assert!(
        within(outcome.mean_drop_ratio, 2.0 / 3.0, 0.05),
        "mean drop ratio {:.3}",
        outcome.mean_drop_ratio
    );
    let directive = &outcome.directives[""];
    assert_eq!(directive.cost_unit, "tokens");
    assert_eq!(directive.budget_period_s, 60);
    assert_eq!(directive.limit_rps, Some(20_000.0));
    // The offered rate the proxies derive their allowance from is cost.
    assert!(directive.offered_rps > 30_000.0, "{directive:?}");
    let status = outcome.status.unwrap();
    assert_eq!(status.limit_rps, Some(LimitRps::new(20_000.0).unwrap()));
    let cost = status.cost.unwrap();
    assert_eq!(cost.budget.as_ref().unwrap().unit().as_str(), "tokens");
    assert!(cost.offered_requests_rps > 30.0, "{cost:?}");
    assert!(cost.offered_per_s > 30_000.0, "{cost:?}");
    // One request's estimate counts at most a multiple of the mean cost.
    let mean = cost.offered_per_s / cost.offered_requests_rps;
    let cap = directive.estimate_cap as f64;
    assert!(
        within(cap, ESTIMATE_CAP_MEANS * mean, 0.25),
        "an estimate cap of {cap} for a mean cost of {mean:.0}"
    );
}

/// Estimates that run low (a client stating fewer tokens than it uses)
/// or high (a `max_tokens` the model never reaches): the budget is held in
/// what the streams were charged, and the status says by how much the
/// estimates were off and what the controller steers by.
#[test]
fn a_budget_is_held_in_charged_cost_whatever_the_estimates_bias() {
    let policy = policy(
        "limits:\n  - bucket: llm\n    budget: {amount: 20000, unit: tokens, per: second}\n",
    );
    for charge_factor in [1.5, 0.5] {
        let outcome = run(
            &policy,
            "llm",
            &[Demand {
                tenant: "",
                fraction: 1.0,
            }],
            60_000.0,
            charge_factor,
            (80, 2080),
        );
        let admitted = outcome.admitted_cost_per_s[""];
        assert!(within(
            outcome.charged_cost_per_s,
            admitted * charge_factor,
            1e-9
        ));
        // Within the noise of the costs admitted.
        assert!(
            within(outcome.charged_cost_per_s, 20_000.0, 0.05),
            "{charge_factor}: charged {:.0} tokens/s for a budget of 20,000",
            outcome.charged_cost_per_s
        );
        let cost = outcome.status.unwrap().cost.unwrap();
        let ratio = cost.charged_to_estimate;
        assert!(
            ratio.is_some_and(|r| within(r, charge_factor, 1e-6)),
            "{ratio:?}"
        );
        let steered = cost.charge_factor.unwrap();
        assert!(within(steered, charge_factor, 0.03), "{steered}");
        // The share stated to clients stays in the budget's tokens; the
        // proxies are told the factor, to compare the budget's rates with
        // estimates (the 429's wait, their local limit when stale).
        let directive = &outcome.directives[""];
        assert_eq!(directive.limit_rps, Some(20_000.0));
        assert!(
            within(directive.charge_factor, charge_factor, 0.08),
            "pushed {}",
            directive.charge_factor
        );
    }
}

/// Two tenants of equal weight, each offering 45,000 tokens a second of
/// estimates; one of them states a third of what its responses use. Held
/// by one factor for the bucket, the honest tenant would pay for the
/// other's low estimates; each cell's own factor holds each tenant to its
/// share in charged tokens.
#[test]
fn a_tenant_whose_estimates_run_low_is_held_to_its_own_share() {
    let policy = policy(
        "limits:\n  - bucket: llm\n    budget: {amount: 20000, unit: tokens, per: second}\n\
         tenants:\n  honest: {weight: 1}\n  low: {weight: 1}\n",
    );
    let demands = halves("honest", "low");
    for seed in [37, 38] {
        let outcome = simulate(
            &policy,
            "llm",
            &Scenario {
                demands: &demands,
                offered_cost_per_s: (90_000.0, 90_000.0),
                tenant_charge_factors: &[("low", 3.0)],
                admission: Admission::Credit,
                seed,
                ..Scenario::default()
            },
        );
        let charged = |tenant: &str| outcome.charged_per_tenant_per_s[tenant];
        eprintln!("{seed}: charged {:?}", outcome.charged_per_tenant_per_s);
        for tenant in ["honest", "low"] {
            assert!(
                within(charged(tenant), 10_000.0, 0.06),
                "{seed}: {tenant} charged {:.0} tokens/s for a share of 10,000 ({:?})",
                charged(tenant),
                outcome.charged_per_tenant_per_s
            );
        }
        let status = outcome.status.unwrap();
        let factor = |tenant: &str| {
            status
                .cells
                .iter()
                .find(|cell| &*cell.tenant == tenant)
                .and_then(|cell| cell.charge_factor)
                .unwrap()
        };
        assert!(factor("low") > 2.5, "{}", factor("low"));
        assert!(factor("honest") < 1.2, "{}", factor("honest"));
        // Each cell's proxies are told its own, as last pushed.
        let pushed = |tenant: &str| outcome.directives[tenant].charge_factor;
        assert!(pushed("low") > 2.5, "{}", pushed("low"));
        assert!(pushed("honest") < 1.2, "{}", pushed("honest"));
    }
}

#[test]
fn tenants_share_a_cost_budget_by_weight() {
    let policy = policy(
        "limits:\n  - bucket: llm\n    budget: {amount: 20000, unit: tokens, per: second}\n\
         tenants:\n  gold: {weight: 3}\n  free: {weight: 1}\n",
    );
    // Both offer more than their share: gold 30,000, free 30,000.
    let demands = halves("gold", "free");
    // Several runs: one seed's luck hid the bias of the division on raw
    // cost rates (free ran 10 to 17 % over its share on most seeds).
    for admission in [Admission::Coin, Admission::Credit] {
        for seed in 1..=4 {
            let outcome = simulate(
                &policy,
                "llm",
                &Scenario {
                    demands: &demands,
                    admission,
                    seed,
                    ..Scenario::default()
                },
            );
            let gold = outcome.admitted_cost_per_s["gold"];
            let free = outcome.admitted_cost_per_s["free"];
            eprintln!(
                "{admission:?} seed {seed}: gold {:+.3}, free {:+.3}, both {:+.3}",
                gold / 15_000.0 - 1.0,
                free / 5_000.0 - 1.0,
                (gold + free) / 20_000.0 - 1.0
            );
            // Half the issue's ±10 % per tenant. Each tenant's cell sees
            // half the requests, and free has a sixth of its own admitted:
            // divided on each interval's raw cost rates, free's share grew
            // whenever gold's interval was light; without the balance, the
            // estimate's convexity left both 3 to 7 % over.
            assert!(
                within(gold, 15_000.0, 0.05),
                "{admission:?} seed {seed}: gold admitted {gold:.0}/s"
            );
            assert!(
                within(free, 5_000.0, 0.05),
                "{admission:?} seed {seed}: free admitted {free:.0}/s, gold {gold:.0}/s"
            );
            assert!(within(gold + free, 20_000.0, 0.03), "{gold} + {free}");
            let gold_directive = &outcome.directives["gold"];
            assert_eq!(gold_directive.cost_unit, "tokens");
            // In tokens a second: the fair share, plus what free leaves
            // unused when its estimated cost falls below its share.
            assert!(
                (15_000.0 * 0.99..=20_000.0).contains(&gold_directive.share_rps),
                "{gold_directive:?}"
            );
        }
    }
}

#[test]
fn a_request_limit_is_steered_on_requests_whatever_cost_is_reported() {
    let mut policy_rps = policy("limits:\n  - bucket: api\n    limit_rps: 20\n");
    let outcome = run(
        &policy_rps,
        "api",
        &[Demand {
            tenant: "",
            fraction: 1.0,
        }],
        60_000.0,
        1.0,
        (40, 240),
    );
    let directive = &outcome.directives[""];
    assert_eq!(directive.cost_unit, "");
    assert_eq!(directive.budget_period_s, 0);
    assert_eq!(directive.charge_factor, 0.0, "no factor without a budget");
    assert_eq!(directive.limit_rps, Some(20.0));
    // About 59 requests a second offered: a third admitted, in requests.
    assert!(directive.offered_rps < 100.0, "{directive:?}");
    assert!(within(outcome.mean_drop_ratio, 0.66, 0.1), "{outcome:?}");
    let status = outcome.status.unwrap();
    assert!(status.cost.as_ref().unwrap().budget.is_none());
    assert!(status.offered_rps < 100.0, "{status:?}");
    // Switching the bucket to a budget pushes every cell with its unit.
    policy_rps = policy(
        "limits:\n  - bucket: api\n    budget: {amount: 20000, unit: tokens, per: second}\n",
    );
    let outcome = run(
        &policy_rps,
        "api",
        &[Demand {
            tenant: "",
            fraction: 1.0,
        }],
        60_000.0,
        1.0,
        (1, 3),
    );
    assert_eq!(outcome.directives[""].cost_unit, "tokens");
}

fn budget_20000() -> Policy {
    policy("limits:\n  - bucket: llm\n    budget: {amount: 20000, unit: tokens, per: second}\n")
}

/// The admitted cost over 1 s and 10 s windows. The traffic's own noise
/// sets a floor no drop ratio can go below: a window admits a third of
/// what was offered in it, about 20 requests a second of costs with
/// `E[C²]/E[C]² ≈ 4`, and one request at the 99.9th percentile is a
/// whole second's budget. The budget's balance pays each interval's noise
/// back over the next ones, so the 10 s windows stray well below that
/// floor and the mean sits on the budget; the price is a little more
/// spread between single seconds, which now answer the ones before.
#[test]
fn the_balance_pays_back_the_noise_of_the_costs_admitted() {
    let policy = budget_20000();
    let oracle = simulate(
        &policy,
        "llm",
        &Scenario {
            admission: Admission::Oracle(&[("", 2.0 / 3.0)]),
            ..Scenario::default()
        },
    );
    let floor = oracle.admitted_total_per_interval();
    let floor_10s = spread(&window_errors(&floor, 10.0, 20_000.0));
    let floor_1s = spread(&window_errors(&floor, 1.0, 20_000.0));
    for admission in [Admission::Credit, Admission::Coin] {
        let outcome = simulate(
            &policy,
            "llm",
            &Scenario {
                admission,
                ..Scenario::default()
            },
        );
        let series = outcome.admitted_total_per_interval();
        let ten = spread(&window_errors(&series, 10.0, 20_000.0));
        let one = spread(&window_errors(&series, 1.0, 20_000.0));
        let inside = |seconds: f64, bound: f64| {
            let errors = window_errors(&series, seconds, 20_000.0);
            errors.iter().filter(|e| e.abs() <= bound).count() as f64 / errors.len() as f64
        };
        eprintln!(
            "{admission:?}: 10 s {ten:.3?} (floor {floor_10s:.3?}), 1 s {one:.3?} \
             (floor {floor_1s:.3?}); within: 10 s ±5 % {:.2}, 1 s ±10 % {:.2}",
            inside(10.0, 0.05),
            inside(1.0, 0.10)
        );
        assert!(ten.mean.abs() <= 0.015, "{admission:?}: mean {ten:?}");
        assert!(
            ten.rms <= floor_10s.rms * 0.8,
            "{admission:?}: 10 s windows {ten:?}, floor {floor_10s:?}"
        );
        assert!(
            one.rms <= floor_1s.rms * 1.2,
            "{admission:?}: 1 s windows {one:?}, floor {floor_1s:?}"
        );
    }
}

/// Offered cost steps from half the budget to three times it: the first
/// interval is admitted at the old ratio (0), the controller sees the
/// request rate more than double and follows at once. The overshoot is
/// `(k − 1) × budget × one interval` for a step of `k` times the budget:
/// +100 % over the first second on average over runs (each window's own
/// noise comes on top). The balance repays it over the next seconds, so
/// the first ten hold the budget.
#[test]
fn a_three_times_step_overshoots_by_one_interval_then_repays_it() {
    let policy = budget_20000();
    let (mut sum_1s, mut sum_10s) = (0.0, 0.0);
    let (mut worst_1s, mut worst_10s) = (f64::MIN, f64::MIN);
    let runs = 20;
    for seed in 1..=runs {
        let outcome = simulate(
            &policy,
            "llm",
            &Scenario {
                offered_cost_per_s: (10_000.0, 60_000.0),
                step_at: 200,
                warm_up: 200,
                intervals: 220,
                admission: Admission::Credit,
                seed,
                ..Scenario::default()
            },
        );
        let series = outcome.admitted_total_per_interval();
        let over = |seconds: f64| window_errors(&series, seconds, 20_000.0)[0];
        sum_1s += over(1.0);
        sum_10s += over(10.0);
        worst_1s = worst_1s.max(over(1.0));
        worst_10s = worst_10s.max(over(10.0));
    }
    let (mean_1s, mean_10s) = (sum_1s / runs as f64, sum_10s / runs as f64);
    eprintln!(
        "3x step over the budget: first 1 s mean {mean_1s:.3} worst {worst_1s:.3}, \
         first 10 s mean {mean_10s:.3} worst {worst_10s:.3}"
    );
    assert!(within(mean_1s, 1.0, 0.25), "{mean_1s}");
    assert!(mean_10s.abs() <= 0.05, "{mean_10s}");
}

/// One admission rule of [`limiters_that_admit_before_the_cost_is_known`].
trait Admits {
    /// Whether a request of `cell` costing `cost` arriving at `ms` is let
    /// through.
    fn admits(&mut self, cell: usize, cost: f64, ms: u64) -> bool;
}

/// A token bucket refilling at `rate_per_s` up to `capacity`, that admits
/// while its level is positive and then owes the whole cost: no size is
/// starved, and it overshoots by at most one request.
struct DebtBucket {
    rate_per_s: f64,
    capacity: f64,
    level: f64,
    at_ms: u64,
}

impl DebtBucket {
    fn new(rate_per_s: f64, capacity_s: f64) -> Self {
        Self {
            rate_per_s,
            capacity: rate_per_s * capacity_s,
            level: 0.0,
            at_ms: 0,
        }
    }

    /// The level at `ms`, refilled since the last call.
    fn level_at(&mut self, ms: u64) -> f64 {
        let elapsed_s = ms.saturating_sub(self.at_ms) as f64 / 1000.0;
        self.at_ms = ms;
        self.level = (self.level + elapsed_s * self.rate_per_s).min(self.capacity);
        self.level
    }

    fn admits(&mut self, cost: f64, ms: u64) -> bool {
        let admitted = self.level_at(ms) > 0.0;
        if admitted {
            self.level -= cost;
        }
        admitted
    }
}

/// One bucket all proxies share, exact and instant: a per-request call to
/// a central limiter without its latency.
struct Central(DebtBucket);

impl Admits for Central {
    fn admits(&mut self, _: usize, cost: f64, ms: u64) -> bool {
        self.0.admits(cost, ms)
    }
}

/// The exact drop ratio, applied to cost per cell as the credit does.
struct ExactRatio {
    /// Per cell, the part of its offered cost it admits.
    admit_shares: Vec<f64>,
    balances: Vec<f64>,
}

impl Admits for ExactRatio {
    fn admits(&mut self, cell: usize, cost: f64, _: u64) -> bool {
        let (Some(balance), Some(admit_share)) =
            (self.balances.get_mut(cell), self.admit_shares.get(cell))
        else {
            return false;
        };
        *balance += admit_share * cost;
        let admitted = *balance > 0.0;
        if admitted {
            *balance -= cost;
        }
        admitted
    }
}

/// A cap in cost per cell (proxy and tenant) at exactly its part of the
/// budget: an allowance in cost with perfect knowledge of the shares.
struct CellCaps(Vec<DebtBucket>);

impl Admits for CellCaps {
    fn admits(&mut self, cell: usize, cost: f64, ms: u64) -> bool {
        self.0
            .get_mut(cell)
            .is_some_and(|bucket| bucket.admits(cost, ms))
    }
}

/// Caps per cell split over a proxy's workers, as the allowance runs in an
/// Envoy with several: each worker's cap is its part of the cell's (here
/// an equal part), and a cell's requests go to its workers in turn (the
/// most even split Envoy's balancing of connections could give).
struct WorkerCaps {
    /// Cell by cell, `workers` caps each.
    caps: Vec<DebtBucket>,
    workers: usize,
    /// Per cell, the worker of its next request.
    next: Vec<usize>,
}

impl Admits for WorkerCaps {
    fn admits(&mut self, cell: usize, cost: f64, ms: u64) -> bool {
        let Some(next) = self.next.get_mut(cell) else {
            return false;
        };
        let worker = *next;
        *next = (worker + 1) % self.workers;
        self.caps
            .get_mut(cell * self.workers + worker)
            .is_some_and(|bucket| bucket.admits(cost, ms))
    }
}

/// A cap per proxy pooling its cells (one bucket for all its tenants),
/// each cell also keeping an account at its own part of the budget that
/// may run at most `borrow_s` of that part into debt: the proxy's cap
/// decides, the accounts keep the tenants to their shares over seconds.
/// Cells are numbered proxy by proxy, `tenants` to a proxy.
struct PooledCaps {
    proxies: Vec<DebtBucket>,
    cells: Vec<DebtBucket>,
    tenants: usize,
    borrow_s: f64,
}

impl Admits for PooledCaps {
    fn admits(&mut self, cell: usize, cost: f64, ms: u64) -> bool {
        let (Some(account), Some(pool)) = (
            self.cells.get_mut(cell),
            self.proxies.get_mut(cell / self.tenants),
        ) else {
            return false;
        };
        let most_debt = account.rate_per_s * self.borrow_s;
        let admitted = pool.level_at(ms) > 0.0 && account.level_at(ms) > -most_debt;
        if admitted {
            pool.level -= cost;
            account.level -= cost;
        }
        admitted
    }
}

/// The 1 s and 10 s windows of the references on the benchmark's
/// traffic (three proxies 60/30/10, tenants 50/30/20 of the demand
/// weighted 2:1:1, 3x a budget of 20,000 tokens/s, costs log-normal median
/// 500 / p99 8,000, Poisson arrivals, 1,000 s), each told its exact parts:
/// what the bounds (±10 % over 1 s, ±5 % over 10 s) ask of any
/// limiter that decides before the cost is known. Even one exact central
/// bucket consulted on every request leaves about a third of the seconds
/// outside ±10 %. Caps per cell, however exact their parts, do worse over
/// 10 s: at a couple of admitted requests a second per cell, each cell's
/// debt after a large request is its own (and, split over Envoy's
/// workers, a debt against half the rate), while one cap per proxy over
/// all its tenants shares it, and accounts per tenant beside that cap keep the
/// tenants to their parts. Run with `--nocapture` for the table
/// (docs/usage-limits.md).
#[test]
fn limiters_that_admit_before_the_cost_is_known() {
    const BUDGET: f64 = 20_000.0;
    const SECONDS: u64 = 1_000;
    const TENANTS: usize = 3;
    const WORKERS: usize = 2;
    let distribution = TokenDistribution::median_500_p99_8000();
    let sigma = (distribution.p99() / distribution.median()).ln() / 2.326_347_874;
    let mean_cost = distribution.median() * (sigma * sigma / 2.0).exp();
    // Each cell's part of the demand, and of the budget: tenants offer
    // 50/30/20 % and are weighted 2:1:1, as in the benchmark.
    let per_cell = |tenants: [f64; TENANTS]| -> Vec<f64> {
        [0.6, 0.3, 0.1]
            .iter()
            .flat_map(|proxy| tenants.map(|tenant| proxy * tenant))
            .collect()
    };
    let demand = per_cell([0.5, 0.3, 0.2]);
    let shares = per_cell([0.5, 0.25, 0.25]);
    let caps_of = |shares: &[f64], capacity_s: f64| -> Vec<DebtBucket> {
        shares
            .iter()
            .map(|share| DebtBucket::new(BUDGET * share, capacity_s))
            .collect()
    };
    let pooled = |borrow_s: f64| PooledCaps {
        proxies: caps_of(&[0.6, 0.3, 0.1], 1.0),
        cells: caps_of(&shares, 2.0),
        tenants: TENANTS,
        borrow_s,
    };
    let mut limiters: Vec<(&str, Box<dyn Admits>)> = vec![
        (
            "one central bucket",
            Box::new(Central(DebtBucket::new(BUDGET, 0.1))),
        ),
        (
            "the exact ratio",
            Box::new(ExactRatio {
                admit_shares: shares
                    .iter()
                    .zip(&demand)
                    .map(|(share, demand)| share / demand / 3.0)
                    .collect(),
                balances: vec![0.0; shares.len()],
            }),
        ),
        ("a cap per cell", Box::new(CellCaps(caps_of(&shares, 0.5)))),
        (
            "a cap per cell and worker, two workers",
            Box::new(WorkerCaps {
                caps: caps_of(
                    &shares
                        .iter()
                        .flat_map(|share| [share / WORKERS as f64; WORKERS])
                        .collect::<Vec<_>>(),
                    0.5,
                ),
                workers: WORKERS,
                next: vec![0; shares.len()],
            }),
        ),
        (
            "a cap per cell, 2 s of it banked",
            Box::new(CellCaps(caps_of(&shares, 2.0))),
        ),
        (
            "a cap per proxy, its tenants pooled (1 s banked)",
            Box::new(pooled(f64::INFINITY)),
        ),
        (
            "the same, each tenant's account at its part (2 s banked, 3 s of debt at most)",
            Box::new(pooled(3.0)),
        ),
    ];
    let mut results = Vec::new();
    for (name, limiter) in &mut limiters {
        // The same traffic for each.
        let mut sampler = TokenSampler::new(distribution, 41);
        let mut per_second = vec![0.0; SECONDS as usize];
        let mut admitted_per_cell = vec![0.0; shares.len()];
        for ms in 0..SECONDS * 1000 {
            for (cell, demand) in demand.iter().enumerate() {
                if !sampler.chance(3.0 * BUDGET / mean_cost * demand / 1000.0) {
                    continue;
                }
                let cost = sampler.tokens() as f64;
                if limiter.admits(cell, cost, ms)
                    && let Some(second) = per_second.get_mut((ms / 1000) as usize)
                    && let Some(admitted) = admitted_per_cell.get_mut(cell)
                {
                    *second += cost;
                    *admitted += cost;
                }
            }
        }
        let within = |seconds: usize, bound: f64| {
            let errors: Vec<f64> = per_second
                .chunks_exact(seconds)
                .skip(1)
                .map(|w| w.iter().sum::<f64>() / (seconds as f64 * BUDGET) - 1.0)
                .collect();
            let inside = errors.iter().filter(|e| e.abs() <= bound).count();
            (inside as f64 / errors.len() as f64, spread(&errors))
        };
        // Each tenant's admitted cost against its part of the budget.
        let total: f64 = admitted_per_cell.iter().sum();
        let tenants_off = (0..TENANTS)
            .map(|tenant| {
                let admitted: f64 = admitted_per_cell.iter().skip(tenant).step_by(TENANTS).sum();
                let part: f64 = shares.iter().skip(tenant).step_by(TENANTS).sum();
                admitted / total / part - 1.0
            })
            .fold(0.0_f64, |most, off| most.max(off.abs()));
        let (one_within, one) = within(1, 0.10);
        let (ten_within, ten) = within(10, 0.05);
        eprintln!(
            "{name}: 1 s windows within ±10 %: {:.0} % (RMS {:.1} %), \
             10 s within ±5 %: {:.0} % (RMS {:.1} %), mean {:+.1} %, \
             tenants within {:.1} % of their parts",
            one_within * 100.0,
            one.rms * 100.0,
            ten_within * 100.0,
            ten.rms * 100.0,
            one.mean * 100.0,
            tenants_off * 100.0
        );
        results.push(Reference {
            one_within,
            one_rms: one.rms,
            ten_within,
            ten_rms: ten.rms,
            tenants_off,
        });
    }
    let [central, ratio, caps, workers, banked, pooled, accounts] = results[..] else {
        panic!("seven limiters");
    };
    // The central bucket holds seconds far better than any ratio, yet
    // still misses the 1 s bound in a good part of them.
    assert!(
        central.one_rms < ratio.one_rms / 2.0,
        "{central:?} vs {ratio:?}"
    );
    assert!((0.4..0.85).contains(&central.one_within), "{central:?}");
    // Caps per cell do not reach the central bucket's seconds; what they
    // cannot bank while a cell waits for its next request is lost.
    assert!(caps.one_rms > central.one_rms, "{caps:?} vs {central:?}");
    assert!(banked.ten_rms < caps.ten_rms, "{banked:?} vs {caps:?}");
    // Split over two workers, each cap holds half the part and each large
    // request is a debt twice as long against it.
    assert!(workers.ten_rms > caps.ten_rms, "{workers:?} vs {caps:?}");
    // Pooling a proxy's tenants in one cap takes most of the way from the
    // caps per cell to the central bucket over 10 s, but admits tenants
    // by their demand; accounts per tenant keep each near its part at
    // little cost.
    assert!(
        pooled.ten_rms < caps.ten_rms * 0.7,
        "{pooled:?} vs {caps:?}"
    );
    assert!(
        pooled.ten_within > caps.ten_within,
        "{pooled:?} vs {caps:?}"
    );
    assert!(pooled.tenants_off > 0.1, "{pooled:?}");
    assert!(
        accounts.ten_rms < caps.ten_rms * 0.8,
        "{accounts:?} vs {caps:?}"
    );
    assert!(accounts.tenants_off < 0.05, "{accounts:?}");
}

/// What one reference of [`limiters_that_admit_before_the_cost_is_known`]
/// measured: 1 s windows (within ±10 %, RMS), 10 s windows (within ±5 %,
/// RMS) and the farthest tenant from its part of the budget.
#[derive(Debug, Clone, Copy)]
struct Reference {
    one_within: f64,
    one_rms: f64,
    ten_within: f64,
    ten_rms: f64,
    tenants_off: f64,
}

/// One window of `bucket` llm: `offered` requests of `cost` each, of
/// which `admitted` let through and charged their estimate.
fn llm_count(offered: u64, admitted: u64, cost: f64) -> BucketCount {
    BucketCount {
        bucket: "llm".to_owned(),
        offered,
        offered_cost: offered as f64 * cost,
        admitted,
        admitted_cost: admitted as f64 * cost,
        charged_cost: admitted as f64 * cost,
        settled_cost: admitted as f64 * cost,
        ..BucketCount::default()
    }
}

/// One proxy reporting 500 ms windows to a fleet and the tracking
/// controller.
struct OneProxy {
    fleet: Fleet,
    controller: Controller,
}

impl OneProxy {
    fn new() -> Self {
        let mut fleet = Fleet::new(Fleet::DEFAULT_CARRY_TICKS);
        fleet.connect("envoy-a", 1, StreamId(0));
        Self {
            fleet,
            controller: Controller::tracking(ControlInterval::default()),
        }
    }

    /// Reports `counts` as the proxy's window and decides the interval.
    fn tick(&mut self, policy: &Policy, counts: Vec<BucketCount>) -> IntervalOutcome {
        report_all(&mut self.fleet, "envoy-a", 0, counts);
        let load = self
            .fleet
            .tick_with(&|name| policy.limits.budget_rate(name));
        self.controller.decide(&load, policy)
    }
}

/// [`llm_count`] of `tenant`'s cell, in requests of 500 tokens.
fn tenant_count(tenant: &str, offered: u64, admitted: u64) -> BucketCount {
    BucketCount {
        tenant: tenant.to_owned(),
        ..llm_count(offered, admitted, 500.0)
    }
}

/// Reports `count` as proxy `proxy`'s (connected on stream `index`) one
/// window.
fn report_one(fleet: &mut Fleet, proxy: &str, index: usize, count: BucketCount) {
    report_all(fleet, proxy, index, vec![count]);
}

/// Reports `counts` as proxy `proxy`'s (connected on stream `index`) one
/// window.
fn report_all(fleet: &mut Fleet, proxy: &str, index: usize, counts: Vec<BucketCount>) {
    report_window(fleet, (proxy, index), counts, WINDOW_MS);
}

/// Reports `counts` as proxy `proxy`'s (connected on stream `index`) one
/// window of `window_ms`.
fn report_window(
    fleet: &mut Fleet,
    (proxy, index): (&str, usize),
    counts: Vec<BucketCount>,
    window_ms: u64,
) {
    let report = Report {
        window_ms,
        buckets: counts,
        ..Report::default()
    };
    fleet
        .report(proxy, StreamId(index as u64), &report)
        .unwrap();
}

/// A budget shadowed for a while admits everything offered. That is not
/// a debt of the proxies: were it kept, the budget would drop every
/// request once enforced, or, with a canary, push the whole repayment
/// onto the proxies that enforce.
#[test]
fn a_shadowed_budget_leaves_no_debt_behind() {
    // Whether the bucket's mode says shadow, and what the proxies report.
    for by_mode in [true, false] {
        let mut policy = budget_20000();
        let mut fleet = Fleet::new(Fleet::DEFAULT_CARRY_TICKS);
        fleet.connect("envoy-a", 1, StreamId(0));
        let mut controller = Controller::tracking(ControlInterval::default());
        // 60,000 tokens/s offered; `admitted` of the 60 requests let
        // through, `shadow_dropped` of them only because of shadowing.
        let mut interval = |policy: &Policy, admitted: u64, shadow_dropped: u64| {
            let count = BucketCount {
                shadow_dropped,
                ..llm_count(60, admitted, 500.0)
            };
            report_one(&mut fleet, "envoy-a", 0, count);
            let load = fleet.tick_with(&|name| policy.limits.budget_rate(name));
            let decision = controller.decide(&load, policy);
            decision.buckets[0].drop_ratio.get()
        };
        if by_mode {
            policy.modes.buckets.insert("llm".into(), Mode::Shadow);
        }
        let shadow_dropped = if by_mode { 0 } else { 40 };
        let shadowed: Vec<f64> = (0..40)
            .map(|_| interval(&policy, 60, shadow_dropped))
            .collect();
        policy.modes.buckets.clear();
        // The interval of the switch still ran shadowed; the next one
        // admits what the ratio asks.
        interval(&policy, 60, shadow_dropped);
        let enforced = interval(&policy, 20, 0);
        assert!(
            (0.6..0.72).contains(&enforced),
            "by mode {by_mode}: enforced at {enforced} after {shadowed:?}"
        );
    }
}

/// A proxy that admits everything whatever it is asked (broken, or lying
/// about it within what the share cap lets one proxy claim) runs a debt
/// that never ends. The others then admit less, down to half their
/// share, but the cell is never shut.
#[test]
fn a_proxy_that_never_enforces_cannot_shut_the_budget() {
    let policy = budget_20000();
    let mut fleet = Fleet::new(Fleet::DEFAULT_CARRY_TICKS);
    for (index, proxy) in ["honest-a", "honest-b", "rogue"].iter().enumerate() {
        fleet.connect(proxy, 1, StreamId(index as u64));
    }
    let mut controller = Controller::tracking(ControlInterval::default());
    let mut ratio: f64 = 0.0;
    let mut ratios = Vec::new();
    for _ in 0..200 {
        // Each offers 20,000 tokens/s (40 requests of 250 a window).
        for (index, proxy) in ["honest-a", "honest-b", "rogue"].iter().enumerate() {
            let admitted = if *proxy == "rogue" {
                40
            } else {
                (40.0 * (1.0 - ratio)).round() as u64
            };
            report_one(&mut fleet, proxy, index, llm_count(40, admitted, 250.0));
        }
        let load = fleet.tick_with(&|name| policy.limits.budget_rate(name));
        ratio = controller.decide(&load, &policy).buckets[0]
            .drop_ratio
            .get();
        ratios.push(ratio);
    }
    // Asked 2/3; the honest proxies admit at least half their share
    // (within the correction's bounds) and never nothing.
    let worst = ratios.iter().copied().fold(0.0, f64::max);
    assert!(worst < 0.9, "{ratios:?}");
}

/// Three proxies each offering 20,000 tokens/s and admitting what they are
/// told; one reports charges far from its estimates, a billion times or
/// nothing at all, with settled estimates a million times what it
/// admitted. Its charges count within 8x of its estimates, at a ratio
/// within twice the median proxy's long run, and weigh no more than the
/// median proxy's, so with three proxies the charge factor is at most
/// (1 + 1 + 2) / 3 and at least (1 + 1 + 1/2) / 3: the budget is held at
/// three quarters at worst, and overrun by at most 1.2 times. Summed as
/// reported, the factor went to its bound (8 or 1/8) at once; within 8x
/// alone, to (1 + 1 + 8) / 3 (the budget held at 30 %) or
/// (1 + 1 + 1/8) / 3.
#[test]
fn a_proxy_that_misreports_its_charges_sways_the_factor_by_a_third_of_twice() {
    let policy = budget_20000();
    let proxies = ["honest-a", "honest-b", "rogue"];
    for rogue_charge in [1e9, 0.0] {
        let mut fleet = Fleet::new(Fleet::DEFAULT_CARRY_TICKS);
        for (index, proxy) in proxies.iter().enumerate() {
            fleet.connect(proxy, 1, StreamId(index as u64));
        }
        let mut controller = Controller::tracking(ControlInterval::default());
        let mut ratio: f64 = 0.0;
        let mut factor = 1.0;
        for _ in 0..200 {
            for (index, proxy) in proxies.iter().enumerate() {
                let admitted = (40.0 * (1.0 - ratio)).round() as u64;
                let mut count = llm_count(40, admitted, 250.0);
                if *proxy == "rogue" {
                    count.charged_cost = count.admitted_cost * rogue_charge;
                    count.settled_cost = count.admitted_cost * 1e6;
                }
                report_one(&mut fleet, proxy, index, count);
            }
            let load = fleet.tick_with(&|name| policy.limits.budget_rate(name));
            let status = &controller.decide(&load, &policy).buckets[0];
            ratio = status.drop_ratio.get();
            factor = status.cost.as_ref().unwrap().charge_factor.unwrap();
        }
        eprintln!("{rogue_charge}: factor {factor}, ratio {ratio}");
        assert!((0.83..=1.34).contains(&factor), "{rogue_charge}: {factor}");
        // Asked 2/3 of 60,000 with the honest charges; 1 - 20,000 / (60,000
        // x factor) with the rogue's: between 0.6 and 0.75.
        assert!((0.58..=0.76).contains(&ratio), "{rogue_charge}: {ratio}");
    }
}

/// One request claiming ten seconds of the budget (the most the filter
/// counts one estimate under a directive, `CellDirective::count`),
/// dropped, among 60 requests of 500 tokens a window at 3x the budget;
/// or a billion tokens claimed by the first request through a proxy
/// that just started, which has no directive for the cell yet and counts
/// the estimate as stated (the fleet's sums count ten seconds of the
/// budget). Per second and per minute, the ratio the proxies follow moves
/// by a few hundredths and is back near 2/3 at once. Counted whole, a
/// claim of a billion tokens held it above 0.999 for 9.5 s and above 0.9
/// for 24 s.
#[test]
fn one_estimate_of_ten_seconds_does_not_shut_the_budget() {
    for (per, new_proxy) in [
        ("second", false),
        ("minute", false),
        ("second", true),
        ("minute", true),
    ] {
        let amount = if per == "second" { 20_000 } else { 1_200_000 };
        let policy = policy(&format!(
            "limits:\n  - bucket: llm\n    budget: {{amount: {amount}, unit: tokens, per: {per}}}\n"
        ));
        let mut fleet = Fleet::new(Fleet::DEFAULT_CARRY_TICKS);
        fleet.connect("envoy-a", 1, StreamId(0));
        let mut controller = Controller::tracking(ControlInterval::default());
        let mut ratio: f64 = 0.0;
        let mut after = Vec::new();
        for interval in 0..120 {
            let admitted = (60.0 * (1.0 - ratio)).round() as u64;
            let mut count = llm_count(60, admitted, 500.0);
            if interval == 60 && new_proxy {
                fleet.connect("envoy-b", 1, StreamId(1));
                report_one(&mut fleet, "envoy-b", 1, llm_count(1, 0, 1e9));
            } else if interval == 60 {
                count.offered += 1;
                count.offered_cost += 200_000.0;
            }
            report_one(&mut fleet, "envoy-a", 0, count);
            let load = fleet.tick_with(&|name| policy.limits.budget_rate(name));
            ratio = controller.decide(&load, &policy).buckets[0]
                .drop_ratio
                .get();
            if interval >= 60 {
                after.push(ratio);
            }
        }
        let worst = after.iter().copied().fold(0.0, f64::max);
        let settled = after.last().copied().unwrap_or(1.0);
        let case = if new_proxy { "new proxy" } else { "one proxy" };
        assert!(worst < 0.75, "per {per}, {case}: {after:?}");
        assert!(
            (0.6..0.72).contains(&settled),
            "per {per}, {case}: {after:?}"
        );
    }
}

/// The status shows a budget cell's balance: after an interval admitted
/// at three times the share, the debt it left (in tokens, what the next
/// intervals repay); a bucket limited in requests shows none.
#[test]
fn the_status_shows_a_budget_cells_balance() {
    for (policy, budget) in [
        (budget_20000(), true),
        (
            policy("limits:\n  - bucket: llm\n    limit_rps: 40\n"),
            false,
        ),
    ] {
        let mut fleet = Fleet::new(Fleet::DEFAULT_CARRY_TICKS);
        fleet.connect("envoy-a", 1, StreamId(0));
        let mut controller = Controller::tracking(ControlInterval::default());
        // 60 requests of 500 tokens a window, all let through: 60,000
        // tokens/s, or 120 requests/s.
        report_one(&mut fleet, "envoy-a", 0, llm_count(60, 60, 500.0));
        let load = fleet.tick_with(&|name| policy.limits.budget_rate(name));
        let decision = controller.decide(&load, &policy);
        let cells = &decision.buckets[0].cells;
        assert_eq!(cells.len(), 1, "{cells:?}");
        let balance = cells[0].balance;
        if budget {
            // (20,000 − 60,000) tokens/s over the 500 ms interval.
            let debt = balance.unwrap();
            assert!((debt + 20_000.0).abs() < 1.0, "{balance:?}");
        } else {
            assert_eq!(balance, None);
        }
    }
}

/// The balance on the benchmark's traffic as Envoy runs it: tenants
/// offering 50/30/20 % of the demand weighted 2:1:1, and each proxy's
/// requests spread over two VMs (Envoy's workers), each applying the
/// ratio by the coin as the filter does under a budget. A tenant's cell
/// repays its own debt within half its share a second and the other
/// tenants lend it the rest of the bucket's repayment within a quarter
/// of theirs, so a large request of a small tenant still takes longer to
/// repay than one of a bucket without tenants. The mean holds and the
/// 10 s windows stay below the exact ratios' floor. Run with
/// `--nocapture` for the numbers (docs/usage-limits.md).
#[test]
fn the_balance_over_tenants_and_workers() {
    let policy = benchmark_policy();
    let demands = BENCHMARK_DEMANDS;
    // 3x offered: each tenant's exact drop ratio for its part.
    let oracle = simulate(
        &policy,
        "llm",
        &Scenario {
            demands: &demands,
            admission: Admission::Oracle(&[
                ("gold", 1.0 - 0.5 / 1.5),
                ("silver", 1.0 - 0.25 / 0.9),
                ("bronze", 1.0 - 0.25 / 0.6),
            ]),
            ..Scenario::default()
        },
    );
    let floor = spread(&window_errors(
        &oracle.admitted_total_per_interval(),
        10.0,
        20_000.0,
    ));
    for vms in [1, 2] {
        let outcome = simulate(
            &policy,
            "llm",
            &Scenario {
                demands: &demands,
                admission: Admission::Coin,
                vms,
                ..Scenario::default()
            },
        );
        let errors = window_errors(&outcome.admitted_total_per_interval(), 10.0, 20_000.0);
        let ten = spread(&errors);
        let inside = errors.iter().filter(|e| e.abs() <= 0.05).count() as f64 / errors.len() as f64;
        eprintln!(
            "{vms} VM(s) a proxy: 10 s {ten:.3?} (exact ratios {floor:.3?}), within ±5 %: {inside:.2}"
        );
        assert!(ten.mean.abs() <= 0.015, "{vms}: {ten:?}");
        assert!(ten.rms < floor.rms, "{vms}: {ten:?} vs {floor:?}");
    }
}

/// An operator may run the control loop faster or slower than the
/// default (`control_interval_ms`, 50 to 60,000): the budget and its
/// tenants' shares are held at any of them. At short intervals each
/// tenant's cell often has an interval without a request; when that
/// lifted the cell's ratio, the budget ran 7 % over at 200 ms and a
/// quarter over at 100 ms, the smallest tenant most; when the held
/// cell's share went to the others meanwhile, the smallest tenant
/// admitted a fifth under its share at 100 ms.
#[test]
fn a_budget_is_held_at_any_control_interval() {
    let policy = benchmark_policy();
    let demands = BENCHMARK_DEMANDS;
    for interval_ms in [100, 250, 1_000] {
        // The same 1,000 s as the default's 2,000 intervals.
        let intervals = (1_020_000 / interval_ms) as usize;
        let outcome = simulate(
            &policy,
            "llm",
            &Scenario {
                demands: &demands,
                warm_up: intervals / 51,
                intervals,
                interval_ms,
                ..Scenario::default()
            },
        );
        let errors = window_errors_at(
            &outcome.admitted_total_per_interval(),
            (10.0, interval_ms),
            20_000.0,
        );
        let ten = spread(&errors);
        let tenants: Vec<String> = BENCHMARK_DEMANDS
            .iter()
            .map(|d| format!("{} {:.0}", d.tenant, outcome.admitted_cost_per_s[d.tenant]))
            .collect();
        eprintln!("{interval_ms} ms: 10 s {ten:.3?}, tenants {tenants:?}");
        assert!(ten.mean.abs() <= 0.02, "{interval_ms} ms: {ten:?}");
        for (demand, share) in BENCHMARK_DEMANDS.iter().zip([10_000.0, 5_000.0, 5_000.0]) {
            let admitted = outcome.admitted_cost_per_s[demand.tenant];
            assert!(
                within(admitted, share, 0.1),
                "{interval_ms} ms: {} admitted {admitted:.0} for a share of {share}",
                demand.tenant
            );
        }
    }
}

/// Why the filter applies a budget's drop ratio by the coin, not by its
/// credit (`sluice_core::decision`): on the benchmark's traffic (tenants
/// 50/30/20 % of the demand weighted 2:1:1, one and two VMs a proxy) the
/// credit's 10 s windows stray far more than the coin's. The balance
/// repays what the costs let through beyond each share; a credit repays
/// the same excess again on its VM (a large request's debt holds its cell
/// off until later estimates pay it back, seconds in a small cell), and
/// the two repayments together overshoot the other way. A bucket without
/// tenants with one VM a proxy shows no difference (each cell is large
/// enough that its credit's debt clears within an interval or two).
/// Run with `--nocapture` for the numbers (docs/usage-limits.md).
#[test]
fn a_budget_s_requests_take_the_coin() {
    let policy = benchmark_policy();
    let demands = BENCHMARK_DEMANDS;
    let shares = BENCHMARK_SHARES;
    let seeds = [37, 38, 39];
    for vms in [1, 2] {
        let measure = |admission: Admission| {
            let (mut rms, mut farthest) = (0.0, 0.0f64);
            for seed in seeds {
                let outcome = simulate(
                    &policy,
                    "llm",
                    &Scenario {
                        demands: &demands,
                        admission,
                        vms,
                        seed,
                        ..Scenario::default()
                    },
                );
                let errors = window_errors(&outcome.admitted_total_per_interval(), 10.0, 20_000.0);
                rms += spread(&errors).rms / seeds.len() as f64;
                for (tenant, share) in shares {
                    let admitted = outcome
                        .admitted_cost_per_s
                        .get(tenant)
                        .copied()
                        .unwrap_or(0.0);
                    farthest = farthest.max((admitted / share - 1.0).abs());
                }
            }
            (rms, farthest)
        };
        let (coin, coin_farthest) = measure(Admission::Coin);
        let (credit, credit_farthest) = measure(Admission::Credit);
        eprintln!(
            "{vms} VM(s) a proxy, 10 s windows RMS: coin {coin:.3} (tenants within {coin_farthest:.3}), \
             credit {credit:.3} (within {credit_farthest:.3})"
        );
        assert!(
            coin < 0.85 * credit,
            "{vms}: coin {coin} vs credit {credit}"
        );
        assert!(
            coin_farthest < 0.05,
            "{vms}: a tenant {coin_farthest} from its share"
        );
    }
}

/// The benchmark's fleet and tenants (proxies 60/30/10, tenants 50/30/20
/// weighted 2:1:1, 3x the budget) with a constant estimate of 250 tokens
/// against log-normal responses (median 500, p99 8,000): each proxy's
/// ratio of charges to estimates is the noise of a few heavy responses,
/// most of all a small tenant's on the small proxy, and must not read as
/// a proxy to hold to the others' ratio. Every tenant is held to its
/// share in charged tokens.
#[test]
fn heavy_tailed_charges_of_a_constant_estimate_hold_every_share() {
    let policy = benchmark_policy();
    let demands = BENCHMARK_DEMANDS;
    // The factor waits for 10 s of charges, and learns over 30 s.
    let constant = Scenario {
        demands: &demands,
        constant_estimate: Some(250.0),
        admission: Admission::Credit,
        warm_up: 120,
        intervals: 2120,
        ..Scenario::default()
    };
    for seed in [37, 38] {
        let outcome = simulate(&policy, "llm", &Scenario { seed, ..constant });
        let charged = &outcome.charged_per_tenant_per_s;
        let factor = outcome
            .status
            .as_ref()
            .and_then(|s| s.cost.as_ref()?.charge_factor);
        eprintln!(
            "{seed}: charged {:.0} tokens/s, {charged:.0?}, k {factor:?}",
            outcome.charged_cost_per_s
        );
        assert!(
            within(outcome.charged_cost_per_s, 20_000.0, 0.05),
            "{seed}: {:.0}",
            outcome.charged_cost_per_s
        );
        for (tenant, share) in BENCHMARK_SHARES {
            assert!(
                within(charged[tenant], share, 0.1),
                "{seed}: {tenant} charged {:.0} for a share of {share}",
                charged[tenant]
            );
        }
    }
}

/// A control plane restarted under a budget whose estimates run 4x low
/// (a constant of 250 tokens against log-normal responses) knows no
/// charge factor: until it does, the estimates offered (three quarters of
/// the budget at 3x) read as under the budget. The first charges tighten
/// it at once; waiting for 10 s of them admitted about three budgets
/// for those seconds.
#[test]
fn a_restart_tightens_a_budget_whose_estimates_run_low_at_the_first_charges() {
    let policy = budget_20000();
    for seed in [37, 38] {
        let outcome = simulate(
            &policy,
            "llm",
            &Scenario {
                constant_estimate: Some(250.0),
                admission: Admission::Credit,
                restart_at: Some(200),
                seed,
                warm_up: 200,
                intervals: 220,
                ..Scenario::default()
            },
        );
        // Ten seconds of the budget.
        let after = outcome.charged_per_interval.iter().sum::<f64>() / 200_000.0 - 1.0;
        eprintln!("{seed}: the 20 intervals after the restart charged {after:+.3} of the budget");
        assert!(after < 0.3, "{seed}: {after:+.3}");
    }
}

/// One tenant's proxy that admits everything it is offered, at one and a
/// half times that tenant's share, beside honest proxies of three
/// tenants. Its cell's debt never ends, so the other tenants lend to it
/// every interval; their own balances count what they lend as credit and
/// reclaim it, so they keep their shares, and the rogue's own tenant is
/// cut but never shut.
#[test]
fn a_tenant_whose_proxy_never_enforces_costs_the_others_nothing() {
    let policy = benchmark_policy();
    // Requests of 250 tokens a window: 15,000, 7,500 and 7,500 tokens/s
    // per honest proxy (three times the budget with two), and the
    // rogue's 7,500 tokens/s of bronze.
    let offered = [("gold", 30), ("silver", 15), ("bronze", 15)];
    let shares = BENCHMARK_SHARES;
    let proxies = ["honest-a", "honest-b", "rogue"];
    let mut fleet = Fleet::new(Fleet::DEFAULT_CARRY_TICKS);
    for (index, proxy) in proxies.iter().enumerate() {
        fleet.connect(proxy, 1, StreamId(index as u64));
    }
    let mut controller = Controller::tracking(ControlInterval::default());
    let mut ratios: HashMap<&str, f64> = HashMap::new();
    let mut admitted: HashMap<&str, f64> = HashMap::new();
    let mut least_bronze = f64::INFINITY;
    let (warm_up, intervals) = (100, 300);
    for interval in 0..intervals {
        for (index, proxy) in proxies.iter().enumerate() {
            let counts = offered
                .iter()
                .filter(|(tenant, _)| *proxy != "rogue" || *tenant == "bronze")
                .map(|&(tenant, requests)| {
                    let ratio = ratios.get(tenant).copied().unwrap_or(0.0);
                    let let_through = if *proxy == "rogue" {
                        requests
                    } else {
                        (requests as f64 * (1.0 - ratio)).round() as u64
                    };
                    if interval >= warm_up {
                        *admitted.entry(tenant).or_default() += let_through as f64 * 250.0;
                        if tenant == "bronze" && *proxy != "rogue" {
                            least_bronze = least_bronze.min(let_through as f64);
                        }
                    }
                    BucketCount {
                        tenant: tenant.to_owned(),
                        ..llm_count(requests, let_through, 250.0)
                    }
                })
                .collect();
            report_all(&mut fleet, proxy, index, counts);
        }
        let load = fleet.tick_with(&|name| policy.limits.budget_rate(name));
        for cell in &controller.decide(&load, &policy).buckets[0].cells {
            let (tenant, _) = offered.iter().find(|(t, _)| **t == *cell.tenant).unwrap();
            ratios.insert(tenant, cell.drop_ratio.get());
        }
    }
    let seconds = (intervals - warm_up) as f64 * WINDOW_MS as f64 / 1000.0;
    let per_s: HashMap<&str, f64> = admitted.iter().map(|(t, a)| (*t, a / seconds)).collect();
    eprintln!("admitted per second: {per_s:?}, least bronze a window {least_bronze}");
    for (tenant, share) in &shares[..2] {
        assert!(per_s[tenant] >= 0.97 * share, "{tenant}: {per_s:?}");
    }
    assert!(least_bronze > 0.0, "{per_s:?}");
}

/// A budget sheds by priority as a request limit does: bulk is dropped
/// before critical. Critical traffic under the budget keeps (almost) all
/// of it while bulk takes what is left (the balance's repayments fall on
/// both by their shares, which costs critical a fraction of one percent);
/// critical beyond the budget takes all of it and bulk is shed.
#[test]
fn a_budget_sheds_bulk_before_critical() {
    let policy = budget_20000();
    for (critical_fraction, seeds) in [(0.1, 37..41), (0.5, 37..39)] {
        let demands = [
            Demand {
                tenant: "critical",
                fraction: critical_fraction,
            },
            Demand {
                tenant: "bulk",
                fraction: 1.0 - critical_fraction,
            },
        ];
        for seed in seeds {
            let outcome = simulate(
                &policy,
                "llm",
                &Scenario {
                    demands: &demands,
                    priorities: &[("critical", Priority::Critical), ("bulk", Priority::Bulk)],
                    admission: Admission::Coin,
                    seed,
                    ..Scenario::default()
                },
            );
            let offered = outcome.offered_per_tenant_per_s["critical"];
            let critical = outcome.admitted_cost_per_s["critical"];
            let bulk = outcome.admitted_cost_per_s["bulk"];
            eprintln!(
                "critical {critical_fraction}, seed {seed}: critical offered {offered:.0}, \
                 admitted {critical:.0}; bulk admitted {bulk:.0} tokens/s"
            );
            assert!(
                within(critical + bulk, 20_000.0, 0.03),
                "{critical} + {bulk}"
            );
            if offered < 20_000.0 {
                assert!(
                    critical >= 0.98 * offered,
                    "{seed}: {critical} of {offered}"
                );
            } else {
                assert!(within(critical, 20_000.0, 0.05), "{seed}: {critical}");
                assert!(bulk < 0.02 * 20_000.0, "{seed}: bulk {bulk}");
            }
        }
    }
}

/// A tenant's floor holds in a budget's unit: bronze, weighted 1 against
/// gold's 10 (a fair share of about 1,800 tokens/s), is kept at its floor
/// of 4,000 tokens/s and gold has the rest.
#[test]
fn a_tenant_s_floor_holds_within_a_budget() {
    let policy = policy(
        "limits:\n  - bucket: llm\n    budget: {amount: 20000, unit: tokens, per: second}\n\
         tenants:\n  gold: {weight: 10}\n  bronze: {weight: 1, min_floor_rps: 4000}\n",
    );
    for seed in 37..41 {
        let outcome = simulate(
            &policy,
            "llm",
            &Scenario {
                demands: &halves("gold", "bronze"),
                admission: Admission::Credit,
                seed,
                ..Scenario::default()
            },
        );
        let gold = outcome.admitted_cost_per_s["gold"];
        let bronze = outcome.admitted_cost_per_s["bronze"];
        eprintln!("seed {seed}: gold {gold:.0}, bronze {bronze:.0} tokens/s");
        assert!(within(bronze, 4_000.0, 0.05), "{seed}: bronze {bronze}");
        assert!(within(gold, 16_000.0, 0.05), "{seed}: gold {gold}");
    }
}

/// A tenant with no request in an interval keeps its share of a budget
/// while its directive is held: the share it counted for is not handed to
/// the others for that interval, and what it left unused is credit it
/// admits when its requests come back. A bucket limited in requests hands
/// a quiet tenant's share to the others at once, as before.
#[test]
fn a_quiet_tenant_keeps_its_share_of_a_budget() {
    // Each tenant offers three times its share in requests of 500 tokens:
    // shares of 10, 5 and 5 requests a 500 ms window.
    let cell = tenant_count;
    let all = || {
        vec![
            cell("bronze", 15, 5),
            cell("gold", 30, 10),
            cell("silver", 15, 5),
        ]
    };
    let without_bronze = || vec![cell("gold", 30, 10), cell("silver", 15, 5)];
    let share_of = |status: &BucketStatus, tenant: &str| {
        let cell = status.cells.iter().find(|c| c.tenant.as_ref() == tenant);
        cell.and_then(|c| c.share_rps).unwrap_or(0.0)
    };
    let request_limit = policy(
        "limits:\n  - bucket: llm\n    limit_rps: 40\n\
         tenants:\n  gold: {weight: 2}\n  silver: {weight: 1}\n  bronze: {weight: 1}\n",
    );
    for (policy, budget) in [(benchmark_policy(), true), (request_limit, false)] {
        let mut proxy = OneProxy::new();
        let mut tick = |counts| proxy.tick(&policy, counts).buckets.remove(0);
        for _ in 0..10 {
            tick(all());
        }
        let before = tick(all());
        let quiet = tick(without_bronze());
        let back = tick(all());
        let bronze = back.cells.iter().find(|c| c.tenant.as_ref() == "bronze");
        let bronze_balance = bronze.and_then(|c| c.balance);
        for tenant in ["gold", "silver"] {
            let (held, now) = (share_of(&before, tenant), share_of(&quiet, tenant));
            if budget {
                assert!(
                    (now - held).abs() <= 0.01 * held,
                    "{tenant}: {held} before, {now} while bronze is quiet"
                );
            } else {
                assert!(
                    now > 1.2 * held,
                    "{tenant}: {held} before, {now} while bronze is quiet"
                );
            }
        }
        let held = quiet.cells.iter().find(|c| c.tenant.as_ref() == "bronze");
        if budget {
            // Bronze's 5,000 tokens/s for the quiet 500 ms, its share
            // admitted exactly before and after; the status shows it held.
            let credit = bronze_balance.unwrap();
            assert!((credit - 2_500.0).abs() <= 250.0, "{credit}");
            let held = held.unwrap();
            assert_eq!(held.quiet_s, Some(0.5), "{held:?}");
            let shown = held.balance.unwrap();
            assert!((shown - 2_500.0).abs() <= 250.0, "{held:?}");
        } else {
            assert_eq!(bronze_balance, None);
            assert_eq!(held.and_then(|c| c.quiet_s), Some(0.5), "{held:?}");
        }
    }
}

/// A budget whose every tenant goes quiet at once is still listed while
/// its cells' directives stand: what its proxies hold, in the budget's
/// unit, with nothing offered; and no longer once they are lifted.
#[test]
fn a_quiet_budget_is_listed_while_its_directives_stand() {
    let policy = benchmark_policy();
    let mut proxy = OneProxy::new();
    for _ in 0..10 {
        proxy.tick(
            &policy,
            vec![tenant_count("gold", 30, 10), tenant_count("silver", 15, 5)],
        );
    }
    let quiet = proxy.tick(&policy, Vec::new());
    assert_eq!(quiet.buckets.len(), 1, "{quiet:?}");
    let status = &quiet.buckets[0];
    assert_eq!(status.bucket.as_ref(), "llm");
    assert_eq!(status.offered_rps, 0.0, "{status:?}");
    assert!(status.drop_ratio.get() > 0.0, "{status:?}");
    let cost = status.cost.as_ref().unwrap();
    let budget = policy.limits.rule_for("llm").and_then(Limit::budget);
    assert_eq!(cost.budget.as_ref(), budget, "{cost:?}");
    assert!(cost.charge_factor.is_some(), "{cost:?}");
    let shown: Vec<(&str, Option<f64>, bool)> = status
        .cells
        .iter()
        .map(|c| (c.tenant.as_ref(), c.quiet_s, c.balance.is_some()))
        .collect();
    assert_eq!(
        shown,
        [("gold", Some(0.5), true), ("silver", Some(0.5), true)],
        "{status:?}"
    );
    let mut last = quiet;
    for _ in 0..10 {
        last = proxy.tick(&policy, Vec::new());
    }
    assert!(last.buckets.is_empty(), "{last:?}");
}

/// A budget whose proxies offer requests but count no cost has nothing to
/// steer: it is listed with its request rate and the cells that count no
/// cost, pushes nothing, and beside a held status (its proxies counted
/// cost until now) the count joins that status.
#[test]
fn a_budget_whose_cells_count_no_cost_is_listed_and_pushes_nothing() {
    let policy = benchmark_policy();
    let uncosted = |tenant: &str| BucketCount {
        tenant: tenant.to_owned(),
        ..llm_count(30, 30, 0.0)
    };
    let mut proxy = OneProxy::new();
    let decision = proxy.tick(&policy, vec![uncosted("gold"), uncosted("silver")]);
    assert!(decision.changed.is_empty(), "{decision:?}");
    assert_eq!(decision.buckets.len(), 1, "{decision:?}");
    let status = &decision.buckets[0];
    assert_eq!(status.bucket.as_ref(), "llm");
    assert!(status.cells.is_empty(), "{status:?}");
    assert_eq!(status.drop_ratio, DropRatio::NEVER);
    assert_eq!(status.proxies_reporting, 1);
    let cost = status.cost.as_ref().unwrap();
    assert_eq!(cost.cells_without_cost, 2, "{cost:?}");
    assert_eq!(cost.offered_requests_rps, 120.0, "{cost:?}");
    let budget = policy.limits.rule_for("llm").and_then(Limit::budget);
    assert_eq!(cost.budget.as_ref(), budget, "{cost:?}");

    // Steered first, then the proxies stop counting cost (a rollout that
    // lost the cost rule): the held cells are listed with the count.
    let mut proxy = OneProxy::new();
    for _ in 0..10 {
        proxy.tick(
            &policy,
            vec![tenant_count("gold", 30, 10), tenant_count("silver", 15, 5)],
        );
    }
    let decision = proxy.tick(&policy, vec![uncosted("gold")]);
    assert_eq!(decision.buckets.len(), 1, "{decision:?}");
    let status = &decision.buckets[0];
    assert_eq!(status.cells.len(), 2, "{status:?}");
    assert!(
        status.cells.iter().all(|c| c.quiet_s.is_some()),
        "{status:?}"
    );
    let cost = status.cost.as_ref().unwrap();
    assert_eq!(cost.cells_without_cost, 1, "{cost:?}");
    assert_eq!(cost.offered_requests_rps, 60.0, "{cost:?}");
}

/// A flood of one-off tenants that shed once and never come back holds
/// their shares of a budget for the hold only: the tenants that stay get
/// theirs back once the flood's cells are lifted, and the flood's credit
/// goes with them.
#[test]
fn a_flood_of_one_off_tenants_holds_shares_for_the_hold_only() {
    let policy = benchmark_policy();
    let cell = tenant_count;
    let mut proxy = OneProxy::new();
    let mut tick = |counts| {
        let mut decision = proxy.tick(&policy, counts);
        (decision.buckets.remove(0), decision.retired.len())
    };
    let gold_share = |status: &BucketStatus| {
        let gold = status.cells.iter().find(|c| c.tenant.as_ref() == "gold");
        gold.and_then(|c| c.share_rps).unwrap_or(0.0)
    };
    for _ in 0..10 {
        tick(vec![cell("gold", 60, 20)]);
    }
    let (alone, _) = tick(vec![cell("gold", 60, 20)]);
    assert!((gold_share(&alone) - 20_000.0).abs() < 1.0, "{alone:?}");
    // 1,000 tenants of 10 requests each for two intervals, then gone.
    let flood = |round: usize| {
        let mut counts: Vec<BucketCount> = (0..1_000)
            .map(|i| cell(&format!("one-off-{round}-{i:04}"), 10, 10))
            .collect();
        counts.push(cell("gold", 60, 20));
        counts
    };
    tick(flood(0));
    tick(flood(0));
    let mut retired = 0;
    let mut held_intervals = 0;
    for _ in 0..10 {
        let (status, lifted) = tick(vec![cell("gold", 60, 20)]);
        retired += lifted;
        if gold_share(&status) < 0.99 * 20_000.0 {
            held_intervals += 1;
        }
    }
    // Held for QUIET_HOLD_S (four intervals of 500 ms), then lifted.
    assert_eq!(retired, 1_000);
    assert!((1..=4).contains(&held_intervals), "{held_intervals}");
    let (after, _) = tick(vec![cell("gold", 60, 20)]);
    assert!((gold_share(&after) - 20_000.0).abs() < 1.0, "{after:?}");
}

/// A held quiet cell counts in a budget's division in the budget's unit:
/// when the budget becomes a request limit, it no longer counts (its
/// tokens a second would count as requests a second, and shrink the
/// other tenants' shares while it is held).
#[test]
fn a_held_cell_counts_in_a_budget_s_unit_only() {
    let budget = benchmark_policy();
    let request_limit = policy(
        "limits:\n  - bucket: llm\n    limit_rps: 40\n\
         tenants:\n  gold: {weight: 2}\n  silver: {weight: 1}\n  bronze: {weight: 1}\n",
    );
    let all = || {
        vec![
            tenant_count("bronze", 15, 5),
            tenant_count("gold", 30, 10),
            tenant_count("silver", 15, 5),
        ]
    };
    let mut proxy = OneProxy::new();
    for _ in 0..10 {
        proxy.tick(&budget, all());
    }
    // Bronze goes quiet as the budget becomes 40 requests a second: gold
    // (60 requests a second) and silver (30) divide it 2:1.
    let without_bronze = vec![tenant_count("gold", 30, 10), tenant_count("silver", 15, 5)];
    let status = proxy.tick(&request_limit, without_bronze).buckets.remove(0);
    let gold = status.cells.iter().find(|c| c.tenant.as_ref() == "gold");
    let share = gold.and_then(|c| c.share_rps).unwrap_or(0.0);
    assert!((share - 80.0 / 3.0).abs() < 0.1, "{status:?}");
}

/// A budget cell in debt admits less than its share until the debt is
/// repaid, so its 429s tell clients to wait that long (at the most the
/// balance moves its target, half its share a second), not the usual
/// second; cells without a debt keep the usual wait.
#[test]
fn a_cell_in_debt_tells_its_clients_to_wait_for_the_repayment() {
    let policy = benchmark_policy();
    let all = |bronze: BucketCount| {
        vec![
            bronze,
            tenant_count("gold", 30, 10),
            tenant_count("silver", 15, 5),
        ]
    };
    let mut proxy = OneProxy::new();
    for _ in 0..10 {
        proxy.tick(&policy, all(tenant_count("bronze", 15, 5)));
    }
    // One of bronze's five admitted requests used 30,000 tokens more than
    // the others: 30,000 beyond its share, about 12 s at 2,500 tokens/s,
    // told as 16 s (waits are powers of two).
    // Bronze's five admitted requests used `cost` tokens together.
    let bronze_admitting = |cost: f64| BucketCount {
        admitted_cost: cost,
        charged_cost: cost,
        settled_cost: cost,
        ..tenant_count("bronze", 15, 5)
    };
    let decision = proxy.tick(&policy, all(bronze_admitting(32_500.0)));
    let wait_of = |tenant: &str| {
        let directive = decision.changed.iter().find(|d| d.tenant == tenant);
        directive.map(|d| d.retry_after_ms)
    };
    let bronze = wait_of("bronze").unwrap();
    assert_eq!(bronze, 16_000, "{decision:?}");
    assert!(
        wait_of("gold").is_none_or(|wait| wait == 1_000),
        "{decision:?}"
    );
    // A debt is kept up to DEBT_S of the share (repaid in at most 20 s),
    // told as the longest wait.
    let decision = proxy.tick(&policy, all(bronze_admitting(1e9)));
    let bronze = decision.changed.iter().find(|d| d.tenant == "bronze");
    assert_eq!(
        bronze.map(|d| d.retry_after_ms),
        Some(retry::MAX_RETRY_AFTER_MS)
    );
}
