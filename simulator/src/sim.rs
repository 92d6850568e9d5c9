//! The event loop: proxies, the fleet and the controller on a simulated
//! clock that advances in 1 ms steps.
//!
//! Every proxy is the filter's own agent ([`AgentProxy`]): its request path,
//! ticks, report windows, directive table, allowances and fallback; the
//! control plane side is the real [`Fleet`] and [`Controller`]. Only the
//! network is simulated: reports arrive as the agent sends them, directive
//! batches (and a heartbeat every second, as `sluice serve` sends) after the
//! push delay. Requests of a bucket with tenants are decided per (bucket,
//! tenant) cell, as the filter does.
//!
//! In a scenario with an upstream, admitted requests go to the modelled
//! service ([`Upstream`]); the agent picks the responses it follows (one in
//! four, the filter's default) and reports their signals, and the control
//! plane moves the adaptive limits on the fleet's signals through the real
//! [`AdaptiveLimits`] before deciding.
//!
//! In a scenario with costs, requests go through the filter's request
//! handler with a cost rule ([`crate::cost`]): the estimate is counted at
//! the decision, and each admitted request's stream ends one response time
//! later, when the handler settles its charge in the VM that decided it
//! and the next report carries it. The fleet then hands the controller
//! the budget's cost rates.

use std::collections::{BTreeMap, VecDeque};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_agent::config::RequestPolicy;
use sluice_agent::tick::pacing::DecisionMode;
use sluice_agent::usage::ChargeSource;
use sluice_core::allowance::{AllowanceSettings, Engage};
use sluice_proto::v1::{Directive, DirectiveBatch, ProxyMessage, proxy_message};

use sluice_control_plane::config::Config;
use sluice_control_plane::config::limits::{Limit, LimitRule, LimitTable, Selector};
use sluice_control_plane::config::policy::{InvalidPolicy, Policy, TenantPolicy, Tenants, Weight};
use sluice_control_plane::control::adaptive::AdaptiveLimits;
use sluice_control_plane::control::adaptive::spec::AdaptiveSpecs;
use sluice_control_plane::control::controller::{Controller, Proportional};
use sluice_control_plane::control::estimator::Tracking;
use sluice_control_plane::fleet::health::HealthWindow;
use sluice_control_plane::fleet::{Fleet, StreamId};
use sluice_core::limit::{InvalidLimit, LimitRps};

use crate::cost::{self, CostSpec, CostedRequest};
use crate::proxy::{self, AgentProxy, CLOCK_ORIGIN_MS, OpenStream};
use crate::scenario::{Arrivals, BucketSpec, Scenario};
use crate::upstream::Upstream;

/// Width of one slot of the recorded trace.
pub const SLOT_MS: u64 = 100;

/// The filter's default caps: large enough that no simulated bucket is
/// ever untracked, as in a correctly sized deployment.
const MAX_BUCKETS: usize = 10_000;

/// Epoch stamped on simulated batches; any constant will do since the
/// simulated control plane never restarts.
const EPOCH: u64 = 1;

/// The longest time without a batch on a stream: `sluice serve`'s
/// heartbeat.
const HEARTBEAT_MS: u64 = 1_000;

/// Above this mean, a Poisson draw is split into several smaller ones:
/// Knuth's method underflows `exp(-λ)` for large λ.
const POISSON_CHUNK: f64 = 30.0;

/// Fleet-wide counts of one bucket, per [`SLOT_MS`] slot.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketTrace {
    /// Bucket key.
    pub name: String,
    /// Requests offered in each slot, over all proxies.
    pub offered: Vec<u64>,
    /// Requests admitted in each slot, over all proxies.
    pub admitted: Vec<u64>,
    /// Per tenant of the scenario's bucket, in scenario order.
    pub tenants: Vec<TenantTrace>,
    /// An adaptive bucket's limit in force at the end of each slot; empty
    /// for a fixed limit.
    pub limit_rps: Vec<f64>,
    /// Its costs, in a budget scenario.
    pub cost: Option<CostTrace>,
}

/// What the requests of a bucket or a tenant cost, per [`SLOT_MS`] slot,
/// in the budget's unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostTrace {
    /// The estimates of the requests offered in each slot.
    pub offered: Vec<u64>,
    /// The estimates of the requests admitted in each slot.
    pub admitted: Vec<u64>,
    /// What the filter charged in each slot, by when each stream ended.
    pub charged: Vec<u64>,
    /// Streams charged.
    pub charges: u64,
    /// Of them, those charged their estimate: the response's usage was
    /// not read.
    pub charged_estimate: u64,
}

