//! Traffic patterns: who offers how much to which bucket, and when proxies
//! come and go; for the adaptive scenarios, the upstream behind them.

use sluice_control_plane::control::adaptive::spec::AdaptiveSpec;

use crate::cost::CostSpec;
use crate::load::Load;
use crate::upstream::UpstreamSpec;

/// How requests arrive within a millisecond step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrivals {
    /// Poisson arrivals: real traffic is bursty, and the controller must
    /// cope with the counting noise that comes with it.
    Poisson,
    /// Fractional accumulation: exactly the offered rate, no noise, so that
    /// what remains is the controller's own error.
    Deterministic,
}

/// One tenant of a bucket: its policy and its part of the bucket's traffic.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantSpec {
    /// Tenant name, as the filter would derive it.
    pub name: String,
    /// Weight in the weighted max-min fair share (the tenants config's
    /// `weight`).
    pub weight: f64,
    /// Rate below which it is never dropped (`min_floor_rps`).
    pub min_floor_rps: f64,
    /// Its part of the bucket's offered rate, relative to the other
    /// tenants' (requests are split in these proportions, exactly).
    pub offered: f64,
}

/// One limited bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketSpec {
    /// Bucket key.
    pub name: String,
    /// Fleet-wide limit.
    pub limit_rps: f64,
    /// Fleet-wide offered rate.
    pub load: Load,
    /// Relative share of the bucket's traffic each proxy receives while it
    /// is up (one weight per proxy); the load balancer spreads the traffic
    /// of proxies that are down over the others in the same proportions.
    pub weights: Vec<f64>,
    /// Tenants sharing the bucket; empty: the filter derives no tenant.
    pub tenants: Vec<TenantSpec>,
    /// Whether its limit follows the upstream's health, and how
    /// (`limit_rps` is then where it starts).
    pub adaptive: Option<AdaptiveSpec>,
}

impl BucketSpec {
    /// Each tenant's offered rate at `t_ms`: the bucket's rate split in the
    /// tenants' proportions.
    pub fn tenant_rps_at(&self, t_ms: u64) -> Vec<f64> {
        let total: f64 = self.tenants.iter().map(|t| t.offered).sum();
        let rps = self.load.rps_at(t_ms);
        self.tenants
            .iter()
            .map(|t| {
                if total > 0.0 {
                    rps * t.offered / total
                } else {
                    0.0
                }
            })
            .collect()
    }
}

/// When a proxy is part of the fleet: from `join_ms` until `leave_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Membership {
    /// When it connects and starts receiving traffic.
    pub join_ms: u64,
    /// When it stops receiving traffic and disconnects; `None`: never.
    pub leave_ms: Option<u64>,
}

impl Membership {
    /// Up for the whole run.
    pub const ALWAYS: Self = Self {
        join_ms: 0,
        leave_ms: None,
    };

    /// Whether the proxy takes traffic at `t_ms`.
    pub fn is_up(&self, t_ms: u64) -> bool {
        t_ms >= self.join_ms && self.leave_ms.is_none_or(|leave_ms| t_ms < leave_ms)
    }
}

/// Everything a run needs besides the seed.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Short name used on the command line.
    pub name: &'static str,
    /// Simulated duration.
    pub duration_ms: u64,
    /// How often each proxy reports (the filter's `report_interval_ms`).
    pub report_interval_ms: u64,
    /// How often the controller runs.
    pub control_interval_ms: u64,
    /// From the controller's decision to the proxies applying it.
    pub push_delay_ms: u64,
    /// How requests arrive.
    pub arrivals: Arrivals,
    /// One entry per proxy.
    pub proxies: Vec<Membership>,
    /// The limited buckets.
    pub buckets: Vec<BucketSpec>,
    /// How long after the start and after every disturbance (load step,
    /// proxy joining or leaving) the system is not yet expected to be in
    /// steady state.
    pub settle_ms: u64,
    /// The service behind the proxies, for the adaptive scenarios; `None`:
    /// responses are not simulated and nothing is adaptive.
    pub upstream: Option<UpstreamSpec>,
    /// What requests cost, for a budget scenario: every bucket's limit is
    /// then a budget of `limit_rps` units a second, and its load is in
    /// requests a second; `None`: requests cost nothing.
    pub costs: Option<CostSpec>,
}

