//! The configuration exactly as written: serde types with their defaults,
//! unknown fields rejected. Nothing here is validated yet.

use crate::settings::{DEFAULT_DIRECTIVE_POLL_MS, DEFAULT_STREAM_IDLE_TIMEOUT_MS};
use crate::usage::rules::RawCostRoute;
use serde::Deserialize;
use sluice_core::Priority;
use sluice_core::allowance::AllowanceSettings;
use sluice_core::directive::DirectiveTtl;
use std::collections::BTreeMap;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) control_plane_cluster: String,
    #[serde(default)]
    pub(super) proxy_id: Option<String>,
    #[serde(default)]
    pub(super) zone: Option<String>,
    #[serde(default = "default_bucket_key")]
    pub(super) bucket_key: Vec<RawKeyPart>,
    #[serde(default = "default_separator")]
    pub(super) bucket_separator: String,
    #[serde(default = "default_report_interval_ms")]
    pub(super) report_interval_ms: u64,
    #[serde(default = "default_retry_after_seconds")]
    pub(super) retry_after_seconds: u32,
    #[serde(default = "default_max_buckets")]
    pub(super) max_buckets: usize,
    #[serde(default)]
    pub(super) tenant: Option<RawKeyPart>,
    #[serde(default)]
    pub(super) priority: Option<RawPriority>,
    #[serde(default = "default_directive_ttl_ms")]
    pub(super) directive_ttl_ms: u64,
    #[serde(default = "default_fallback")]
    pub(super) fallback: RawFallback,
    #[serde(default = "default_new_bucket")]
    pub(super) new_bucket: RawNewBucket,
    #[serde(default)]
    pub(super) response: RawResponse,
    #[serde(default = "default_directive_poll_ms")]
    pub(super) directive_poll_ms: u64,
    #[serde(default = "default_stream_idle_timeout_ms")]
    pub(super) stream_idle_timeout_ms: u64,
    #[serde(default)]
    pub(super) decision: RawDecision,
    // Absent: the default allowance; `null` turns it off.
    #[serde(default = "default_allowance")]
    pub(super) allowance: Option<RawAllowance>,
    #[serde(default)]
    pub(super) decision_record: RawRecordMode,
    // Absent: the default header; `null` adds none.
    #[serde(default = "default_undirected_header")]
    pub(super) undirected_header: Option<String>,
    #[serde(default = "default_upstream_sample_every")]
    pub(super) upstream_sample_every: u32,
    #[serde(default)]
    pub(super) cost_rules: Vec<RawCostRoute>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawRecordMode {
    Off,
    #[default]
    Drops,
    All,
}

pub(super) fn default_undirected_header() -> Option<String> {
    Some("x-sluice-undirected".into())
}

/// The default decision is the credit one and the allowance is on: the
/// configuration that holds a limit when the load surges while the control
/// plane is unreachable (docs/accuracy.md, "Why these defaults"). Coin
/// flips without an allowance stay available as `"decision": "coin",
/// "allowance": null`.
#[derive(Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawDecision {
    Coin,
    #[default]
    Credit,
}

pub(super) fn default_allowance() -> Option<RawAllowance> {
    let defaults = AllowanceSettings::default();
    Some(RawAllowance {
        headroom: defaults.headroom,
        burst_ms: defaults.burst_ms,
        engage: RawEngage::WhenLost,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAllowance {
    #[serde(default)]
    pub(super) headroom: f64,
    #[serde(default = "default_burst_ms")]
    pub(super) burst_ms: u64,
    #[serde(default)]
    pub(super) engage: RawEngage,
}

/// When the allowance's caps decide: by default only while the control
/// plane is lost (docs/accuracy.md, "Why these defaults").
#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawEngage {
    Always,
    #[default]
    WhenLost,
}

pub(super) fn default_burst_ms() -> u64 {
    AllowanceSettings::default().burst_ms
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawClass {
    Critical,
    Degraded,
    BestEffort,
    Bulk,
}

impl RawClass {
    pub(super) fn priority(self) -> Priority {
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
pub(super) struct RawPriority {
    #[serde(default)]
    pub(super) header: Option<String>,
    #[serde(default)]
    pub(super) values: Option<BTreeMap<String, RawClass>>,
    #[serde(default)]
    pub(super) routes: BTreeMap<String, RawClass>,
    #[serde(default = "default_class")]
    pub(super) default: RawClass,
}

pub(super) fn default_class() -> RawClass {
    RawClass::BestEffort
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawFallback {
    KeepLast,
    LocalLimit,
    Allow,
}

#[derive(Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub(super) enum RawNewBucket {
    // A struct variant, so unknown fields next to the tag are refused.
    Allow {},
    LocalLimit {
        fleet_limit_rps: f64,
        expected_proxies: u32,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawResponse {
    #[serde(default = "default_reason_header")]
    pub(super) reason_header: String,
    #[serde(default = "default_true")]
    pub(super) x_ratelimit_headers: bool,
    #[serde(default = "default_true")]
    pub(super) ietf_headers: bool,
    #[serde(default = "default_policy_name")]
    pub(super) policy_name: String,
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

pub(super) fn default_reason_header() -> String {
    "x-ratelimit-reason".into()
}
pub(super) fn default_policy_name() -> String {
    "sluice".into()
}
pub(super) fn default_true() -> bool {
    true
}
pub(super) fn default_directive_ttl_ms() -> u64 {
    DirectiveTtl::DEFAULT.as_millis()
}
pub(super) fn default_directive_poll_ms() -> u64 {
    DEFAULT_DIRECTIVE_POLL_MS
}
pub(super) fn default_stream_idle_timeout_ms() -> u64 {
    DEFAULT_STREAM_IDLE_TIMEOUT_MS
}
pub(super) fn default_upstream_sample_every() -> u32 {
    crate::settings::DEFAULT_UPSTREAM_SAMPLE_EVERY
}
pub(super) fn default_fallback() -> RawFallback {
    RawFallback::KeepLast
}
pub(super) fn default_new_bucket() -> RawNewBucket {
    RawNewBucket::Allow {}
}

#[derive(Deserialize)]
#[serde(tag = "source", rename_all = "snake_case", deny_unknown_fields)]
pub(super) enum RawKeyPart {
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

pub(super) fn default_bucket_key() -> Vec<RawKeyPart> {
    vec![RawKeyPart::Authority { default: None }]
}
pub(super) fn default_separator() -> String {
    "/".into()
}
pub(super) fn default_report_interval_ms() -> u64 {
    crate::settings::DEFAULT_REPORT_INTERVAL_MS
}
pub(super) fn default_retry_after_seconds() -> u32 {
    1
}
pub(super) fn default_max_buckets() -> usize {
    crate::settings::DEFAULT_MAX_BUCKETS
}