impl CostTrace {
    fn new(slots: usize) -> Self {
        Self {
            offered: vec![0; slots],
            admitted: vec![0; slots],
            charged: vec![0; slots],
            charges: 0,
            charged_estimate: 0,
        }
    }

    fn decided(&mut self, slot: usize, estimate: u64, admitted: bool) {
        if let (Some(offered), Some(admitted_cost)) =
            (self.offered.get_mut(slot), self.admitted.get_mut(slot))
        {
            *offered += estimate;
            *admitted_cost += if admitted { estimate } else { 0 };
        }
    }

    fn charged(&mut self, slot: usize, cost: u64, source: ChargeSource) {
        if let Some(charged) = self.charged.get_mut(slot) {
            *charged += cost;
        }
        self.charges += 1;
        self.charged_estimate += u64::from(source == ChargeSource::Estimate);
    }
}

/// What the upstream of an adaptive scenario did, per [`SLOT_MS`] slot (by
/// when each response reached its proxy), over every bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamTrace {
    /// Its capacity at the end of each slot.
    pub capacity_rps: Vec<f64>,
    /// Responses that were not 5xx: the goodput.
    pub ok: Vec<u64>,
    /// 5xx responses.
    pub errors: Vec<u64>,
    /// Every response's latency, in microseconds.
    pub latency_us: Vec<Vec<u64>>,
}

/// Fleet-wide counts of one tenant of a bucket, per [`SLOT_MS`] slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantTrace {
    /// Tenant name.
    pub name: String,
    /// Requests offered in each slot.
    pub offered: Vec<u64>,
    /// Requests admitted in each slot.
    pub admitted: Vec<u64>,
    /// Its costs, in a budget scenario.
    pub cost: Option<CostTrace>,
}

/// What a run recorded, one entry per bucket in scenario order.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Per-bucket counts.
    pub buckets: Vec<BucketTrace>,
    /// The upstream's answers, when the scenario has one.
    pub upstream: Option<UpstreamTrace>,
    /// Directive batches the controller pushed.
    pub batches_pushed: u64,
    /// Directives those batches carried (a cell's directive counted once
    /// per batch it changed in).
    pub directives_pushed: u64,
    /// The cost charged at stream end that the proxies' reports carried
    /// to the control plane, over every bucket.
    pub charged_reported: f64,
    /// The estimated cost admitted that the reports carried (with the
    /// usage counted late), over every bucket.
    pub admitted_reported: f64,
    /// The estimated cost settled at stream end that the reports carried,
    /// over every bucket.
    pub settled_reported: f64,
}

/// Why a scenario cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    /// A bucket's limit is not a valid limit.
    #[error("bucket {bucket}: {source}")]
    Limit {
        /// The bucket.
        bucket: String,
        /// What is wrong with it.
        source: InvalidLimit,
    },
    /// Intervals of 0 would never fire.
    #[error("report and control intervals must be positive")]
    ZeroInterval,
    /// A tenant's weight or floor is not valid in a tenants config.
    #[error("tenant {tenant}: {reason}")]
    Tenant {
        /// The tenant.
        tenant: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The buckets' adaptive specs do not go together.
    #[error("adaptive limits: {0}")]
    Adaptive(String),
    /// A bucket's budget, or the filter's cost rule for it, is not valid.
    #[error("bucket {bucket}: {reason}")]
    Budget {
        /// The bucket.
        bucket: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Which controller and which per-request decision a run uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Variant {
    /// Name in tables and file names.
    pub name: &'static str,
    /// The control plane's drop policy.
    pub policy: PolicyKind,
    /// How proxies apply a drop ratio.
    pub decision: DecisionMode,
    /// The local allowance, if proxies enforce one.
    pub allowance: Option<AllowanceSettings>,
}

/// The drop policies the simulator can compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    /// `(offered − limit) / offered` from the last interval.
    Proportional,
    /// [`Tracking`]: smoothed, step-following, feedback-corrected.
    Tracking,
}

impl Variant {
    /// The original design: proportional ratio, independent coin flips.
    pub const BASELINE: Self = Self {
        name: "baseline",
        policy: PolicyKind::Proportional,
        decision: DecisionMode::Coin,
        allowance: None,
    };

    /// The default: tracking policy, local allowance, credit where no
    /// allowance applies.
    pub const IMPROVED: Self = Self {
        name: "improved",
        policy: PolicyKind::Tracking,
        decision: DecisionMode::Credit,
        // Always engaged: the simulator measures what the caps do to load
        // steps while the control plane is up.
        allowance: Some(AllowanceSettings {
            headroom: 0.0,
            burst_ms: 20,
            engage: Engage::Always,
        }),
    };

    /// Every variant the CLI can name.
    pub const ALL: [Self; 4] = [
        Self::BASELINE,
        Self::IMPROVED,
        Self {
            name: "credit",
            policy: PolicyKind::Proportional,
            decision: DecisionMode::Credit,
            allowance: None,
        },
        Self {
            name: "tracking-coin",
            policy: PolicyKind::Tracking,
            decision: DecisionMode::Coin,
            allowance: None,
        },
    ];

    /// The variant called `name`.
    pub fn by_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.name == name)
    }

    fn controller(&self) -> Controller {
        match self.policy {
            PolicyKind::Proportional => Controller::new(Proportional),
            PolicyKind::Tracking => Controller::new(Tracking::new()),
        }
    }
}