impl Scenario {
    /// Times that disturb the steady state: load steps and membership
    /// changes within the run, sorted.
    pub fn disturbances(&self) -> Vec<u64> {
        let mut times: Vec<u64> = self
            .buckets
            .iter()
            .flat_map(|bucket| bucket.load.steps())
            .chain(self.proxies.iter().flat_map(|membership| {
                let join = Some(membership.join_ms).filter(|t| *t > 0);
                join.into_iter().chain(membership.leave_ms)
            }))
            .filter(|t| *t < self.duration_ms)
            .collect();
        times.sort_unstable();
        times.dedup();
        times
    }

    /// Times within the run at which some bucket's load jumps.
    pub fn load_steps(&self) -> Vec<u64> {
        let mut times: Vec<u64> = self
            .buckets
            .iter()
            .flat_map(|bucket| bucket.load.steps())
            .filter(|t| *t < self.duration_ms)
            .collect();
        times.sort_unstable();
        times.dedup();
        times
    }

    /// A copy running for `duration_ms` instead, for quick tests.
    #[cfg(test)]
    pub fn truncated(mut self, duration_ms: u64) -> Self {
        self.duration_ms = duration_ms;
        self
    }
}

/// The defaults of a real deployment: the filter's default report interval,
/// the control plane's default control interval, and a push that reaches
/// the workers within about half of the filter's 100 ms cache refresh.
const REPORT_INTERVAL_MS: u64 = 250;
const CONTROL_INTERVAL_MS: u64 = 500;
const PUSH_DELAY_MS: u64 = 50;
const SETTLE_MS: u64 = 3_000;
const PROXIES: usize = 10;

/// Names accepted by [`by_name`], in the order `all` runs them.
pub const NAMES: [&str; 12] = [
    "steady",
    "low-rate",
    "step-2x",
    "step-10x",
    "zipf",
    "hot-proxy",
    "churn",
    "ramp",
    "steady-deterministic",
    "tenants",
    "adaptive-aimd",
    "adaptive-gradient",
];

/// Scenarios that `all` leaves out: a budget is held in tokens, not
/// requests, and has a table of its own.
pub const BUDGET_NAMES: [&str; 2] = ["token-budget", "token-budget-bench"];

/// The scenario called `name`, of [`NAMES`] or [`BUDGET_NAMES`].
pub fn by_name(name: &str) -> Option<Scenario> {
    let scenario = match name {
        "token-budget" => token_budget(),
        "token-budget-bench" => token_budget_bench(),
        "steady" => steady(Arrivals::Poisson),
        "steady-deterministic" => Scenario {
            name: "steady-deterministic",
            ..steady(Arrivals::Deterministic)
        },
        "low-rate" => low_rate(),
        "step-2x" => step("step-2x", 800.0, 1_600.0),
        "step-10x" => step("step-10x", 500.0, 5_000.0),
        "zipf" => zipf(),
        "hot-proxy" => hot_proxy(),
        "churn" => churn(),
        "ramp" => ramp(),
        "tenants" => tenants(),
        "adaptive-aimd" => adaptive("adaptive-aimd", "aimd"),
        "adaptive-gradient" => adaptive("adaptive-gradient", "gradient"),
        _ => return None,
    };
    Some(scenario)
}

/// Every scenario, in [`NAMES`] order.
pub fn all() -> Vec<Scenario> {
    NAMES.iter().filter_map(|name| by_name(name)).collect()
}

