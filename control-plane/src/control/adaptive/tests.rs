//! Tests of the adaptive limits: each algorithm's step, the bounds, and the
//! limits' state across intervals.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::HashMap;

use super::*;
use sluice_core::histogram::LatencyHistogram;

/// An upstream that serves `capacity` rps at 50 ms; past it the p99 climbs
/// steeply (a queue) and, past 1.3x, the excess fails.
struct ModelUpstream {
    capacity: f64,
}

impl ModelUpstream {
    /// One interval at `admitted` rps: the fleet's sampled signal.
    fn health(&self, admitted: f64) -> UpstreamHealth {
        let over = ((admitted - self.capacity) / self.capacity).max(0.0);
        let p99_ms = 50.0 * (1.0 + 40.0 * over);
        let error_ratio = if admitted > 1.3 * self.capacity {
            (admitted - 1.3 * self.capacity) / admitted
        } else {
            0.0
        };
        let responses = 200;
        let mut latency = LatencyHistogram::default();
        for _ in 0..responses {
            latency.record((p99_ms * 1e3) as u64);
        }
        UpstreamHealth {
            responses,
            errors: (error_ratio * responses as f64) as u64,
            latency,
        }
    }
}

fn specs(algorithm: &str) -> AdaptiveSpecs {
    serde_yaml_ng::from_str(&format!(
        "- {{bucket: api, target_p99_ms: 100, min_rps: 50, max_rps: 5000, algorithm: {algorithm}, increase_rps: 20, decrease_factor: 0.9}}"
    ))
    .unwrap()
}

/// Runs `intervals` intervals at 3x the capacity offered; the capacity is
/// `capacities[i].1` from interval `capacities[i].0` on. Returns the limit
/// after each.
fn run(algorithm: &str, capacities: &[(usize, f64)], intervals: usize) -> Vec<f64> {
    let specs = specs(algorithm);
    let mut limits = AdaptiveLimits::default();
    let mut upstream = ModelUpstream { capacity: 0.0 };
    let mut limit = 1_000.0;
    let mut trace = Vec::with_capacity(intervals);
    for interval in 0..intervals {
        if let Some((_, capacity)) = capacities.iter().find(|(at, _)| *at == interval) {
            upstream.capacity = *capacity;
        }
        let offered = 3.0 * upstream.capacity;
        let admitted = offered.min(limit);
        let health = HashMap::from([("api".to_owned(), upstream.health(admitted))]);
        limits.step(&specs, |_| Some(1_000.0), &health, |_| offered);
        limit = limits.status()[0].limit_rps;
        trace.push(limit);
    }
    trace
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

#[test]
fn both_algorithms_converge_near_capacity_and_follow_it_down_and_up() {
    for algorithm in ["aimd", "gradient"] {
        // 400 rps capacity, halved at interval 300, back at 600.
        let trace = run(algorithm, &[(0, 400.0), (300, 200.0), (600, 400.0)], 900);
        let settled = mean(&trace[200..300]);
        assert!(
            (settled - 400.0).abs() <= 40.0,
            "{algorithm}: settled at {settled:.1} for 400"
        );
        // Within 20 intervals of the halving the limit is near the new
        // capacity.
        let after = mean(&trace[320..400]);
        assert!(
            (after - 200.0).abs() <= 20.0,
            "{algorithm}: {after:.1} after the halving to 200"
        );
        let time_to_adapt = trace[300..]
            .iter()
            .position(|&limit| limit <= 220.0)
            .unwrap();
        // AIMD needs 0.8^3 from 400 to 220, each decrease three intervals
        // after the last.
        assert!(
            time_to_adapt <= 25,
            "{algorithm}: {time_to_adapt} intervals"
        );
        // Oscillation bound (docs/adaptive.md): AIMD swings between the
        // congestion point and 0.9 of it (plus one step), the gradient
        // limiter within a tenth of it.
        let (low, high) = trace[200..300]
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &l| (lo.min(l), hi.max(l)));
        let bound = if algorithm == "aimd" {
            0.1 * high + 20.0
        } else {
            0.1 * high
        };
        assert!(
            high - low <= bound,
            "{algorithm}: swing {low:.1}..{high:.1}"
        );
        let recovered = mean(&trace[800..900]);
        assert!(
            (recovered - 400.0).abs() <= 40.0,
            "{algorithm}: {recovered:.1} after the recovery to 400"
        );
        println!(
            "{algorithm}: settled {settled:.1} (swing {low:.1}..{high:.1}) for 400; {after:.1} for 200, \
             reached within {time_to_adapt} intervals; {recovered:.1} after the recovery to 400"
        );
    }
}

#[test]
fn recovery_is_bounded_by_max_and_no_signal_holds() {
    let specs = specs("aimd");
    let mut limits = AdaptiveLimits::default();
    let healthy = ModelUpstream { capacity: 1e9 };
    for _ in 0..1_000 {
        let health = HashMap::from([("api".to_owned(), healthy.health(100.0))]);
        limits.step(&specs, |_| Some(1_000.0), &health, |_| 1e9);
    }
    assert_eq!(
        limits.status()[0].limit_rps,
        5_000.0,
        "climbs to max, not past it"
    );
    // Nothing reported: the limit holds, whatever it was.
    limits.step(&specs, |_| None, &HashMap::new(), |_| 1e9);
    let status = &limits.status()[0];
    assert_eq!(status.limit_rps, 5_000.0);
    assert!(status.reason.starts_with("no signal"), "{status:?}");
    // Too few samples say nothing either.
    let few = HashMap::from([(
        "api".to_owned(),
        UpstreamHealth {
            responses: MIN_SAMPLES - 1,
            errors: MIN_SAMPLES - 1,
            latency: LatencyHistogram::default(),
        },
    )]);
    limits.step(&specs, |_| None, &few, |_| 1e9);
    assert_eq!(limits.status()[0].limit_rps, 5_000.0);
    // But they are kept: with the next interval's they are enough, and all
    // errors say congested.
    limits.step(&specs, |_| None, &few, |_| 1e9);
    assert!(limits.status()[0].limit_rps < 5_000.0);
}

