//! Validated value types shared by the config, the admin API and the controller.
//!
//! Each type is parsed from its raw representation once, at the edge, so that
//! the rest of the crate never has to re-check a rate or a probability.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

pub use sluice_core::control_interval::{ControlInterval, InvalidControlInterval};
pub(crate) use sluice_core::directive::DirectiveTtl;
pub use sluice_core::limit::{InvalidLimit, LimitRps, MAX_LIMIT_RPS};

/// The longest bucket key or tenant an operator can configure: the filter
/// cuts the keys and tenants it builds at this length, so a longer name
/// could never match a request.
pub(crate) const MAX_BUCKET_LEN: usize = sluice_core::MAX_BUCKET_KEY_BYTES;

/// The longest tenant name, for the same reason.
pub(crate) const MAX_TENANT_LEN: usize = sluice_core::MAX_TENANT_BYTES;

/// Checks a bucket key or pattern given by an operator.
pub(crate) fn validate_bucket(bucket: &str) -> Result<(), InvalidBucket> {
    validate_name(bucket, MAX_BUCKET_LEN)
}

/// Checks a tenant name given by an operator.
pub(crate) fn validate_tenant(tenant: &str) -> Result<(), InvalidBucket> {
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
pub(crate) struct TenantName(pub String);

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
pub(crate) fn bucket_keyed<'de, D, V>(deserializer: D) -> Result<BTreeMap<String, V>, D::Error>
where
    D: Deserializer<'de>,
    V: Deserialize<'de>,
{
    let map = BTreeMap::<BucketName, V>::deserialize(deserializer)?;
    Ok(map.into_iter().map(|(BucketName(k), v)| (k, v)).collect())
}

/// Deserializes a map keyed by tenant names, each key validated where it
/// stands.
pub(crate) fn tenant_keyed<'de, D, V>(deserializer: D) -> Result<BTreeMap<String, V>, D::Error>
where
    D: Deserializer<'de>,
    V: Deserialize<'de>,
{
    let map = BTreeMap::<TenantName, V>::deserialize(deserializer)?;
    Ok(map.into_iter().map(|(TenantName(k), v)| (k, v)).collect())
}

/// A bucket key or pattern from a file: validated while deserializing.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct BucketName(pub String);

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
pub(crate) enum InvalidBucket {
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
