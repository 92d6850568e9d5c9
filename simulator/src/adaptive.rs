//! What an adaptive scenario measures: per phase of the upstream's
//! capacity, how long the limit took to find the new capacity, where it
//! settled and how much it swung, and what the upstream delivered (goodput,
//! p99 latency against the target, errors).

use serde::Serialize;

use crate::scenario::Scenario;
use crate::sim::{SLOT_MS, Trace};

/// The limit has found a capacity once it is within this share of it.
pub const FOUND_WITHIN: f64 = 0.10;
/// The second half of each phase is its settled part.
const SETTLED_FROM: f64 = 0.5;

/// One stretch of constant capacity.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Phase {
    /// When it starts.
    pub from_ms: u64,
    /// When it ends.
    pub to_ms: u64,
    /// The upstream's capacity throughout.
    pub capacity_rps: f64,
    /// From the start of the phase until the limit is first within
    /// [`FOUND_WITHIN`] of the capacity; `None`: never in the phase.
    pub adapt_ms: Option<u64>,
    /// The limit's mean over the settled part, over the capacity.
    pub limit_ratio: f64,
    /// The limit's lowest and highest values over the settled part, over
    /// the capacity: how far it swings around what it found.
    pub limit_low_ratio: f64,
    /// See `limit_low_ratio`.
    pub limit_high_ratio: f64,
    /// Non-5xx responses per second over the settled part, over the
    /// capacity.
    pub goodput_ratio: f64,
    /// The p99 latency of the settled part's responses, in milliseconds.
    pub p99_ms: f64,
    /// The share of the settled part's responses that were 5xx.
    pub error_ratio: f64,
}

/// What an adaptive run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdaptiveMetrics {
    /// The latency target.
    pub target_p99_ms: f64,
    /// The limit's hard bounds.
    pub min_rps: f64,
    /// See `min_rps`.
    pub max_rps: f64,
    /// The lowest and highest limit over the run.
    pub limit_low_rps: f64,
    /// See `limit_low_rps`.
    pub limit_high_rps: f64,
    /// Non-5xx responses per second over the whole run, over the mean
    /// capacity.
    pub goodput_ratio: f64,
    /// The share of whole seconds whose responses' p99 was within target.
    pub seconds_within_target: f64,
    /// Per stretch of constant capacity.
    pub phases: Vec<Phase>,
}

/// Measures `trace` of adaptive `scenario`: `None` if it has no upstream or
/// no adaptive bucket (the first adaptive bucket is the one measured).
pub fn compute(scenario: &Scenario, trace: &Trace) -> Option<AdaptiveMetrics> {
    let spec = scenario.upstream.as_ref()?;
    let (bucket_spec, bucket) = scenario
        .buckets
        .iter()
        .zip(&trace.buckets)
        .find(|(spec, _)| spec.adaptive.is_some())?;
    let adaptive = bucket_spec.adaptive.as_ref()?;
    let upstream = trace.upstream.as_ref()?;
    let target = adaptive.target_p99_ms.unwrap_or(f64::INFINITY);
    let limits = &bucket.limit_rps;
    let slots = limits.len();

    let mut boundaries: Vec<u64> = std::iter::once(0)
        .chain(spec.capacity.steps())
        .filter(|t| *t < scenario.duration_ms)
        .collect();
    boundaries.push(scenario.duration_ms);
    let phases = boundaries
        .windows(2)
        .filter_map(|pair| {
            let (from_ms, to_ms) = (*pair.first()?, *pair.get(1)?);
            let capacity_rps = spec.capacity.rps_at(from_ms);
            let (first, end) = (slot_of(from_ms), slot_of(to_ms).min(slots));
            let settled = first + ((end - first) as f64 * SETTLED_FROM) as usize;
            let adapt_ms = (first..end)
                .find(|&slot| {
                    limits
                        .get(slot)
                        .is_some_and(|l| (l - capacity_rps).abs() <= FOUND_WITHIN * capacity_rps)
                })
                .map(|slot| (slot - first + 1) as u64 * SLOT_MS);
            let settled_limits = limits.get(settled..end)?;
            let mean = settled_limits.iter().sum::<f64>() / settled_limits.len().max(1) as f64;
            let low = settled_limits.iter().copied().fold(f64::INFINITY, f64::min);
            let high = settled_limits.iter().copied().fold(0.0, f64::max);
            let ok: u64 = upstream.ok.get(settled..end)?.iter().sum();
            let errors: u64 = upstream.errors.get(settled..end)?.iter().sum();
            let seconds = ((end - settled) as u64 * SLOT_MS) as f64 / 1_000.0;
            let mut latencies: Vec<u64> = upstream
                .latency_us
                .get(settled..end)?
                .iter()
                .flatten()
                .copied()
                .collect();
            Some(Phase {
                from_ms,
                to_ms,
                capacity_rps,
                adapt_ms,
                limit_ratio: mean / capacity_rps,
                limit_low_ratio: low / capacity_rps,
                limit_high_ratio: high / capacity_rps,
                goodput_ratio: ok as f64 / seconds.max(f64::MIN_POSITIVE) / capacity_rps,
                p99_ms: quantile(&mut latencies, 0.99).unwrap_or(0.0) / 1_000.0,
                error_ratio: errors as f64 / (ok + errors).max(1) as f64,
            })
        })
        .collect();

    let per_second = (1_000 / SLOT_MS) as usize;
    let seconds: Vec<bool> = upstream
        .latency_us
        .chunks(per_second)
        .filter_map(|chunk| {
            let mut latencies: Vec<u64> = chunk.iter().flatten().copied().collect();
            quantile(&mut latencies, 0.99).map(|p99| p99 / 1_000.0 <= target)
        })
        .collect();
    let mean_capacity =
        upstream.capacity_rps.iter().sum::<f64>() / upstream.capacity_rps.len().max(1) as f64;
    let run_seconds = scenario.duration_ms as f64 / 1_000.0;
    Some(AdaptiveMetrics {
        target_p99_ms: target,
        min_rps: adaptive.min_rps,
        max_rps: adaptive.max_rps,
        limit_low_rps: limits.iter().copied().fold(f64::INFINITY, f64::min),
        limit_high_rps: limits.iter().copied().fold(0.0, f64::max),
        goodput_ratio: upstream.ok.iter().sum::<u64>() as f64
            / run_seconds.max(f64::MIN_POSITIVE)
            / mean_capacity.max(f64::MIN_POSITIVE),
        seconds_within_target: seconds.iter().filter(|within| **within).count() as f64
            / seconds.len().max(1) as f64,
        phases,
    })
}

