//! The per-VM logic: the request-path decision and the ticks that
//! reconcile this VM with the rest of the Envoy process.
//!
//! Every VM (each worker's and the main thread's) ticks every
//! `directive_poll_ms` (20 ms by default). Each tick reads one small shared
//! key, the table's sequence and freshness, and reads and decodes the table
//! only when the sequence changed: a directive reaches every VM within one
//! short tick of the leader receiving it. The rest runs at the old cadence,
//! every [`TICK_MS`]:
//! 1. lease: read the leader lease and renew, follow or try to acquire it
//!    ([`crate::tick::lease`]);
//! 2. counts: a follower hands its counts, with the span they cover, to the
//!    leader through the shared queue, but only while a leader holds a live
//!    lease (otherwise nobody drains the queue, so the counts stay local,
//!    bounded by `max_buckets`); the leader aligns them to its report
//!    windows ([`crate::leader::report_window`]);
//! 3. leader only: keep the control-plane stream open (reconnecting with
//!    backoff), publish how many VMs serve requests.
//!
//! The leader closes its report window on the first tick at or after the
//! window's end, short or slow, and sends it once every VM has handed off
//! past that end.
//!
//! The leader merges every `DirectiveBatch` it receives into its table,
//! writes the table to shared data when it changed, and stamps the batch's
//! arrival (heartbeats included) in the freshness key.
//!
//! Metrics ([`crate::metrics`]) are counted in plain fields and flushed on
//! the slow tick; the leader alone records the process-wide gauges.
//!
//! The code and the state follow the three roles: the request path in
//! `request_path.rs` (`RequestPath`: the table, the pacer, the counters and
//! the decision), keeping in step with the process in `sync.rs` (`VmSync`),
//! and the stream in `leader.rs` (`Leadership`, which only the leader has).
//! `Agent` holds one of each and the VM's identity, PRNG and metrics; what
//! the VMs exchange is [`crate::shared`].

use crate::request::path::RequestPath;
use crate::tick::sync::VmSync;

use crate::directives::DirectiveTable;
use crate::leader::counters::Outcome;
use crate::request::classify::Classifier;
use crate::request::record::LastDecision;

use crate::host::{Host, LogLevel};
use crate::identity::ProxyIdentity;
use crate::leader::process_rates::ProcessRates;
use crate::leader::report_window::ReportWindows;
use crate::leader::stream::ControlStream;
use crate::metrics::{Counter, Gauge, Metrics};
use crate::request::attributes::RequestAttributes;
use crate::request::new_cells::NewBucketPolicy;
use crate::request::reject::{RejectResponse, ResponseSettings};
use crate::tick::lease::LEASE_TTL_TICKS;
use crate::tick::pacing::DecisionMode;
use crate::upstream::UpstreamSignals;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_core::allowance::AllowanceSettings;
use sluice_core::decision::{Fallback, Regime, Verdict};
use sluice_core::directive::DirectiveTtl;
use std::sync::Arc;

/// The slow cadence: lease, hand-offs, metrics.
pub const TICK_MS: u64 = 100;
/// Default short tick: how often every VM checks for a new directive table.
pub const DEFAULT_DIRECTIVE_POLL_MS: u64 = 20;
/// How long a lease outlives its last renewal.
pub const LEASE_TTL_MS: u64 = LEASE_TTL_TICKS * TICK_MS;
/// Most queue messages the leader takes per tick: one per VM per tick
/// arrives, so this only bounds a backlog, never falls behind in steady state.
pub const MAX_DEQUEUES_PER_TICK: usize = 256;
/// Default for giving up on a control-plane stream that stays silent: ten
/// missed heartbeats of a healthy control plane.
pub const DEFAULT_STREAM_IDLE_TIMEOUT_MS: u64 = 10_000;
/// Least time between two warnings about buckets beyond `max_buckets`.
const OVERFLOW_LOG_INTERVAL_MS: u64 = 10_000;
/// While the control plane stays unreachable, warn again every this many
/// failed attempts (the others are logged at debug level).
pub(crate) const RECONNECT_WARN_EVERY: u32 = 20;
/// A slow tick is due this long after the previous one (a little less than
/// [`TICK_MS`], so short ticks that jitter do not skip a beat).
const SLOW_TICK_DUE_MS: u64 = TICK_MS - TICK_MS / 4;

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

/// What the request path does with a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Let it through (also a shadow drop).
    Admit,
    /// Answer with this prepared 429.
    Reject(Arc<RejectResponse>),
}

/// State of one VM.
#[derive(Debug)]
pub struct Agent {
    pub(crate) settings: AgentSettings,
    /// The proxy's name once known: from the start when something named
    /// it, else the one its process's instance id gives
    /// ([`crate::identity`]).
    pub(crate) name: Option<String>,
    /// Whether this VM, leading, warned that the name is made up.
    pub(crate) warned_made_up_name: bool,
    /// Identifies this VM in the lease and its hand-offs.
    pub(crate) vm_id: u64,
    pub(crate) rng: SmallRng,
    /// What the request path reads and writes.
    pub(crate) path: RequestPath,
    /// How this VM keeps in step with the rest of the process.
    pub(crate) sync: VmSync,
    pub(crate) role: Role,
    pub(crate) untracked: u64,
    pub(crate) last_overflow_log_ms: Option<u64>,
    pub(crate) metrics: Metrics,
}

