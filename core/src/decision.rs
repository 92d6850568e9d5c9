//! The coin flip against a drop threshold, and the regimes a data plane
//! decides in.
//!
//! [`decide`] is the coin flip; [`crate::credit::Credit`] is its
//! deterministic alternative; [`crate::allowance`] caps either with a local
//! rate; [`crate::gcra::Gcra::per_second`] is the local limit applied when
//! directives are stale (the same limiter the allowance uses).
//! [`crate::cell_decision::decide`] combines them per cell for every data
//! plane; modes (shadow or enforce) are applied by the caller, so shadow
//! runs exactly the same decision.

use crate::DropThreshold;
use rand::Rng;

/// What a VM does with the directives it holds once they are older than
/// their TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Keep applying the last directives.
    KeepLast,
    /// Enforce each cell's limit locally: its stated limit over the
    /// reporting proxies, split evenly between the VMs serving requests.
    LocalLimit,
    /// Let everything through.
    Allow,
}

/// Whether the directives are current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Regime {
    /// Within the TTL.
    Fresh,
    /// Past the TTL: the configured fallback applies.
    Stale(Fallback),
}

/// What to do with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Let the request through.
    Admit,
    /// Answer it locally with 429.
    Drop,
}

/// Flips the coin: [`Verdict::Drop`] with the probability `threshold` stands
/// for. Costs one PRNG step, and none when the bucket never drops.
#[inline]
pub fn decide(threshold: DropThreshold, rng: &mut impl Rng) -> Verdict {
    if threshold.is_never() {
        return Verdict::Admit;
    }
    if threshold.drops(rng.next_u64()) {
        Verdict::Drop
    } else {
        Verdict::Admit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DropRatio;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn drop_fraction(ratio: f64, draws: u32, seed: u64) -> f64 {
        let threshold = DropRatio::new(ratio).unwrap().threshold();
        let mut rng = SmallRng::seed_from_u64(seed);
        let drops = (0..draws)
            .filter(|_| decide(threshold, &mut rng) == Verdict::Drop)
            .count();
        drops as f64 / f64::from(draws)
    }

    #[test]
    fn zero_never_drops_and_one_always_drops() {
        assert_eq!(drop_fraction(0.0, 10_000, 1), 0.0);
        assert_eq!(drop_fraction(1.0, 10_000, 2), 1.0);
    }

    #[test]
    fn frequency_follows_the_ratio() {
        for ratio in [0.01, 0.25, 0.5, 0.9] {
            let observed = drop_fraction(ratio, 100_000, 7);
            // 100k draws: the standard deviation is at most 0.0016.
            assert!((observed - ratio).abs() < 0.01, "{ratio}: {observed}");
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod proptests {
    use super::*;
    use crate::DropRatio;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn frequency_is_close_to_the_ratio(ratio in 0.0f64..=1.0, seed in any::<u64>()) {
            let threshold = DropRatio::new(ratio).map_err(|e| TestCaseError::fail(e.to_string()))?.threshold();
            let mut rng = SmallRng::seed_from_u64(seed);
            let draws = 20_000u32;
            let drops = (0..draws).filter(|_| decide(threshold, &mut rng) == Verdict::Drop).count();
            let observed = drops as f64 / f64::from(draws);
            // Six standard deviations of a binomial proportion (at most 0.0035 here).
            prop_assert!((observed - ratio).abs() < 0.022, "ratio {} observed {}", ratio, observed);
        }
    }
}