/// A proxy and what the control plane knows of it.
struct Member {
    proxy: AgentProxy,
    /// In rotation now.
    up: bool,
    /// Its stream once it said hello: the agent's token, the fleet's id.
    stream: Option<(u32, StreamId)>,
}

/// Where a batch goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recipient {
    /// Every proxy with a stream: a delta broadcast or a heartbeat.
    All,
    /// One proxy's stream (its index and token): the snapshot a newly
    /// connected stream receives.
    Stream(usize, u32),
}

/// A budget scenario's costed requests: the filter's cost rule and the
/// streams whose responses have not ended.
struct Costs<'s> {
    spec: &'s CostSpec,
    policy: RequestPolicy,
    /// Draws each response's tokens, apart from the arrivals.
    rng: SmallRng,
    /// Streams by when they end, then by admission.
    streams: BTreeMap<(u64, u64), Streaming>,
    /// Streams admitted so far: the order of those that end together.
    admitted: u64,
}

/// An admitted request whose response is still streaming.
struct Streaming {
    proxy: usize,
    bucket: usize,
    tenant: Option<usize>,
    request: CostedRequest,
    stream: OpenStream,
}

impl<'s> Costs<'s> {
    /// The costs of `scenario`, drawn from `seed`; `None` without costs.
    fn new(scenario: &'s Scenario, seed: u64) -> Result<Option<Self>, SimError> {
        let Some(spec) = scenario.costs.as_ref() else {
            return Ok(None);
        };
        // The cost rule names the bucket it applies to: one bucket.
        let bucket = match scenario.buckets.as_slice() {
            [bucket] => bucket.name.as_str(),
            _ => {
                return Err(SimError::Budget {
                    bucket: String::new(),
                    reason: "a budget scenario has one bucket".to_owned(),
                });
            }
        };
        let policy = cost::request_policy(bucket).map_err(|reason| SimError::Budget {
            bucket: bucket.to_owned(),
            reason,
        })?;
        Ok(Some(Self {
            spec,
            policy,
            rng: SmallRng::seed_from_u64(seed ^ 0xC057_C057_C057_C057),
            streams: BTreeMap::new(),
            admitted: 0,
        }))
    }

    /// Ends every stream due by `t_ms`: the proxy that admitted it
    /// settles and counts its charge, recorded in `slot`.
    fn end_streams(&mut self, proxies: &mut [Member], trace: &mut Trace, t_ms: u64, slot: usize) {
        while let Some(entry) = self.streams.first_entry() {
            if entry.key().0 > t_ms {
                break;
            }
            let streaming = entry.remove();
            let Some(member) = proxies.get_mut(streaming.proxy).filter(|m| m.up) else {
                continue;
            };
            let Some(charge) =
                member
                    .proxy
                    .end_stream(&self.policy, streaming.stream, &streaming.request)
            else {
                continue;
            };
            let Some(recorded) = trace.buckets.get_mut(streaming.bucket) else {
                continue;
            };
            let tenant = streaming
                .tenant
                .and_then(|t| recorded.tenants.get_mut(t))
                .and_then(|t| t.cost.as_mut());
            for cost in recorded.cost.as_mut().into_iter().chain(tenant) {
                cost.charged(slot, charge.cost, charge.source);
            }
        }
    }
}

struct InFlight {
    due_ms: u64,
    recipient: Recipient,
    batch: DirectiveBatch,
}

/// The control plane's side of the proxies' streams.
struct Reception<'a> {
    fleet: &'a mut Fleet,
    health: &'a mut HealthWindow,
    in_flight: &'a mut VecDeque<InFlight>,
    next_stream: &'a mut u64,
    push_delay_ms: u64,
    version: u64,
    snapshot: &'a [Directive],
    /// The cost charged that the reports carried.
    charged_reported: &'a mut f64,
    /// The estimated cost admitted, then settled, that they carried.
    admitted_reported: &'a mut f64,
    settled_reported: &'a mut f64,
}