#[derive(Debug)]
pub(crate) enum Role {
    Follower,
    Leader(Box<Leadership>),
}

/// What only the leader has.
#[derive(Debug)]
pub(crate) struct Leadership {
    pub(crate) stream: ControlStream,
    /// The whole process's counts, aligned to report windows.
    pub(crate) windows: ReportWindows,
    /// Workers last published.
    pub(crate) published_workers: Option<u32>,
    /// The process's recent offered rate per limited cell, published for
    /// the allowance ([`crate::leader::process_rates`]).
    pub(crate) process: ProcessRates,
    /// Since when the leader's own counts have not been added to
    /// `process`.
    pub(crate) own_counted_from_ms: u64,
    /// The process's upstream signals since the last report.
    pub(crate) upstream: UpstreamSignals,
}

impl Agent {
    /// A follower with no directives. `seed` seeds the VM's PRNG (the host
    /// passes entropy; tests pass a constant).
    pub fn new(settings: AgentSettings, seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let vm_id = rng.next_u64();
        Self {
            path: RequestPath::new(&settings),
            sync: VmSync::new(settings.directive_ttl.as_millis()),
            name: settings.proxy_id.name().map(str::to_owned),
            warned_made_up_name: false,
            settings,
            vm_id,
            rng,
            role: Role::Follower,
            untracked: 0,
            last_overflow_log_ms: None,
            metrics: Metrics::default(),
        }
    }

    /// The request path: classifies the request into its cell, decides and
    /// counts. No host calls beyond the attribute reads the classifier
    /// needs; no allocation once the cell has been seen. Values that are
    /// not UTF-8 are taken as absent and counted
    /// ([`crate::request::attributes`]).
    pub fn admit_request(
        &mut self,
        classifier: &Classifier,
        request: &impl RequestAttributes,
    ) -> Decision {
        let invalid = classifier.classify_into(request, &mut self.path.cell);
        if invalid > 0 {
            self.metrics
                .add(Counter::HeaderValuesInvalid, u64::from(invalid));
        }
        self.decide_current()
    }

    /// After an admitted request's decision: the bucket to follow the
    /// request's response under, one admitted request in
    /// `upstream_sample_every` (the host then notes when the request
    /// started and calls [`Agent::observe_response`]).
    pub fn follow_response(&mut self) -> Option<String> {
        if self.path.last.outcome == Outcome::Dropped || !self.path.responses.pick() {
            return None;
        }
        Some(self.path.cell.bucket.clone())
    }

    /// The response to a followed request of `bucket`: its HTTP `status`,
    /// `latency_us` after the request headers (`None`: not measured).
    pub fn observe_response(&mut self, bucket: &str, status: u32, latency_us: Option<u64>) {
        self.path
            .responses
            .signals
            .observe(bucket, status, latency_us);
    }

    /// Decides a request of a bucket without tenant or priority.
    pub fn admit(&mut self, bucket: &str) -> Verdict {
        self.path.cell.bucket.clear();
        self.path.cell.bucket.push_str(bucket);
        self.path.cell.tenant.clear();
        self.path.cell.priority = Default::default();
        match self.decide_current() {
            Decision::Admit => Verdict::Admit,
            Decision::Reject(_) => Verdict::Drop,
        }
    }

    /// Decides a request of the cell (`bucket`, `tenant`, `priority`).
    pub fn admit_cell(
        &mut self,
        bucket: &str,
        tenant: &str,
        priority: sluice_core::Priority,
    ) -> Decision {
        self.path.cell.bucket.clear();
        self.path.cell.bucket.push_str(bucket);
        self.path.cell.tenant.clear();
        self.path.cell.tenant.push_str(tenant);
        self.path.cell.priority = priority;
        self.decide_current()
    }

    pub(crate) fn decide_current(&mut self) -> Decision {
        self.path
            .decide(&self.sync, &mut self.metrics, &mut self.rng)
    }

    /// What the last request's decision was, for its record and the
    /// upstream header.
    pub fn last_decision(&self) -> &LastDecision {
        &self.path.last
    }

    /// The last request's record ([`crate::request::record`]), written into a buffer
    /// the VM reuses.
    pub fn last_record(&mut self) -> &str {
        self.path.last.write(
            &mut self.path.record,
            &self.path.cell.bucket,
            &self.path.cell.tenant,
            self.path.cell.priority,
        );
        &self.path.record
    }

    /// Replaces the directive table, as if it had arrived fresh at the last
    /// tick: for simulations and benchmarks, which have no host. Envoy's
    /// VMs take the table from shared data.
    pub fn load_directives(&mut self, mut table: DirectiveTable) {
        table.adopt_state(&mut self.path.directives);
        self.path.directives = table;
        self.path.pace_directives();
        self.sync.freshness.received_at_ms = Some(self.path.clock_ms);
        self.path.regime = Regime::Fresh;
    }

