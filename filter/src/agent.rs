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
//!    ([`crate::lease`]);
//! 2. counts: a follower hands its counts, with the span they cover, to the
//!    leader through the shared queue, but only while a leader holds a live
//!    lease (otherwise nobody drains the queue, so the counts stay local,
//!    bounded by `max_buckets`); the leader aligns them to its report
//!    windows ([`crate::report_window`]);
//! 3. leader only: keep the control-plane stream open (reconnecting with
//!    backoff), send one `Report` per report window, publish how many VMs
//!    serve requests.
//!
//! The leader merges every `DirectiveBatch` it receives into its table,
//! writes the table to shared data when it changed, and stamps the batch's
//! arrival (heartbeats included) in the freshness key.
//!
//! Metrics ([`crate::metrics`]) are counted in plain fields and flushed on
//! the slow tick; the leader alone records the process-wide gauges.

use crate::allowance::{AllowanceSettings, DirectiveRates};
use crate::bucket_key::RequestAttributes;
use crate::cell::CellKeyBuf;
use crate::cell::key_of;
use crate::classify::Classifier;
use crate::counters::{BucketCounters, Outcome};
use crate::decision::{Fallback, Local, Regime, Verdict, decide_cell};
use crate::directives::DirectiveTable;
use crate::freshness::{DirectivesMeta, Freshness};
use crate::host_api::{Host, LogLevel};
use crate::lease::{LEASE_TTL_TICKS, Lease, LeaseStep, next_step};
use crate::metrics::{Counter, Gauge, Metrics};
use crate::new_cells::{NewBucketPolicy, NewCells};
use crate::pacing::{DecisionMode, Pacer};
use crate::reject::{DropReason, RejectResponse, ResponseSettings};
use crate::report_window::{Handoff, ReportWindows};
use crate::shared_keys::{
    COUNTS_QUEUE, DIRECTIVES_KEY, DIRECTIVES_META_KEY, INSTANCE_ID_KEY, LEASE_KEY, WORKERS_KEY,
};
use crate::stream::{ControlStream, Reconnect};
use prost::Message;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_proto::v1::{
    ControlMessage, DirectiveBatch, Hello, ProxyMessage, Report, control_message, proxy_message,
};
use std::sync::Arc;

/// The slow cadence: lease, hand-offs, reports, metrics.
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
/// Default TTL of the directives when batches name none.
pub const DEFAULT_DIRECTIVE_TTL_MS: u64 = 90_000;
/// Least time between two warnings about buckets beyond `max_buckets`.
const OVERFLOW_LOG_INTERVAL_MS: u64 = 10_000;
/// While the control plane stays unreachable, warn again every this many
/// failed attempts (the others are logged at debug level).
const RECONNECT_WARN_EVERY: u32 = 20;
/// A slow tick is due this long after the previous one (a little less than
/// [`TICK_MS`], so short ticks that jitter do not skip a beat).
const SLOW_TICK_DUE_MS: u64 = TICK_MS - TICK_MS / 4;

/// What the agent needs from the configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSettings {
    /// Envoy cluster of the control plane.
    pub control_plane_cluster: String,
    /// Identity sent in `Hello`; also decides canary membership.
    pub proxy_id: String,
    /// Failure domain sent in `Hello`; empty when unknown.
    pub zone: String,
    /// Milliseconds between reports.
    pub report_interval_ms: u64,
    /// Cap on cells counted and directives held.
    pub max_buckets: usize,
    /// TTL of the directives when batches name none.
    pub directive_ttl_ms: u64,
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
}

