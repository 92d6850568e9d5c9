//! What only the leader VM does: own the control-plane stream (open it,
//! say hello, reconnect with backoff, give up on a silent one), report the
//! process's counts once per report window, and merge and publish the
//! directive batches that arrive.

use crate::host::{Host, LogLevel};
use crate::identity::{ProxyIdentity, made_up_name_warning, process_proxy_id};
use crate::leader::grpc_service;
use crate::leader::process_rates::ProcessRates;
use crate::leader::report_window::ReportWindows;
use crate::leader::stream::{ControlStream, Reconnect};
use crate::metrics::Counter;
use crate::request::classify::key_of;
use crate::request::path::RequestPath;
use crate::shared::{
    DIRECTIVES_KEY, DIRECTIVES_META_KEY, DirectivesMeta, Handoff, INSTANCE_ID_KEY, InstanceId,
    PROCESS_RATES_KEY, WINDOW_END_KEY, WORKERS_KEY, WindowEnd, WorkerCount,
};
use crate::tick::sync::VmSync;
use crate::upstream::UpstreamSignals;
use crate::vm::Vm;
use prost::Message;
use rand::Rng;
use sluice_core::Priority;
use sluice_proto::v1::{
    ControlMessage, DirectiveBatch, Hello, ProxyMessage, Report, control_message, proxy_message,
};

/// Most queue messages the leader takes per tick: one per VM per tick
/// arrives, so this only bounds a backlog, never falls behind in steady state.
pub(crate) const MAX_DEQUEUES_PER_TICK: usize = 256;
/// While the control plane stays unreachable, warn again every this many
/// failed attempts (the others are logged at debug level).
const RECONNECT_WARN_EVERY: u32 = 20;

/// What only the leader has.
#[derive(Debug)]
pub(crate) struct Leadership {
    stream: ControlStream,
    /// The whole process's counts, aligned to report windows.
    windows: ReportWindows,
    /// Workers last published.
    published_workers: Option<u32>,
    /// The process's recent offered rate per limited cell, published for
    /// the allowance ([`crate::leader::process_rates`]).
    process: ProcessRates,
    /// Since when the leader's own counts have not been added to
    /// `process`.
    own_counted_from_ms: u64,
    /// The process's upstream signals since the last report.
    upstream: UpstreamSignals,
}

impl Leadership {
    /// A VM that just took the lease at `now_ms`, for cells up to
    /// `max_buckets`.
    pub(crate) fn new(max_buckets: usize, now_ms: u64) -> Self {
        Self {
            stream: ControlStream::new(),
            windows: ReportWindows::new(max_buckets, now_ms),
            published_workers: None,
            process: ProcessRates::new(max_buckets),
            own_counted_from_ms: now_ms,
            upstream: UpstreamSignals::default(),
        }
    }

    /// The leader's slow tick: collect every VM's counts and signals,
    /// publish the process's rates and workers, keep the stream open, and
    /// report a window that is due.
    pub(crate) fn lead(
        &mut self,
        host: &mut impl Host,
        vm: &mut Vm,
        path: &mut RequestPath,
        sync: &mut VmSync,
        now_ms: u64,
    ) {
        self.absorb_own_counts(vm, path, now_ms);
        self.upstream.absorb(&mut path.responses.signals);
        self.drain_queue(host, vm, path, sync, now_ms);
        self.publish_process_rates(host, vm, now_ms);
        // The leader reads them back like every VM.
        sync.read_process_rates(host, vm, path);
        self.publish_workers(host, sync, now_ms);
        self.abandon_silent_stream(host, vm, now_ms);
        if self.stream.should_open(now_ms) {
            self.open_stream(host, vm, path, now_ms);
        }
        self.report_due_window(host, vm, path, sync, now_ms);
    }

