//! Adaptive limits: buckets whose limit follows the upstream's health,
//! fleet-wide. Every control interval each adaptive bucket's limit moves
//! on the fleet's upstream signals ([`crate::fleet::health`]) by AIMD or a
//! gradient, always within the operator's hard bounds, and the result
//! replaces the bucket's configured limit in the fair-share and priority
//! machinery (tenants, floors and priority shedding still hold: a lowered
//! limit sheds BULK, then BEST_EFFORT, then DEGRADED before CRITICAL).

pub(crate) mod algorithm;
pub mod spec;

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::config::limits::LimitTable;
use crate::config::policy::Policy;
use crate::fleet::health::UpstreamHealth;
use crate::types::LimitRps;
use algorithm::{UpstreamReading, next_limit};
use spec::{AdaptiveSpec, AdaptiveSpecs, Algorithm, Signal};

/// Fewest sampled responses for a signal to count: fewer say nothing (one
/// slow response is not congestion). A bucket with fewer in an interval
/// keeps them and is judged once enough have come in over several.
pub(crate) const MIN_SAMPLES: u64 = 10;
/// Most intervals a bucket's sparse samples are pooled over before they
/// are dropped as too old to say anything about the upstream now.
const MAX_POOLED_INTERVALS: u32 = 20;
/// A bucket uses its limit when its offered rate reaches this share of it;
/// only then does a healthy signal raise the limit.
const IN_USE: f64 = 0.9;
/// A p99 over this share of the target holds the limit instead of raising
/// it: that close, the upstream is at its capacity and probing further
/// only fills its queue until the next decrease, which comes an interval or
/// two late. The simulator measured the settled p99 at 133-163 ms without
/// it and 101-130 ms with it for AIMD on a 100 ms target (the gradient:
/// 122-127 ms and 100-105 ms, goodput up from 0.91-0.94 to 0.93-0.97 of
/// the capacity). The sampled p99 is its histogram bucket's upper bound,
/// up to 19 % over the true one, so 0.9 would act as 0.8 does.
const NEAR_TARGET: f64 = 0.7;
/// A move larger than this share of the limit is logged.
const LOGGED_MOVE: f64 = 0.2;
/// After AIMD lowers a limit, this many intervals pass before it lowers it
/// again: the signals of the intervals that follow a decrease still show
/// the traffic of the old limit (directives reach the proxies, the queue
/// the old limit built drains, and the reports of its responses come back
/// up to three intervals later), and decreasing on them again would
/// overshoot far below the capacity. The simulator's `adaptive-aimd`
/// measured it: with two intervals, a halved capacity drew a second
/// decrease to 0.69 of it; with three, the limit stays above 0.81.
const AIMD_DECREASE_COOLDOWN: u32 = 3;
/// The gradient's decreases scale with how far over the target the p99 is,
/// so it needs less wait than AIMD's fixed factor, but not none: the
/// interval right after a decrease still judges the old limit's traffic.
/// With the filter's own report timing (the simulator runs its agent) a
/// gradient that lowered on it again went down to 0.58 of the capacity
/// from a start-up at twice it and took the first 30 s to climb back
/// (settled at 0.85–0.86 of the capacity over seeds 1–3); one interval of
/// wait keeps it at 0.94–0.98 and comes down to a halved capacity in
/// 3.6 s (three intervals: 0.97–0.99, but 6.6 s to come down).
const GRADIENT_DECREASE_COOLDOWN: u32 = 1;

/// Where one adaptive bucket stands.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdaptiveStatus {
    /// The bucket.
    pub bucket: String,
    /// The limit in force.
    pub limit_rps: f64,
    /// The hard bounds.
    pub(crate) min_rps: f64,
    /// The hard bounds.
    pub(crate) max_rps: f64,
    /// How it moves.
    pub(crate) algorithm: Algorithm,
    /// What it follows.
    pub(crate) signal: Signal,
    /// Why it last moved or held.
    pub(crate) reason: String,
    /// The last interval's fleet p99 in milliseconds, when measured.
    pub(crate) p99_ms: Option<f64>,
    /// The last interval's fleet 5xx ratio, when there were responses.
    pub(crate) error_ratio: Option<f64>,
}

