//! The per-VM logic: the request-path decision and the 100 ms tick that
//! reconciles this VM with the rest of the Envoy process.
//!
//! Every VM (each worker's and the main thread's) runs the same tick:
//! 1. lease: read the leader lease and renew, follow or try to acquire it
//!    ([`crate::lease`]);
//! 2. directives: one shared-data read; decode only when the CAS changed;
//! 3. counts: a follower hands its counts to the leader through the shared
//!    queue, but only while a leader holds a live lease (otherwise nobody
//!    drains the queue, so the counts stay local, bounded by `max_buckets`);
//!    the leader adds its own counts and drains the queue;
//! 4. leader only: keep the control-plane stream open (reconnecting with
//!    backoff) and send one `Report` per report interval.
//!
//! The leader merges every `DirectiveBatch` it receives into its table and
//! writes the whole table to shared data, where every VM picks it up on its
//! next tick.
//!
//! Metrics ([`crate::metrics`]) are counted in plain fields and flushed at the
//! end of every tick; the leader alone records the process-wide gauges.

use crate::allowance::AllowanceSettings;
use crate::counters::BucketCounters;
use crate::decision::Verdict;
use crate::directives::DirectiveTable;
use crate::host_api::{Host, LogLevel};
use crate::lease::{LEASE_TTL_TICKS, Lease, LeaseStep, next_step};
use crate::metrics::{Counter, Gauge, Metrics};
use crate::pacing::{DecisionMode, Pacer};
use crate::shared_keys::{COUNTS_QUEUE, DIRECTIVES_KEY, INSTANCE_ID_KEY, LEASE_KEY};
use crate::stream::{ControlStream, Reconnect};
use prost::Message;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_proto::v1::{
    ControlMessage, DirectiveBatch, Hello, ProxyMessage, Report, control_message, proxy_message,
};

/// Tick period of every VM.
pub const TICK_MS: u64 = 100;
/// How long a lease outlives its last renewal.
pub const LEASE_TTL_MS: u64 = LEASE_TTL_TICKS * TICK_MS;
/// Most queue messages the leader takes per tick: one per VM per tick
/// arrives, so this only bounds a backlog, never falls behind in steady state.
pub const MAX_DEQUEUES_PER_TICK: usize = 256;
/// Least time between two warnings about buckets beyond `max_buckets`.
const OVERFLOW_LOG_INTERVAL_MS: u64 = 10_000;
/// While the control plane stays unreachable, warn again every this many
/// failed attempts (the others are logged at debug level).
const RECONNECT_WARN_EVERY: u32 = 20;

/// What the agent needs from the configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSettings {
    /// Envoy cluster of the control plane.
    pub control_plane_cluster: String,
    /// Identity sent in `Hello`.
    pub proxy_id: String,
    /// Milliseconds between reports.
    pub report_interval_ms: u64,
    /// Cap on buckets counted and directives held.
    pub max_buckets: usize,
    /// How a drop ratio is applied to single requests.
    pub decision: DecisionMode,
    /// The local allowance; `None`: off.
    pub allowance: Option<AllowanceSettings>,
}

/// State of one VM.
#[derive(Debug)]
pub struct Agent {
    settings: AgentSettings,
    /// Identifies this VM in the lease.
    vm_id: u64,
    rng: SmallRng,
    /// Requests counted on this VM and not yet handed on.
    local: BucketCounters,
    directives: DirectiveTable,
    /// Per-bucket decision state: credit balances and local allowances.
    pacer: Pacer,
    /// CAS of the shared table last decoded, to skip unchanged reads.
    directives_cas: Option<u32>,
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
    /// The whole process's counts for the current report window.
    window: BucketCounters,
    window_started_ms: u64,
}