fn base(name: &'static str, duration_ms: u64, buckets: Vec<BucketSpec>) -> Scenario {
    Scenario {
        name,
        duration_ms,
        report_interval_ms: REPORT_INTERVAL_MS,
        control_interval_ms: CONTROL_INTERVAL_MS,
        push_delay_ms: PUSH_DELAY_MS,
        arrivals: Arrivals::Poisson,
        proxies: vec![Membership::ALWAYS; PROXIES],
        buckets,
        settle_ms: SETTLE_MS,
        upstream: None,
        costs: None,
    }
}

/// Proxy `i` of `n` gets weight `i + 1`: the busiest proxy sees ten times
/// the traffic of the quietest, as behind an uneven load balancer.
fn skewed(n: usize) -> Vec<f64> {
    (1..=n).map(|i| i as f64).collect()
}

fn bucket(name: &str, limit_rps: f64, load: Load, weights: Vec<f64>) -> BucketSpec {
    BucketSpec {
        name: name.to_owned(),
        limit_rps,
        load,
        weights,
        tenants: Vec::new(),
        adaptive: None,
    }
}

fn tenant(name: &str, weight: f64, offered: f64) -> TenantSpec {
    TenantSpec {
        name: name.to_owned(),
        weight,
        min_floor_rps: 0.0,
        offered,
    }
}

fn steady(arrivals: Arrivals) -> Scenario {
    let buckets = vec![bucket(
        "acme",
        1_000.0,
        Load::Constant(3_000.0),
        skewed(PROXIES),
    )];
    Scenario {
        arrivals,
        ..base("steady", 30_000, buckets)
    }
}

fn low_rate() -> Scenario {
    let buckets = vec![bucket(
        "acme",
        100.0,
        Load::Constant(300.0),
        skewed(PROXIES),
    )];
    base("low-rate", 30_000, buckets)
}

/// Below the limit, a jump to `high_rps` at 10 s, back at 20 s.
fn step(name: &'static str, low_rps: f64, high_rps: f64) -> Scenario {
    let load = Load::Steps(vec![(0, low_rps), (10_000, high_rps), (20_000, low_rps)]);
    let buckets = vec![bucket("acme", 1_000.0, load, skewed(PROXIES))];
    base(name, 30_000, buckets)
}

/// 20 buckets with a 200 rps limit each and 6000 rps in total, bucket `k`
/// offered in proportion to `1 / k`: a few buckets far over their limit,
/// most under it.
fn zipf() -> Scenario {
    const BUCKETS: usize = 20;
    const TOTAL_RPS: f64 = 6_000.0;
    let harmonic: f64 = (1..=BUCKETS).map(|k| 1.0 / k as f64).sum();
    let buckets = (1..=BUCKETS)
        .map(|k| {
            let rps = TOTAL_RPS / (k as f64 * harmonic);
            bucket(
                &format!("tenant-{k:02}"),
                200.0,
                Load::Constant(rps),
                skewed(PROXIES),
            )
        })
        .collect();
    base("zipf", 30_000, buckets)
}

/// Proxy 0 carries half of the bucket, the other nine share the rest.
fn hot_proxy() -> Scenario {
    let mut weights = vec![1.0; PROXIES];
    if let Some(hot) = weights.first_mut() {
        *hot = (PROXIES - 1) as f64;
    }
    let buckets = vec![bucket("acme", 1_000.0, Load::Constant(3_000.0), weights)];
    base("hot-proxy", 30_000, buckets)
}

/// Ten proxies; two leave at 10 s, three new ones join at 15 s, one of the
/// originals leaves at 20 s. The total offered rate stays the same.
fn churn() -> Scenario {
    let mut proxies = vec![Membership::ALWAYS; PROXIES];
    for (index, membership) in proxies.iter_mut().enumerate() {
        membership.leave_ms = match index {
            0 | 1 => Some(10_000),
            2 => Some(20_000),
            _ => None,
        };
    }
    proxies.extend(
        [Membership {
            join_ms: 15_000,
            leave_ms: None,
        }; 3],
    );
    let buckets = vec![bucket(
        "acme",
        1_000.0,
        Load::Constant(3_000.0),
        skewed(proxies.len()),
    )];
    Scenario {
        proxies,
        ..base("churn", 30_000, buckets)
    }
}

