//! A fleet-wide limit in requests per second, validated once where it is
//! read (the limits file, the admin API, a directive) so nothing after it
//! re-checks a rate.

use std::fmt;

use serde::Serialize;
use serde::de::{self, Deserialize, Deserializer, Visitor};

/// The largest accepted limit. Far above any real fleet, low enough that
/// arithmetic on rates never gets near overflow or precision trouble.
pub const MAX_LIMIT_RPS: f64 = 1e9;

/// A fleet-wide limit in requests per second: finite, `0 ..= 1e9`.
///
/// `0` means "drop everything"; "unlimited" is expressed as the absence of a
/// limit (`Option::None`), never as a magic number.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize)]
#[serde(into = "f64")]
pub struct LimitRps(f64);

impl LimitRps {
    /// No requests at all.
    pub const ZERO: Self = Self(0.0);

    /// Validates a raw rate.
    pub fn new(rps: f64) -> Result<Self, InvalidLimit> {
        if rps.is_finite() && (0.0..=MAX_LIMIT_RPS).contains(&rps) {
            Ok(Self(rps))
        } else if rps.is_finite() && rps > MAX_LIMIT_RPS {
            Err(InvalidLimit::TooLarge)
        } else {
            Err(InvalidLimit::NotFiniteNonNegative)
        }
    }

    /// The rate in requests per second.
    pub fn get(self) -> f64 {
        self.0
    }

    /// Whether the limit admits nothing (0): the bucket is blocked.
    pub fn is_blocked(self) -> bool {
        self.0 == 0.0
    }
}

impl TryFrom<f64> for LimitRps {
    type Error = InvalidLimit;

    fn try_from(rps: f64) -> Result<Self, Self::Error> {
        Self::new(rps)
    }
}

impl From<LimitRps> for f64 {
    fn from(limit: LimitRps) -> Self {
        limit.0
    }
}

impl fmt::Display for LimitRps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

// Validation runs inside the visitor rather than through `try_from`, so that a
// YAML error is reported at the offending scalar instead of at its parent map.
impl<'de> Deserialize<'de> for LimitRps {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LimitVisitor;

        impl Visitor<'_> for LimitVisitor {
            type Value = LimitRps;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number of requests per second")
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<LimitRps, E> {
                LimitRps::new(v).map_err(E::custom)
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<LimitRps, E> {
                self.visit_f64(v as f64)
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<LimitRps, E> {
                self.visit_f64(v as f64)
            }
        }

        deserializer.deserialize_f64(LimitVisitor)
    }
}

/// Why a number is not a [`LimitRps`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidLimit {
    /// NaN, infinite or negative.
    #[error("must be a finite number >= 0")]
    NotFiniteNonNegative,
    /// Above [`MAX_LIMIT_RPS`].
    #[error("must be at most 1e9")]
    TooLarge,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn limit_accepts_zero_to_a_billion() {
        assert_eq!(LimitRps::new(0.0).unwrap().get(), 0.0);
        assert_eq!(LimitRps::new(200.0).unwrap().get(), 200.0);
        assert_eq!(LimitRps::new(1e9).unwrap().get(), 1e9);
    }

    #[test]
    fn limit_rejects_nan_infinite_negative_and_huge() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0, -0.001] {
            assert_eq!(LimitRps::new(bad), Err(InvalidLimit::NotFiniteNonNegative));
        }
        assert_eq!(LimitRps::new(1e9 + 1.0), Err(InvalidLimit::TooLarge));
    }

    #[test]
    fn limit_deserializes_through_validation() {
        let ok: LimitRps = serde_json::from_str("150").unwrap();
        assert_eq!(ok.get(), 150.0);
        let err = serde_json::from_str::<LimitRps>("-3").unwrap_err();
        assert!(err.to_string().contains("must be a finite number >= 0"));
    }
}