impl Reception<'_> {
    /// Ticks every proxy in rotation and receives what each sent.
    fn exchange(&mut self, proxies: &mut [Member], sent: &mut Vec<(u32, ProxyMessage)>, t_ms: u64) {
        for (index, member) in proxies.iter_mut().enumerate().filter(|(_, m)| m.up) {
            member.proxy.tick(t_ms, sent);
            self.receive(index, member, sent, t_ms);
        }
    }

    /// What proxy `index` sent at `t_ms`: a hello opens its stream at the
    /// fleet and brings the snapshot; reports go to the fleet.
    fn receive(
        &mut self,
        index: usize,
        member: &mut Member,
        sent: &mut Vec<(u32, ProxyMessage)>,
        t_ms: u64,
    ) {
        for (token, message) in sent.drain(..) {
            match message.kind {
                Some(proxy_message::Kind::Hello(hello)) => {
                    if let Some((_, previous)) = member.stream.take() {
                        self.fleet.disconnect(member.proxy.id(), previous);
                    }
                    *self.next_stream += 1;
                    let stream = StreamId(*self.next_stream);
                    self.fleet
                        .connect(&hello.proxy_id, hello.instance_id, stream);
                    member.stream = Some((token, stream));
                    self.in_flight.push_back(InFlight {
                        due_ms: t_ms + self.push_delay_ms,
                        recipient: Recipient::Stream(index, token),
                        batch: batch(self.version, t_ms, self.snapshot.to_vec()),
                    });
                }
                Some(proxy_message::Kind::Report(mut report)) => {
                    let Some((_, stream)) = member.stream.filter(|(t, _)| *t == token) else {
                        continue;
                    };
                    // The agent lists its cells in the order of a hash map
                    // seeded per process; in cell order, the fleet sums
                    // them alike in every run.
                    report.buckets.sort_by(|a, b| {
                        (&a.bucket, &a.tenant, a.priority).cmp(&(&b.bucket, &b.tenant, b.priority))
                    });
                    self.health.add(&report.upstream);
                    for bucket in &report.buckets {
                        *self.charged_reported += bucket.charged_cost;
                        *self.admitted_reported += bucket.admitted_cost;
                        *self.settled_reported += bucket.settled_cost;
                    }
                    // A rejected report is lost, as on the wire.
                    let _ = self.fleet.report(member.proxy.id(), stream, &report);
                }
                None => {}
            }
        }
    }
}

/// Runs `scenario` with the baseline (proportional policy, coin flips).
#[cfg(test)]
pub fn run(scenario: &Scenario, seed: u64) -> Result<Trace, SimError> {
    run_variant(scenario, seed, Variant::BASELINE)
}

/// Runs `scenario` with `variant`'s policy and decision, one worker per
/// proxy.
#[cfg(test)]
pub fn run_variant(scenario: &Scenario, seed: u64, variant: Variant) -> Result<Trace, SimError> {
    run_workers(scenario, seed, variant, 1)
}