impl Agent {
    /// A follower with no directives. `seed` seeds the VM's PRNG (the host
    /// passes entropy; tests pass a constant).
    pub fn new(settings: AgentSettings, seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let vm_id = rng.next_u64();
        Self {
            local: BucketCounters::new(settings.max_buckets),
            directives: DirectiveTable::new(settings.max_buckets),
            pacer: Pacer::new(
                settings.decision,
                settings.allowance,
                TICK_MS,
                settings.max_buckets,
            ),
            settings,
            vm_id,
            rng,
            directives_cas: None,
            queue_id: None,
            role: Role::Follower,
            untracked: 0,
            last_overflow_log_ms: None,
            metrics: Metrics::default(),
        }
    }

    /// The request path: flips the coin for `bucket` and counts the request.
    /// No host calls: the decision is counted in a plain field and flushed
    /// on the next tick.
    pub fn admit(&mut self, bucket: &str) -> Verdict {
        let threshold = self.directives.threshold(bucket);
        let verdict = self.pacer.decide(bucket, threshold, &mut self.rng);
        self.local.record(bucket, verdict == Verdict::Admit);
        self.metrics.count_decision(verdict);
        verdict
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

    /// Runs one tick at `now_ms` (Unix milliseconds).
    pub fn on_tick(&mut self, host: &mut impl Host, now_ms: u64) {
        self.pacer
            .on_tick(now_ms, self.local.buckets(), &mut self.rng);
        self.ensure_queue(host);
        let leader_alive = self.run_lease(host, now_ms);
        self.refresh_directives(host);
        match std::mem::replace(&mut self.role, Role::Follower) {
            Role::Leader(mut leadership) => {
                self.lead(host, &mut leadership, now_ms);
                self.role = Role::Leader(leadership);
            }
            Role::Follower if leader_alive => self.hand_counts_to_leader(host),
            // No leader to drain the queue: keep counting locally.
            Role::Follower => {}
        }
        self.log_overflow(host, now_ms);
        self.flush_metrics(host, now_ms);
    }

    /// Flushes counter deltas; the leader also records the gauges. Every VM
    /// holds the same table, but VMs tick at different moments, so if all
    /// recorded the age the gauge would jitter by up to a tick between
    /// writers; one writer keeps it monotonic between batches.
    fn flush_metrics(&mut self, host: &mut impl Host, now_ms: u64) {
        if !self.is_leader() {
            self.metrics.flush(host, &[]);
            return;
        }
        let issued_at = self.directives.provenance().issued_at_unix_ms;
        // Before any batch, issued_at is 0: report 0, not 55 years. A
        // control-plane clock ahead of ours saturates to 0 as well.
        let age_ms = if issued_at == 0 {
            0
        } else {
            now_ms.saturating_sub(issued_at)
        };
        let buckets = u64::try_from(self.directives.len()).unwrap_or(u64::MAX);
        self.metrics.flush(
            host,
            &[
                (Gauge::DirectiveAgeMs, age_ms),
                (Gauge::DirectiveBuckets, buckets),
            ],
        );
    }

    /// A message arrived on stream `token`.
    pub fn on_stream_message(&mut self, host: &mut impl Host, token: u32, message: &[u8]) {
        let Role::Leader(leadership) = &mut self.role else {
            host.log(
                LogLevel::Debug,
                &format!("ignoring message on stream {token}: not the leader"),
            );
            return;
        };
        if !leadership.stream.received(token) {
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
                self.apply_batch(host, batch);
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
            window: BucketCounters::new(self.settings.max_buckets),
            window_started_ms: now_ms,
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
        // Keep the window's counts: they go to the next leader.
        self.local.merge(leadership.window.drain());
    }

    fn refresh_directives(&mut self, host: &mut impl Host) {
        let value = match host.get_shared_data(DIRECTIVES_KEY) {
            Ok(Some(value)) if Some(value.cas) != self.directives_cas => value,
            Ok(_) => return,
            Err(err) => {
                host.log(LogLevel::Debug, &format!("cannot read directives: {err}"));
                return;
            }
        };
        // Remember the CAS even if decoding fails, so a bad blob costs one
        // warning rather than one per tick; the last good table stays.
        self.directives_cas = Some(value.cas);
        match DirectiveTable::decode(&value.bytes, self.settings.max_buckets) {
            Ok((table, outcome)) => {
                // Allowances are derived again only for directives that
                // changed: an unchanged one stays frozen.
                let changed = table.changed_since(&self.directives);
                self.pacer.apply(&changed);
                if outcome.rejected > 0 {
                    host.log(
                        LogLevel::Warn,
                        &format!(
                            "shared directive table had {} invalid entries",
                            outcome.rejected
                        ),
                    );
                }
                self.directives = table;
            }
            Err(err) => host.log(
                LogLevel::Warn,
                &format!("keeping last-known directives: {err}"),
            ),
        }
    }

    fn hand_counts_to_leader(&mut self, host: &mut impl Host) {
        let Some(queue_id) = self.queue_id else {
            return;
        };
        if self.local.is_empty() {
            return;
        }
        let report = Report {
            sequence: 0,
            window_ms: 0,
            buckets: self.local.drain(),
        };
        if let Err(err) = host.enqueue_shared_queue(queue_id, &report.encode_to_vec()) {
            host.log(LogLevel::Warn, &format!("cannot enqueue counts: {err}"));
            self.local.merge(report.buckets);
        }
    }

    fn lead(&mut self, host: &mut impl Host, leadership: &mut Leadership, now_ms: u64) {
        leadership.window.merge(self.local.drain());
        self.drain_queue(host, leadership);
        if leadership.stream.should_open(now_ms) {
            self.open_stream(host, leadership, now_ms);
        }
        if now_ms.saturating_sub(leadership.window_started_ms) >= self.settings.report_interval_ms {
            self.send_report(host, leadership, now_ms);
        }
    }

    fn drain_queue(&mut self, host: &mut impl Host, leadership: &mut Leadership) {
        let Some(queue_id) = self.queue_id else {
            return;
        };
        for _ in 0..MAX_DEQUEUES_PER_TICK {
            match host.dequeue_shared_queue(queue_id) {
                Ok(Some(bytes)) => match Report::decode(bytes.as_slice()) {
                    Ok(report) => leadership.window.merge(report.buckets),
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
        leadership.stream.opened(token);
        let hello = Hello {
            proxy_id: self.settings.proxy_id.clone(),
            instance_id: self.instance_id(host),
            ..Default::default()
        };
        let message = ProxyMessage {
            kind: Some(proxy_message::Kind::Hello(hello)),
        };
        // A failed Hello is not a report; the reconnect is logged by send().
        let _ = self.send(host, leadership, token, &message.encode_to_vec(), now_ms);
    }

    fn send_report(&mut self, host: &mut impl Host, leadership: &mut Leadership, now_ms: u64) {
        let buckets = leadership.window.drain();
        let window_ms = now_ms.saturating_sub(leadership.window_started_ms);
        leadership.window_started_ms = now_ms;
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

    fn apply_batch(&mut self, host: &mut impl Host, batch: DirectiveBatch) {
        let previous_epoch = self.directives.provenance().epoch;
        self.pacer.apply(&batch.directives);
        let outcome = self.directives.merge(batch);
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
                "directives epoch {} version {}: {} applied, {} rejected, {} buckets shedding",
                provenance.epoch,
                provenance.version,
                outcome.applied,
                outcome.rejected,
                self.directives.len()
            ),
        );
        if let Err(err) = host.set_shared_data(DIRECTIVES_KEY, &self.directives.encode(), None) {
            host.log(
                LogLevel::Warn,
                &format!("cannot publish directives to other VMs: {err}"),
            );
        }
    }

    fn log_overflow(&mut self, host: &impl Host, now_ms: u64) {
        self.untracked = self.untracked.saturating_add(self.local.take_untracked());
        if let Role::Leader(leadership) = &mut self.role {
            self.untracked = self
                .untracked
                .saturating_add(leadership.window.take_untracked());
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