    /// A message arrived on stream `token` at `now_ms`.
    pub(crate) fn on_stream_message(
        &mut self,
        host: &mut impl Host,
        vm: &mut Vm,
        path: &mut RequestPath,
        sync: &mut VmSync,
        (token, message): (u32, &[u8]),
        now_ms: u64,
    ) {
        if !self.stream.received(token, now_ms) {
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
                apply_batch(host, vm, path, sync, batch, now_ms);
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
    pub(crate) fn on_stream_close(
        &mut self,
        host: &mut impl Host,
        vm: &mut Vm,
        token: u32,
        status: u32,
        now_ms: u64,
    ) {
        if let Some(reconnect) = self.stream.closed(token, now_ms, &mut vm.rng) {
            // Reports in flight on a closed stream may be lost.
            vm.metrics.add(Counter::ReportsFailed, 1);
            let what = format!("control-plane stream closed with gRPC status {status}");
            log_reconnect(host, &vm.settings.control_plane_cluster, &what, reconnect);
            publish_stream_lost(host);
        }
    }

    /// Gives the leadership up: closes the stream and keeps the counts of
    /// the windows not reported yet, which go to the next leader.
    pub(crate) fn step_down(mut self, host: &mut impl Host, path: &mut RequestPath) {
        host.log(
            LogLevel::Info,
            "this VM no longer owns the control-plane stream",
        );
        if let Some(token) = self.stream.shut_down()
            && let Err(err) = host.close_stream(token)
        {
            host.log(LogLevel::Debug, &format!("closing stream {token}: {err}"));
        }
        let kept = self.windows.drain_all().drain();
        let directives = &path.directives;
        path.cells.merge(kept, |key| directives.covers(key));
    }

    /// Requests the leader's windows could not count since the last call.
    pub(crate) fn take_untracked(&mut self) -> u64 {
        self.windows.take_untracked()
    }

    /// The leader's own counts up to `now_ms` into the report window (and,
    /// with allowances, into the process's rates).
    fn absorb_own_counts(&mut self, vm: &Vm, path: &mut RequestPath, now_ms: u64) {
        if vm.settings.allowance.is_some() {
            let counted_from_ms = std::mem::replace(&mut self.own_counted_from_ms, now_ms);
            self.process
                .add_span(vm.id, now_ms.saturating_sub(counted_from_ms));
            let directives = &path.directives;
            for (key, counts) in path.cells.offered_by_key() {
                if let Some(budget) = directives.is_budget(key) {
                    let cost = budget.then_some(counts.offered_cost);
                    self.process.add(key, vm.id, counts.offered, cost);
                }
            }
        }
        self.windows.add_own(&mut path.cells, now_ms);
    }

    /// Closes the report window once it is due and sends the closed one
    /// once it is ready. Runs on every tick, not only on slow ones: with a
    /// 20 ms poll a slow tick comes every 80 ms, and a 250 ms window that
    /// waited for one lasted 320 ms, so the control plane heard of a change
    /// later and saw one window in some control intervals and two in
    /// others.
    pub(crate) fn report_due_window(
        &mut self,
        host: &mut impl Host,
        vm: &mut Vm,
        path: &mut RequestPath,
        sync: &VmSync,
        now_ms: u64,
    ) {
        if now_ms.saturating_sub(self.windows.current_start_ms()) >= vm.settings.report_interval_ms
        {
            self.absorb_own_counts(vm, path, now_ms);
            self.windows.close(now_ms);
            if let Err(err) =
                host.set_shared_data(WINDOW_END_KEY, &WindowEnd(now_ms).encode(), None)
            {
                host.log(
                    LogLevel::Debug,
                    &format!("cannot publish the window's end: {err}"),
                );
            }
        }
        if self.windows.is_closing() {
            // The followers' hand-offs past the window's end, on the short
            // tick after they saw it closed.
            self.drain_queue(host, vm, path, sync, now_ms);
        }
        if let Some(ready) = self.windows.take_ready(now_ms) {
            self.send_report(host, vm, sync, ready.window_ms, ready.counts, now_ms);
        }
    }

    /// Closes a stream that delivered nothing (not even a heartbeat) for
    /// `stream_idle_timeout_ms` and schedules a reconnect with backoff.
    fn abandon_silent_stream(&mut self, host: &mut impl Host, vm: &mut Vm, now_ms: u64) {
        let timeout_ms = vm.settings.stream_idle_timeout_ms;
        let Some(token) = self.stream.silent_for(now_ms, timeout_ms) else {
            return;
        };
        if let Err(err) = host.close_stream(token) {
            host.log(LogLevel::Debug, &format!("closing stream {token}: {err}"));
        }
        vm.metrics.add(Counter::StreamsAbandoned, 1);
        publish_stream_lost(host);
        let reconnect = self.stream.failed(now_ms, &mut vm.rng);
        log_reconnect(
            host,
            &vm.settings.control_plane_cluster,
            &format!("the control plane sent nothing for {timeout_ms} ms"),
            reconnect,
        );
    }

    /// Closes a slot of the process's rates and publishes them.
    fn publish_process_rates(&mut self, host: &mut impl Host, vm: &Vm, now_ms: u64) {
        if vm.settings.allowance.is_none() {
            return;
        }
        self.process.close_slot(now_ms);
        if let Err(err) = host.set_shared_data(PROCESS_RATES_KEY, &self.process.encode(), None) {
            host.log(
                LogLevel::Debug,
                &format!("cannot publish the process rates: {err}"),
            );
        }
    }

    fn publish_workers(&mut self, host: &mut impl Host, sync: &mut VmSync, now_ms: u64) {
        let workers = self.windows.workers(now_ms);
        sync.workers = workers;
        if self.published_workers == Some(workers) {
            return;
        }
        match host.set_shared_data(WORKERS_KEY, &WorkerCount(workers).encode(), None) {
            Ok(()) => self.published_workers = Some(workers),
            Err(err) => host.log(
                LogLevel::Debug,
                &format!("cannot publish the worker count: {err}"),
            ),
        }
    }

    fn drain_queue(
        &mut self,
        host: &mut impl Host,
        vm: &Vm,
        path: &RequestPath,
        sync: &VmSync,
        now_ms: u64,
    ) {
        let Some(queue_id) = sync.queue_id else {
            return;
        };
        for _ in 0..MAX_DEQUEUES_PER_TICK {
            match host.dequeue_shared_queue(queue_id) {
                Ok(Some(bytes)) => match Handoff::decode(bytes.as_slice()) {
                    Ok(mut handoff) => {
                        self.upstream
                            .merge_wire(std::mem::take(&mut handoff.upstream));
                        let directives = &path.directives;
                        if vm.settings.allowance.is_some() {
                            self.process.add_span(
                                handoff.source,
                                handoff.end_ms.saturating_sub(handoff.start_ms),
                            );
                            for count in &handoff.counts {
                                let key = key_of(
                                    &count.bucket,
                                    &count.tenant,
                                    Priority::from_wire(count.priority),
                                );
                                if let Some(budget) = directives.is_budget(&key) {
                                    // Whole units (the wire's cost is a
                                    // float; the cast saturates, NaN to 0).
                                    let cost = budget.then_some(count.offered_cost as u64);
                                    self.process.add(&key, handoff.source, count.offered, cost);
                                }
                            }
                        }
                        self.windows
                            .add_handoff(handoff, now_ms, |key| directives.covers(key));
                    }
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

    fn open_stream(
        &mut self,
        host: &mut impl Host,
        vm: &mut Vm,
        path: &mut RequestPath,
        now_ms: u64,
    ) {
        let cluster = &vm.settings.control_plane_cluster;
        let token = match host.open_control_stream(&grpc_service::stream_target(cluster)) {
            Ok(token) => token,
            Err(err) => {
                let reconnect = self.stream.failed(now_ms, &mut vm.rng);
                log_reconnect(
                    host,
                    cluster,
                    &format!("cannot open the control-plane stream: {err}"),
                    reconnect,
                );
                return;
            }
        };
        self.stream.opened(token, now_ms);
        let instance_id = instance_id(host, vm);
        if vm.settings.proxy_id == ProxyIdentity::PerProcess {
            let name = process_proxy_id(instance_id);
            if vm.name.as_deref() != Some(name.as_str()) {
                vm.adopt_name(name, &mut path.directives);
            }
            if !vm.warned_made_up_name {
                vm.warned_made_up_name = true;
                host.log(
                    LogLevel::Warn,
                    &made_up_name_warning(vm.name.as_deref().unwrap_or_default()),
                );
            }
        }
        let hello = Hello {
            proxy_id: vm.name.clone().unwrap_or_default(),
            instance_id,
            zone: vm.settings.zone.clone(),
            known_proxies: path.directives.known_proxies(),
        };
        let message = ProxyMessage {
            kind: Some(proxy_message::Kind::Hello(hello)),
        };
        // A failed Hello is not a report; the reconnect is logged by send().
        let _ = self.send(host, vm, token, &message.encode_to_vec(), now_ms);
    }

    fn send_report(
        &mut self,
        host: &mut impl Host,
        vm: &mut Vm,
        sync: &VmSync,
        window_ms: u64,
        buckets: Vec<sluice_proto::v1::BucketCount>,
        now_ms: u64,
    ) {
        let upstream = self.upstream.drain();
        let Some((token, sequence)) = self.stream.take_sequence() else {
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
            directive_age_ms: sync.freshness.table_age_ms(now_ms),
            upstream,
        };
        let message = ProxyMessage {
            kind: Some(proxy_message::Kind::Report(report)),
        };
        let counter = if self.send(host, vm, token, &message.encode_to_vec(), now_ms) {
            Counter::ReportsSent
        } else {
            Counter::ReportsFailed
        };
        vm.metrics.add(counter, 1);
    }

    /// Sends on the stream; on failure closes it and schedules a reconnect.
    /// Returns whether the host took the message.
    fn send(
        &mut self,
        host: &mut impl Host,
        vm: &mut Vm,
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
            let reconnect = self.stream.failed(now_ms, &mut vm.rng);
            log_reconnect(
                host,
                &vm.settings.control_plane_cluster,
                &format!("cannot send on the control-plane stream: {err}"),
                reconnect,
            );
            return false;
        }
        true
    }
}

/// Merges a batch into the leader's table and publishes the table (when it
/// changed) and its freshness to every VM.
fn apply_batch(
    host: &mut impl Host,
    vm: &mut Vm,
    path: &mut RequestPath,
    sync: &mut VmSync,
    mut batch: DirectiveBatch,
    now_ms: u64,
) {
    // The table every VM reads holds the ratios this proxy applies: a
    // proxy whose rate counted only in part admits that part.
    sluice_core::proxy_cap::resolve_batch(&mut batch, vm.name.as_deref().unwrap_or_default());
    let previous_epoch = path.directives.provenance().epoch;
    let changes = path.directives.changes_with(&batch);
    let ttl_ms = batch.ttl_ms;
    let outcome = path.directives.merge(batch);
    // A batch on the stream: the control plane is there, so the first
    // one after an outage derives the budgets rather than leaving the
    // outage's frozen ones to the caps.
    path.pacer.set_control_plane_lost(false);
    if changes {
        path.pace_directives();
    } else {
        path.renew_budgets();
    }
    vm.metrics.add(Counter::DirectiveBatches, 1);
    vm.metrics.add(
        Counter::DirectivesRejected,
        u64::try_from(outcome.rejected).unwrap_or(u64::MAX),
    );
    let provenance = path.directives.provenance();
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
            path.directives.len(),
            path.directives.shedding()
        ),
    );
    let stored = host
        .get_shared_data(DIRECTIVES_META_KEY)
        .ok()
        .flatten()
        .and_then(|value| DirectivesMeta::decode(&value.bytes));
    let mut sequence = stored
        .map(|meta| meta.sequence)
        .max(sync.directives_sequence)
        .unwrap_or(0);
    // A VM that just became leader may hold a table other than the
    // shared one: write it whenever the sequence is not its own.
    if changes || sync.directives_sequence != stored.map(|meta| meta.sequence) {
        sequence = sequence.wrapping_add(1);
        if let Err(err) = host.set_shared_data(DIRECTIVES_KEY, &path.directives.encode(), None) {
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
        stream_lost: false,
    };
    if let Err(err) = host.set_shared_data(DIRECTIVES_META_KEY, &meta.encode(), None) {
        host.log(
            LogLevel::Warn,
            &format!("cannot publish directive freshness to other VMs: {err}"),
        );
        return;
    }
    sync.directives_sequence = Some(sequence);
    sync.freshness.received_at_ms = Some(now_ms);
    sync.freshness
        .set_ttl(ttl_ms, vm.settings.directive_ttl.as_millis());
    sync.update_regime(host, vm, path, true, now_ms);
}

/// The process-wide instance id: created once by the first leader and
/// kept in shared data, so `Hello` names the same instance whichever VM
/// leads.
fn instance_id(host: &mut impl Host, vm: &mut Vm) -> u64 {
    match host.get_shared_data(INSTANCE_ID_KEY) {
        Ok(Some(value)) => {
            if let Some(InstanceId(id)) = InstanceId::decode(&value.bytes) {
                return id;
            }
        }
        Ok(None) => {}
        Err(err) => {
            host.log(
                LogLevel::Warn,
                &format!("cannot read the instance id: {err}"),
            );
            return vm.rng.next_u64();
        }
    }
    let id = vm.rng.next_u64();
    if let Err(err) = host.set_shared_data(INSTANCE_ID_KEY, &InstanceId(id).encode(), None) {
        host.log(
            LogLevel::Warn,
            &format!("cannot store the instance id: {err}"),
        );
    }
    id
}

/// Tells every VM that the stream to the control plane is gone (the next
/// batch clears it), so allowances that engage only then take over at once
/// rather than after [`sluice_core::allowance::LOST_AFTER_MS`] without a batch.
fn publish_stream_lost(host: &mut impl Host) {
    let stored = host
        .get_shared_data(DIRECTIVES_META_KEY)
        .ok()
        .flatten()
        .and_then(|value| DirectivesMeta::decode(&value.bytes));
    let Some(meta) = stored.filter(|meta| !meta.stream_lost) else {
        return;
    };
    let lost = DirectivesMeta {
        stream_lost: true,
        ..meta
    };
    if let Err(err) = host.set_shared_data(DIRECTIVES_META_KEY, &lost.encode(), None) {
        host.log(
            LogLevel::Debug,
            &format!("cannot publish the lost stream to other VMs: {err}"),
        );
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