/// Runs `scenario` with `variant`'s policy and decision on proxies of
/// `workers` VMs each.
pub fn run_workers(
    scenario: &Scenario,
    seed: u64,
    variant: Variant,
    workers: usize,
) -> Result<Trace, SimError> {
    let mut controller = variant.controller();
    if scenario.report_interval_ms == 0 || scenario.control_interval_ms == 0 {
        return Err(SimError::ZeroInterval);
    }
    let mut costs = Costs::new(scenario, seed)?;
    // The buckets whose limit is a budget: the fleet hands on their cost
    // rates.
    let policy = Policy {
        limits: limit_table(scenario)?,
        tenants: tenants(scenario)?,
        adaptive: adaptive_specs(scenario)?,
        ..Policy::default()
    };
    let mut upstream = scenario.upstream.clone().map(Upstream::new);
    let mut health = HealthWindow::default();
    let mut adaptive = AdaptiveLimits::default();
    // Each bucket's limit in force, as the trace records it.
    let mut limits_in_force: Vec<f64> = scenario.buckets.iter().map(|b| b.limit_rps).collect();
    // Per bucket: each tenant's share of the bucket's requests, and the
    // running credit that splits them exactly in those shares (smooth
    // weighted round robin: no noise beyond the arrivals').
    let tenant_shares: Vec<Vec<f64>> = scenario
        .buckets
        .iter()
        .map(|bucket| {
            let total: f64 = bucket.tenants.iter().map(|t| t.offered).sum();
            bucket
                .tenants
                .iter()
                .map(|t| if total > 0.0 { t.offered / total } else { 0.0 })
                .collect()
        })
        .collect();
    let mut tenant_credit: Vec<Vec<f64>> =
        tenant_shares.iter().map(|s| vec![0.0; s.len()]).collect();
    let mut fleet = Fleet::new(Fleet::DEFAULT_CARRY_TICKS);
    // Arrivals draw from their own generator so that changing a proxy's
    // decisions never changes the traffic it is offered.
    let mut arrival_rng = SmallRng::seed_from_u64(seed);
    let mut proxies: Vec<Member> = (0..scenario.proxies.len())
        .map(|index| Member {
            proxy: new_proxy(scenario, seed, index, variant, workers),
            up: false,
            stream: None,
        })
        .collect();
    let mut sent = Vec::new();
    let mut last_push_ms = 0;
    let mut accumulators = vec![vec![0.0_f64; proxies.len()]; scenario.buckets.len()];
    let slots = usize::try_from(scenario.duration_ms.div_ceil(SLOT_MS)).unwrap_or(0);
    let mut trace = Trace {
        buckets: scenario
            .buckets
            .iter()
            .map(|bucket| BucketTrace {
                name: bucket.name.clone(),
                offered: vec![0; slots],
                admitted: vec![0; slots],
                tenants: bucket
                    .tenants
                    .iter()
                    .map(|tenant| TenantTrace {
                        name: tenant.name.clone(),
                        offered: vec![0; slots],
                        admitted: vec![0; slots],
                        cost: costs.as_ref().map(|_| CostTrace::new(slots)),
                    })
                    .collect(),
                limit_rps: if bucket.adaptive.is_some() {
                    vec![0.0; slots]
                } else {
                    Vec::new()
                },
                cost: costs.as_ref().map(|_| CostTrace::new(slots)),
            })
            .collect(),
        upstream: scenario.upstream.as_ref().map(|_| UpstreamTrace {
            capacity_rps: vec![0.0; slots],
            ok: vec![0; slots],
            errors: vec![0; slots],
            latency_us: vec![Vec::new(); slots],
        }),
        batches_pushed: 0,
        directives_pushed: 0,
        charged_reported: 0.0,
        admitted_reported: 0.0,
        settled_reported: 0.0,
    };
    let mut in_flight: VecDeque<InFlight> = VecDeque::new();
    let mut snapshot: Vec<Directive> = Vec::new();
    let mut version = 0_u64;
    let mut next_stream = 0_u64;
    // Proxies up at the current step, and per bucket the cumulative weights
    // over them; recomputed only when membership changes.
    let mut up: Vec<usize> = Vec::new();
    let mut cumulative: Vec<Vec<f64>> = Vec::new();

    for t_ms in 0..scenario.duration_ms {
        deliver(&mut in_flight, &mut proxies, t_ms);

        let mut membership_changed = t_ms == 0;
        for (membership, member) in scenario.proxies.iter().zip(&mut proxies) {
            let should_be_up = membership.is_up(t_ms);
            if should_be_up && !member.up {
                // The proxies up from the start tick first at random times;
                // one that joins later is a new Envoy starting now.
                if t_ms > 0 {
                    member.proxy.restart(t_ms);
                }
                member.up = true;
                membership_changed = true;
            } else if !should_be_up && member.up {
                // A proxy taken out of rotation loses its partial window,
                // as an Envoy that is shut down does.
                if let Some((_, stream)) = member.stream.take() {
                    fleet.disconnect(member.proxy.id(), stream);
                }
                member.up = false;
                membership_changed = true;
            }
        }
        if membership_changed {
            up = (0..proxies.len())
                .filter(|&index| proxies.get(index).is_some_and(|p| p.up))
                .collect();
            cumulative = scenario
                .buckets
                .iter()
                .map(|bucket| {
                    let mut total = 0.0;
                    up.iter()
                        .map(|&index| {
                            total += bucket.weights.get(index).copied().unwrap_or(0.0);
                            total
                        })
                        .collect()
                })
                .collect();
        }

        let mut reception = Reception {
            fleet: &mut fleet,
            health: &mut health,
            in_flight: &mut in_flight,
            next_stream: &mut next_stream,
            push_delay_ms: scenario.push_delay_ms,
            version,
            snapshot: &snapshot,
            charged_reported: &mut trace.charged_reported,
            admitted_reported: &mut trace.admitted_reported,
            settled_reported: &mut trace.settled_reported,
        };
        reception.exchange(&mut proxies, &mut sent, t_ms);

        let slot = usize::try_from(t_ms / SLOT_MS).unwrap_or(usize::MAX);
        if let Some(upstream) = upstream.as_mut() {
            respond(upstream, scenario, &mut proxies, &mut trace, t_ms, slot);
        }
        if let Some(costs) = costs.as_mut() {
            costs.end_streams(&mut proxies, &mut trace, t_ms, slot);
        }
        for (recorded, limit) in trace.buckets.iter_mut().zip(&limits_in_force) {
            if let Some(in_force) = recorded.limit_rps.get_mut(slot) {
                *in_force = *limit;
            }
        }
        for (bucket_index, bucket) in scenario.buckets.iter().enumerate() {
            let (Some(weights), Some(recorded), Some(shares), Some(credit)) = (
                cumulative.get(bucket_index),
                trace.buckets.get_mut(bucket_index),
                tenant_shares.get(bucket_index),
                tenant_credit.get_mut(bucket_index),
            ) else {
                continue;
            };
            let Some(&total_weight) = weights.last() else {
                continue;
            };
            if total_weight <= 0.0 {
                continue;
            }
            let per_ms = bucket.load.rps_at(t_ms) / 1000.0;
            let mut offer = |proxy_index: usize| {
                let Some(member) = proxies.get_mut(proxy_index) else {
                    return;
                };
                let tenant = pick_tenant(shares, credit);
                let tenant_name = tenant
                    .and_then(|t| bucket.tenants.get(t))
                    .map_or("", |t| t.name.as_str());
                let (admitted, estimate) = match costs.as_mut() {
                    Some(costs) => {
                        let tokens = costs.spec.draw(&mut costs.rng);
                        // The client names the tokens it will use.
                        let mut request =
                            CostedRequest::new(&bucket.name, tenant_name, tokens, tokens);
                        let (admitted, stream) =
                            member.proxy.admit_costed(&costs.policy, &mut request);
                        if let Some(stream) = stream {
                            let ends_ms = t_ms + costs.spec.response_ms(tokens);
                            costs.admitted += 1;
                            let streaming = Streaming {
                                proxy: proxy_index,
                                bucket: bucket_index,
                                tenant,
                                request,
                                stream,
                            };
                            costs.streams.insert((ends_ms, costs.admitted), streaming);
                        }
                        (admitted, Some(tokens))
                    }
                    None => (member.proxy.admit(&bucket.name, tenant_name), None),
                };
                if let Some(estimate) = estimate {
                    let tenant_cost = tenant
                        .and_then(|t| recorded.tenants.get_mut(t))
                        .and_then(|t| t.cost.as_mut());
                    for cost in recorded.cost.as_mut().into_iter().chain(tenant_cost) {
                        cost.decided(slot, estimate, admitted);
                    }
                }
                if admitted && let Some(upstream) = upstream.as_mut() {
                    let followed = member.proxy.follows_response();
                    upstream.serve(t_ms, proxy_index, bucket_index, followed);
                }
                let tenant_trace = tenant.and_then(|t| recorded.tenants.get_mut(t));
                for (offered, admitted_slots) in [(&mut recorded.offered, &mut recorded.admitted)]
                    .into_iter()
                    .chain(tenant_trace.map(|t| (&mut t.offered, &mut t.admitted)))
                {
                    if let (Some(offered), Some(admitted_count)) =
                        (offered.get_mut(slot), admitted_slots.get_mut(slot))
                    {
                        *offered += 1;
                        *admitted_count += u64::from(admitted);
                    }
                }
            };
            match scenario.arrivals {
                Arrivals::Poisson => {
                    // Poisson splitting: one fleet-wide draw, each request
                    // routed by weight, is the same as independent draws
                    // per proxy and costs one draw per bucket, not per proxy.
                    for _ in 0..poisson(per_ms, &mut arrival_rng) {
                        let pick = uniform(&mut arrival_rng) * total_weight;
                        let position = weights.partition_point(|&c| c <= pick);
                        let proxy_index = up.get(position).or(up.last()).copied();
                        if let Some(proxy_index) = proxy_index {
                            offer(proxy_index);
                        }
                    }
                }
                Arrivals::Deterministic => {
                    let Some(row) = accumulators.get_mut(bucket_index) else {
                        continue;
                    };
                    let mut previous = 0.0;
                    for (&proxy_index, &c) in up.iter().zip(weights) {
                        let share = (c - previous) / total_weight;
                        previous = c;
                        let Some(accumulator) = row.get_mut(proxy_index) else {
                            continue;
                        };
                        *accumulator += per_ms * share;
                        while *accumulator >= 1.0 {
                            *accumulator -= 1.0;
                            offer(proxy_index);
                        }
                    }
                }
            }
        }

        if t_ms > 0 && t_ms % scenario.control_interval_ms == 0 {
            let load = fleet.tick_with(&|bucket| policy.limits.budget_rate(bucket));
            let adapted = adaptive.adapt(&policy, &health.take(), |bucket| {
                load.get(bucket).map_or(0.0, |b| b.load.offered_rps)
            });
            for status in adaptive.status() {
                let index = scenario
                    .buckets
                    .iter()
                    .position(|b| b.name == status.bucket);
                if let Some(limit) = index.and_then(|i| limits_in_force.get_mut(i)) {
                    *limit = status.limit_rps;
                }
            }
            let decision = controller.decide(&load, adapted.as_ref().unwrap_or(&policy));
            snapshot = controller.snapshot();
            if !decision.changed.is_empty() {
                version += 1;
                trace.batches_pushed += 1;
                trace.directives_pushed += decision.changed.len() as u64;
                last_push_ms = t_ms;
                in_flight.push_back(InFlight {
                    due_ms: t_ms + scenario.push_delay_ms,
                    recipient: Recipient::All,
                    batch: batch(version, t_ms, decision.changed),
                });
            }
        }
        if t_ms >= last_push_ms + HEARTBEAT_MS {
            last_push_ms = t_ms;
            in_flight.push_back(InFlight {
                due_ms: t_ms + scenario.push_delay_ms,
                recipient: Recipient::All,
                batch: batch(version, t_ms, Vec::new()),
            });
        }
    }
    Ok(trace)
}

