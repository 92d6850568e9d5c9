//! The plugin configuration: the JSON string in Envoy's `configuration`
//! field, parsed strictly (unknown fields rejected) and validated into a
//! [`FilterConfig`]. Errors name the offending field path, e.g.
//! `report_interval_ms: must be between 50 and 60000`.

use crate::agent::{
    DEFAULT_DIRECTIVE_POLL_MS, DEFAULT_DIRECTIVE_TTL_MS, DEFAULT_STREAM_IDLE_TIMEOUT_MS,
};
use crate::allowance::AllowanceSettings;
use crate::bucket_key::{BucketKeySpec, KeyPart, KeySource, MAX_BUCKET_KEY_BYTES};
use crate::classify::{Classifier, PrioritySpec};
use crate::decision::Fallback;
use crate::new_cells::NewBucketPolicy;
use crate::pacing::DecisionMode;
use crate::reject::ResponseSettings;
use serde::Deserialize;
use sluice_proto::v1::Priority;
use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use thiserror::Error;

const BUCKET_KEY_PARTS: RangeInclusive<usize> = 1..=8;
const PATH_SEGMENTS: RangeInclusive<usize> = 1..=32;
const REPORT_INTERVAL_MS: RangeInclusive<u64> = 50..=60_000;
const RETRY_AFTER_SECONDS: RangeInclusive<u32> = 1..=3600;
const MAX_BUCKETS: RangeInclusive<usize> = 1..=1_000_000;
const MAX_SEPARATOR_BYTES: usize = 16;
const DIRECTIVE_TTL_MS: RangeInclusive<u64> = 100..=86_400_000;
const DIRECTIVE_POLL_MS: RangeInclusive<u64> = 4..=100;
// Above the control plane's one-second heartbeat with room for a slow
// network; at most ten minutes so a wedged stream is always given up.
const STREAM_IDLE_TIMEOUT_MS: RangeInclusive<u64> = 2_000..=600_000;
const BURST_MS: RangeInclusive<u64> = 0..=10_000;
const EXPECTED_PROXIES: RangeInclusive<u32> = 1..=100_000;
const MAX_PRIORITY_MAPPINGS: usize = 64;
const MAX_NAME_BYTES: usize = 64;
const MAX_ZONE_BYTES: usize = 128;

/// The validated plugin configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterConfig {
    /// Envoy cluster (HTTP/2) of the control plane.
    pub control_plane_cluster: String,
    /// Identity sent in `Hello`; `None` means "use the Envoy node id".
    pub proxy_id: Option<String>,
    /// Failure domain sent in `Hello`; `None` means "use the Envoy node's
    /// locality zone".
    pub zone: Option<String>,
    /// How requests map to buckets.
    pub bucket_key: BucketKeySpec,
    /// How often the leader sends a `Report`.
    pub report_interval_ms: u64,
    /// Value of the `retry-after` header on a 429.
    pub retry_after_seconds: u32,
    /// Most distinct cells counted per report window and held as
    /// directives.
    pub max_buckets: usize,
    /// How requests map to cells (bucket as `bucket_key`, tenant,
    /// priority).
    pub classifier: Classifier,
    /// Directive TTL when batches name none.
    pub directive_ttl_ms: u64,
    /// What applies once the directives are stale.
    pub fallback: Fallback,
    /// What applies to cells without a directive.
    pub new_bucket: NewBucketPolicy,
    /// How 429s are rendered.
    pub response: ResponseSettings,
    /// Short tick: how often every VM checks for new directives.
    pub directive_poll_ms: u64,
    /// Give up on a control-plane stream that delivered nothing for this
    /// long, and reconnect.
    pub stream_idle_timeout_ms: u64,
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
    #[serde(default)]
    zone: Option<String>,
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
    tenant: Option<RawKeyPart>,
    #[serde(default)]
    priority: Option<RawPriority>,
    #[serde(default = "default_directive_ttl_ms")]
    directive_ttl_ms: u64,
    #[serde(default = "default_fallback")]
    fallback: RawFallback,
    #[serde(default = "default_new_bucket")]
    new_bucket: RawNewBucket,
    #[serde(default)]
    response: RawResponse,
    #[serde(default = "default_directive_poll_ms")]
    directive_poll_ms: u64,
    #[serde(default = "default_stream_idle_timeout_ms")]
    stream_idle_timeout_ms: u64,
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

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum RawClass {
    Critical,
    Degraded,
    BestEffort,
    Bulk,
}