    /// The name the proxy reports as; `None` until an unnamed proxy's
    /// first leader has drawn its process's instance id.
    pub fn proxy_name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Whether this VM currently owns the control-plane stream.
    pub fn is_leader(&self) -> bool {
        matches!(self.role, Role::Leader(_))
    }

    /// Metric counts not flushed yet.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The directives this VM enforces.
    pub fn directives(&self) -> &DirectiveTable {
        &self.path.directives
    }

    /// Whether the configured fallback applies (directives past their TTL).
    pub fn in_fallback(&self) -> bool {
        matches!(self.path.regime, Regime::Stale(_))
    }

    /// VMs of this proxy sharing local limits, as last published.
    pub fn workers(&self) -> u32 {
        self.sync.workers
    }

    /// Runs one tick at `now_ms` (Unix milliseconds): the directive check
    /// and the leader's report window always, the rest when a slow tick is
    /// due.
    pub fn on_tick(&mut self, host: &mut impl Host, now_ms: u64) {
        if self.name.is_none() {
            self.learn_process_name(host);
        }
        self.path.clock_ms = now_ms;
        self.path.close_pacer_window(now_ms, &mut self.rng);
        self.poll_directives(host, now_ms);
        let slow_due = self
            .sync
            .last_slow_ms
            .is_none_or(|last| now_ms.saturating_sub(last) >= SLOW_TICK_DUE_MS);
        if slow_due {
            self.slow_tick(host, now_ms);
            return;
        }
        match std::mem::replace(&mut self.role, Role::Follower) {
            Role::Leader(mut leadership) => {
                self.report_due_window(host, &mut leadership, now_ms);
                self.role = Role::Leader(leadership);
            }
            Role::Follower => self.hand_off_for_closed_window(host, now_ms),
        }
    }

    pub(crate) fn slow_tick(&mut self, host: &mut impl Host, now_ms: u64) {
        // Counts of a VM that has not handed off yet cover at most the
        // time since its previous slow tick.
        if self.sync.handoff_from_ms.is_none() {
            self.sync.handoff_from_ms = self.sync.last_slow_ms;
        }
        self.sync.last_slow_ms = Some(now_ms);
        self.ensure_queue(host);
        let leader_alive = self.run_lease(host, now_ms);
        self.sync.leader_alive = leader_alive;
        match std::mem::replace(&mut self.role, Role::Follower) {
            Role::Leader(mut leadership) => {
                self.lead(host, &mut leadership, now_ms);
                self.role = Role::Leader(leadership);
            }
            Role::Follower if leader_alive => {
                self.hand_counts_to_leader(host, now_ms);
                self.read_workers(host);
                self.read_process_rates(host);
            }
            // No leader to drain the queue: keep counting locally.
            Role::Follower => {}
        }
        self.log_overflow(host, now_ms);
        self.flush_metrics(host, now_ms);
    }

    /// Flushes counter deltas; the leader also records the gauges, so VMs
    /// ticking at different moments do not overwrite each other.
    pub(crate) fn flush_metrics(&mut self, host: &mut impl Host, now_ms: u64) {
        if !self.is_leader() {
            self.metrics.flush(host, &[]);
            return;
        }
        let cells = u64::try_from(self.path.directives.len()).unwrap_or(u64::MAX);
        let shedding = u64::try_from(self.path.directives.shedding()).unwrap_or(u64::MAX);
        self.metrics.flush(
            host,
            &[
                (Gauge::DirectiveAgeMs, self.sync.freshness.age_ms(now_ms)),
                (Gauge::DirectiveBuckets, shedding),
                (Gauge::DirectiveCells, cells),
                (Gauge::FallbackActive, u64::from(self.in_fallback())),
                (Gauge::Workers, u64::from(self.sync.workers)),
            ],
        );
    }

    /// Releases what this VM holds before it goes away or is replaced.
    pub fn shut_down(&mut self, host: &mut impl Host) {
        self.step_down(host);
        // Counts since the last tick would otherwise vanish with the VM.
        self.metrics.flush(host, &[]);
    }

    pub(crate) fn log_overflow(&mut self, host: &impl Host, now_ms: u64) {
        let mut untracked = self.path.cells.take_untracked();
        if let Role::Leader(leadership) = &mut self.role {
            untracked = untracked.saturating_add(leadership.windows.take_untracked());
        }
        self.metrics.add(Counter::RequestsUncounted, untracked);
        self.untracked = self.untracked.saturating_add(untracked);
        let due = self
            .last_overflow_log_ms
            .is_none_or(|last| now_ms.saturating_sub(last) >= OVERFLOW_LOG_INTERVAL_MS);
        if self.untracked > 0 && due {
            host.log(
                LogLevel::Warn,
                &format!(
                    "{} requests were not counted: more than max_buckets ({}) buckets",
                    self.untracked, self.settings.max_buckets
                ),
            );
            self.untracked = 0;
            self.last_overflow_log_ms = Some(now_ms);
        }
    }
}

#[cfg(test)]
mod tests;
