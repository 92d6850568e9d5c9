//! The coin flip against a drop threshold: the seed's per-request
//! decision, and the one-decision's coin mode. The credit (`credit.rs`) is
//! its deterministic alternative; the decision (`decision.rs`) combines
//! them, the allowance's cap and the local limits per cell.

use crate::DropThreshold;
use rand::Rng;

/// Flips the coin: whether a request drops, with the probability
/// `threshold` stands for. Costs one PRNG step, and none when the bucket
/// never drops.
#[inline]
pub fn flip(threshold: DropThreshold, rng: &mut impl Rng) -> bool {
    !threshold.is_never() && threshold.drops(rng.next_u64())
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
        let drops = (0..draws).filter(|_| flip(threshold, &mut rng)).count();
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
            let drops = (0..draws).filter(|_| flip(threshold, &mut rng)).count();
            let observed = drops as f64 / f64::from(draws);
            // Six standard deviations of a binomial proportion (at most 0.0035 here).
            prop_assert!((observed - ratio).abs() < 0.022, "ratio {} observed {}", ratio, observed);
        }
    }
}