impl AgentSettings {
    /// Settings with every optional behaviour at its default.
    pub fn new(control_plane_cluster: &str, proxy_id: &str) -> Self {
        Self {
            control_plane_cluster: control_plane_cluster.into(),
            proxy_id: proxy_id.into(),
            zone: String::new(),
            report_interval_ms: 250,
            max_buckets: 10_000,
            directive_ttl_ms: DEFAULT_DIRECTIVE_TTL_MS,
            fallback: Fallback::KeepLast,
            new_bucket: NewBucketPolicy::Allow,
            responses: Arc::new(ResponseSettings::default()),
            stream_idle_timeout_ms: DEFAULT_STREAM_IDLE_TIMEOUT_MS,
            decision: DecisionMode::Coin,
            allowance: None,
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
    settings: AgentSettings,
    /// Identifies this VM in the lease and its hand-offs.
    vm_id: u64,
    rng: SmallRng,
    /// Requests counted on this VM and not yet handed on.
    local: BucketCounters,
    directives: DirectiveTable,
    /// Per-cell decision state: credit balances and local allowances.
    pacer: Pacer,
    /// When the pacer's next 100 ms window closes.
    pacer_due_ms: Option<u64>,
    new_cells: NewCells,
    /// Sequence of the shared table last decoded (or written).
    directives_sequence: Option<u64>,
    freshness: Freshness,
    regime: Regime,
    /// The request's cell, built in reused buffers.
    cell: CellKeyBuf,
    /// The VM's clock as of its last tick (the request path reads no clock).
    clock_ms: u64,
    last_slow_ms: Option<u64>,
    /// End of the span the next hand-off starts at.
    handoff_from_ms: Option<u64>,
    handed_off_last: bool,
    workers: u32,
    queue_id: Option<u32>,
    role: Role,
    untracked: u64,
    last_overflow_log_ms: Option<u64>,
    metrics: Metrics,
}

#[derive(Debug)]
enum Role {
    Follower,
    Leader(Box<Leadership>),
}

/// What only the leader has.
#[derive(Debug)]
struct Leadership {
    stream: ControlStream,
    /// The whole process's counts, aligned to report windows.
    windows: ReportWindows,
    /// Workers last published.
    published_workers: Option<u32>,
}

impl Agent {
    /// A follower with no directives. `seed` seeds the VM's PRNG (the host
    /// passes entropy; tests pass a constant).
    pub fn new(settings: AgentSettings, seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let vm_id = rng.next_u64();
        Self {
            local: BucketCounters::new(settings.max_buckets),
            directives: DirectiveTable::with_settings(
                settings.max_buckets,
                Arc::clone(&settings.responses),
                &settings.proxy_id,
            ),
            pacer: Pacer::new(
                settings.decision,
                settings.allowance,
                TICK_MS,
                settings.max_buckets,
            ),
            pacer_due_ms: None,
            new_cells: NewCells::new(
                settings.new_bucket,
                settings.max_buckets,
                Arc::clone(&settings.responses),
            ),
            freshness: Freshness {
                received_at_ms: None,
                ttl_ms: settings.directive_ttl_ms,
            },
            settings,
            vm_id,
            rng,
            directives_sequence: None,
            regime: Regime::Fresh,
            cell: CellKeyBuf::default(),
            clock_ms: 0,
            last_slow_ms: None,
            handoff_from_ms: None,
            handed_off_last: false,
            workers: 1,
            queue_id: None,
            role: Role::Follower,
            untracked: 0,
            last_overflow_log_ms: None,
            metrics: Metrics::default(),
        }
    }

    /// The request path: classifies the request into its cell, decides and
    /// counts. No host calls beyond the attribute reads the classifier
    /// needs; no allocation once the cell has been seen.
    pub fn admit_request(
        &mut self,
        classifier: &Classifier,
        request: &impl RequestAttributes,
    ) -> Decision {
        classifier.classify_into(request, &mut self.cell);
        self.decide_current()
    }

    /// Decides a request of a bucket without tenant or priority.
    pub fn admit(&mut self, bucket: &str) -> Verdict {
        self.cell.bucket.clear();
        self.cell.bucket.push_str(bucket);
        self.cell.tenant.clear();
        self.cell.priority = Default::default();
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
        priority: sluice_proto::v1::Priority,
    ) -> Decision {
        self.cell.bucket.clear();
        self.cell.bucket.push_str(bucket);
        self.cell.tenant.clear();
        self.cell.tenant.push_str(tenant);
        self.cell.priority = priority;
        self.decide_current()
    }

    fn decide_current(&mut self) -> Decision {
        let wide = self.cell.is_bucket_wide();
        let (exact, bucket) = self.cell.keys();
        let local = Local {
            now_ms: self.clock_ms,
            workers: self.workers,
        };
        // A cell counted earlier in this window remembers its directive:
        // one probe (the counter's) instead of one or two more.
        let generation = self.directives.generation();
        let mut slot = self.local.slot_mut(exact);
        let found = match slot.as_deref().and_then(|slot| slot.directive(generation)) {
            Some(found) => found,
            None => {
                let found = self.directives.find((!wide).then_some(exact), bucket);
                if let Some(slot) = slot.as_deref_mut() {
                    slot.remember(generation, found);
                }
                found
            }
        };
        let (reason, enforce, response) = match found.and_then(|i| self.directives.entry_mut(i)) {
            Some(entry) => match decide_cell(
                entry,
                self.regime,
                local,
                &mut self.pacer,
                exact,
                &mut self.rng,
            ) {
                None => (None, false, None),
                Some(reason) => {
                    let response = if reason == DropReason::FallbackLimit {
                        &entry.fallback_response
                    } else {
                        &entry.response
                    };
                    (Some(reason), entry.enforce, Some(Arc::clone(response)))
                }
            },
            None => match self.new_cells.decide(exact, local.now_ms, local.workers) {
                None => (None, false, None),
                Some((reason, response)) => (
                    Some(reason),
                    self.directives.modes().enforces_local(),
                    Some(response),
                ),
            },
        };
        let (outcome, decision) = match (reason, response) {
            (Some(_), Some(response)) if enforce => (Outcome::Dropped, Decision::Reject(response)),
            (Some(_), _) => (Outcome::ShadowDropped, Decision::Admit),
            (None, _) => (Outcome::Admitted, Decision::Admit),
        };
        match slot {
            Some(slot) => slot.count(outcome),
            None => self.local.record_cell(exact, outcome),
        }
        self.metrics.count_decision(outcome, reason);
        decision
    }

    /// Replaces the directive table, as if it had arrived fresh at the last
    /// tick: for simulations and benchmarks, which have no host. Envoy's
    /// VMs take the table from shared data.
    pub fn load_directives(&mut self, mut table: DirectiveTable) {
        table.adopt_state(&mut self.directives);
        self.directives = table;
        self.pace_directives();
        self.freshness.received_at_ms = Some(self.clock_ms);
        self.regime = Regime::Fresh;
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
        &self.directives
    }

    /// Whether the configured fallback applies (directives past their TTL).
    pub fn in_fallback(&self) -> bool {
        matches!(self.regime, Regime::Stale(_))
    }

    /// VMs of this proxy sharing local limits, as last published.
    pub fn workers(&self) -> u32 {
        self.workers
    }

    /// Runs one tick at `now_ms` (Unix milliseconds): the directive check
    /// always, the rest when a slow tick is due.
    pub fn on_tick(&mut self, host: &mut impl Host, now_ms: u64) {
        self.clock_ms = now_ms;
        self.close_pacer_window(now_ms);
        self.poll_directives(host, now_ms);
        let slow_due = self
            .last_slow_ms
            .is_none_or(|last| now_ms.saturating_sub(last) >= SLOW_TICK_DUE_MS);
        if slow_due {
            self.slow_tick(host, now_ms);
        }
    }

    /// Closes the pacer's rate window every [`TICK_MS`] of clock, whatever
    /// the tick period, so its per-window counts are rates. Counts are
    /// taken before the slow tick hands them on.
    fn close_pacer_window(&mut self, now_ms: u64) {
        self.pacer.advance_clock(now_ms);
        let due = *self.pacer_due_ms.get_or_insert(now_ms);
        if now_ms < due {
            return;
        }
        self.pacer
            .on_tick(now_ms, self.local.buckets(), &mut self.rng);
        // After a stall, restart the cadence rather than closing a burst of
        // empty windows.
        let next = due.saturating_add(TICK_MS);
        self.pacer_due_ms = Some(if next <= now_ms {
            now_ms.saturating_add(TICK_MS)
        } else {
            next
        });
    }

    /// Lets the pacer derive allowances of cells whose directive changed.
    fn pace_directives(&mut self) {
        for entry in self.directives.entries() {
            let wire = entry.wire();
            let priority = sluice_proto::v1::Priority::try_from(wire.priority)
                .unwrap_or(sluice_proto::v1::Priority::Unspecified);
            let rates = DirectiveRates {
                drop_ratio: entry.directive.drop_ratio,
                limit_rps: entry.directive.stated_limit_rps(),
                fleet_offered_rps: entry.directive.offered_rps,
            };
            self.pacer
                .apply_cell(&key_of(&wire.bucket, &wire.tenant, priority), rates);
        }
    }

    fn slow_tick(&mut self, host: &mut impl Host, now_ms: u64) {
        // Counts of a VM that has not handed off yet cover at most the
        // time since its previous slow tick.
        if self.handoff_from_ms.is_none() {
            self.handoff_from_ms = self.last_slow_ms;
        }
        self.last_slow_ms = Some(now_ms);
        self.ensure_queue(host);
        let leader_alive = self.run_lease(host, now_ms);
        match std::mem::replace(&mut self.role, Role::Follower) {
            Role::Leader(mut leadership) => {
                self.lead(host, &mut leadership, now_ms);
                self.role = Role::Leader(leadership);
            }
            Role::Follower if leader_alive => {
                self.hand_counts_to_leader(host, now_ms);
                self.read_workers(host);
            }
            // No leader to drain the queue: keep counting locally.
            Role::Follower => {}
        }
        self.log_overflow(host, now_ms);
        self.flush_metrics(host, now_ms);
    }

    /// Flushes counter deltas; the leader also records the gauges, so VMs
    /// ticking at different moments do not overwrite each other.
    fn flush_metrics(&mut self, host: &mut impl Host, now_ms: u64) {
        if !self.is_leader() {
            self.metrics.flush(host, &[]);
            return;
        }
        let cells = u64::try_from(self.directives.len()).unwrap_or(u64::MAX);
        let shedding = u64::try_from(self.directives.shedding()).unwrap_or(u64::MAX);
        self.metrics.flush(
            host,
            &[
                (Gauge::DirectiveAgeMs, self.freshness.age_ms(now_ms)),
                (Gauge::DirectiveBuckets, shedding),
                (Gauge::DirectiveCells, cells),
                (Gauge::FallbackActive, u64::from(self.in_fallback())),
                (Gauge::Workers, u64::from(self.workers)),
            ],
        );
    }

    /// A message arrived on stream `token` at `now_ms`.
    pub fn on_stream_message(
        &mut self,
        host: &mut impl Host,
        token: u32,
        message: &[u8],
        now_ms: u64,
    ) {
        let Role::Leader(leadership) = &mut self.role else {
            host.log(
                LogLevel::Debug,
                &format!("ignoring message on stream {token}: not the leader"),
            );
            return;
        };
        if !leadership.stream.received(token, now_ms) {
            host.log(
                LogLevel::Debug,
                &format!("ignoring message on abandoned stream {token}"),
            );
            return;
        }
        match ControlMessage::decode(message) {
            Ok(ControlMessage {
                kind: Some(control_message::Kind::Directives(batch)),
            }) => {
                self.apply_batch(host, batch, now_ms);
            }
            Ok(ControlMessage { kind: None }) => {
                host.log(
                    LogLevel::Debug,
                    "ignoring control message of an unknown kind",
                );
            }
            Err(err) => {
                host.log(
                    LogLevel::Warn,
                    &format!("undecodable control message: {err}"),
                );
            }
        }
    }

    /// The host closed stream `token` with gRPC `status`.
    pub fn on_stream_close(&mut self, host: &mut impl Host, token: u32, status: u32, now_ms: u64) {
        let Role::Leader(leadership) = &mut self.role else {
            return;
        };
        if let Some(reconnect) = leadership.stream.closed(token, now_ms, &mut self.rng) {
            // Reports in flight on a closed stream may be lost.
            self.metrics.add(Counter::ReportsFailed, 1);
            let what = format!("control-plane stream closed with gRPC status {status}");
            log_reconnect(host, &self.settings.control_plane_cluster, &what, reconnect);
        }
    }

    /// Releases what this VM holds before it goes away or is replaced.
    pub fn shut_down(&mut self, host: &mut impl Host) {
        self.step_down(host);
        // Counts since the last tick would otherwise vanish with the VM.
        self.metrics.flush(host, &[]);
    }

    fn ensure_queue(&mut self, host: &mut impl Host) {
        if self.queue_id.is_some() {
            return;
        }
        match host.register_shared_queue(COUNTS_QUEUE) {
            Ok(id) => self.queue_id = Some(id),
            Err(err) => host.log(
                LogLevel::Warn,
                &format!("cannot register the counts queue: {err}"),
            ),
        }
    }

    /// Runs the lease step; returns whether some VM holds a live lease.
    fn run_lease(&mut self, host: &mut impl Host, now_ms: u64) -> bool {
        let (current, cas) = match host.get_shared_data(LEASE_KEY) {
            Ok(Some(value)) => (Lease::decode(&value.bytes), Some(value.cas)),
            Ok(None) => (None, None),
            Err(err) => {
                host.log(
                    LogLevel::Warn,
                    &format!("cannot read the leader lease: {err}"),
                );
                self.step_down(host);
                return false;
            }
        };
        let mine = Lease {
            holder: self.vm_id,
            expires_at_ms: now_ms.saturating_add(LEASE_TTL_MS),
        };
        match next_step(current, self.vm_id, now_ms) {
            LeaseStep::Renew => match host.set_shared_data(LEASE_KEY, &mine.encode(), cas) {
                Ok(()) => {
                    self.become_leader(host, now_ms);
                    true
                }
                Err(err) => {
                    // Another VM took the expired lease between read and write.
                    host.log(LogLevel::Debug, &format!("lease renewal failed: {err}"));
                    self.step_down(host);
                    false
                }
            },
            LeaseStep::Follow => {
                self.step_down(host);
                true
            }
            LeaseStep::Acquire => {
                self.step_down(host);
                if let Err(err) = host.set_shared_data(LEASE_KEY, &mine.encode(), cas) {
                    host.log(LogLevel::Debug, &format!("lease acquisition failed: {err}"));
                }
                false
            }
        }
    }

    fn become_leader(&mut self, host: &impl Host, now_ms: u64) {
        if self.is_leader() {
            return;
        }
        host.log(LogLevel::Info, "this VM now owns the control-plane stream");
        self.role = Role::Leader(Box::new(Leadership {
            stream: ControlStream::new(),
            windows: ReportWindows::new(self.settings.max_buckets, now_ms),
            published_workers: None,
        }));
    }

    fn step_down(&mut self, host: &mut impl Host) {
        let Role::Leader(mut leadership) = std::mem::replace(&mut self.role, Role::Follower) else {
            return;
        };
        host.log(
            LogLevel::Info,
            "this VM no longer owns the control-plane stream",
        );
        if let Some(token) = leadership.stream.shut_down()
            && let Err(err) = host.close_stream(token)
        {
            host.log(LogLevel::Debug, &format!("closing stream {token}: {err}"));
        }
        // Keep the windows' counts: they go to the next leader.
        leadership.windows.drain_all().move_into(&mut self.local);
    }

    /// The short-tick check: one small read; the table only if it changed.
    fn poll_directives(&mut self, host: &mut impl Host, now_ms: u64) {
        let meta = match host.get_shared_data(DIRECTIVES_META_KEY) {
            Ok(Some(value)) => DirectivesMeta::decode(&value.bytes),
            Ok(None) => None,
            Err(err) => {
                host.log(
                    LogLevel::Debug,
                    &format!("cannot read directive freshness: {err}"),
                );
                None
            }
        };
        if let Some(meta) = meta {
            if self.directives_sequence != Some(meta.sequence) {
                self.read_table(host, meta.sequence);
            }
            self.freshness.received_at_ms = Some(meta.received_at_ms);
            self.freshness.ttl_ms = effective_ttl(meta.ttl_ms, self.settings.directive_ttl_ms);
        }
        self.update_regime(host, now_ms);
    }

    fn read_table(&mut self, host: &mut impl Host, sequence: u64) {
        let value = match host.get_shared_data(DIRECTIVES_KEY) {
            Ok(Some(value)) => value,
            Ok(None) => return,
            Err(err) => {
                host.log(LogLevel::Debug, &format!("cannot read directives: {err}"));
                return;
            }
        };
        // Remember the sequence even if decoding fails, so a bad blob costs
        // one warning rather than one per tick; the last good table stays.
        self.directives_sequence = Some(sequence);
        match DirectiveTable::decode_with(&value.bytes, self.directives.empty_like()) {
            Ok((mut table, outcome)) => {
                if outcome.rejected > 0 {
                    host.log(
                        LogLevel::Warn,
                        &format!(
                            "shared directive table had {} invalid entries",
                            outcome.rejected
                        ),
                    );
                }
                table.adopt_state(&mut self.directives);
                self.directives = table;
                self.pace_directives();
            }
            Err(err) => host.log(
                LogLevel::Warn,
                &format!("keeping last-known directives: {err}"),
            ),
        }
    }

    /// Moves between fresh and fallback; the leader logs and counts each
    /// transition once for the process.
    fn update_regime(&mut self, host: &mut impl Host, now_ms: u64) {
        let regime = self.freshness.regime(now_ms, self.settings.fallback);
        if regime == self.regime {
            return;
        }
        let was_stale = matches!(self.regime, Regime::Stale(_));
        self.regime = regime;
        let stale = matches!(regime, Regime::Stale(_));
        if stale == was_stale {
            return;
        }
        let level = if self.is_leader() {
            LogLevel::Warn
        } else {
            LogLevel::Debug
        };
        let age = self.freshness.age_ms(now_ms);
        if stale {
            if self.is_leader() {
                self.metrics.add(Counter::FallbackEntered, 1);
            }
            host.log(
                level,
                &format!(
                    "directives are stale ({age} ms since the last batch, TTL {} ms): fallback {} applies",
                    self.freshness.ttl_ms,
                    fallback_name(self.settings.fallback)
                ),
            );
        } else {
            host.log(
                if self.is_leader() {
                    LogLevel::Info
                } else {
                    LogLevel::Debug
                },
                "directives are fresh again: leaving the fallback",
            );
        }
    }

    fn hand_counts_to_leader(&mut self, host: &mut impl Host, now_ms: u64) {
        let Some(queue_id) = self.queue_id else {
            return;
        };
        let from_ms = self.handoff_from_ms.unwrap_or(now_ms);
        if self.local.is_empty() && !self.handed_off_last {
            // Nothing counted since `now_ms`: the next span starts here.
            self.handoff_from_ms = Some(now_ms);
            return;
        }
        let handoff = Handoff {
            source: self.vm_id,
            start_ms: from_ms,
            end_ms: now_ms,
            counts: self.local.drain(),
        };
        let had_counts = !handoff.counts.is_empty();
        if let Err(err) = host.enqueue_shared_queue(queue_id, &handoff.encode_to_vec()) {
            host.log(LogLevel::Warn, &format!("cannot enqueue counts: {err}"));
            self.local.merge(handoff.counts);
            return;
        }
        self.handoff_from_ms = Some(now_ms);
        // One empty hand-off after traffic tells the leader this VM is
        // idle, so it need not wait for it at the next window's end.
        self.handed_off_last = had_counts;
    }

    fn read_workers(&mut self, host: &mut impl Host) {
        if let Ok(Some(value)) = host.get_shared_data(WORKERS_KEY)
            && let Ok(bytes) = <[u8; 4]>::try_from(value.bytes.as_slice())
        {
            self.workers = u32::from_le_bytes(bytes).max(1);
        }
    }

    fn lead(&mut self, host: &mut impl Host, leadership: &mut Leadership, now_ms: u64) {
        leadership.windows.add_own(&mut self.local, now_ms);
        self.drain_queue(host, leadership, now_ms);
        self.publish_workers(host, leadership, now_ms);
        self.abandon_silent_stream(host, leadership, now_ms);
        if leadership.stream.should_open(now_ms) {
            self.open_stream(host, leadership, now_ms);
        }
        if now_ms.saturating_sub(leadership.windows.current_start_ms())
            >= self.settings.report_interval_ms
        {
            leadership.windows.close(now_ms);
        }
        if let Some(ready) = leadership.windows.take_ready(now_ms) {
            self.send_report(host, leadership, ready.window_ms, ready.counts, now_ms);
        }
    }

    /// Closes a stream that delivered nothing (not even a heartbeat) for
    /// `stream_idle_timeout_ms` and schedules a reconnect with backoff.
    fn abandon_silent_stream(
        &mut self,
        host: &mut impl Host,
        leadership: &mut Leadership,
        now_ms: u64,
    ) {
        let timeout_ms = self.settings.stream_idle_timeout_ms;
        let Some(token) = leadership.stream.silent_for(now_ms, timeout_ms) else {
            return;
        };
        if let Err(err) = host.close_stream(token) {
            host.log(LogLevel::Debug, &format!("closing stream {token}: {err}"));
        }
        self.metrics.add(Counter::StreamsAbandoned, 1);
        let reconnect = leadership.stream.failed(now_ms, &mut self.rng);
        log_reconnect(
            host,
            &self.settings.control_plane_cluster,
            &format!("the control plane sent nothing for {timeout_ms} ms"),
            reconnect,
        );
    }

    fn publish_workers(&mut self, host: &mut impl Host, leadership: &mut Leadership, now_ms: u64) {
        let workers = leadership.windows.workers(now_ms);
        self.workers = workers;
        if leadership.published_workers == Some(workers) {
            return;
        }
        match host.set_shared_data(WORKERS_KEY, &workers.to_le_bytes(), None) {
            Ok(()) => leadership.published_workers = Some(workers),
            Err(err) => host.log(
                LogLevel::Debug,
                &format!("cannot publish the worker count: {err}"),
            ),
        }
    }

    fn drain_queue(&mut self, host: &mut impl Host, leadership: &mut Leadership, now_ms: u64) {
        let Some(queue_id) = self.queue_id else {
            return;
        };
        for _ in 0..MAX_DEQUEUES_PER_TICK {
            match host.dequeue_shared_queue(queue_id) {
                Ok(Some(bytes)) => match Handoff::decode(bytes.as_slice()) {
                    Ok(handoff) => leadership.windows.add_handoff(handoff, now_ms),
                    Err(err) => host.log(
                        LogLevel::Warn,
                        &format!("dropping undecodable counts: {err}"),
                    ),
                },
                Ok(None) => break,
                Err(err) => {
                    host.log(LogLevel::Warn, &format!("cannot dequeue counts: {err}"));
                    break;
                }
            }
        }
    }

    fn open_stream(&mut self, host: &mut impl Host, leadership: &mut Leadership, now_ms: u64) {
        let cluster = &self.settings.control_plane_cluster;
        let token = match host.open_control_stream(cluster) {
            Ok(token) => token,
            Err(err) => {
                let reconnect = leadership.stream.failed(now_ms, &mut self.rng);
                log_reconnect(
                    host,
                    cluster,
                    &format!("cannot open the control-plane stream: {err}"),
                    reconnect,
                );
                return;
            }
        };
        leadership.stream.opened(token, now_ms);
        let hello = Hello {
            proxy_id: self.settings.proxy_id.clone(),
            instance_id: self.instance_id(host),
            zone: self.settings.zone.clone(),
            known_proxies: self.directives.known_proxies(),
        };
        let message = ProxyMessage {
            kind: Some(proxy_message::Kind::Hello(hello)),
        };
        // A failed Hello is not a report; the reconnect is logged by send().
        let _ = self.send(host, leadership, token, &message.encode_to_vec(), now_ms);
    }

    fn send_report(
        &mut self,
        host: &mut impl Host,
        leadership: &mut Leadership,
        window_ms: u64,
        buckets: Vec<sluice_proto::v1::BucketCount>,
        now_ms: u64,
    ) {
        let Some((token, sequence)) = leadership.stream.take_sequence() else {
            // Counts of a window nobody hears about would skew the next
            // report's rate; the control plane holds rates across short gaps.
            if !buckets.is_empty() {
                host.log(
                    LogLevel::Debug,
                    &format!("no stream: discarding counts of {} buckets", buckets.len()),
                );
            }
            return;
        };
        let report = Report {
            sequence,
            window_ms,
            buckets,
            directive_age_ms: self.freshness.table_age_ms(now_ms),
        };
        let message = ProxyMessage {
            kind: Some(proxy_message::Kind::Report(report)),
        };
        let counter = if self.send(host, leadership, token, &message.encode_to_vec(), now_ms) {
            Counter::ReportsSent
        } else {
            Counter::ReportsFailed
        };
        self.metrics.add(counter, 1);
    }

    /// Sends on the stream; on failure closes it and schedules a reconnect.
    /// Returns whether the host took the message.
    fn send(
        &mut self,
        host: &mut impl Host,
        leadership: &mut Leadership,
        token: u32,
        bytes: &[u8],
        now_ms: u64,
    ) -> bool {
        if let Err(err) = host.send_stream_message(token, bytes) {
            if let Err(close_err) = host.close_stream(token) {
                host.log(
                    LogLevel::Debug,
                    &format!("closing stream {token}: {close_err}"),
                );
            }
            let reconnect = leadership.stream.failed(now_ms, &mut self.rng);
            let cluster = &self.settings.control_plane_cluster;
            log_reconnect(
                host,
                cluster,
                &format!("cannot send on the control-plane stream: {err}"),
                reconnect,
            );
            return false;
        }
        true
    }

    /// The process-wide instance id: created once by the first leader and
    /// kept in shared data, so `Hello` names the same instance whichever VM
    /// leads.
    fn instance_id(&mut self, host: &mut impl Host) -> u64 {
        match host.get_shared_data(INSTANCE_ID_KEY) {
            Ok(Some(value)) => {
                if let Ok(bytes) = <[u8; 8]>::try_from(value.bytes.as_slice()) {
                    return u64::from_le_bytes(bytes);
                }
            }
            Ok(None) => {}
            Err(err) => {
                host.log(
                    LogLevel::Warn,
                    &format!("cannot read the instance id: {err}"),
                );
                return self.rng.next_u64();
            }
        }
        let id = self.rng.next_u64();
        if let Err(err) = host.set_shared_data(INSTANCE_ID_KEY, &id.to_le_bytes(), None) {
            host.log(
                LogLevel::Warn,
                &format!("cannot store the instance id: {err}"),
            );
        }
        id
    }

    fn apply_batch(&mut self, host: &mut impl Host, batch: DirectiveBatch, now_ms: u64) {
        let previous_epoch = self.directives.provenance().epoch;
        let changes = self.directives.changes_with(&batch);
        let ttl_ms = batch.ttl_ms;
        let outcome = self.directives.merge(batch);
        if changes {
            self.pace_directives();
        }
        self.metrics.add(Counter::DirectiveBatches, 1);
        self.metrics.add(
            Counter::DirectivesRejected,
            u64::try_from(outcome.rejected).unwrap_or(u64::MAX),
        );
        let provenance = self.directives.provenance();
        let level = if outcome.rejected > 0 {
            LogLevel::Warn
        } else if provenance.epoch != previous_epoch {
            LogLevel::Info
        } else {
            LogLevel::Debug
        };
        host.log(
            level,
            &format!(
                "directives epoch {} version {}: {} applied, {} rejected, {} cells, {} shedding",
                provenance.epoch,
                provenance.version,
                outcome.applied,
                outcome.rejected,
                self.directives.len(),
                self.directives.shedding()
            ),
        );
        let stored = host
            .get_shared_data(DIRECTIVES_META_KEY)
            .ok()
            .flatten()
            .and_then(|value| DirectivesMeta::decode(&value.bytes));
        let mut sequence = stored
            .map(|meta| meta.sequence)
            .max(self.directives_sequence)
            .unwrap_or(0);
        // A VM that just became leader may hold a table other than the
        // shared one: write it whenever the sequence is not its own.
        if changes || self.directives_sequence != stored.map(|meta| meta.sequence) {
            sequence = sequence.wrapping_add(1);
            if let Err(err) = host.set_shared_data(DIRECTIVES_KEY, &self.directives.encode(), None)
            {
                host.log(
                    LogLevel::Warn,
                    &format!("cannot publish directives to other VMs: {err}"),
                );
                return;
            }
        }
        let meta = DirectivesMeta {
            sequence,
            received_at_ms: now_ms,
            ttl_ms,
        };
        if let Err(err) = host.set_shared_data(DIRECTIVES_META_KEY, &meta.encode(), None) {
            host.log(
                LogLevel::Warn,
                &format!("cannot publish directive freshness to other VMs: {err}"),
            );
            return;
        }
        self.directives_sequence = Some(sequence);
        self.freshness.received_at_ms = Some(now_ms);
        self.freshness.ttl_ms = effective_ttl(ttl_ms, self.settings.directive_ttl_ms);
        self.update_regime(host, now_ms);
    }

    fn log_overflow(&mut self, host: &impl Host, now_ms: u64) {
        self.untracked = self.untracked.saturating_add(self.local.take_untracked());
        if let Role::Leader(leadership) = &mut self.role {
            self.untracked = self
                .untracked
                .saturating_add(leadership.windows.take_untracked());
        }
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

/// The batch's TTL, else the configured one.
fn effective_ttl(batch_ttl_ms: u64, configured_ms: u64) -> u64 {
    if batch_ttl_ms == 0 {
        configured_ms
    } else {
        batch_ttl_ms
    }
}

fn fallback_name(fallback: Fallback) -> &'static str {
    match fallback {
        Fallback::KeepLast => "keep_last",
        Fallback::LocalLimit => "local_limit",
        Fallback::Allow => "allow",
    }
}

/// Logs a failed attempt without flooding: the first failure and every
/// [`RECONNECT_WARN_EVERY`]th are warnings, the rest debug.
fn log_reconnect(host: &impl Host, cluster: &str, what: &str, reconnect: Reconnect) {
    let level =
        if reconnect.failures == 1 || reconnect.failures.is_multiple_of(RECONNECT_WARN_EVERY) {
            LogLevel::Warn
        } else {
            LogLevel::Debug
        };
    host.log(
        level,
        &format!(
            "{what} (cluster {cluster}, {} consecutive failures); retrying in {} ms",
            reconnect.failures, reconnect.delay_ms
        ),
    );
}

#[cfg(test)]
#[path = "agent_tests.rs"]
mod tests;