impl RawClass {
    fn priority(self) -> Priority {
        match self {
            Self::Critical => Priority::Critical,
            Self::Degraded => Priority::Degraded,
            Self::BestEffort => Priority::BestEffort,
            Self::Bulk => Priority::Bulk,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPriority {
    #[serde(default)]
    header: Option<String>,
    #[serde(default)]
    values: Option<BTreeMap<String, RawClass>>,
    #[serde(default)]
    routes: BTreeMap<String, RawClass>,
    #[serde(default = "default_class")]
    default: RawClass,
}

fn default_class() -> RawClass {
    RawClass::BestEffort
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum RawFallback {
    KeepLast,
    LocalLimit,
    Allow,
}

#[derive(Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
enum RawNewBucket {
    // A struct variant, so unknown fields next to the tag are refused.
    Allow {},
    LocalLimit {
        fleet_limit_rps: f64,
        expected_proxies: u32,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResponse {
    #[serde(default = "default_reason_header")]
    reason_header: String,
    #[serde(default = "default_true")]
    x_ratelimit_headers: bool,
    #[serde(default = "default_true")]
    ietf_headers: bool,
    #[serde(default = "default_policy_name")]
    policy_name: String,
}

impl Default for RawResponse {
    fn default() -> Self {
        Self {
            reason_header: default_reason_header(),
            x_ratelimit_headers: true,
            ietf_headers: true,
            policy_name: default_policy_name(),
        }
    }
}

fn default_reason_header() -> String {
    "x-ratelimit-reason".into()
}
fn default_policy_name() -> String {
    "sluice".into()
}
fn default_true() -> bool {
    true
}
fn default_directive_ttl_ms() -> u64 {
    DEFAULT_DIRECTIVE_TTL_MS
}
fn default_directive_poll_ms() -> u64 {
    DEFAULT_DIRECTIVE_POLL_MS
}
fn default_stream_idle_timeout_ms() -> u64 {
    DEFAULT_STREAM_IDLE_TIMEOUT_MS
}
fn default_fallback() -> RawFallback {
    RawFallback::KeepLast
}
fn default_new_bucket() -> RawNewBucket {
    RawNewBucket::Allow {}
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
                let path = if path == "." || path.is_empty() {
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
        if let Some(zone) = &self.zone
            && (zone.trim().is_empty() || zone.len() > MAX_ZONE_BYTES)
        {
            return Err(ConfigError::new(
                "zone",
                format!("must be between 1 and {MAX_ZONE_BYTES} bytes when set"),
            ));
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
        check_range("directive_ttl_ms", self.directive_ttl_ms, &DIRECTIVE_TTL_MS)?;
        check_range(
            "directive_poll_ms",
            self.directive_poll_ms,
            &DIRECTIVE_POLL_MS,
        )?;
        check_range(
            "stream_idle_timeout_ms",
            self.stream_idle_timeout_ms,
            &STREAM_IDLE_TIMEOUT_MS,
        )?;
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
        let bucket_key = BucketKeySpec::new(parts, self.bucket_separator);
        let tenant = match self.tenant {
            None => None,
            Some(part) => Some(part.validate_with_default("tenant", "default")?),
        };
        let priority = self.priority.map(|p| p.validate("priority")).transpose()?;
        let new_bucket = match self.new_bucket {
            RawNewBucket::Allow {} => NewBucketPolicy::Allow,
            RawNewBucket::LocalLimit {
                fleet_limit_rps,
                expected_proxies,
            } => {
                if !(fleet_limit_rps.is_finite() && (0.0..=1e9).contains(&fleet_limit_rps)) {
                    return Err(ConfigError::new(
                        "new_bucket.fleet_limit_rps",
                        format!("must be a finite number between 0 and 1e9, got {fleet_limit_rps}"),
                    ));
                }
                check_range(
                    "new_bucket.expected_proxies",
                    expected_proxies,
                    &EXPECTED_PROXIES,
                )?;
                NewBucketPolicy::LocalLimit {
                    fleet_limit_rps,
                    expected_proxies,
                }
            }
        };
        let response = self.response.validate(self.retry_after_seconds)?;
        Ok(FilterConfig {
            control_plane_cluster: self.control_plane_cluster,
            proxy_id: self.proxy_id,
            zone: self.zone,
            classifier: Classifier {
                bucket_key: bucket_key.clone(),
                tenant,
                priority,
            },
            bucket_key,
            report_interval_ms: self.report_interval_ms,
            retry_after_seconds: self.retry_after_seconds,
            max_buckets: self.max_buckets,
            directive_ttl_ms: self.directive_ttl_ms,
            fallback: match self.fallback {
                RawFallback::KeepLast => Fallback::KeepLast,
                RawFallback::LocalLimit => Fallback::LocalLimit,
                RawFallback::Allow => Fallback::Allow,
            },
            new_bucket,
            response,
            directive_poll_ms: self.directive_poll_ms,
            stream_idle_timeout_ms: self.stream_idle_timeout_ms,
            decision,
            allowance,
        })
    }
}

impl RawResponse {
    fn validate(self, retry_after_seconds: u32) -> Result<ResponseSettings, ConfigError> {
        check_header_name("response.reason_header", &self.reason_header)?;
        if self.policy_name.is_empty()
            || self.policy_name.len() > MAX_NAME_BYTES
            || !self
                .policy_name
                .bytes()
                .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
        {
            return Err(ConfigError::new(
                "response.policy_name",
                format!(
                    "must be 1 to {MAX_NAME_BYTES} printable ASCII characters without quotes or backslashes"
                ),
            ));
        }
        Ok(ResponseSettings {
            reason_header: self.reason_header.to_ascii_lowercase(),
            x_ratelimit_headers: self.x_ratelimit_headers,
            ietf_headers: self.ietf_headers,
            policy_name: self.policy_name,
            default_retry_after_seconds: retry_after_seconds,
        })
    }
}

impl RawPriority {
    fn validate(self, path: &str) -> Result<PrioritySpec, ConfigError> {
        let header = match self.header {
            Some(name) => {
                check_header_name(&format!("{path}.header"), &name)?;
                Some(name.to_ascii_lowercase())
            }
            None => None,
        };
        let values: Vec<(String, Priority)> = match self.values {
            Some(values) => {
                if header.is_none() {
                    return Err(ConfigError::new(format!("{path}.values"), "needs `header`"));
                }
                for name in values.keys() {
                    check_mapping_name(&format!("{path}.values.{name}"), name)?;
                }
                values
                    .into_iter()
                    .map(|(name, class)| (name, class.priority()))
                    .collect()
            }
            // The class names themselves.
            None => [
                ("critical", Priority::Critical),
                ("degraded", Priority::Degraded),
                ("best_effort", Priority::BestEffort),
                ("bulk", Priority::Bulk),
            ]
            .into_iter()
            .map(|(name, class)| (name.to_owned(), class))
            .collect(),
        };
        for name in self.routes.keys() {
            check_mapping_name(&format!("{path}.routes.{name}"), name)?;
        }
        if values.len() > MAX_PRIORITY_MAPPINGS || self.routes.len() > MAX_PRIORITY_MAPPINGS {
            return Err(ConfigError::new(
                path,
                format!(
                    "at most {MAX_PRIORITY_MAPPINGS} values and {MAX_PRIORITY_MAPPINGS} routes"
                ),
            ));
        }
        if header.is_none() && self.routes.is_empty() {
            return Err(ConfigError::new(
                path,
                "needs `header` or `routes` (or both)",
            ));
        }
        Ok(PrioritySpec {
            header,
            values,
            routes: self
                .routes
                .into_iter()
                .map(|(name, class)| (name, class.priority()))
                .collect(),
            default: self.default.priority(),
        })
    }
}

fn check_header_name(path: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty()
        || name.len() > MAX_NAME_BYTES
        || name
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control() || !b.is_ascii() || b == b':')
    {
        return Err(ConfigError::new(
            path,
            format!(
                "must be a header name of 1 to {MAX_NAME_BYTES} bytes without whitespace or ':'"
            ),
        ));
    }
    Ok(())
}

fn check_mapping_name(path: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() || name.len() > MAX_BUCKET_KEY_BYTES {
        return Err(ConfigError::new(
            path,
            format!("must be between 1 and {MAX_BUCKET_KEY_BYTES} bytes"),
        ));
    }
    Ok(())
}

impl RawKeyPart {
    fn validate(self, path: &str) -> Result<KeyPart, ConfigError> {
        self.validate_with_default(path, "-")
    }

    fn validate_with_default(self, path: &str, fallback: &str) -> Result<KeyPart, ConfigError> {
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
        let default = default.unwrap_or_else(|| fallback.to_owned());
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
              "zone": "eu-west-1a",
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
        assert_eq!(config.zone.as_deref(), Some("eu-west-1a"));
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
        assert_eq!(config.zone, None);
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
        assert_eq!(
            error_of(r#"{"control_plane_cluster": "cp", "zone": " "}"#),
            "zone: must be between 1 and 128 bytes when set"
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
    fn classification_and_behaviour_keys_parse() {
        let config = FilterConfig::from_json(
            br#"{
              "control_plane_cluster": "cp",
              "tenant": {"source": "header", "name": "X-Tenant"},
              "priority": {
                "header": "X-Priority",
                "values": {"high": "critical", "batch": "bulk"},
                "routes": {"checkout": "critical"},
                "default": "degraded"
              },
              "directive_ttl_ms": 5000,
              "fallback": "local_limit",
              "new_bucket": {"action": "local_limit", "fleet_limit_rps": 100, "expected_proxies": 4},
              "response": {"reason_header": "X-Shed-Reason", "x_ratelimit_headers": false, "ietf_headers": true, "policy_name": "edge"},
              "directive_poll_ms": 10
            }"#,
        )
        .unwrap();
        let tenant = config.classifier.tenant.clone().unwrap();
        assert_eq!(tenant.source, KeySource::Header("x-tenant".into()));
        assert_eq!(tenant.default, "default");
        let priority = config.classifier.priority.clone().unwrap();
        assert_eq!(priority.header.as_deref(), Some("x-priority"));
        assert_eq!(
            priority.values,
            vec![
                ("batch".to_owned(), Priority::Bulk),
                ("high".to_owned(), Priority::Critical)
            ]
        );
        assert_eq!(
            priority.routes,
            vec![("checkout".to_owned(), Priority::Critical)]
        );
        assert_eq!(priority.default, Priority::Degraded);
        assert_eq!(config.directive_ttl_ms, 5000);
        assert_eq!(config.fallback, Fallback::LocalLimit);
        assert_eq!(
            config.new_bucket,
            NewBucketPolicy::LocalLimit {
                fleet_limit_rps: 100.0,
                expected_proxies: 4
            }
        );
        assert_eq!(config.response.reason_header, "x-shed-reason");
        assert!(!config.response.x_ratelimit_headers);
        assert_eq!(config.response.policy_name, "edge");
        assert_eq!(config.directive_poll_ms, 10);
    }

    #[test]
    fn behaviour_defaults_are_explicit() {
        let config = FilterConfig::from_json(br#"{"control_plane_cluster": "cp"}"#).unwrap();
        assert_eq!(config.classifier.tenant, None);
        assert_eq!(config.classifier.priority, None);
        assert_eq!(config.directive_ttl_ms, 90_000);
        assert_eq!(config.fallback, Fallback::KeepLast);
        assert_eq!(config.new_bucket, NewBucketPolicy::Allow);
        assert_eq!(config.response, ResponseSettings::default());
        assert_eq!(config.directive_poll_ms, 20);
        // A priority header alone maps the class names themselves.
        let config = FilterConfig::from_json(
            br#"{"control_plane_cluster": "cp", "priority": {"header": "x-priority"}}"#,
        )
        .unwrap();
        let priority = config.classifier.priority.unwrap();
        assert_eq!(priority.values.len(), 4);
        assert_eq!(priority.default, Priority::BestEffort);
    }

    #[test]
    fn new_keys_name_the_field_in_errors() {
        let cases = [
            (
                r#""directive_ttl_ms": 10"#,
                "directive_ttl_ms: must be between 100 and 86400000, got 10",
            ),
            (
                r#""directive_poll_ms": 1"#,
                "directive_poll_ms: must be between 4 and 100, got 1",
            ),
            (
                r#""new_bucket": {"action": "local_limit", "fleet_limit_rps": -1, "expected_proxies": 2}"#,
                "new_bucket.fleet_limit_rps: must be a finite number between 0 and 1e9, got -1",
            ),
            (
                r#""new_bucket": {"action": "local_limit", "fleet_limit_rps": 1, "expected_proxies": 0}"#,
                "new_bucket.expected_proxies: must be between 1 and 100000, got 0",
            ),
            (
                r#""priority": {"default": "bulk"}"#,
                "priority: needs `header` or `routes` (or both)",
            ),
            (
                r#""priority": {"routes": {"r": "bulk"}, "values": {"a": "bulk"}}"#,
                "priority.values: needs `header`",
            ),
            (
                r#""response": {"reason_header": "bad header"}"#,
                "response.reason_header: must be a header name of 1 to 64 bytes without whitespace or ':'",
            ),
            (
                r#""tenant": {"source": "header", "name": "x", "default": ""}"#,
                "tenant.default: must be between 1 and 256 bytes",
            ),
        ];
        for (field, expected) in cases {
            assert_eq!(
                error_of(&format!(r#"{{"control_plane_cluster": "cp", {field}}}"#)),
                expected
            );
        }
        let prefixed = [
            (
                r#""fallback": "panic""#,
                "fallback: unknown variant `panic`",
            ),
            (r#""fallback": 3"#, "fallback: "),
            (
                r#""new_bucket": {"action": "deny"}"#,
                "new_bucket.action: unknown variant `deny`",
            ),
            (
                r#""new_bucket": {"action": "allow", "rps": 1}"#,
                "new_bucket: unknown field `rps`",
            ),
            (
                r#""priority": {"header": "x", "values": {"a": "urgent"}}"#,
                "priority.values.a: unknown variant `urgent`",
            ),
            (
                r#""priority": {"header": "x", "colour": 1}"#,
                "priority.colour: unknown field `colour`",
            ),
            (
                r#""response": {"x_ratelimit_headers": "no"}"#,
                "response.x_ratelimit_headers: invalid type",
            ),
            (
                r#""tenant": {"source": "cookie"}"#,
                "tenant.source: unknown variant `cookie`",
            ),
        ];
        for (field, expected) in prefixed {
            let err = error_of(&format!(r#"{{"control_plane_cluster": "cp", {field}}}"#));
            assert!(err.starts_with(expected), "{field}: {err}");
        }
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