#[derive(Debug, Clone)]
struct AdaptiveBucket {
    spec: AdaptiveSpec,
    limit: f64,
    reason: String,
    p99_ms: Option<f64>,
    error_ratio: Option<f64>,
    /// Intervals left before AIMD may lower the limit again.
    cooldown: u32,
    /// Samples of the last intervals that were too few to judge on.
    pooled: UpstreamHealth,
    /// Intervals `pooled` covers.
    pooled_intervals: u32,
}

impl AdaptiveBucket {
    /// This interval's samples, with the ones pooled before when there
    /// were too few: `None` until there are [`MIN_SAMPLES`]. Pooling is
    /// what lets a limit at a low rate move at all: at 50 rps, 500 ms
    /// intervals and one response in four sampled, no single interval has
    /// ten, and without it a limit pushed to its floor would never rise
    /// again.
    fn samples(&mut self, health: Option<&UpstreamHealth>) -> Option<UpstreamHealth> {
        if let Some(health) = health {
            self.pooled.absorb(health);
        }
        self.pooled_intervals += 1;
        if self.pooled.responses >= MIN_SAMPLES {
            self.pooled_intervals = 0;
            Some(std::mem::take(&mut self.pooled))
        } else {
            if self.pooled_intervals >= MAX_POOLED_INTERVALS {
                self.pooled = UpstreamHealth::default();
                self.pooled_intervals = 0;
            }
            None
        }
    }
}

/// Every adaptive bucket's current limit.
#[derive(Debug, Default)]
pub struct AdaptiveLimits {
    buckets: BTreeMap<String, AdaptiveBucket>,
}

/// What the signal says, for `spec`.
pub(crate) fn judge(
    spec: &AdaptiveSpec,
    health: Option<&UpstreamHealth>,
) -> (UpstreamReading, Option<f64>, Option<f64>) {
    let Some(health) = health.filter(|h| h.responses >= MIN_SAMPLES) else {
        return (UpstreamReading::NoSignal, None, None);
    };
    let p99_ms = health
        .latency_quantile(0.99)
        .map(|p99| p99.as_secs_f64() * 1e3);
    let error_ratio = health.error_ratio();
    let mut verdict = UpstreamReading::Healthy;
    let mut worst = 1.0;
    if matches!(spec.signal, Signal::Latency | Signal::Both)
        && let (Some(target), Some(p99)) = (spec.target_p99_ms, p99_ms)
        && p99 > target
    {
        worst = target / p99;
        verdict = UpstreamReading::Congested {
            reason: format!("p99 {p99:.0} ms > target {target:.0} ms"),
            pressure: worst,
        };
    }
    if matches!(spec.signal, Signal::Errors | Signal::Both)
        && let Some(ratio) = error_ratio
        && ratio > spec.max_error_ratio
    {
        // As far under target as the excess errors are over it.
        let pressure = (1.0 - (ratio - spec.max_error_ratio)).clamp(0.0, 1.0);
        if pressure < worst || verdict == UpstreamReading::Healthy {
            verdict = UpstreamReading::Congested {
                reason: format!("error ratio {ratio:.3} > {:.3}", spec.max_error_ratio),
                pressure,
            };
        }
    }
    if verdict == UpstreamReading::Healthy
        && matches!(spec.signal, Signal::Latency | Signal::Both)
        && let (Some(target), Some(p99)) = (spec.target_p99_ms, p99_ms)
        && p99 > NEAR_TARGET * target
    {
        verdict = UpstreamReading::NearTarget;
    }
    (verdict, p99_ms, error_ratio)
}

