//! Validated value types shared by the config, the admin API and the controller.
//!
//! Each type is parsed from its raw representation once, at the edge, so that
//! the rest of the crate never has to re-check a rate or a probability.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

/// The largest accepted limit. Far above any real fleet, low enough that
/// arithmetic on rates never gets near overflow or precision trouble.
pub const MAX_LIMIT_RPS: f64 = 1e9;

/// The longest bucket key or tenant an operator can configure: the filter
/// cuts the keys and tenants it builds at this length, so a longer name
/// could never match a request.
pub const MAX_BUCKET_LEN: usize = sluice_core::MAX_BUCKET_KEY_BYTES;

/// The longest tenant name, for the same reason.
pub const MAX_TENANT_LEN: usize = sluice_core::MAX_TENANT_BYTES;

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

/// Checks a bucket key or pattern given by an operator.
pub fn validate_bucket(bucket: &str) -> Result<(), InvalidBucket> {
    validate_name(bucket, MAX_BUCKET_LEN)
}

/// Checks a tenant name given by an operator.
pub fn validate_tenant(tenant: &str) -> Result<(), InvalidBucket> {
    validate_name(tenant, MAX_TENANT_LEN)
}

fn validate_name(name: &str, max_len: usize) -> Result<(), InvalidBucket> {
    if name.is_empty() {
        Err(InvalidBucket::Empty)
    } else if name.len() > max_len {
        Err(InvalidBucket::TooLong { max_len })
    } else if let Some(at) = name.chars().position(char::is_control) {
        Err(InvalidBucket::ControlCharacter { at })
    } else {
        Ok(())
    }
}

/// A tenant name from a file: validated while deserializing.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TenantName(pub String);

impl<'de> Deserialize<'de> for TenantName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor;

        impl Visitor<'_> for NameVisitor {
            type Value = TenantName;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a tenant name")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<TenantName, E> {
                validate_tenant(v).map_err(|err| E::custom(format!("tenant {v:?}: {err}")))?;
                Ok(TenantName(v.to_owned()))
            }
        }

        deserializer.deserialize_str(NameVisitor)
    }
}

/// Deserializes a map keyed by bucket keys, each key validated where it
/// stands (so an error names its line).
pub fn bucket_keyed<'de, D, V>(deserializer: D) -> Result<BTreeMap<String, V>, D::Error>
where
    D: Deserializer<'de>,
    V: Deserialize<'de>,
{
    let map = BTreeMap::<BucketName, V>::deserialize(deserializer)?;
    Ok(map.into_iter().map(|(BucketName(k), v)| (k, v)).collect())
}

/// Deserializes a map keyed by tenant names, each key validated where it
/// stands.
pub fn tenant_keyed<'de, D, V>(deserializer: D) -> Result<BTreeMap<String, V>, D::Error>
where
    D: Deserializer<'de>,
    V: Deserialize<'de>,
{
    let map = BTreeMap::<TenantName, V>::deserialize(deserializer)?;
    Ok(map.into_iter().map(|(TenantName(k), v)| (k, v)).collect())
}

/// A bucket key or pattern from a file: validated while deserializing.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct BucketName(pub String);

impl<'de> Deserialize<'de> for BucketName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor;

        impl Visitor<'_> for NameVisitor {
            type Value = BucketName;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a bucket key")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<BucketName, E> {
                validate_bucket(v).map_err(|err| match err {
                    // Which name, since a map key's error is reported at
                    // its map.
                    InvalidBucket::ControlCharacter { .. } => E::custom(format!("{v:?}: {err}")),
                    _ => E::custom(err),
                })?;
                Ok(BucketName(v.to_owned()))
            }
        }

        deserializer.deserialize_str(NameVisitor)
    }
}

/// Why a string is not an acceptable bucket key, pattern or tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidBucket {
    /// The empty string.
    #[error("must not be empty")]
    Empty,
    /// Longer than the filter keeps.
    #[error("must be at most {max_len} bytes (the filter cuts longer keys, so they never match)")]
    TooLong {
        /// The limit in bytes.
        max_len: usize,
    },
    /// A control character (NUL, a line break, an escape…): no filter
    /// builds such a name from a request, and it would corrupt logs and
    /// the file.
    #[error("must not contain control characters (character {at} is one)")]
    ControlCharacter {
        /// Where the first one is, in characters.
        at: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn bucket_validation() {
        assert_eq!(validate_bucket(""), Err(InvalidBucket::Empty));
        assert_eq!(
            validate_bucket(&"x".repeat(MAX_BUCKET_LEN + 1)),
            Err(InvalidBucket::TooLong { max_len: 256 })
        );
        assert!(validate_bucket("acme/api").is_ok());
        assert!(validate_bucket("..").is_ok());
        for bad in ["a\0b", "line\nbreak", "\u{1b}[31m", "del\u{7f}", "c1\u{85}"] {
            assert!(
                matches!(
                    validate_bucket(bad),
                    Err(InvalidBucket::ControlCharacter { .. })
                ),
                "{bad:?}"
            );
            assert!(validate_tenant(bad).is_err(), "{bad:?}");
        }
    }
}

/// How long proxies keep enforcing directives after the last batch from the
/// control plane arrived, before their configured fallback applies:
/// `1000 ..= 86400000` ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct DirectiveTtl(u64);

impl DirectiveTtl {
    /// Shortest accepted TTL in milliseconds.
    pub const MIN_MS: u64 = 1_000;
    /// Longest accepted TTL in milliseconds (one day).
    pub const MAX_MS: u64 = 86_400_000;
    /// Long enough to ride out a control-plane restart or a minute-long
    /// outage on the last-known directives.
    pub const DEFAULT: Self = Self(90_000);

    /// Validates a TTL in milliseconds.
    pub fn from_millis(ms: u64) -> Result<Self, InvalidDirectiveTtl> {
        if (Self::MIN_MS..=Self::MAX_MS).contains(&ms) {
            Ok(Self(ms))
        } else {
            Err(InvalidDirectiveTtl)
        }
    }

    /// The TTL in milliseconds.
    pub fn as_millis(self) -> u64 {
        self.0
    }
}

impl Default for DirectiveTtl {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl TryFrom<u64> for DirectiveTtl {
    type Error = InvalidDirectiveTtl;

    fn try_from(ms: u64) -> Result<Self, Self::Error> {
        Self::from_millis(ms)
    }
}

impl From<DirectiveTtl> for u64 {
    fn from(ttl: DirectiveTtl) -> Self {
        ttl.0
    }
}

/// A TTL outside `1000 ..= 86400000` ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("must be between 1000 and 86400000 (milliseconds)")]
pub struct InvalidDirectiveTtl;
