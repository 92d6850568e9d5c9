//! How one adaptive limit moves in one control interval, given what the
//! upstream's signal said: pure functions, hard bounds always.

use super::spec::{AdaptiveSpec, Algorithm};

/// What one interval's signal says about the upstream.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum UpstreamReading {
    /// Too few samples to say anything: the limit holds still.
    NoSignal,
    /// Within target.
    Healthy,
    /// Within target but close to it: the upstream is at its capacity, so
    /// the limit holds (raising it would only build the upstream's queue).
    NearTarget,
    /// Over target; `pressure` is how far (the target over the observed
    /// value, in (0, 1): lower is worse).
    Congested {
        /// Why, for the operator.
        reason: String,
        /// Target over observed, in (0, 1).
        pressure: f64,
    },
}

/// The next limit after `limit` under `verdict`; `in_use` says whether the
/// bucket's traffic reaches the limit (a limit nobody uses is not raised:
/// a healthy signal at low load says nothing about higher load).
pub(crate) fn next_limit(
    spec: &AdaptiveSpec,
    limit: f64,
    verdict: &UpstreamReading,
    in_use: bool,
) -> f64 {
    let next = match (spec.algorithm, verdict) {
        (_, UpstreamReading::NoSignal | UpstreamReading::NearTarget) => limit,
        (_, UpstreamReading::Healthy) if !in_use => limit,
        (Algorithm::Aimd, UpstreamReading::Healthy) => limit + spec.increase_rps,
        (Algorithm::Aimd, UpstreamReading::Congested { .. }) => limit * spec.decrease_factor,
        (Algorithm::Gradient, UpstreamReading::Healthy) => {
            // Room for a queue's worth more, as the gradient limiter
            // probes: grows fast when small, slowly when large.
            let estimate = limit + limit.max(1.0).sqrt();
            limit + (estimate - limit) * spec.smoothing
        }
        (Algorithm::Gradient, UpstreamReading::Congested { pressure, .. }) => {
            // Scale by how far over target, at most halving per interval.
            let estimate = limit * pressure.clamp(0.5, 1.0);
            limit + (estimate - limit) * spec.smoothing
        }
    };
    spec.bound(next)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;

    use super::*;
    use crate::control::adaptive::spec::{AdaptiveSpecs, Signal};

    pub(crate) fn spec(algorithm: Algorithm) -> AdaptiveSpec {
        let specs: AdaptiveSpecs = serde_yaml_ng::from_str(
            "- {bucket: api, target_p99_ms: 100, min_rps: 20, max_rps: 2000, increase_rps: 20}",
        )
        .unwrap();
        let mut spec = specs.iter().next().unwrap().clone();
        spec.algorithm = algorithm;
        spec.signal = Signal::Both;
        spec
    }

    fn congested(pressure: f64) -> UpstreamReading {
        UpstreamReading::Congested {
            reason: String::new(),
            pressure,
        }
    }

    #[test]
    fn no_signal_and_unused_limits_hold_still() {
        for algorithm in [Algorithm::Aimd, Algorithm::Gradient] {
            let spec = spec(algorithm);
            assert_eq!(
                next_limit(&spec, 500.0, &UpstreamReading::NoSignal, true),
                500.0
            );
            assert_eq!(
                next_limit(&spec, 500.0, &UpstreamReading::NearTarget, true),
                500.0
            );
            assert_eq!(
                next_limit(&spec, 500.0, &UpstreamReading::Healthy, false),
                500.0
            );
            assert!(next_limit(&spec, 500.0, &UpstreamReading::Healthy, true) > 500.0);
            assert!(next_limit(&spec, 500.0, &congested(0.5), true) < 500.0);
        }
    }

    proptest! {
        /// Whatever the signals, never outside [min, max], never NaN.
        #[test]
        fn the_limit_never_leaves_its_bounds(
            gradient in any::<bool>(),
            start in -1e12f64..1e12,
            steps in prop::collection::vec((0u8..4, -1.0f64..2.0, any::<bool>()), 1..200),
        ) {
            let spec = spec(if gradient { Algorithm::Gradient } else { Algorithm::Aimd });
            let mut limit = spec.bound(start);
            for (kind, pressure, in_use) in steps {
                let verdict = match kind {
                    0 => UpstreamReading::NoSignal,
                    1 => UpstreamReading::Healthy,
                    2 => UpstreamReading::NearTarget,
                    _ => congested(pressure),
                };
                limit = next_limit(&spec, limit, &verdict, in_use);
                prop_assert!(limit.is_finite());
                prop_assert!((spec.min_rps..=spec.max_rps).contains(&limit), "{limit}");
            }
        }

        /// A constant healthy signal under demand climbs to max and stays.
        #[test]
        fn healthy_and_in_use_climbs_to_max(gradient in any::<bool>(), start in 20f64..2000.0) {
            let spec = spec(if gradient { Algorithm::Gradient } else { Algorithm::Aimd });
            let mut limit = start;
            for _ in 0..20_000 {
                limit = next_limit(&spec, limit, &UpstreamReading::Healthy, true);
            }
            prop_assert!((limit - spec.max_rps).abs() < 1e-6, "{limit}");
        }
    }
}
