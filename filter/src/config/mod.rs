//! The plugin configuration: the JSON string in Envoy's `configuration`
//! field, parsed strictly (unknown fields rejected) and validated into a
//! [`FilterConfig`]. Errors name the offending field path, e.g.
//! `report_interval_ms: must be between 50 and 60000`.

mod raw;
mod validate;

use crate::allowance::AllowanceSettings;
use crate::audit::RecordMode;
use crate::bucket_key::BucketKeySpec;
use crate::classify::Classifier;
use crate::decision::Fallback;
use crate::new_cells::NewBucketPolicy;
use crate::pacing::DecisionMode;
use crate::reject::ResponseSettings;
use raw::RawConfig;
use thiserror::Error;

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
    /// Follow every this many admitted requests to their response headers
    /// for the upstream signals (status, latency); 0: none.
    pub upstream_sample_every: u32,
    /// How a drop ratio is applied to single requests.
    pub decision: DecisionMode,
    /// The local allowance; `None`: off.
    pub allowance: Option<AllowanceSettings>,
    /// Which decisions are handed to Envoy as `wasm.sluice` filter state
    /// for access logs.
    pub decision_record: RecordMode,
    /// Request header added upstream when no fresh directive decided
    /// (lowercase); `None`: none.
    pub undirected_header: Option<String>,
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

#[cfg(test)]
mod tests;