impl AdaptiveLimits {
    /// One control interval: follows `specs` (new buckets start at their
    /// configured limit, within bounds, else at `max_rps`; removed ones are
    /// forgotten) and moves every limit on `health`; `offered` is each
    /// bucket's fleet offered rate.
    pub(crate) fn step(
        &mut self,
        specs: &AdaptiveSpecs,
        configured: impl Fn(&str) -> Option<f64>,
        health: &HashMap<String, UpstreamHealth>,
        offered: impl Fn(&str) -> f64,
    ) {
        self.buckets
            .retain(|bucket, _| specs.iter().any(|s| s.bucket == *bucket));
        for spec in specs.iter() {
            let state = self
                .buckets
                .entry(spec.bucket.clone())
                .or_insert_with(|| AdaptiveBucket {
                    spec: spec.clone(),
                    limit: spec.bound(configured(&spec.bucket).unwrap_or(spec.max_rps)),
                    reason: "started".to_owned(),
                    p99_ms: None,
                    error_ratio: None,
                    cooldown: 0,
                    pooled: UpstreamHealth::default(),
                    pooled_intervals: 0,
                });
            if state.spec != *spec {
                state.spec = spec.clone();
                state.limit = spec.bound(state.limit);
            }
            let samples = state.samples(health.get(&spec.bucket));
            let (verdict, p99_ms, error_ratio) = judge(spec, samples.as_ref());
            let in_use = offered(&spec.bucket) >= IN_USE * state.limit;
            let before = state.limit;
            let cooling =
                state.cooldown > 0 && matches!(verdict, UpstreamReading::Congested { .. });
            state.cooldown = state.cooldown.saturating_sub(1);
            if !cooling {
                state.limit = next_limit(spec, before, &verdict, in_use);
                if state.limit < before {
                    state.cooldown = match spec.algorithm {
                        Algorithm::Aimd => AIMD_DECREASE_COOLDOWN,
                        Algorithm::Gradient => GRADIENT_DECREASE_COOLDOWN,
                    };
                }
            }
            state.p99_ms = p99_ms;
            state.error_ratio = error_ratio;
            state.reason = match &verdict {
                UpstreamReading::NoSignal => "no signal: holding".to_owned(),
                UpstreamReading::NearTarget => match (p99_ms, spec.target_p99_ms) {
                    (Some(p99), Some(target)) => {
                        format!("p99 {p99:.0} ms near target {target:.0} ms: holding")
                    }
                    _ => "near target: holding".to_owned(),
                },
                UpstreamReading::Healthy if in_use => "healthy: raising".to_owned(),
                UpstreamReading::Healthy => "healthy, limit not in use: holding".to_owned(),
                UpstreamReading::Congested { reason, .. } if cooling => {
                    format!("{reason}: waiting for the last decrease to show")
                }
                UpstreamReading::Congested { reason, .. } => format!("{reason}: lowering"),
            };
            if (state.limit - before).abs() > LOGGED_MOVE * before.max(1.0) {
                tracing::info!(
                    bucket = %spec.bucket,
                    from = before,
                    to = state.limit,
                    reason = %state.reason,
                    "adaptive limit moved"
                );
            }
        }
    }

    /// One control interval of `policy`'s adaptive buckets on the fleet's
    /// `health`, `offered` being each bucket's fleet offered rate: `policy`
    /// with the adaptive limits in place of the configured ones, or `None`
    /// when no bucket is (or was) adaptive. The control loop, the what-if
    /// replay and the simulator all move the limits through here.
    pub fn adapt(
        &mut self,
        policy: &Policy,
        health: &HashMap<String, UpstreamHealth>,
        offered: impl Fn(&str) -> f64,
    ) -> Option<Policy> {
        if policy.adaptive.is_empty() && self.is_empty() {
            return None;
        }
        self.step(
            &policy.adaptive,
            |bucket| policy.limits.limit_for(bucket).map(|l| l.get()),
            health,
            offered,
        );
        let mut adapted = policy.clone();
        self.apply(&mut adapted.limits);
        Some(adapted)
    }

    /// Puts every adaptive limit in `limits` in place of the configured
    /// one.
    pub(crate) fn apply(&self, limits: &mut LimitTable) {
        for (bucket, state) in &self.buckets {
            // A budget is a cost, not a capacity: the upstream's health
            // moves request limits only.
            if limits
                .rule_for(bucket)
                .is_some_and(|l| l.budget().is_some())
            {
                continue;
            }
            if let Ok(limit) = LimitRps::try_from(state.limit) {
                limits.set_exact(bucket.clone(), limit.into());
            }
        }
    }

    /// Whether any bucket is adaptive.
    pub(crate) fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Where every adaptive bucket stands, by bucket.
    pub fn status(&self) -> Vec<AdaptiveStatus> {
        self.buckets
            .iter()
            .map(|(bucket, state)| AdaptiveStatus {
                bucket: bucket.clone(),
                limit_rps: state.limit,
                min_rps: state.spec.min_rps,
                max_rps: state.spec.max_rps,
                algorithm: state.spec.algorithm,
                signal: state.spec.signal,
                reason: state.reason.clone(),
                p99_ms: state.p99_ms,
                error_ratio: state.error_ratio,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