fn slot_of(t_ms: u64) -> usize {
    usize::try_from(t_ms / SLOT_MS).unwrap_or(usize::MAX)
}

/// The `q` quantile of `values` (nearest rank); `None` if empty.
pub(super) fn quantile(values: &mut [u64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let rank = ((values.len() as f64 * q).ceil() as usize).clamp(1, values.len());
    let (_, value, _) = values.select_nth_unstable(rank - 1);
    Some(*value as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::Load;
    use crate::scenario;
    use crate::sim::{self, Variant};
    use sluice_control_plane::control::adaptive::spec::Signal;

    fn measured(scenario: &Scenario) -> (AdaptiveMetrics, Trace) {
        let trace = sim::run_variant(scenario, 1, Variant::IMPROVED).unwrap();
        (compute(scenario, &trace).unwrap(), trace)
    }

    /// The capacity starts at 1000 rps, halves at 30 s and comes back at
    /// 90 s; in every phase the limit finds it, settles within 10 % of it
    /// and swings no further than docs/adaptive.md says.
    #[test]
    fn the_limit_finds_the_capacity_and_follows_it() {
        // Seeds 1-3: AIMD found the capacity in 2.6-3.1 s going down (from
        // 1000 to 500, decreases by 0.8 three intervals apart) and
        // 10.1-11.6 s coming back up (+20 rps per interval); the gradient
        // 3.6 s and 27.1-32.1 s (it climbs by a smoothed square root of the
        // limit). Settled means 0.92-0.98 of the capacity, ranges within
        // 0.77-1.08.
        for (name, up_within_ms) in [("adaptive-aimd", 15_000), ("adaptive-gradient", 35_000)] {
            let (metrics, _) = measured(&scenario::by_name(name).unwrap());
            assert_eq!(metrics.phases.len(), 3, "{name}");
            for phase in &metrics.phases {
                let within_ms = if phase.from_ms == scenario::CAPACITY_RESTORED_MS {
                    up_within_ms
                } else {
                    8_000
                };
                let context = format!("{name}: {phase:?}");
                assert!(
                    phase.adapt_ms.is_some_and(|ms| ms <= within_ms),
                    "{context}"
                );
                assert!((0.9..=1.1).contains(&phase.limit_ratio), "{context}");
                assert!((0.9..=1.1).contains(&phase.goodput_ratio), "{context}");
                assert!(phase.limit_low_ratio >= 0.75, "{context}");
                assert!(phase.limit_high_ratio <= 1.15, "{context}");
                assert!(phase.error_ratio < 0.01, "{context}");
            }
            assert!(metrics.seconds_within_target >= 0.6, "{name}: {metrics:?}");
        }
    }

    /// An upstream far below the lower bound, then far above the upper:
    /// the limit sits on each bound and never leaves them.
    #[test]
    fn the_limit_never_leaves_its_bounds() {
        for name in ["adaptive-aimd", "adaptive-gradient"] {
            let mut scenario = scenario::by_name(name).unwrap().truncated(60_000);
            if let Some(upstream) = scenario.upstream.as_mut() {
                upstream.capacity = Load::Steps(vec![(0, 10.0), (40_000, 100_000.0)]);
            }
            // At 10 rps almost every response is a 503 answered at once, so
            // the latency alone looks healthy: the errors must count too
            // (the default signal, `both`).
            if let Some(spec) = scenario.buckets[0].adaptive.as_mut() {
                spec.signal = Signal::Both;
            }
            let (metrics, trace) = measured(&scenario);
            let limits = &trace.buckets[0].limit_rps;
            assert!(
                limits.iter().all(|l| (50.0..=2_000.0).contains(l)),
                "{name}: {:?}",
                (metrics.limit_low_rps, metrics.limit_high_rps)
            );
            // At 10 rps of capacity every interval is congested: from 2000
            // down to the floor (AIMD: 17 decreases 1.5 s apart), and held
            // there.
            assert_eq!(limits[399], 50.0, "{name}");
            // Healthy under 3000 rps of demand: climbing again.
            assert!(limits[599] > limits[450], "{name}");
        }
    }

    #[test]
    fn nearest_rank_quantiles() {
        let mut values: Vec<u64> = (1..=100).rev().collect();
        assert_eq!(quantile(&mut values, 0.99), Some(99.0));
        assert_eq!(quantile(&mut values, 1.0), Some(100.0));
        assert_eq!(quantile(&mut [7], 0.5), Some(7.0));
        assert_eq!(quantile(&mut [], 0.5), None);
    }
}
