//! The per-VM logic: the request-path decision and the ticks that
//! reconcile this VM with the rest of the Envoy process.
//!
//! Every VM (each worker's and the main thread's) ticks every
//! `directive_poll_ms` (20 ms by default). Each tick reads one small shared
//! key, the table's sequence and freshness, and reads and decodes the table
//! only when the sequence changed: a directive reaches every VM within one
//! short tick of the leader receiving it. The rest runs at the old cadence,
//! every [`crate::settings::TICK_MS`]:
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
//! The code and the state follow the three roles, each with its methods on
//! its own struct: the request path ([`crate::request::path`],
//! `RequestPath`: the table, the cells and the decision), keeping in step
//! with the process ([`crate::tick::sync`], `VmSync`), and the stream
//! ([`crate::leader::leadership`], `Leadership`, which only the leader
//! has). `Agent` holds one of each and what they share (the VM's settings,
//! identity, PRNG and metrics, [`crate::vm`]), runs the lease that decides
//! which VM leads, and hands each tick and stream event to the roles; what
//! the VMs exchange is [`crate::shared`].

use crate::directives::DirectiveTable;
use crate::host::{Host, LogLevel};
use crate::leader::leadership::Leadership;
use crate::metrics::{Counter, Gauge, Metrics};
use crate::request::charge::{self, PendingCharge};
use crate::request::classify::Classifier;
use crate::request::classify::RequestAttributes;
use crate::request::classify::parse_key;
use crate::request::path::RequestPath;
use crate::request::record;
use crate::request::reject::RejectResponse;
use crate::settings::{AgentSettings, TICK_MS};
use crate::shared::{LEASE_KEY, Lease};
use crate::tick::lease::{LEASE_TTL_TICKS, LeaseStep, next_step};
use crate::tick::sync::VmSync;
use crate::usage::rules::CostRules;
use crate::usage::{Charge, UsageParser};
use crate::vm::Vm;
use sluice_core::decision::{Decision, Outcome};
use sluice_core::regime::Regime;
use std::sync::Arc;

/// How long a lease outlives its last renewal.
pub const LEASE_TTL_MS: u64 = LEASE_TTL_TICKS * TICK_MS;
/// Least time between two warnings about buckets beyond `max_buckets`.
const OVERFLOW_LOG_INTERVAL_MS: u64 = 10_000;

/// State of one VM.
#[derive(Debug)]
pub struct Agent {
    /// What the roles share.
    vm: Vm,
    /// What the request path reads and writes.
    pub(crate) path: RequestPath,
    /// How this VM keeps in step with the rest of the process.
    sync: VmSync,
    /// What only the leader has: `Some` while this VM holds the lease.
    leader: Option<Box<Leadership>>,
    /// Requests not counted since the last warning.
    untracked: u64,
    last_overflow_log_ms: Option<u64>,
}

impl Agent {
    /// A follower with no directives. `seed` seeds the VM's PRNG (the host
    /// passes entropy; tests pass a constant).
    pub fn new(settings: AgentSettings, seed: u64) -> Self {
        let mut agent = Self {
            path: RequestPath::new(&settings),
            sync: VmSync::new(settings.directive_ttl.as_millis()),
            vm: Vm::new(settings, seed),
            leader: None,
            untracked: 0,
            last_overflow_log_ms: None,
        };
        agent.refresh();
        agent
    }

    /// Hands the request path what a tick or a batch changed
    /// ([`RequestPath::refresh`]); every entry point that may change it
    /// ends here.
    fn refresh(&mut self) {
        self.path.refresh(&self.sync.freshness, self.sync.workers);
    }

