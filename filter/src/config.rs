//! The plugin configuration: the JSON string in Envoy's `configuration`
//! field, parsed strictly (unknown fields rejected) and validated into a
//! [`FilterConfig`]. Errors name the offending field path, e.g.
//! `report_interval_ms: must be between 50 and 60000`.

use crate::allowance::AllowanceSettings;
use crate::bucket_key::{BucketKeySpec, KeyPart, KeySource, MAX_BUCKET_KEY_BYTES};
use crate::pacing::DecisionMode;
use serde::Deserialize;
use std::ops::RangeInclusive;
use thiserror::Error;

const BUCKET_KEY_PARTS: RangeInclusive<usize> = 1..=8;
const PATH_SEGMENTS: RangeInclusive<usize> = 1..=32;
const REPORT_INTERVAL_MS: RangeInclusive<u64> = 50..=60_000;
const RETRY_AFTER_SECONDS: RangeInclusive<u32> = 1..=3600;
const MAX_BUCKETS: RangeInclusive<usize> = 1..=1_000_000;
const MAX_SEPARATOR_BYTES: usize = 16;
const BURST_MS: RangeInclusive<u64> = 0..=10_000;

/// The validated plugin configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterConfig {
    /// Envoy cluster (HTTP/2) of the control plane.
    pub control_plane_cluster: String,
    /// Identity sent in `Hello`; `None` means "use the Envoy node id".
    pub proxy_id: Option<String>,
    /// How requests map to buckets.
    pub bucket_key: BucketKeySpec,
    /// How often the leader sends a `Report`.
    pub report_interval_ms: u64,
    /// Value of the `retry-after` header on a 429.
    pub retry_after_seconds: u32,
    /// Most distinct buckets counted per report window and held as
    /// directives.
    pub max_buckets: usize,
    /// How a drop ratio is applied to single requests.
    pub decision: DecisionMode,
    /// The local allowance; `None`: off.
    pub allowance: Option<AllowanceSettings>,
}

/// Why a configuration was rejected: the field path and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{path}: {message}")]
pub struct ConfigError {
    /// Where in the JSON document, e.g. `bucket_key[1].name`.
    pub path: String,
    /// What is wrong there.
    pub message: String,
}

impl ConfigError {
    fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    control_plane_cluster: String,
    #[serde(default)]
    proxy_id: Option<String>,
    #[serde(default = "default_bucket_key")]
    bucket_key: Vec<RawKeyPart>,
    #[serde(default = "default_separator")]
    bucket_separator: String,
    #[serde(default = "default_report_interval_ms")]
    report_interval_ms: u64,
    #[serde(default = "default_retry_after_seconds")]
    retry_after_seconds: u32,
    #[serde(default = "default_max_buckets")]
    max_buckets: usize,
    #[serde(default)]
    decision: RawDecision,
    #[serde(default)]
    allowance: Option<RawAllowance>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "snake_case")]
enum RawDecision {
    #[default]
    Coin,
    Credit,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAllowance {
    #[serde(default)]
    headroom: f64,
    #[serde(default = "default_burst_ms")]
    burst_ms: u64,
}

fn default_burst_ms() -> u64 {
    AllowanceSettings::default().burst_ms
}

#[derive(Deserialize)]
#[serde(tag = "source", rename_all = "snake_case", deny_unknown_fields)]
enum RawKeyPart {
    Header {
        name: String,
        default: Option<String>,
    },
    Authority {
        default: Option<String>,
    },
    PathPrefix {
        segments: usize,
        default: Option<String>,
    },
    RouteName {
        default: Option<String>,
    },
    Literal {
        value: String,
    },
}

fn default_bucket_key() -> Vec<RawKeyPart> {
    vec![RawKeyPart::Authority { default: None }]
}
fn default_separator() -> String {
    "/".into()
}
fn default_report_interval_ms() -> u64 {
    250
}
fn default_retry_after_seconds() -> u32 {
    1
}
fn default_max_buckets() -> usize {
    10_000
}

impl FilterConfig {
    /// Parses and validates the plugin configuration bytes.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ConfigError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ConfigError::new(
                "configuration",
                "is empty; a JSON object with at least control_plane_cluster is required",
            ));
        }
        let mut deserializer = serde_json::Deserializer::from_slice(bytes);
        let raw: RawConfig =
            serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
                let path = err.path().to_string();
                let path = if path == "." {
                    "configuration".to_owned()
                } else {
                    path
                };
                ConfigError::new(path, err.into_inner().to_string())
            })?;
        raw.validate()
    }
}

