//! What one Envoy may admit of a cell, as a `rate_limit_quota` assignment:
//! the allowance the wasm filter would derive ([`sluice_core::allowance`])
//! turned into a token bucket Envoy 1.40 enforces exactly.
//!
//! Envoy 1.40 turns a token bucket into a continuous fill rate of
//! `tokens_per_fill / fill_interval` with the interval truncated to whole
//! seconds, so the interval here is always whole seconds and the rate is
//! expressed as the integer `tokens_per_fill` over the shortest interval
//! (1–60 s) that hits the rate within 0.5 %. Its check for "the same token
//! bucket as before" compares only the interval's nanoseconds, so the
//! interval carries its own length in nanoseconds too (N s + N ns):
//! otherwise a new rate with the same `tokens_per_fill` and `max_tokens`
//! but another interval would be ignored.

use sluice_core::gcra::{MAX_BURST_FLOOR_MS, MIN_BURST_REQUESTS};

/// Longest fill interval, in seconds.
const MAX_INTERVAL_S: u32 = 60;
/// Relative error at which a shorter interval is good enough.
const GOOD_ENOUGH: f64 = 0.005;

/// An assignment for one bucket id on one Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Assignment {
    /// Admit everything: unlimited, not enforced on this Envoy (shadow,
    /// canary, kill switch).
    AllowAll,
    /// Admit nothing: the cell's allowance is 0.
    DenyAll,
    /// Admit at a rate, with a burst.
    TokenBucket {
        /// Tokens the bucket holds at most (and starts with).
        max_tokens: u32,
        /// Tokens added per interval.
        tokens_per_fill: u32,
        /// The interval in whole seconds.
        fill_interval_s: u32,
    },
}

impl Assignment {
    /// The assignment for an allowance of `rate_rps` (`None`: not limited)
    /// with a burst of `burst_ms` of the rate.
    pub(crate) fn for_rate(rate_rps: Option<f64>, burst_ms: u64) -> Self {
        let Some(rate) = rate_rps else {
            return Self::AllowAll;
        };
        if !rate.is_finite() || rate <= 0.0 {
            // Not a number or nothing left: a NaN must not open the gate.
            return if rate.is_nan() || rate <= 0.0 {
                Self::DenyAll
            } else {
                Self::AllowAll
            };
        }
        let (tokens_per_fill, fill_interval_s) = fill_for(rate);
        if tokens_per_fill == 0 {
            return Self::DenyAll;
        }
        // The same burst rule as the wasm filter's allowance: `burst_ms` of
        // the rate, at least a few requests (up to 600 ms of the rate) so
        // that Poisson arrivals at a few requests per second are not cut.
        let floor = (MIN_BURST_REQUESTS as f64).min(rate * MAX_BURST_FLOOR_MS as f64 / 1000.0);
        let burst = (rate * burst_ms as f64 / 1000.0).max(floor).max(1.0).ceil();
        Self::TokenBucket {
            max_tokens: to_u32(burst),
            tokens_per_fill,
            fill_interval_s,
        }
    }

    /// Whether `other` is not worth sending after `self`: the same kind,
    /// and a token bucket whose rate moved by at most 1 %. Envoy replaces
    /// its token bucket on every new assignment, and the control loop's
    /// ratio moves a little every interval.
    pub(crate) fn close_to(&self, other: &Self) -> bool {
        match (self.rate_rps(), other.rate_rps()) {
            (None, None) => true,
            (Some(a), Some(b)) if a == 0.0 || b == 0.0 => a == b,
            (Some(a), Some(b)) => (a - b).abs() <= 0.01 * a.max(b),
            _ => false,
        }
    }

    /// The rate the assignment admits, in requests per second (`None`:
    /// unlimited).
    pub(super) fn rate_rps(&self) -> Option<f64> {
        match *self {
            Self::AllowAll => None,
            Self::DenyAll => Some(0.0),
            Self::TokenBucket {
                tokens_per_fill,
                fill_interval_s,
                ..
            } => Some(f64::from(tokens_per_fill) / f64::from(fill_interval_s.max(1))),
        }
    }
}

/// `(tokens_per_fill, interval_s)` closest to `rate`: the first interval
/// within [`GOOD_ENOUGH`], else the best of all.
fn fill_for(rate: f64) -> (u32, u32) {
    let mut best = (0, 1, f64::INFINITY);
    for interval in 1..=MAX_INTERVAL_S {
        let tokens = to_u32((rate * f64::from(interval)).round());
        if tokens == 0 {
            continue;
        }
        let error = (f64::from(tokens) / f64::from(interval) - rate).abs() / rate;
        if error < best.2 {
            best = (tokens, interval, error);
        }
        if error <= GOOD_ENOUGH {
            break;
        }
    }
    (best.0, best.1)
}

fn to_u32(value: f64) -> u32 {
    // `as` saturates; the caller passes finite non-negative values.
    value as u32
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn unlimited_zero_and_nan() {
        assert_eq!(Assignment::for_rate(None, 20), Assignment::AllowAll);
        assert_eq!(Assignment::for_rate(Some(0.0), 20), Assignment::DenyAll);
        assert_eq!(
            Assignment::for_rate(Some(f64::NAN), 20),
            Assignment::DenyAll
        );
        assert_eq!(Assignment::for_rate(Some(0.001), 20), Assignment::DenyAll);
    }

    #[test]
    fn small_moves_are_not_worth_sending() {
        let a = Assignment::for_rate(Some(100.0), 20);
        assert!(a.close_to(&Assignment::for_rate(Some(100.5), 20)));
        assert!(!a.close_to(&Assignment::for_rate(Some(102.0), 20)));
        assert!(!a.close_to(&Assignment::AllowAll));
        assert!(!a.close_to(&Assignment::DenyAll));
        assert!(Assignment::DenyAll.close_to(&Assignment::DenyAll));
    }

    #[test]
    fn whole_rates_fill_every_second() {
        assert_eq!(
            Assignment::for_rate(Some(150.0), 20),
            Assignment::TokenBucket {
                max_tokens: 6,
                tokens_per_fill: 150,
                fill_interval_s: 1
            }
        );
    }

    #[test]
    fn low_and_fractional_rates_use_longer_intervals() {
        let a = Assignment::for_rate(Some(0.5), 20);
        assert_eq!(a.rate_rps(), Some(0.5));
        let a = Assignment::for_rate(Some(15.3), 20);
        assert!(
            (a.rate_rps().unwrap() - 15.3).abs() / 15.3 <= GOOD_ENOUGH,
            "{a:?}"
        );
    }

    proptest! {
        /// Between 0.05 and 10^6 rps the assignment's rate is within 1 % of
        /// the allowance (1/60 rps granularity for the slowest).
        #[test]
        fn the_rate_is_kept(rate in 0.05_f64..1e6) {
            let a = Assignment::for_rate(Some(rate), 20);
            let got = a.rate_rps().unwrap();
            prop_assert!((got - rate).abs() <= rate * 0.01 + 1.0 / 60.0, "{rate} -> {a:?}");
            if let Assignment::TokenBucket { max_tokens, .. } = a {
                prop_assert!(max_tokens >= 1);
            }
        }
    }
}
