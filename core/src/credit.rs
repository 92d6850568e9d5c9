//! The deterministic alternative to the coin flip: error diffusion.
//!
//! Each request of a bucket adds the bucket's admit share `1 − drop_ratio`
//! to a credit balance; the request is admitted when the balance reaches
//! one whole request, which is then spent. Over any run of `n` requests the
//! number admitted is within one of `n × (1 − drop_ratio)`, where
//! independent coin flips stray by about `√n`: at a few hundred requests a
//! second per proxy that noise is most of the steady-state error.
//!
//! Integer arithmetic only (fractions of 2⁻³² of a request in an `i128`),
//! so the result is the same natively and on wasm32 and nothing can wrap.
//!
//! ## Weighted requests
//!
//! [`Credit::drops_weighted`] keeps the balance in a weight per request,
//! such as a cost. The request path does not use it for a cost budget's
//! requests: those take the coin, since the control plane's balance
//! already repays the costs' noise and a credit would repay it twice
//! ([`crate::decision`]). With a weight `w` per request the rule
//! is the same error diffusion with the balance kept in cost: a request is
//! admitted when the balance plus the admit share reaches one, exactly as
//! for a request, and then the balance moves by `w × share − w` (admitted)
//! or `w × share` (dropped) instead of by `share − 1` or `share`.
//!
//! - The decision reads the balance and the share, never the request's
//!   own weight: a request of 8,000 tokens is admitted exactly when one of
//!   10 tokens in its place would have been. With costs independent of
//!   arrival order, every size class is admitted at the same rate, so
//!   large requests are neither starved nor favoured. (Admitting when the
//!   balance covers the whole request starves large ones: many small
//!   requests keep the balance below any large one. Admitting by rounding
//!   to the nearest balance starves them too, for the same reason.)
//! - The admitted cost tracks `(1 − drop_ratio) ×` offered cost with an
//!   error bounded by one request of the largest weight `W` seen: the
//!   balance stays within `[1 − W, 1 + W × share)` requests' worth (an
//!   admitted request only lowers it, and only from at least `1 − share`;
//!   a dropped one only raises it, and only from below `1 − share`).
//! - Weight 1 is the request rule above, step for step: a request-limit
//!   directive decides as it always did. Weight 0 moves nothing (a free
//!   request is admitted or dropped as the balance stands); any weight up
//!   to `u64::MAX` fits the `i128` balance.

use crate::DropThreshold;

/// One whole request in the balance's fixed-point unit.
const ONE: u64 = 1 << 32;

/// The admit share of a threshold in units of 2⁻³²: `(2⁶³ − threshold) / 2³¹`.
#[inline]
fn admit_share(threshold: DropThreshold) -> u64 {
    (DropThreshold::ALWAYS_RAW - threshold.raw().min(DropThreshold::ALWAYS_RAW)) >> 31
}

/// The credit balance of one bucket on one VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Credit {
    /// In `[0, ONE)` between decisions of weight 1; within one request of
    /// the largest weight of that range under a cost budget.
    balance: i128,
}

impl Credit {
    /// A balance starting at `phase` (taken modulo one request). VMs should
    /// start at different phases (from their PRNG), so that at low rates
    /// they do not all admit the same requests of a burst.
    pub fn new(phase: u64) -> Self {
        Self {
            balance: i128::from(phase % ONE),
        }
    }

    /// Decides one request of a bucket whose directive is `threshold`:
    /// whether it drops (the balance has not reached one whole request).
    #[inline]
    pub fn drops(&mut self, threshold: DropThreshold) -> bool {
        self.drops_weighted(threshold, 1)
    }