impl RawConfig {
    fn validate(self) -> Result<FilterConfig, ConfigError> {
        if self.control_plane_cluster.trim().is_empty() {
            return Err(ConfigError::new(
                "control_plane_cluster",
                "must not be empty",
            ));
        }
        if let Some(proxy_id) = &self.proxy_id
            && proxy_id.trim().is_empty()
        {
            return Err(ConfigError::new("proxy_id", "must not be empty when set"));
        }
        if !BUCKET_KEY_PARTS.contains(&self.bucket_key.len()) {
            return Err(ConfigError::new(
                "bucket_key",
                format!(
                    "must have between {} and {} parts",
                    BUCKET_KEY_PARTS.start(),
                    BUCKET_KEY_PARTS.end()
                ),
            ));
        }
        if self.bucket_separator.len() > MAX_SEPARATOR_BYTES {
            return Err(ConfigError::new(
                "bucket_separator",
                format!("must be at most {MAX_SEPARATOR_BYTES} bytes"),
            ));
        }
        check_range(
            "report_interval_ms",
            self.report_interval_ms,
            &REPORT_INTERVAL_MS,
        )?;
        check_range(
            "retry_after_seconds",
            self.retry_after_seconds,
            &RETRY_AFTER_SECONDS,
        )?;
        check_range("max_buckets", self.max_buckets, &MAX_BUCKETS)?;
        let allowance = match self.allowance {
            None => None,
            Some(raw) => {
                if !(0.0..=1.0).contains(&raw.headroom) {
                    return Err(ConfigError::new(
                        "allowance.headroom",
                        format!("must be between 0 and 1, got {}", raw.headroom),
                    ));
                }
                check_range("allowance.burst_ms", raw.burst_ms, &BURST_MS)?;
                Some(AllowanceSettings {
                    headroom: raw.headroom,
                    burst_ms: raw.burst_ms,
                })
            }
        };
        let decision = match self.decision {
            RawDecision::Coin => DecisionMode::Coin,
            RawDecision::Credit => DecisionMode::Credit,
        };
        let parts = self
            .bucket_key
            .into_iter()
            .enumerate()
            .map(|(index, part)| part.validate(&format!("bucket_key[{index}]")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(FilterConfig {
            control_plane_cluster: self.control_plane_cluster,
            proxy_id: self.proxy_id,
            bucket_key: BucketKeySpec::new(parts, self.bucket_separator),
            report_interval_ms: self.report_interval_ms,
            retry_after_seconds: self.retry_after_seconds,
            max_buckets: self.max_buckets,
            decision,
            allowance,
        })
    }
}

impl RawKeyPart {
    fn validate(self, path: &str) -> Result<KeyPart, ConfigError> {
        let (source, default) = match self {
            Self::Header { name, default } => {
                if name.is_empty()
                    || name
                        .bytes()
                        .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
                {
                    return Err(ConfigError::new(
                        format!("{path}.name"),
                        "must be a non-empty header name without whitespace",
                    ));
                }
                // Envoy stores header names in lower case.
                (KeySource::Header(name.to_ascii_lowercase()), default)
            }
            Self::Authority { default } => (KeySource::Authority, default),
            Self::PathPrefix { segments, default } => {
                check_range(&format!("{path}.segments"), segments, &PATH_SEGMENTS)?;
                (KeySource::PathPrefix(segments), default)
            }
            Self::RouteName { default } => (KeySource::RouteName, default),
            Self::Literal { value } => {
                check_key_text(&format!("{path}.value"), &value)?;
                return Ok(KeyPart {
                    source: KeySource::Literal(value),
                    default: String::new(),
                });
            }
        };
        let default = default.unwrap_or_else(|| "-".to_owned());
        check_key_text(&format!("{path}.default"), &default)?;
        Ok(KeyPart { source, default })
    }
}

fn check_key_text(path: &str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() || value.len() > MAX_BUCKET_KEY_BYTES {
        return Err(ConfigError::new(
            path,
            format!("must be between 1 and {MAX_BUCKET_KEY_BYTES} bytes"),
        ));
    }
    Ok(())
}

fn check_range<T: PartialOrd + std::fmt::Display>(
    path: &str,
    value: T,
    range: &RangeInclusive<T>,
) -> Result<(), ConfigError> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::new(
            path,
            format!(
                "must be between {} and {}, got {value}",
                range.start(),
                range.end()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn decision_and_allowance() {
        let config = FilterConfig::from_json(
            br#"{"control_plane_cluster": "cp", "decision": "credit",
                 "allowance": {"headroom": 0.05, "burst_ms": 20}}"#,
        )
        .unwrap();
        assert_eq!(config.decision, DecisionMode::Credit);
        assert_eq!(
            config.allowance,
            Some(AllowanceSettings {
                headroom: 0.05,
                burst_ms: 20
            })
        );
        let config = FilterConfig::from_json(br#"{"control_plane_cluster": "cp"}"#).unwrap();
        assert_eq!(config.decision, DecisionMode::Coin);
        assert_eq!(config.allowance, None);
        assert!(
            error_of(r#"{"control_plane_cluster": "cp", "decision": "dice"}"#)
                .starts_with("decision: unknown variant")
        );
        assert_eq!(
            error_of(r#"{"control_plane_cluster": "cp", "allowance": {"headroom": 2}}"#),
            "allowance.headroom: must be between 0 and 1, got 2"
        );
        assert!(
            error_of(r#"{"control_plane_cluster": "cp", "allowance": {"burst": 2}}"#)
                .starts_with("allowance.burst: unknown field")
        );
    }

    fn error_of(json: &str) -> String {
        FilterConfig::from_json(json.as_bytes())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_configuration_with_every_field_parses() {
        let config = FilterConfig::from_json(
            br#"{
              "control_plane_cluster": "sluice_control_plane",
              "proxy_id": "envoy-a",
              "bucket_key": [
                {"source": "header", "name": "X-Tenant", "default": "anonymous"},
                {"source": "authority"},
                {"source": "path_prefix", "segments": 1},
                {"source": "route_name"},
                {"source": "literal", "value": "api"}
              ],
              "bucket_separator": "/",
              "report_interval_ms": 250,
              "retry_after_seconds": 1,
              "max_buckets": 10000
            }"#,
        )
        .unwrap();
        assert_eq!(config.control_plane_cluster, "sluice_control_plane");
        assert_eq!(config.proxy_id.as_deref(), Some("envoy-a"));
        assert!(config.bucket_key.uses_route_name());
        let expected = BucketKeySpec::new(
            vec![
                KeyPart {
                    source: KeySource::Header("x-tenant".into()),
                    default: "anonymous".into(),
                },
                KeyPart {
                    source: KeySource::Authority,
                    default: "-".into(),
                },
                KeyPart {
                    source: KeySource::PathPrefix(1),
                    default: "-".into(),
                },
                KeyPart {
                    source: KeySource::RouteName,
                    default: "-".into(),
                },
                KeyPart {
                    source: KeySource::Literal("api".into()),
                    default: String::new(),
                },
            ],
            "/".into(),
        );
        assert_eq!(config.bucket_key, expected);
    }

    #[test]
    fn defaults_apply() {
        let config = FilterConfig::from_json(br#"{"control_plane_cluster": "cp"}"#).unwrap();
        assert_eq!(config.proxy_id, None);
        assert_eq!(config.report_interval_ms, 250);
        assert_eq!(config.retry_after_seconds, 1);
        assert_eq!(config.max_buckets, 10_000);
        let authority = BucketKeySpec::new(
            vec![KeyPart {
                source: KeySource::Authority,
                default: "-".into(),
            }],
            "/".into(),
        );
        assert_eq!(config.bucket_key, authority);
    }

    #[test]
    fn range_errors_name_the_field() {
        assert_eq!(
            error_of(r#"{"control_plane_cluster": "cp", "report_interval_ms": 10}"#),
            "report_interval_ms: must be between 50 and 60000, got 10"
        );
        assert_eq!(
            error_of(r#"{"control_plane_cluster": "cp", "retry_after_seconds": 0}"#),
            "retry_after_seconds: must be between 1 and 3600, got 0"
        );
        assert_eq!(
            error_of(r#"{"control_plane_cluster": "cp", "max_buckets": 1000001}"#),
            "max_buckets: must be between 1 and 1000000, got 1000001"
        );
        assert_eq!(
            error_of(
                r#"{"control_plane_cluster": "cp", "bucket_key": [{"source": "path_prefix", "segments": 0}]}"#
            ),
            "bucket_key[0].segments: must be between 1 and 32, got 0"
        );
    }

    #[test]
    fn type_errors_name_the_field() {
        let err = error_of(r#"{"control_plane_cluster": "cp", "report_interval_ms": "fast"}"#);
        assert!(err.starts_with("report_interval_ms: invalid type"), "{err}");
        let err = error_of(
            r#"{"control_plane_cluster": "cp", "bucket_key": [{"source": "authority"}, {"source": "header"}]}"#,
        );
        assert!(
            err.starts_with("bucket_key[1]: missing field `name`"),
            "{err}"
        );
    }

    #[test]
    fn unknown_fields_and_sources_are_rejected() {
        let err = error_of(r#"{"control_plane_cluster": "cp", "report_interval": 100}"#);
        assert!(err.contains("unknown field `report_interval`"), "{err}");
        let err =
            error_of(r#"{"control_plane_cluster": "cp", "bucket_key": [{"source": "cookie"}]}"#);
        assert!(
            err.starts_with("bucket_key[0].source: unknown variant `cookie`"),
            "{err}"
        );
        let err = error_of(
            r#"{"control_plane_cluster": "cp", "bucket_key": [{"source": "authority", "nme": "x"}]}"#,
        );
        assert!(err.contains("unknown field `nme`"), "{err}");
    }

    #[test]
    fn structural_errors_are_reported() {
        assert!(error_of("").starts_with("configuration: is empty"));
        assert!(error_of("{}").contains("missing field `control_plane_cluster`"));
        assert_eq!(
            error_of(r#"{"control_plane_cluster": " "}"#),
            "control_plane_cluster: must not be empty"
        );
        assert_eq!(
            error_of(r#"{"control_plane_cluster": "cp", "bucket_key": []}"#),
            "bucket_key: must have between 1 and 8 parts"
        );
        assert_eq!(
            error_of(
                r#"{"control_plane_cluster": "cp", "bucket_key": [{"source": "header", "name": "x", "default": ""}]}"#
            ),
            "bucket_key[0].default: must be between 1 and 256 bytes"
        );
        assert_eq!(
            error_of(
                r#"{"control_plane_cluster": "cp", "bucket_key": [{"source": "header", "name": "a b"}]}"#
            ),
            "bucket_key[0].name: must be a non-empty header name without whitespace"
        );
    }
}
