//! What an agent is configured with ([`AgentSettings`]), its defaults, and
//! the cadences every role keeps.

use crate::identity::ProxyIdentity;
use crate::request::new_cells::NewBucketPolicy;
use crate::request::reject::ResponseSettings;
use sluice_core::allowance::AllowanceSettings;
use sluice_core::decision::DecisionMode;
use sluice_core::directive::DirectiveTtl;
use sluice_core::regime::Fallback;
use std::sync::Arc;

/// The slow cadence: lease, hand-offs, metrics, and the rate slots of the
/// cells' decision state.
pub const TICK_MS: u64 = 100;
/// Default short tick: how often every VM checks for a new directive table.
pub const DEFAULT_DIRECTIVE_POLL_MS: u64 = 20;
/// Default for giving up on a control-plane stream that stays silent: ten
/// missed heartbeats of a healthy control plane.
pub const DEFAULT_STREAM_IDLE_TIMEOUT_MS: u64 = 10_000;

/// Default [`AgentSettings::upstream_sample_every`]: one admitted request
/// in four is followed to its response, which keeps the two clock reads
/// and the status read off most requests and still gives a p99 from a few
/// hundred samples per bucket and control interval at a few hundred
/// requests per second.
pub const DEFAULT_UPSTREAM_SAMPLE_EVERY: u32 = 4;

/// Default [`AgentSettings::report_interval_ms`].
pub const DEFAULT_REPORT_INTERVAL_MS: u64 = 250;

/// Default [`AgentSettings::max_buckets`].
pub const DEFAULT_MAX_BUCKETS: usize = 10_000;

/// What the agent needs from the configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSettings {
    /// Envoy cluster of the control plane.
    pub control_plane_cluster: String,
    /// Identity sent in `Hello`; also decides canary membership.
    pub proxy_id: ProxyIdentity,
    /// Failure domain sent in `Hello`; empty when unknown.
    pub zone: String,
    /// Milliseconds between reports.
    pub report_interval_ms: u64,
    /// Cap on cells counted and directives held.
    pub max_buckets: usize,
    /// TTL of the directives when batches name none.
    pub directive_ttl: DirectiveTtl,
    /// What applies once the directives are stale.
    pub fallback: Fallback,
    /// What applies to cells without a directive.
    pub new_bucket: NewBucketPolicy,
    /// How 429 responses are rendered.
    pub responses: Arc<ResponseSettings>,
    /// Give up on a stream that delivered nothing for this long.
    pub stream_idle_timeout_ms: u64,
    /// How a drop ratio is applied to single requests.
    pub decision: DecisionMode,
    /// The local allowance; `None`: off.
    pub allowance: Option<AllowanceSettings>,
    /// Follow every this many admitted requests to their response for the
    /// upstream signals ([`crate::upstream`]); 0: none.
    pub upstream_sample_every: u32,
}

impl AgentSettings {
    /// The settings of a configuration that names only the cluster and the
    /// proxy: every other field at the configuration's default (a unit test
    /// in `config` holds the two together).
    pub fn new(control_plane_cluster: &str, proxy_id: &str) -> Self {
        Self {
            control_plane_cluster: control_plane_cluster.into(),
            proxy_id: ProxyIdentity::Named(proxy_id.into()),
            zone: String::new(),
            report_interval_ms: DEFAULT_REPORT_INTERVAL_MS,
            max_buckets: DEFAULT_MAX_BUCKETS,
            directive_ttl: DirectiveTtl::DEFAULT,
            fallback: Fallback::KeepLast,
            new_bucket: NewBucketPolicy::Allow,
            responses: Arc::new(ResponseSettings::default()),
            stream_idle_timeout_ms: DEFAULT_STREAM_IDLE_TIMEOUT_MS,
            decision: DecisionMode::default(),
            allowance: Some(AllowanceSettings::default()),
            upstream_sample_every: DEFAULT_UPSTREAM_SAMPLE_EVERY,
        }
    }
}