fn limit_table(scenario: &Scenario) -> Result<LimitTable, SimError> {
    let rules = scenario
        .buckets
        .iter()
        .map(|bucket| {
            let limit = match &scenario.costs {
                Some(costs) => budget(bucket, costs)?,
                None => LimitRps::new(bucket.limit_rps)
                    .map_err(|source| SimError::Limit {
                        bucket: bucket.name.clone(),
                        source,
                    })?
                    .into(),
            };
            Ok(LimitRule {
                selector: Selector::Bucket(bucket.name.clone()),
                limit,
            })
        })
        .collect::<Result<Vec<_>, SimError>>()?;
    Ok(LimitTable::from_rules(None, rules))
}

/// A budget of `bucket.limit_rps` of the costs' unit a second, as a
/// limits file writes it.
fn budget(bucket: &BucketSpec, costs: &CostSpec) -> Result<Limit, SimError> {
    let invalid = |reason: String| SimError::Budget {
        bucket: bucket.name.clone(),
        reason,
    };
    let yaml = format!(
        "limits:\n  - bucket: {:?}\n    budget: {{amount: {}, unit: {:?}, per: second}}\n",
        bucket.name, bucket.limit_rps, costs.unit
    );
    let config = Config::from_yaml(&yaml, "budget").map_err(|err| invalid(err.to_string()))?;
    config
        .limits
        .exact(&bucket.name)
        .cloned()
        .ok_or_else(|| invalid("no budget".to_owned()))
}

