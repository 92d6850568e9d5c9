//! How often the control plane's control loop runs: validated once where
//! it is read (the limits file, the command line).

use std::fmt;
use std::time::Duration;

use serde::Serialize;
use serde::de::{self, Deserialize, Deserializer, Visitor};

/// How often the control loop runs: `50 ..= 60000` ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(into = "u64")]
pub struct ControlInterval(u64);

impl ControlInterval {
    /// Shortest accepted interval in milliseconds.
    pub const MIN_MS: u64 = 50;
    /// Longest accepted interval in milliseconds.
    pub const MAX_MS: u64 = 60_000;
    /// Used when neither the file nor the command line sets one.
    pub const DEFAULT: Self = Self(500);

    /// Validates an interval in milliseconds.
    pub fn from_millis(ms: u64) -> Result<Self, InvalidControlInterval> {
        if (Self::MIN_MS..=Self::MAX_MS).contains(&ms) {
            Ok(Self(ms))
        } else {
            Err(InvalidControlInterval)
        }
    }

    /// The interval in milliseconds.
    pub fn as_millis(self) -> u64 {
        self.0
    }

    /// The interval as a [`Duration`].
    pub fn as_duration(self) -> Duration {
        Duration::from_millis(self.0)
    }
}

impl Default for ControlInterval {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl TryFrom<u64> for ControlInterval {
    type Error = InvalidControlInterval;

    fn try_from(ms: u64) -> Result<Self, Self::Error> {
        Self::from_millis(ms)
    }
}

impl From<ControlInterval> for u64 {
    fn from(interval: ControlInterval) -> Self {
        interval.0
    }
}

// See `LimitRps`: validating in the visitor keeps the error's position exact.
impl<'de> Deserialize<'de> for ControlInterval {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct IntervalVisitor;

        impl Visitor<'_> for IntervalVisitor {
            type Value = ControlInterval;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number of milliseconds")
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ControlInterval, E> {
                ControlInterval::from_millis(v).map_err(E::custom)
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ControlInterval, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(InvalidControlInterval))
                    .and_then(|v| self.visit_u64(v))
            }
        }

        deserializer.deserialize_u64(IntervalVisitor)
    }
}

/// An interval outside `50 ..= 60000` ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("must be between 50 and 60000 (milliseconds)")]
pub struct InvalidControlInterval;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn control_interval_range() {
        assert!(ControlInterval::from_millis(49).is_err());
        assert!(ControlInterval::from_millis(60_001).is_err());
        assert_eq!(ControlInterval::from_millis(50).unwrap().as_millis(), 50);
        assert_eq!(
            ControlInterval::default().as_duration(),
            Duration::from_millis(500)
        );
    }
}