#[test]
fn sparse_samples_are_pooled_until_they_say_something_and_not_forever() {
    let specs = specs("aimd");
    let mut limits = AdaptiveLimits::default();
    let slow = |responses| {
        let mut latency = LatencyHistogram::default();
        for _ in 0..responses {
            latency.record(1_000_000);
        }
        HashMap::from([(
            "api".to_owned(),
            UpstreamHealth {
                responses,
                errors: 0,
                latency,
            },
        )])
    };
    // Three slow responses an interval: judged every fourth interval.
    let mut lowered_at = Vec::new();
    for interval in 0..12 {
        let before = limits.status().first().map_or(1_000.0, |s| s.limit_rps);
        limits.step(&specs, |_| Some(1_000.0), &slow(3), |_| 1e9);
        if limits.status()[0].limit_rps < before {
            lowered_at.push(interval);
        }
    }
    assert_eq!(lowered_at, [3, 7, 11]);
    // Nine samples, then silence past the pooling bound: dropped, so a
    // tenth much later does not complete them.
    let mut limits = AdaptiveLimits::default();
    limits.step(&specs, |_| Some(1_000.0), &slow(9), |_| 1e9);
    for _ in 0..MAX_POOLED_INTERVALS {
        limits.step(&specs, |_| Some(1_000.0), &HashMap::new(), |_| 1e9);
    }
    limits.step(&specs, |_| Some(1_000.0), &slow(1), |_| 1e9);
    assert_eq!(limits.status()[0].limit_rps, 1_000.0);
}

#[test]
fn the_adaptive_limit_replaces_the_configured_one_and_leaves_with_its_spec() {
    let specs = specs("aimd");
    let mut limits = AdaptiveLimits::default();
    let overloaded = ModelUpstream { capacity: 100.0 };
    let health = HashMap::from([("api".to_owned(), overloaded.health(1_000.0))]);
    limits.step(&specs, |_| Some(1_000.0), &health, |_| 3_000.0);
    let status = &limits.status()[0];
    assert_eq!(status.limit_rps, 900.0, "started at 1000, lowered by 0.9");
    assert!(status.reason.contains("> target 100 ms"), "{status:?}");
    let mut table = LimitTable::new(None);
    limits.apply(&mut table);
    assert_eq!(table.limit_for("api").map(|l| l.get()), Some(900.0));
    // The spec removed: the bucket is no longer adaptive.
    limits.step(
        &AdaptiveSpecs::default(),
        |_| None,
        &HashMap::new(),
        |_| 0.0,
    );
    assert!(limits.is_empty());
}

#[test]
fn errors_alone_say_congested() {
    let specs: AdaptiveSpecs = serde_yaml_ng::from_str(
        "- {bucket: api, signal: errors, max_error_ratio: 0.1, min_rps: 10, max_rps: 100}",
    )
    .unwrap();
    let spec = specs.iter().next().unwrap();
    let health = UpstreamHealth {
        responses: 100,
        errors: 30,
        latency: LatencyHistogram::default(),
    };
    let (verdict, _, ratio) = judge(spec, Some(&health));
    assert_eq!(ratio, Some(0.3));
    assert!(
        matches!(verdict, UpstreamReading::Congested { .. }),
        "{verdict:?}"
    );
    let fine = UpstreamHealth {
        errors: 5,
        ..health
    };
    assert_eq!(judge(spec, Some(&fine)).0, UpstreamReading::Healthy);
}

#[test]
fn a_p99_close_to_the_target_holds_the_limit() {
    let specs = specs("aimd");
    let spec = specs.iter().next().unwrap();
    let at = |latency_ms: u64| {
        let mut latency = LatencyHistogram::default();
        for _ in 0..100 {
            latency.record(latency_ms * 1_000);
        }
        UpstreamHealth {
            responses: 100,
            errors: 0,
            latency,
        }
    };
    // The target is 100 ms: 50 ms is healthy, 85 ms is near it (the
    // upstream is at its capacity), 150 ms is over it.
    assert_eq!(judge(spec, Some(&at(50))).0, UpstreamReading::Healthy);
    assert_eq!(judge(spec, Some(&at(85))).0, UpstreamReading::NearTarget);
    assert!(matches!(
        judge(spec, Some(&at(150))).0,
        UpstreamReading::Congested { .. }
    ));
    let mut limits = AdaptiveLimits::default();
    let near = HashMap::from([("api".to_owned(), at(85))]);
    limits.step(&specs, |_| Some(1_000.0), &near, |_| 1e9);
    let status = &limits.status()[0];
    assert_eq!(status.limit_rps, 1_000.0);
    assert!(status.reason.contains("near target"), "{status:?}");
}