/// The adaptive buckets' specs.
fn adaptive_specs(scenario: &Scenario) -> Result<AdaptiveSpecs, SimError> {
    let specs: Vec<_> = scenario
        .buckets
        .iter()
        .filter_map(|bucket| bucket.adaptive.clone())
        .collect();
    AdaptiveSpecs::try_from(specs).map_err(|err| SimError::Adaptive(err.to_string()))
}

/// Hands every response due by `t_ms` back to its proxy, which observes
/// those it chose to follow at admission, and records them all in the
/// trace.
fn respond(
    upstream: &mut Upstream,
    scenario: &Scenario,
    proxies: &mut [Member],
    trace: &mut Trace,
    t_ms: u64,
    slot: usize,
) {
    let recorded = trace.upstream.as_mut();
    let mut recorded = recorded.filter(|r| slot < r.ok.len());
    if let Some(recorded) = recorded.as_mut()
        && let Some(capacity) = recorded.capacity_rps.get_mut(slot)
    {
        *capacity = upstream.capacity_at(t_ms);
    }
    while let Some(response) = upstream.next_due(t_ms) {
        if let Some(recorded) = recorded.as_mut() {
            let count = if response.is_error() {
                recorded.errors.get_mut(slot)
            } else {
                recorded.ok.get_mut(slot)
            };
            if let Some(count) = count {
                *count += 1;
            }
            if let Some(latencies) = recorded.latency_us.get_mut(slot) {
                latencies.push(response.latency_us);
            }
        }
        let bucket = scenario.buckets.get(response.bucket);
        if let (Some(member), Some(bucket), Some(worker)) =
            (proxies.get_mut(response.proxy), bucket, response.followed)
            && member.up
        {
            member.proxy.observe_response(
                worker,
                &bucket.name,
                response.status,
                response.latency_us,
            );
        }
    }
}

