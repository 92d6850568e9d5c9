//! The probability of dropping a request of a bucket.

use serde::Serialize;
use thiserror::Error;

/// A drop probability, always a finite number in `[0, 1]`.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default, Serialize)]
#[serde(into = "f64")]
pub struct DropRatio(f64);

/// A value that cannot be a [`DropRatio`] (NaN, infinite or outside `[0, 1]`).
#[derive(Debug, Clone, Copy, PartialEq, Error)]
#[error("drop ratio must be a number between 0 and 1, got {0}")]
pub struct InvalidDropRatio(pub f64);

impl DropRatio {
    /// Never drop.
    pub const NEVER: Self = Self(0.0);
    /// Always drop.
    pub const ALWAYS: Self = Self(1.0);

    /// Checks that `value` is a probability.
    pub fn new(value: f64) -> Result<Self, InvalidDropRatio> {
        // `contains` is false for NaN; adding 0.0 turns -0.0 into 0.0.
        if (0.0..=1.0).contains(&value) {
            Ok(Self(value + 0.0))
        } else {
            Err(InvalidDropRatio(value))
        }
    }

    /// Clamps into `[0, 1]`; NaN becomes 0 because a computation that went
    /// wrong must never start dropping traffic on its own.
    pub fn saturating(value: f64) -> Self {
        if value.is_nan() {
            Self::NEVER
        } else {
            Self(value.clamp(0.0, 1.0) + 0.0)
        }
    }

    /// The probability as a number in `[0, 1]`.
    #[inline]
    pub fn get(self) -> f64 {
        self.0
    }

    /// The integer form the request path compares a random draw against.
    #[inline]
    pub fn threshold(self) -> DropThreshold {
        // 2^63 is exact in f64 and fits in u64, so ratio 1.0 maps to a value
        // every 63-bit draw is below: "always" really means always.
        DropThreshold((self.0 * DropThreshold::SCALE) as u64)
    }
}

impl From<DropRatio> for f64 {
    fn from(ratio: DropRatio) -> Self {
        ratio.0
    }
}

/// A drop ratio scaled to `[0, 2^63]`: drop when a uniform 63-bit draw is
/// below it. Precomputed per directive so the per-request decision is one
/// PRNG step, a shift and a compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct DropThreshold(u64);

impl DropThreshold {
    const SCALE: f64 = 9_223_372_036_854_775_808.0; // 2^63

    /// The threshold of [`DropRatio::NEVER`].
    pub const NEVER: Self = Self(0);

    /// The raw value of [`DropRatio::ALWAYS`]'s threshold: 2⁶³.
    pub const ALWAYS_RAW: u64 = 1 << 63;

    /// The scaled value, in `[0, 2⁶³]`.
    #[inline]
    pub fn raw(self) -> u64 {
        self.0
    }

    /// Whether a uniformly random `u64` means "drop".
    #[inline]
    pub fn drops(self, random: u64) -> bool {
        (random >> 1) < self.0
    }

    /// Whether no draw can ever mean "drop".
    #[inline]
    pub fn is_never(self) -> bool {
        self.0 == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn accepts_the_closed_unit_interval() {
        assert_eq!(DropRatio::new(0.0).map(DropRatio::get), Ok(0.0));
        assert_eq!(DropRatio::new(0.25).map(DropRatio::get), Ok(0.25));
        assert_eq!(DropRatio::new(1.0).map(DropRatio::get), Ok(1.0));
    }

    #[test]
    fn rejects_nan_infinities_and_out_of_range() {
        for bad in [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.001,
            1.000_001,
            2.0,
        ] {
            assert!(DropRatio::new(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn negative_zero_is_normalised() {
        let ratio = DropRatio::new(-0.0).unwrap();
        assert!(ratio.get().is_sign_positive());
    }

    #[test]
    fn saturating_clamps_and_never_drops_on_nan() {
        assert_eq!(DropRatio::saturating(1.5), DropRatio::ALWAYS);
        assert_eq!(DropRatio::saturating(-0.5), DropRatio::NEVER);
        assert_eq!(DropRatio::saturating(f64::NAN), DropRatio::NEVER);
        assert_eq!(DropRatio::saturating(f64::INFINITY), DropRatio::ALWAYS);
        assert_eq!(DropRatio::saturating(0.25).get(), 0.25);
    }

    #[test]
    fn never_and_always_are_exact() {
        let never = DropRatio::NEVER.threshold();
        let always = DropRatio::ALWAYS.threshold();
        for draw in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
            assert!(!never.drops(draw));
            assert!(always.drops(draw));
        }
        assert!(never.is_never());
        assert!(!always.is_never());
    }

    #[test]
    fn half_splits_the_draw_space() {
        let half = DropRatio::new(0.5).unwrap().threshold();
        assert!(half.drops(0));
        assert!(half.drops((1 << 63) - 1));
        assert!(!half.drops(1 << 63));
        assert!(!half.drops(u64::MAX));
    }

    #[test]
    fn threshold_is_monotonic_in_the_ratio() {
        let ratios = [0.0, 1e-12, 0.001, 0.3, 0.5, 0.999, 1.0];
        let thresholds: Vec<_> = ratios
            .iter()
            .map(|r| DropRatio::new(*r).unwrap().threshold())
            .collect();
        assert!(thresholds.windows(2).all(|w| w[0] <= w[1]));
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn construction_matches_the_unit_interval(value in proptest::num::f64::ANY) {
            let in_range = (0.0..=1.0).contains(&value);
            prop_assert_eq!(DropRatio::new(value).is_ok(), in_range);
            if let Ok(ratio) = DropRatio::new(value) {
                prop_assert!((0.0..=1.0).contains(&ratio.get()));
            }
        }
    }
}