/// From half the limit to twice the limit over 40 s.
fn ramp() -> Scenario {
    let load = Load::Ramp {
        start_ms: 5_000,
        end_ms: 45_000,
        from_rps: 500.0,
        to_rps: 2_000.0,
    };
    let buckets = vec![bucket("acme", 1_000.0, load, skewed(PROXIES))];
    base("ramp", 50_000, buckets)
}

/// Three tenants of one 1000 rps bucket, weights 4 / 1 / 0.25, offering
/// 900 / 600 / 300 rps: every tenant wants more than its weighted max-min
/// fair share (762 / 190 / 48 rps), so each is cut to a different rate.
fn tenants() -> Scenario {
    let tenants = vec![
        tenant("gold", 4.0, 900.0),
        tenant("silver", 1.0, 600.0),
        tenant("bronze", 0.25, 300.0),
    ];
    let buckets = vec![BucketSpec {
        tenants,
        ..bucket("acme", 1_000.0, Load::Constant(1_800.0), skewed(PROXIES))
    }];
    base("tenants", 30_000, buckets)
}

/// The capacity of the adaptive scenarios' upstream: 1000 rps, halved at
/// [`CAPACITY_HALVED_MS`], back at [`CAPACITY_RESTORED_MS`].
pub const CAPACITY_RPS: f64 = 1_000.0;
/// When the upstream loses half its capacity.
pub const CAPACITY_HALVED_MS: u64 = 30_000;
/// When it gets it back.
pub const CAPACITY_RESTORED_MS: u64 = 90_000;
/// The adaptive scenarios' latency target.
pub const TARGET_P99_MS: f64 = 100.0;

/// One bucket offered 3x the upstream's capacity through ten skewed
/// proxies, its limit adaptive on latency by `algorithm` (the spec the
/// integration tests use, scaled to 1000 rps: AIMD adds 20 rps per healthy
/// interval and multiplies by 0.8 when congested; the gradient smooths by
/// the default 0.3), starting at its 2000 rps upper bound. The upstream
/// queues up to 200 ms of work (the tests' capped upstream), so its p99
/// stays under the 100 ms target only while the admitted rate stays under
/// its capacity.
fn adaptive(name: &'static str, algorithm: &str) -> Scenario {
    let spec = format!(
        "{{bucket: api, signal: latency, target_p99_ms: {TARGET_P99_MS}, min_rps: 50, \
         max_rps: 2000, algorithm: {algorithm}, increase_rps: 20, decrease_factor: 0.8}}"
    );
    let capacity = Load::Steps(vec![
        (0, CAPACITY_RPS),
        (CAPACITY_HALVED_MS, CAPACITY_RPS / 2.0),
        (CAPACITY_RESTORED_MS, CAPACITY_RPS),
    ]);
    let buckets = vec![BucketSpec {
        adaptive: serde_yaml_ng::from_str(&spec).ok(),
        ..bucket(
            "api",
            2_000.0,
            Load::Constant(3.0 * CAPACITY_RPS),
            skewed(PROXIES),
        )
    }];
    Scenario {
        upstream: Some(UpstreamSpec {
            capacity,
            max_wait_ms: 200.0,
            base_latency_ms: 5.0,
        }),
        ..base(name, 150_000, buckets)
    }
}

/// The token budget: 20,000 tokens a second for the bucket `llm`.
pub const BUDGET_TOKENS_PER_S: f64 = 20_000.0;
/// When the token budget's offered load triples, from the budget to 3x.
pub const BUDGET_STEP_MS: u64 = 30_000;

