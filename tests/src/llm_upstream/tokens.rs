//! Token counts drawn from a seeded log-normal distribution: most
//! responses short, a heavy tail of long ones, reproducible run to run.

use anyhow::{Result, ensure};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

/// The standard normal's 99th percentile: `p99 = median · e^(σ · Z99)`.
const Z99: f64 = 2.326_347_874;

/// A log-normal distribution of token counts, given by its median and its
/// 99th percentile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenDistribution {
    median: f64,
    sigma: f64,
}

impl TokenDistribution {
    /// Half of the draws below `median`, one in a hundred above `p99`
    /// (`p99 >= median >= 1`).
    pub fn new(median: f64, p99: f64) -> Result<Self> {
        ensure!(
            median.is_finite() && median >= 1.0,
            "median: {median} tokens is not a count of at least 1"
        );
        ensure!(
            p99.is_finite() && p99 >= median,
            "p99: {p99} tokens is below the median {median}"
        );
        Ok(Self {
            median,
            sigma: (p99 / median).ln() / Z99,
        })
    }

    /// Median 500, p99 8,000: the shape of the benchmarks.
    pub fn median_500_p99_8000() -> Self {
        Self {
            median: 500.0,
            sigma: 16.0_f64.ln() / Z99,
        }
    }

    /// The median.
    pub fn median(&self) -> f64 {
        self.median
    }

    /// The 99th percentile.
    pub fn p99(&self) -> f64 {
        self.median * (self.sigma * Z99).exp()
    }

    /// The mean, `median · e^(σ²/2)`: a load generator's tokens per
    /// request (draws are rounded and capped, which moves it by far less
    /// than a token at the shapes used here).
    pub fn mean(&self) -> f64 {
        self.median * (self.sigma * self.sigma / 2.0).exp()
    }
}

/// The most output tokens one answer has.
pub const MAX_TOKENS: u64 = 100_000_000;

/// Draws token counts from a [`TokenDistribution`] with a seeded
/// generator (and the uniform draws the upstream's abort and error rates
/// need, from the same sequence).
#[derive(Debug, Clone)]
pub struct TokenSampler {
    distribution: TokenDistribution,
    rng: SmallRng,
}

impl TokenSampler {
    /// The same `seed` gives the same sequence.
    pub fn new(distribution: TokenDistribution, seed: u64) -> Self {
        Self {
            distribution,
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    /// A count of at least 1.
    pub fn tokens(&mut self) -> u64 {
        // Box–Muller: a standard normal from two uniforms in (0, 1].
        let u1 = 1.0 - self.rng.random::<f64>();
        let u2 = self.rng.random::<f64>();
        let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let drawn = self.distribution.median * (self.distribution.sigma * normal).exp();
        // Saturating float-to-int: a huge draw is u64::MAX, then capped.
        (drawn.round() as u64).clamp(1, MAX_TOKENS)
    }

    /// True with probability `rate` (0 never, 1 always).
    pub fn chance(&mut self, rate: f64) -> bool {
        rate > 0.0 && self.rng.random::<f64>() < rate
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;

    #[test]
    fn the_mean_is_the_draws_mean() {
        let distribution = TokenDistribution::median_500_p99_8000();
        let mut sampler = TokenSampler::new(distribution, 3);
        let draws = 400_000;
        let sum: u64 = (0..draws).map(|_| sampler.tokens()).sum();
        let mean = sum as f64 / draws as f64;
        assert!(
            (mean / distribution.mean() - 1.0).abs() < 0.03,
            "{mean} vs {}",
            distribution.mean()
        );
    }

    #[test]
    fn the_drawn_median_and_p99_are_the_configured_ones() {
        let distribution = TokenDistribution::new(500.0, 8_000.0).unwrap();
        assert!((distribution.p99() - 8_000.0).abs() < 1e-6);
        assert_eq!(distribution, TokenDistribution::median_500_p99_8000());
        let mut sampler = TokenSampler::new(distribution, 7);
        let mut draws: Vec<u64> = (0..100_000).map(|_| sampler.tokens()).collect();
        draws.sort_unstable();
        let median = draws[draws.len() / 2] as f64;
        let p99 = draws[draws.len() * 99 / 100] as f64;
        assert!((median - 500.0).abs() / 500.0 < 0.03, "median {median}");
        assert!((p99 - 8_000.0).abs() / 8_000.0 < 0.08, "p99 {p99}");
        assert!(draws[0] >= 1);
    }

    #[test]
    fn a_seed_gives_the_same_sequence() {
        let distribution = TokenDistribution::new(100.0, 1_000.0).unwrap();
        let mut a = TokenSampler::new(distribution, 42);
        let mut b = TokenSampler::new(distribution, 42);
        let mut c = TokenSampler::new(distribution, 43);
        let seq = |s: &mut TokenSampler| (0..50).map(|_| s.tokens()).collect::<Vec<_>>();
        let first = seq(&mut a);
        assert_eq!(first, seq(&mut b));
        assert_ne!(first, seq(&mut c));
    }

    #[test]
    fn bad_shapes_are_refused_with_the_field() {
        let err = TokenDistribution::new(0.0, 10.0).unwrap_err().to_string();
        assert!(err.starts_with("median"), "{err}");
        let err = TokenDistribution::new(10.0, 5.0).unwrap_err().to_string();
        assert!(err.starts_with("p99"), "{err}");
        assert!(TokenDistribution::new(f64::NAN, 5.0).is_err());
        // A constant: median = p99.
        let mut sampler = TokenSampler::new(TokenDistribution::new(37.0, 37.0).unwrap(), 1);
        assert!((0..100).all(|_| sampler.tokens() == 37));
    }

    #[test]
    fn chance_follows_the_rate() {
        let mut sampler = TokenSampler::new(TokenDistribution::new(1.0, 1.0).unwrap(), 3);
        assert!(!(0..1_000).any(|_| sampler.chance(0.0)));
        assert!((0..1_000).all(|_| sampler.chance(1.0)));
        let hits = (0..10_000).filter(|_| sampler.chance(0.25)).count();
        assert!((2_300..2_700).contains(&hits), "{hits}");
    }
}
