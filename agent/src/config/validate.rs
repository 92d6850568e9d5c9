//! From what was written to what the filter runs: every range, name and
//! combination checked, each error naming its field path.

use super::raw::{
    RawConfig, RawDecision, RawEngage, RawFallback, RawKeyPart, RawNewBucket, RawPriority,
    RawRecordMode, RawResponse,
};
use super::{ConfigError, FilterConfig};
use crate::request::classify::{BucketKeySpec, KeyPart, KeySource};
use crate::request::classify::{Classifier, PrioritySpec};
use crate::request::new_cells::NewBucketPolicy;
use crate::request::record::RecordMode;
use crate::request::reject::ResponseSettings;
use crate::tick::pacing::DecisionMode;
use crate::usage::rules::{CostRules, MAX_COST_RULES};
use sluice_core::allowance::{AllowanceSettings, Engage};
use sluice_core::directive::DirectiveTtl;
use sluice_core::regime::Fallback;
use sluice_core::{MAX_BUCKET_KEY_BYTES, Priority};
use std::ops::RangeInclusive;

pub(super) const BUCKET_KEY_PARTS: RangeInclusive<usize> = 1..=8;
pub(super) const PATH_SEGMENTS: RangeInclusive<usize> = 1..=32;
pub(super) const REPORT_INTERVAL_MS: RangeInclusive<u64> = 50..=60_000;
pub(super) const RETRY_AFTER_SECONDS: RangeInclusive<u32> = 1..=3600;
pub(super) const MAX_BUCKETS: RangeInclusive<usize> = 1..=1_000_000;
pub(super) const MAX_SEPARATOR_BYTES: usize = 16;
pub(super) const DIRECTIVE_POLL_MS: RangeInclusive<u64> = 4..=100;
// Above the control plane's one-second heartbeat with room for a slow
// network; at most ten minutes so a wedged stream is always given up.
pub(super) const STREAM_IDLE_TIMEOUT_MS: RangeInclusive<u64> = 2_000..=600_000;
/// 0 follows no response; 1 follows every admitted request.
pub(super) const UPSTREAM_SAMPLE_EVERY: RangeInclusive<u32> = 0..=65_536;
pub(super) const BURST_MS: RangeInclusive<u64> = 0..=10_000;
pub(super) const EXPECTED_PROXIES: RangeInclusive<u32> = 1..=100_000;
pub(super) const MAX_PRIORITY_MAPPINGS: usize = 64;
pub(super) const MAX_NAME_BYTES: usize = 64;
pub(super) const MAX_ZONE_BYTES: usize = 128;

impl RawConfig {
    pub(super) fn validate(self) -> Result<FilterConfig, ConfigError> {
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
        let directive_ttl = DirectiveTtl::from_millis(self.directive_ttl_ms).map_err(|_| {
            range_error(
                "directive_ttl_ms",
                self.directive_ttl_ms,
                &(DirectiveTtl::MIN_MS..=DirectiveTtl::MAX_MS),
            )
        })?;
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
        check_range(
            "upstream_sample_every",
            self.upstream_sample_every,
            &UPSTREAM_SAMPLE_EVERY,
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
                    engage: match raw.engage {
                        RawEngage::Always => Engage::Always,
                        RawEngage::WhenLost => Engage::WhenLost,
                    },
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
        let undirected_header = match self.undirected_header {
            Some(name) => {
                check_header_name("undirected_header", &name)?;
                Some(name.to_ascii_lowercase())
            }
            None => None,
        };
        if self.cost_rules.len() > MAX_COST_RULES {
            return Err(ConfigError::new(
                "cost_rules",
                format!("at most {MAX_COST_RULES} rules"),
            ));
        }
        let costs = self
            .cost_rules
            .into_iter()
            .enumerate()
            .map(|(index, raw)| {
                raw.validate().map_err(|err| {
                    ConfigError::new(format!("cost_rules[{index}].{}", err.field), err.message)
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(FilterConfig {
            costs: CostRules::new(costs),
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
            directive_ttl,
            fallback: match self.fallback {
                RawFallback::KeepLast => Fallback::KeepLast,
                RawFallback::LocalLimit => Fallback::LocalLimit,
                RawFallback::Allow => Fallback::Allow,
            },
            new_bucket,
            response,
            directive_poll_ms: self.directive_poll_ms,
            stream_idle_timeout_ms: self.stream_idle_timeout_ms,
            upstream_sample_every: self.upstream_sample_every,
            decision,
            allowance,
            decision_record: match self.decision_record {
                RawRecordMode::Off => RecordMode::Off,
                RawRecordMode::Drops => RecordMode::Drops,
                RawRecordMode::All => RecordMode::All,
            },
            undirected_header,
        })
    }
}

impl RawResponse {
    pub(super) fn validate(
        self,
        retry_after_seconds: u32,
    ) -> Result<ResponseSettings, ConfigError> {
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
    pub(super) fn validate(self, path: &str) -> Result<PrioritySpec, ConfigError> {
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
            None => Priority::ALL
                .into_iter()
                .filter(|class| *class != Priority::Unspecified)
                .map(|class| (class.name().to_owned(), class))
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

pub(super) fn check_header_name(path: &str, name: &str) -> Result<(), ConfigError> {
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

pub(super) fn check_mapping_name(path: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() || name.len() > MAX_BUCKET_KEY_BYTES {
        return Err(ConfigError::new(
            path,
            format!("must be between 1 and {MAX_BUCKET_KEY_BYTES} bytes"),
        ));
    }
    Ok(())
}

impl RawKeyPart {
    pub(super) fn validate(self, path: &str) -> Result<KeyPart, ConfigError> {
        self.validate_with_default(path, "-")
    }

    pub(super) fn validate_with_default(
        self,
        path: &str,
        fallback: &str,
    ) -> Result<KeyPart, ConfigError> {
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

pub(super) fn check_key_text(path: &str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() || value.len() > MAX_BUCKET_KEY_BYTES {
        return Err(ConfigError::new(
            path,
            format!("must be between 1 and {MAX_BUCKET_KEY_BYTES} bytes"),
        ));
    }
    Ok(())
}

pub(super) fn check_range<T: PartialOrd + std::fmt::Display>(
    path: &str,
    value: T,
    range: &RangeInclusive<T>,
) -> Result<(), ConfigError> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(range_error(path, value, range))
    }
}

/// The error of a `value` outside `range` at `path`.
fn range_error<T: std::fmt::Display>(
    path: &str,
    value: T,
    range: &RangeInclusive<T>,
) -> ConfigError {
    ConfigError::new(
        path,
        format!(
            "must be between {} and {}, got {value}",
            range.start(),
            range.end()
        ),
    )
}