/// A budget of 20,000 tokens a second for `llm` through three proxies
/// carrying 60 / 30 / 10 % of the requests, from the tenants gold, silver
/// and bronze (weights 3 : 2 : 1, offering 50 / 30 / 20 % of the tokens:
/// fair shares of 10,000 / 6,667 / 3,333 tokens a second, all below what
/// they offer after the step). The offered tokens equal the budget until
/// [`BUDGET_STEP_MS`], then triple. Each response uses log-normal tokens
/// (median 500, p99 8,000), which the client names as its estimate (a
/// `max_tokens` the model uses up), and streams them after 200 ms at
/// 1,000 tokens a second: its charge lands 0.7 s after the decision at
/// the median, 8 s at the p99.
fn token_budget() -> Scenario {
    let costs = CostSpec {
        unit: "tokens".to_owned(),
        median: 500.0,
        p99: 8_000.0,
        first_token_ms: 200,
        tokens_per_s: 1_000.0,
    };
    let rps = BUDGET_TOKENS_PER_S / costs.mean();
    let load = Load::Steps(vec![(0, rps), (BUDGET_STEP_MS, 3.0 * rps)]);
    let tenants = vec![
        tenant("gold", 3.0, 0.5),
        tenant("silver", 2.0, 0.3),
        tenant("bronze", 1.0, 0.2),
    ];
    let buckets = vec![BucketSpec {
        tenants,
        ..bucket("llm", BUDGET_TOKENS_PER_S, load, vec![6.0, 3.0, 1.0])
    }];
    Scenario {
        proxies: vec![Membership::ALWAYS; 3],
        settle_ms: 10_000,
        costs: Some(costs),
        ..base("token-budget", 330_000, buckets)
    }
}

/// [`token_budget`] with the tenants of `bench_tokens` (weights 2 : 1 : 1,
/// fair shares of 10,000 / 5,000 / 5,000 tokens a second): bronze offers
/// 2.4 times its share, the least of the three, so a cap that wastes part
/// of its allowance leaves it the least for the balance to make up.
fn token_budget_bench() -> Scenario {
    let mut scenario = token_budget();
    let tenants = scenario
        .buckets
        .iter_mut()
        .flat_map(|b| b.tenants.iter_mut());
    for (tenant, weight) in tenants.zip([2.0, 1.0, 1.0]) {
        tenant.weight = weight;
    }
    Scenario {
        name: "token-budget-bench",
        ..scenario
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;

    #[test]
    fn every_name_resolves() {
        for name in NAMES.into_iter().chain(BUDGET_NAMES) {
            assert_eq!(by_name(name).unwrap().name, name);
        }
        assert!(all().iter().all(|s| s.costs.is_none()));
        assert!(by_name("nope").is_none());
    }

    #[test]
    fn loads_over_time() {
        let steps = Load::Steps(vec![(0, 1.0), (10, 2.0)]);
        assert_eq!(steps.rps_at(9), 1.0);
        assert_eq!(steps.rps_at(10), 2.0);
        assert_eq!(steps.steps(), [10]);
        let ramp = Load::Ramp {
            start_ms: 10,
            end_ms: 20,
            from_rps: 0.0,
            to_rps: 100.0,
        };
        assert_eq!(ramp.rps_at(0), 0.0);
        assert_eq!(ramp.rps_at(15), 50.0);
        assert_eq!(ramp.rps_at(30), 100.0);
    }

    #[test]
    fn tenants_split_the_bucket_load_in_proportion() {
        let scenario = by_name("tenants").unwrap();
        assert_eq!(scenario.buckets[0].tenant_rps_at(0), [900.0, 600.0, 300.0]);
    }

    #[test]
    fn adaptive_scenarios_have_an_upstream_and_a_valid_spec() {
        for name in ["adaptive-aimd", "adaptive-gradient"] {
            let scenario = by_name(name).unwrap();
            assert!(scenario.upstream.is_some());
            assert!(scenario.buckets[0].adaptive.is_some(), "{name}");
        }
        assert!(by_name("steady").unwrap().upstream.is_none());
    }

    #[test]
    fn churn_disturbances() {
        assert_eq!(
            by_name("churn").unwrap().disturbances(),
            [10_000, 15_000, 20_000]
        );
    }
}
