//! The deterministic alternative to the coin flip: error diffusion.
//!
//! Each request of a bucket adds the bucket's admit share `1 − drop_ratio`
//! to a credit balance; the request is admitted when the balance reaches
//! one whole request, which is then spent. Over any run of `n` requests the
//! number admitted is within one of `n × (1 − drop_ratio)`, where
//! independent coin flips stray by about `√n`: at a few hundred requests a
//! second per proxy that noise is most of the steady-state error.
//!
//! Integer arithmetic only (fractions of 2⁻³² of a request in a `u64`), so
//! the result is the same natively and on wasm32 and nothing can wrap.

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
    /// Always below [`ONE`] between decisions.
    balance: u64,
}

impl Credit {
    /// A balance starting at `phase` (taken modulo one request). VMs should
    /// start at different phases (from their PRNG), so that at low rates
    /// they do not all admit the same requests of a burst.
    pub fn new(phase: u64) -> Self {
        Self {
            balance: phase % ONE,
        }
    }

    /// Decides one request of a bucket whose directive is `threshold`:
    /// whether it drops (the balance has not reached one whole request).
    #[inline]
    pub fn drops(&mut self, threshold: DropThreshold) -> bool {
        // balance < ONE and share <= ONE, so the sum stays below 2^33.
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

    proptest! {
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
