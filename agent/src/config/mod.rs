//! The plugin configuration: the JSON string in Envoy's `configuration`
//! field, parsed strictly (unknown fields rejected) and validated into a
//! [`FilterConfig`]. Errors name the offending field path, e.g.
//! `report_interval_ms: must be between 50 and 60000`.

mod raw;
mod validate;

use std::sync::Arc;

use crate::identity::ProxyIdentity;
use crate::request::classify::BucketKeySpec;
use crate::request::classify::Classifier;
use crate::request::new_cells::NewBucketPolicy;
use crate::request::record::RecordMode;
use crate::request::reject::ResponseSettings;
use crate::settings::AgentSettings;
use crate::tick::pacing::DecisionMode;
use crate::usage::rules::CostRules;
use raw::RawConfig;
use sluice_core::allowance::AllowanceSettings;
use sluice_core::directive::DirectiveTtl;
use sluice_core::regime::Fallback;
use thiserror::Error;

/// The validated plugin configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterConfig {
    /// Envoy cluster (HTTP/2) of the control plane.
    pub control_plane_cluster: String,
    /// Identity sent in `Hello`; `None` means "use the Envoy node id, else
    /// a name of the process's own" ([`crate::identity`]).
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
    pub directive_ttl: DirectiveTtl,
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
    /// The cost rules of routes and buckets (empty: no request has a
    /// cost).
    pub costs: CostRules,
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

impl FilterConfig {
    /// Splits the configuration between what uses it, so that every data
    /// plane builds its agent alike. `proxy_id` and `zone` name the proxy
    /// where the configuration does not (the Envoy node, the process, or
    /// the native module's host).
    pub fn into_parts(
        self,
        proxy_id: impl FnOnce() -> ProxyIdentity,
        zone: impl FnOnce() -> String,
    ) -> ConfigParts {
        ConfigParts {
            agent: AgentSettings {
                control_plane_cluster: self.control_plane_cluster,
                proxy_id: self.proxy_id.map_or_else(proxy_id, ProxyIdentity::Named),
                zone: self.zone.unwrap_or_else(zone),
                report_interval_ms: self.report_interval_ms,
                max_buckets: self.max_buckets,
                directive_ttl: self.directive_ttl,
                fallback: self.fallback,
                new_bucket: self.new_bucket,
                responses: Arc::new(self.response),
                stream_idle_timeout_ms: self.stream_idle_timeout_ms,
                upstream_sample_every: self.upstream_sample_every,
                decision: self.decision,
                allowance: self.allowance,
            },
            request: RequestPolicy {
                classifier: self.classifier,
                decision_record: self.decision_record,
                undirected_header: self.undirected_header,
                costs: self.costs,
            },
            directive_poll_ms: self.directive_poll_ms,
        }
    }
}

/// What every request of a configured filter reads besides its agent: how
/// it maps to a cell, and what the filter tells Envoy of the decision.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestPolicy {
    /// How requests map to cells.
    pub classifier: Classifier,
    /// Which decisions are handed to Envoy for access logs.
    pub decision_record: RecordMode,
    /// Request header added upstream when no fresh directive decided.
    pub undirected_header: Option<String>,
    /// Which requests have a cost, and how they are charged.
    pub costs: CostRules,
}

/// A validated configuration split between its users
/// ([`FilterConfig::into_parts`]).
#[derive(Debug)]
pub struct ConfigParts {
    /// The agent's settings.
    pub agent: AgentSettings,
    /// What each request reads.
    pub request: RequestPolicy,
    /// How often the host ticks the agent (the short tick).
    pub directive_poll_ms: u64,
}

#[cfg(test)]
mod tests;