/// Tenant policies of every bucket's tenants, as a tenants config would
/// hold them (tenant policies are not per bucket; the first wins).
fn tenants(scenario: &Scenario) -> Result<Tenants, SimError> {
    let mut policies = BTreeMap::new();
    for tenant in scenario.buckets.iter().flat_map(|b| &b.tenants) {
        let invalid = |reason: String| SimError::Tenant {
            tenant: tenant.name.clone(),
            reason,
        };
        let weight =
            Weight::new(tenant.weight).map_err(|err: InvalidPolicy| invalid(err.to_string()))?;
        let min_floor_rps =
            LimitRps::new(tenant.min_floor_rps).map_err(|err| invalid(err.to_string()))?;
        policies.entry(tenant.name.clone()).or_insert(TenantPolicy {
            weight,
            min_floor_rps,
            ..TenantPolicy::default()
        });
    }
    Ok(Tenants::new(policies))
}

/// The tenant of the next request: the one furthest behind its share.
/// `None` for a bucket without tenants.
fn pick_tenant(shares: &[f64], credit: &mut [f64]) -> Option<usize> {
    for (credit, share) in credit.iter_mut().zip(shares) {
        *credit += share;
    }
    let (pick, _) = credit
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))?;
    if let Some(picked) = credit.get_mut(pick) {
        *picked -= 1.0;
    }
    Some(pick)
}

fn new_proxy(
    scenario: &Scenario,
    seed: u64,
    index: usize,
    variant: Variant,
    workers: usize,
) -> AgentProxy {
    let id = format!("proxy-{index:02}");
    let index = index as u64;
    // Distinct, reproducible streams per proxy (the golden-ratio increment
    // keeps neighbouring seeds far apart).
    let mut rng = SmallRng::seed_from_u64(seed ^ (index + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    // Real proxies start at random times, so their ticks and report
    // windows are not aligned with each other or with the control interval.
    let phase = 1 + rng.next_u64() % scenario.report_interval_ms.max(1);
    let settings = proxy::settings(&id, |settings| {
        settings.report_interval_ms = scenario.report_interval_ms;
        settings.max_buckets = MAX_BUCKETS;
        settings.decision = variant.decision;
        settings.allowance = variant.allowance;
    });
    AgentProxy::new(settings, rng.next_u64(), workers, phase)
}

fn batch(version: u64, t_ms: u64, directives: Vec<Directive>) -> DirectiveBatch {
    DirectiveBatch {
        epoch: EPOCH,
        version,
        issued_at_unix_ms: CLOCK_ORIGIN_MS + t_ms,
        directives,
        ..Default::default()
    }
}

/// Hands every batch due by `t_ms` to its proxies, in the order they were
/// sent.
fn deliver(in_flight: &mut VecDeque<InFlight>, proxies: &mut [Member], t_ms: u64) {
    while in_flight.front().is_some_and(|f| f.due_ms <= t_ms) {
        let Some(InFlight {
            recipient, batch, ..
        }) = in_flight.pop_front()
        else {
            break;
        };
        match recipient {
            Recipient::All => {
                for member in proxies.iter_mut().filter(|m| m.up) {
                    if let Some((token, _)) = member.stream {
                        member.proxy.deliver(token, batch.clone(), t_ms);
                    }
                }
            }
            Recipient::Stream(index, token) => {
                if let Some(member) = proxies.get_mut(index).filter(|m| m.up) {
                    member.proxy.deliver(token, batch, t_ms);
                }
            }
        }
    }
}

/// Uniform in `[0, 1)` from the top 53 bits.
fn uniform(rng: &mut SmallRng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1_u64 << 53) as f64
}

/// A Poisson draw with mean `mean` (Knuth's multiplication method).
fn poisson(mean: f64, rng: &mut SmallRng) -> u64 {
    let mut remaining = mean.max(0.0);
    let mut count = 0;
    while remaining > 0.0 {
        let chunk = remaining.min(POISSON_CHUNK);
        remaining -= chunk;
        let floor = (-chunk).exp();
        let mut product = uniform(rng);
        while product > floor {
            count += 1;
            product *= uniform(rng);
        }
    }
    count
}