    /// Decides one request of weight `weight` (its estimated cost under a
    /// cost budget): whether it drops. The decision does not depend on the
    /// weight, only what the balance is charged (the module's docs).
    #[inline]
    pub fn drops_weighted(&mut self, threshold: DropThreshold, weight: u64) -> bool {
        let share = i128::from(admit_share(threshold));
        let one = i128::from(ONE);
        let weight = i128::from(weight);
        // |balance| stays within (weight + 1) x 2^32 < 2^97, and weight x
        // 2^32 < 2^96: no sum or product here comes near i128's range.
        let admits = self.balance + share >= one;
        let charged = if admits { one - share } else { -share };
        self.balance -= weight * charged;
        !admits
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DropRatio;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn admitted(ratio: f64, requests: u32, phase: u64) -> u32 {
        let threshold = DropRatio::new(ratio).unwrap().threshold();
        let mut credit = Credit::new(phase);
        let mut admitted = 0;
        for _ in 0..requests {
            if !credit.drops(threshold) {
                admitted += 1;
            }
        }
        admitted
    }

    #[test]
    fn never_and_always_are_exact() {
        assert_eq!(admitted(0.0, 1_000, 0), 1_000);
        assert_eq!(admitted(1.0, 1_000, 12_345), 0);
    }

    #[test]
    fn admits_the_share_to_within_one_request() {
        for (ratio, phase) in [(0.5, 0), (2.0 / 3.0, 7), (0.1, ONE - 1), (0.999, 3)] {
            for requests in [1, 2, 3, 10, 999, 10_000] {
                let expected = f64::from(requests) * (1.0 - ratio);
                let got = f64::from(admitted(ratio, requests, phase));
                assert!(
                    (got - expected).abs() <= 1.0 + 1e-6,
                    "{ratio} {requests}: {got}"
                );
            }
        }
    }

    /// Costs drawn log-normal with a median of 500 and a p99 of 8,000
    /// (sigma = ln 16 / 2.326), the LLM token counts.
    pub(super) fn heavy_tailed_costs(seed: u64, n: usize) -> Vec<u64> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut uniform = move || ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let sigma = 16f64.ln() / 2.326;
        (0..n)
            .map(|_| {
                // Box-Muller: one standard normal per pair of uniforms.
                let normal =
                    (-2.0 * uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * uniform()).cos();
                (500.0 * (sigma * normal).exp()).round().max(1.0) as u64
            })
            .collect()
    }

    #[test]
    fn admitted_cost_tracks_the_share_within_the_largest_request() {
        for (ratio, seed) in [(0.5, 1u64), (2.0 / 3.0, 2), (0.1, 3), (0.95, 4)] {
            let threshold = DropRatio::new(ratio).unwrap().threshold();
            let mut credit = Credit::new(seed.wrapping_mul(0x9e37_79b9));
            let (mut offered, mut admitted, mut largest) = (0u64, 0u64, 0u64);
            for cost in heavy_tailed_costs(seed, 100_000) {
                offered += cost;
                largest = largest.max(cost);
                if !credit.drops_weighted(threshold, cost) {
                    admitted += cost;
                }
                let expected = offered as f64 * (1.0 - ratio);
                let error = admitted as f64 - expected;
                assert!(
                    error.abs() <= largest as f64 + 1.0,
                    "{ratio}: admitted {admitted} of {offered}, error {error}, largest {largest}"
                );
            }
        }
    }

    #[test]
    fn no_size_class_is_starved_or_favoured() {
        // Admitted share of each size class's offered cost, at a ratio of
        // 0.7 (an admit share of 0.3), over 400,000 heavy-tailed requests.
        let classes: [(u64, u64); 5] = [
            (0, 200),
            (200, 1_000),
            (1_000, 3_000),
            (3_000, 8_000),
            (8_000, u64::MAX),
        ];
        let threshold = DropRatio::new(0.7).unwrap().threshold();
        let mut credit = Credit::new(12_345);
        let mut offered = [0u64; 5];
        let mut admitted = [0u64; 5];
        for cost in heavy_tailed_costs(9, 400_000) {
            let class = classes
                .iter()
                .position(|(low, high)| (*low..*high).contains(&cost))
                .unwrap();
            offered[class] += cost;
            if !credit.drops_weighted(threshold, cost) {
                admitted[class] += cost;
            }
        }
        for (class, (offered, admitted)) in offered.iter().zip(admitted).enumerate() {
            let share = admitted as f64 / *offered as f64;
            // The top class holds about 4,000 requests: its share's
            // standard deviation is under 0.01.
            assert!((share - 0.3).abs() < 0.03, "class {class}: {share}");
        }
    }