    /// The request path: classifies the request into its cell, decides and
    /// counts. No host calls beyond the attribute reads the classifier
    /// needs; no allocation once the cell has been seen. Values that are
    /// not UTF-8 are taken as absent and counted
    /// ([`crate::request::classify`]).
    pub fn admit_request(
        &mut self,
        classifier: &Classifier,
        request: &impl RequestAttributes,
    ) -> Decision {
        let invalid = classifier.classify_into(request, &mut self.path.cell);
        if invalid > 0 {
            self.vm
                .metrics
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
    pub fn admit(&mut self, bucket: &str) -> Decision {
        self.set_cell(bucket, "", Default::default());
        self.decide_current()
    }

    /// Decides a request of the cell (`bucket`, `tenant`, `priority`).
    pub fn admit_cell(
        &mut self,
        bucket: &str,
        tenant: &str,
        priority: sluice_core::Priority,
    ) -> Decision {
        self.set_cell(bucket, tenant, priority);
        self.decide_current()
    }

    /// Makes (`bucket`, `tenant`, `priority`) the cell the next decision
    /// is of.
    fn set_cell(&mut self, bucket: &str, tenant: &str, priority: sluice_core::Priority) {
        self.path.cell.bucket.clear();
        self.path.cell.bucket.push_str(bucket);
        self.path.cell.tenant.clear();
        self.path.cell.tenant.push_str(tenant);
        self.path.cell.priority = priority;
    }

    /// [`Agent::admit_cell`] for a request of estimated cost `estimate`,
    /// as a cost rule would count it.
    #[cfg(test)]
    pub(crate) fn admit_cell_costing(
        &mut self,
        (bucket, tenant, priority): (&str, &str, sluice_core::Priority),
        estimate: u64,
    ) -> Decision {
        self.set_cell(bucket, tenant, priority);
        self.path
            .decide(&mut self.vm.metrics, &mut self.vm.rng, Some(estimate))
    }

    fn decide_current(&mut self) -> Decision {
        self.path
            .decide(&mut self.vm.metrics, &mut self.vm.rng, None)
    }

    /// [`Agent::admit_request`] for a filter with cost rules: a request
    /// the first matching rule of `costs` applies to is counted with its
    /// estimate (offered, and admitted if let through) and, when admitted,
    /// comes back as the [`PendingCharge`] its stream's end settles
    /// ([`Agent::charge`]). A request no rule applies to is decided and
    /// counted exactly as by [`Agent::admit_request`].
    pub fn admit_costed_request(
        &mut self,
        classifier: &Classifier,
        costs: &CostRules,
        request: &impl RequestAttributes,
    ) -> (Decision, Option<PendingCharge>) {
        let invalid = classifier.classify_into(request, &mut self.path.cell);
        if invalid > 0 {
            self.vm
                .metrics
                .add(Counter::HeaderValuesInvalid, u64::from(invalid));
        }
        let route = if costs.reads_route() {
            request.route_name()
        } else {
            None
        };
        let Some((index, route)) = costs
            .find(route.as_deref(), &self.path.cell.bucket)
            .and_then(|index| Some((index, costs.get(index)?)))
        else {
            return (self.decide_current(), None);
        };
        let estimate = charge::estimate_of(route, request);
        // What it was counted, not what it claimed: the charge of a stream
        // ending without a usage is bounded as its count was.
        let decision = self
            .path
            .decide(&mut self.vm.metrics, &mut self.vm.rng, Some(estimate));
        let pending = decision.admits().then(|| PendingCharge {
            key: self.path.cell.exact_key().to_owned(),
            rule: index,
            estimate: self.path.last_cost.counted,
            claimed: self.path.last_cost.claimed,
            parser: route.actual.body_cap.map(UsageParser::new),
            body_started: false,
            complete: false,
        });
        (decision, pending)
    }

    /// Adds the actual cost of a stream that ended to its cell's counts
    /// (with the usage its count at the decision left out,
    /// [`PendingCharge::uncounted_usage`]), and to the metrics by source.
    pub fn charge(&mut self, pending: &PendingCharge, charge: Charge) {
        let directives = &self.path.directives;
        let late = pending.uncounted_usage(charge);
        let estimate = pending.estimate();
        let counted = self
            .path
            .cells
            .charge(&pending.key, charge, (estimate, late), || {
                parse_key(&pending.key).is_some_and(|(bucket, tenant, priority)| {
                    let wide = tenant.is_empty() && priority == sluice_core::Priority::Unspecified;
                    directives
                        .find((!wide).then_some(pending.key.as_str()), bucket)
                        .is_some()
                })
            });
        if counted {
            self.vm.metrics.count_charge(charge);
        } else {
            self.vm.metrics.add(Counter::ChargesUncounted, 1);
        }
    }

    /// What the last request's decision was, for its record and the
    /// upstream header.
    pub fn last_decision(&self) -> &Decision {
        &self.path.last
    }

    /// The 429 to answer the last request with, when it was dropped.
    pub fn rejection(&self) -> Option<&Arc<RejectResponse>> {
        match self.path.last.outcome {
            Outcome::Dropped => self.path.rejection.as_ref(),
            Outcome::Admitted | Outcome::ShadowDropped => None,
        }
    }

    /// The last request's record ([`crate::request::record`]), written into
    /// a buffer the VM reuses.
    pub fn last_record(&mut self) -> &str {
        let path = &mut self.path;
        let cell = (
            path.cell.bucket.as_str(),
            path.cell.tenant.as_str(),
            path.cell.priority,
        );
        record::write(&mut path.record, &path.last, path.table, cell);
        &path.record
    }

    /// Replaces the directive table, as if it had arrived fresh at the last
    /// tick: for simulations and benchmarks, which have no host. Envoy's
    /// VMs take the table from shared data.
    pub fn load_directives(&mut self, table: DirectiveTable) {
        self.path.replace_directives(table);
        self.sync.freshness.received_at_ms = Some(self.path.now.now_ms);
        self.path.rules.regime = Regime::Fresh;
        self.refresh();
    }

    /// The name the proxy reports as; `None` until an unnamed proxy's
    /// first leader has drawn its process's instance id.
    pub fn proxy_name(&self) -> Option<&str> {
        self.vm.name.as_deref()
    }

    /// Whether this VM currently owns the control-plane stream.
    pub fn is_leader(&self) -> bool {
        self.leader.is_some()
    }

    /// Metric counts not flushed yet.
    pub fn metrics(&self) -> &Metrics {
        &self.vm.metrics
    }

    /// The directives this VM enforces.
    pub fn directives(&self) -> &DirectiveTable {
        &self.path.directives
    }

    /// Whether the configured fallback applies (directives past their TTL).
    pub fn in_fallback(&self) -> bool {
        matches!(self.path.rules.regime, Regime::Stale(_))
    }

    /// VMs of this proxy sharing local limits, as last published.
    pub fn workers(&self) -> u32 {
        self.sync.workers
    }

    /// Runs one tick at `now_ms` (Unix milliseconds): the directive check
    /// and the leader's report window always, the rest when a slow tick is
    /// due.
    pub fn on_tick(&mut self, host: &mut impl Host, now_ms: u64) {
        if self.vm.name.is_none()
            && let Some(name) = self.sync.process_name(host)
        {
            self.vm.adopt_name(name, &mut self.path.directives);
        }
        self.path.close_pacer_window(now_ms, &mut self.vm.rng);
        let leading = self.is_leader();
        self.sync
            .poll_directives(host, &mut self.vm, &mut self.path, leading, now_ms);
        if self.sync.slow_tick_due(now_ms) {
            self.slow_tick(host, now_ms);
        } else {
            match &mut self.leader {
                Some(leader) => {
                    leader.report_due_window(
                        host,
                        &mut self.vm,
                        &mut self.path,
                        &self.sync,
                        now_ms,
                    );
                }
                None => {
                    self.sync
                        .hand_off_for_closed_window(host, self.vm.id, &mut self.path, now_ms);
                }
            }
        }
        self.refresh();
    }

    fn slow_tick(&mut self, host: &mut impl Host, now_ms: u64) {
        self.sync.start_slow_tick(now_ms);
        self.sync.ensure_queue(host);
        let leader_alive = self.run_lease(host, now_ms);
        self.sync.leader_alive = leader_alive;
        match &mut self.leader {
            Some(leader) => {
                leader.lead(host, &mut self.vm, &mut self.path, &mut self.sync, now_ms);
            }
            None if leader_alive => {
                self.sync.follow(host, &self.vm, &mut self.path, now_ms);
            }
            // No leader to drain the queue: keep counting locally.
            None => {}
        }
        self.log_overflow(host, now_ms);
        self.flush_metrics(host, now_ms);
    }

    /// The lease step ([`crate::tick::lease`]): renews this VM's lease and
    /// leads, follows another VM's live lease, or tries to take an expired
    /// or absent one. Returns whether some VM holds a live lease.
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
            holder: self.vm.id,
            expires_at_ms: now_ms.saturating_add(LEASE_TTL_MS),
        };
        match next_step(current, self.vm.id, now_ms) {
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
        if self.leader.is_some() {
            return;
        }
        host.log(LogLevel::Info, "this VM now owns the control-plane stream");
        self.leader = Some(Box::new(Leadership::new(
            self.vm.settings.max_buckets,
            now_ms,
        )));
    }

    fn step_down(&mut self, host: &mut impl Host) {
        if let Some(leader) = self.leader.take() {
            leader.step_down(host, &mut self.path);
        }
    }

    /// A message arrived on stream `token` at `now_ms`.
    pub fn on_stream_message(
        &mut self,
        host: &mut impl Host,
        token: u32,
        message: &[u8],
        now_ms: u64,
    ) {
        let Some(leader) = &mut self.leader else {
            host.log(
                LogLevel::Debug,
                &format!("ignoring message on stream {token}: not the leader"),
            );
            return;
        };
        leader.on_stream_message(
            host,
            &mut self.vm,
            &mut self.path,
            &mut self.sync,
            (token, message),
            now_ms,
        );
        self.refresh();
    }

    /// The host closed stream `token` with gRPC `status`.
    pub fn on_stream_close(&mut self, host: &mut impl Host, token: u32, status: u32, now_ms: u64) {
        if let Some(leader) = &mut self.leader {
            leader.on_stream_close(host, &mut self.vm, token, status, now_ms);
        }
    }

    /// Flushes counter deltas; the leader also records the gauges, so VMs
    /// ticking at different moments do not overwrite each other.
    fn flush_metrics(&mut self, host: &mut impl Host, now_ms: u64) {
        if !self.is_leader() {
            self.vm.metrics.flush(host, &[]);
            return;
        }
        let cells = u64::try_from(self.path.directives.len()).unwrap_or(u64::MAX);
        let shedding = u64::try_from(self.path.directives.shedding()).unwrap_or(u64::MAX);
        let gauges = [
            (Gauge::DirectiveAgeMs, self.sync.freshness.age_ms(now_ms)),
            (Gauge::DirectiveBuckets, shedding),
            (Gauge::DirectiveCells, cells),
            (Gauge::FallbackActive, u64::from(self.in_fallback())),
            (Gauge::Workers, u64::from(self.sync.workers)),
        ];
        self.vm.metrics.flush(host, &gauges);
    }

    /// Releases what this VM holds before it goes away or is replaced.
    pub fn shut_down(&mut self, host: &mut impl Host) {
        self.step_down(host);
        // Counts since the last tick would otherwise vanish with the VM.
        self.vm.metrics.flush(host, &[]);
    }

    fn log_overflow(&mut self, host: &impl Host, now_ms: u64) {
        let mut untracked = self.path.cells.take_untracked();
        if let Some(leader) = &mut self.leader {
            untracked = untracked.saturating_add(leader.take_untracked());
        }
        self.vm.metrics.add(Counter::RequestsUncounted, untracked);
        self.untracked = self.untracked.saturating_add(untracked);
        let due = self
            .last_overflow_log_ms
            .is_none_or(|last| now_ms.saturating_sub(last) >= OVERFLOW_LOG_INTERVAL_MS);
        if self.untracked > 0 && due {
            host.log(
                LogLevel::Warn,
                &format!(
                    "{} requests were not counted: more than max_buckets ({}) buckets",
                    self.untracked, self.vm.settings.max_buckets
                ),
            );
            self.untracked = 0;
            self.last_overflow_log_ms = Some(now_ms);
        }
    }
}

#[cfg(test)]
mod tests;