    #[test]
    fn any_weight_is_safe() {
        let threshold = DropRatio::new(0.5).unwrap().threshold();
        let mut credit = Credit::new(ONE - 1);
        for weight in [0, 1, u64::MAX, u64::MAX, 0, 7, u64::MAX, 1] {
            credit.drops_weighted(threshold, weight);
        }
        // Weight 0 moves nothing: the same answer until a weighed request.
        let before = credit;
        let first = credit.drops_weighted(threshold, 0);
        assert_eq!(credit, before);
        assert_eq!(credit.drops_weighted(threshold, 0), first);
        // Never and always stay exact whatever the weights.
        let mut never = Credit::new(3);
        let mut always = Credit::new(3);
        let never_threshold = DropRatio::new(0.0).unwrap().threshold();
        let always_threshold = DropRatio::new(1.0).unwrap().threshold();
        for weight in [u64::MAX, 1, 0, 1 << 40, u64::MAX] {
            assert!(!never.drops_weighted(never_threshold, weight));
            assert!(always.drops_weighted(always_threshold, weight));
        }
    }

    #[test]
    fn alternates_at_one_half() {
        let threshold = DropRatio::new(0.5).unwrap().threshold();
        let mut credit = Credit::new(0);
        let drops: Vec<bool> = (0..4).map(|_| credit.drops(threshold)).collect();
        assert_eq!(drops, [true, false, true, false]);
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod proptests {
    use super::*;
    use crate::DropRatio;
    use proptest::prelude::*;

    /// The balance as it was before weights, kept to check that weight 1
    /// decides step for step as it did.
    struct RequestCredit {
        balance: u64,
    }

    impl RequestCredit {
        fn drops(&mut self, threshold: crate::DropThreshold) -> bool {
            let balance = self.balance.saturating_add(admit_share(threshold));
            if balance >= ONE {
                self.balance = balance - ONE;
                false
            } else {
                self.balance = balance;
                true
            }
        }
    }

    proptest! {
        #[test]
        fn weight_one_decides_as_requests_did(
            ratios in proptest::collection::vec(0.0f64..=1.0, 1..400),
            phase in any::<u64>(),
        ) {
            let mut weighted = Credit::new(phase);
            let mut requests = RequestCredit { balance: phase % ONE };
            for ratio in ratios {
                let threshold = DropRatio::new(ratio).map_err(|e| TestCaseError::fail(e.to_string()))?.threshold();
                prop_assert_eq!(weighted.drops_weighted(threshold, 1), requests.drops(threshold));
                prop_assert_eq!(weighted.balance, i128::from(requests.balance));
            }
        }

        #[test]
        fn admitted_cost_is_within_the_largest_weight(
            ratio in 0.0f64..=1.0,
            phase in any::<u64>(),
            weights in proptest::collection::vec(0u64..1_000_000, 1..2_000),
        ) {
            let threshold = DropRatio::new(ratio).map_err(|e| TestCaseError::fail(e.to_string()))?.threshold();
            let share = admit_share(threshold) as f64 / ONE as f64;
            let mut credit = Credit::new(phase);
            let (mut offered, mut admitted, mut largest) = (0f64, 0f64, 0f64);
            for weight in weights {
                offered += weight as f64;
                largest = largest.max(weight as f64);
                if !credit.drops_weighted(threshold, weight) {
                    admitted += weight as f64;
                }
                let error = admitted - offered * share;
                prop_assert!(error.abs() <= largest + 1.0, "{} vs {} (largest {})", admitted, offered * share, largest);
            }
        }

        #[test]
        fn any_prefix_is_within_one_request(ratio in 0.0f64..=1.0, phase in any::<u64>(), n in 1u32..5_000) {
            let threshold = DropRatio::new(ratio).map_err(|e| TestCaseError::fail(e.to_string()))?.threshold();
            let mut credit = Credit::new(phase);
            let mut admitted = 0u32;
            for i in 1..=n {
                if !credit.drops(threshold) {
                    admitted += 1;
                }
                prop_assert!(admitted <= i, "admitted more than offered");
                let expected = f64::from(i) * (1.0 - ratio);
                prop_assert!((f64::from(admitted) - expected).abs() <= 1.0 + 1e-6, "{} vs {}", admitted, expected);
            }
        }
    }
}
