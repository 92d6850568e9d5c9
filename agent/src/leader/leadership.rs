//! What only the leader VM does: own the control-plane stream (open it,
//! say hello, reconnect with backoff, give up on a silent one), report the
//! process's counts once per report window, and merge and publish the
//! directive batches that arrive.

use crate::agent::{Agent, Leadership, MAX_DEQUEUES_PER_TICK, RECONNECT_WARN_EVERY, Role};
use crate::host::{Host, LogLevel};
use crate::identity::{ProxyIdentity, made_up_name_warning, process_proxy_id};
use crate::leader::grpc_service;
use crate::leader::stream::Reconnect;
use crate::metrics::Counter;
use crate::request::cell::key_of;
use crate::shared::{
    DIRECTIVES_KEY, DIRECTIVES_META_KEY, DirectivesMeta, Handoff, INSTANCE_ID_KEY, InstanceId,
    PROCESS_RATES_KEY, WINDOW_END_KEY, WORKERS_KEY, WindowEnd, WorkerCount,
};
use crate::tick::sync::effective_ttl;
use prost::Message;
use rand::Rng;
use sluice_core::Priority;
use sluice_proto::v1::{
    ControlMessage, DirectiveBatch, Hello, ProxyMessage, Report, control_message, proxy_message,
};

impl Agent {
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
            publish_stream_lost(host);
        }
    }

    pub(crate) fn lead(&mut self, host: &mut impl Host, leadership: &mut Leadership, now_ms: u64) {
        self.absorb_own_counts(leadership, now_ms);
        leadership.upstream.absorb(&mut self.path.responses.signals);
        self.drain_queue(host, leadership, now_ms);
        self.publish_process_rates(host, leadership, now_ms);
        self.publish_workers(host, leadership, now_ms);
        self.abandon_silent_stream(host, leadership, now_ms);
        if leadership.stream.should_open(now_ms) {
            self.open_stream(host, leadership, now_ms);
        }
        self.report_due_window(host, leadership, now_ms);
    }

    /// The leader's own counts up to `now_ms` into the report window (and,
    /// with allowances, into the process's rates).
    fn absorb_own_counts(&mut self, leadership: &mut Leadership, now_ms: u64) {
        if self.settings.allowance.is_some() {
            let counted_from_ms = std::mem::replace(&mut leadership.own_counted_from_ms, now_ms);
            leadership
                .process
                .add_span(self.vm_id, now_ms.saturating_sub(counted_from_ms));
            let directives = &self.path.directives;
            for (key, offered) in self.path.cells.offered_by_key() {
                if directives.covers(key) {
                    leadership.process.add(key, self.vm_id, offered);
                }
            }
        }
        leadership.windows.add_own(&mut self.path.cells, now_ms);
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
        leadership: &mut Leadership,
        now_ms: u64,
    ) {
        if now_ms.saturating_sub(leadership.windows.current_start_ms())
            >= self.settings.report_interval_ms
        {
            self.absorb_own_counts(leadership, now_ms);
            leadership.windows.close(now_ms);
            if let Err(err) =
                host.set_shared_data(WINDOW_END_KEY, &WindowEnd(now_ms).encode(), None)
            {
                host.log(
                    LogLevel::Debug,
                    &format!("cannot publish the window's end: {err}"),
                );
            }
        }
        if leadership.windows.is_closing() {
            // The followers' hand-offs past the window's end, on the short
            // tick after they saw it closed.
            self.drain_queue(host, leadership, now_ms);
        }
        if let Some(ready) = leadership.windows.take_ready(now_ms) {
            self.send_report(host, leadership, ready.window_ms, ready.counts, now_ms);
        }
    }

    /// Closes a stream that delivered nothing (not even a heartbeat) for
    /// `stream_idle_timeout_ms` and schedules a reconnect with backoff.
    pub(crate) fn abandon_silent_stream(
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
        publish_stream_lost(host);
        let reconnect = leadership.stream.failed(now_ms, &mut self.rng);
        log_reconnect(
            host,
            &self.settings.control_plane_cluster,
            &format!("the control plane sent nothing for {timeout_ms} ms"),
            reconnect,
        );
    }

    /// Closes a slot of the process's rates and publishes them; the leader
    /// reads them back like every VM.
    pub(crate) fn publish_process_rates(
        &mut self,
        host: &mut impl Host,
        leadership: &mut Leadership,
        now_ms: u64,
    ) {
        if self.settings.allowance.is_none() {
            return;
        }
        leadership.process.close_slot(now_ms);
        if let Err(err) =
            host.set_shared_data(PROCESS_RATES_KEY, &leadership.process.encode(), None)
        {
            host.log(
                LogLevel::Debug,
                &format!("cannot publish the process rates: {err}"),
            );
        }
        self.read_process_rates(host);
    }

    pub(crate) fn publish_workers(
        &mut self,
        host: &mut impl Host,
        leadership: &mut Leadership,
        now_ms: u64,
    ) {
        let workers = leadership.windows.workers(now_ms);
        self.sync.workers = workers;
        if leadership.published_workers == Some(workers) {
            return;
        }
        match host.set_shared_data(WORKERS_KEY, &WorkerCount(workers).encode(), None) {
            Ok(()) => leadership.published_workers = Some(workers),
            Err(err) => host.log(
                LogLevel::Debug,
                &format!("cannot publish the worker count: {err}"),
            ),
        }
    }

    pub(crate) fn drain_queue(
        &mut self,
        host: &mut impl Host,
        leadership: &mut Leadership,
        now_ms: u64,
    ) {
        let Some(queue_id) = self.sync.queue_id else {
            return;
        };
        for _ in 0..MAX_DEQUEUES_PER_TICK {
            match host.dequeue_shared_queue(queue_id) {
                Ok(Some(bytes)) => match Handoff::decode(bytes.as_slice()) {
                    Ok(mut handoff) => {
                        leadership
                            .upstream
                            .merge_wire(std::mem::take(&mut handoff.upstream));
                        let directives = &self.path.directives;
                        if self.settings.allowance.is_some() {
                            leadership.process.add_span(
                                handoff.source,
                                handoff.end_ms.saturating_sub(handoff.start_ms),
                            );
                            for count in &handoff.counts {
                                let key = key_of(
                                    &count.bucket,
                                    &count.tenant,
                                    Priority::from_wire(count.priority),
                                );
                                if directives.covers(&key) {
                                    leadership.process.add(&key, handoff.source, count.offered);
                                }
                            }
                        }
                        leadership
                            .windows
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

    pub(crate) fn open_stream(
        &mut self,
        host: &mut impl Host,
        leadership: &mut Leadership,
        now_ms: u64,
    ) {
        let cluster = &self.settings.control_plane_cluster;
        let token = match host.open_control_stream(&grpc_service::stream_target(cluster)) {
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
        let instance_id = self.instance_id(host);
        if self.settings.proxy_id == ProxyIdentity::PerProcess {
            let name = process_proxy_id(instance_id);
            if self.name.as_deref() != Some(name.as_str()) {
                self.adopt_name(name);
            }
            if !self.warned_made_up_name {
                self.warned_made_up_name = true;
                host.log(
                    LogLevel::Warn,
                    &made_up_name_warning(self.name.as_deref().unwrap_or_default()),
                );
            }
        }
        let hello = Hello {
            proxy_id: self.name.clone().unwrap_or_default(),
            instance_id,
            zone: self.settings.zone.clone(),
            known_proxies: self.path.directives.known_proxies(),
        };
        let message = ProxyMessage {
            kind: Some(proxy_message::Kind::Hello(hello)),
        };
        // A failed Hello is not a report; the reconnect is logged by send().
        let _ = self.send(host, leadership, token, &message.encode_to_vec(), now_ms);
    }

    pub(crate) fn send_report(
        &mut self,
        host: &mut impl Host,
        leadership: &mut Leadership,
        window_ms: u64,
        buckets: Vec<sluice_proto::v1::BucketCount>,
        now_ms: u64,
    ) {
        let upstream = leadership.upstream.drain();
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
            directive_age_ms: self.sync.freshness.table_age_ms(now_ms),
            upstream,
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
    pub(crate) fn send(
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
    pub(crate) fn instance_id(&mut self, host: &mut impl Host) -> u64 {
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
                return self.rng.next_u64();
            }
        }
        let id = self.rng.next_u64();
        if let Err(err) = host.set_shared_data(INSTANCE_ID_KEY, &InstanceId(id).encode(), None) {
            host.log(
                LogLevel::Warn,
                &format!("cannot store the instance id: {err}"),
            );
        }
        id
    }

    pub(crate) fn apply_batch(
        &mut self,
        host: &mut impl Host,
        mut batch: DirectiveBatch,
        now_ms: u64,
    ) {
        // The table every VM reads holds the ratios this proxy applies: a
        // proxy whose rate counted only in part admits that part.
        sluice_core::proxy_cap::resolve_batch(&mut batch, self.name.as_deref().unwrap_or_default());
        let previous_epoch = self.path.directives.provenance().epoch;
        let changes = self.path.directives.changes_with(&batch);
        let ttl_ms = batch.ttl_ms;
        let outcome = self.path.directives.merge(batch);
        // A batch on the stream: the control plane is there, so the first
        // one after an outage derives the budgets rather than leaving the
        // outage's frozen ones to the caps.
        self.path.pacer.set_control_plane_lost(false);
        if changes {
            self.path.pace_directives();
        } else {
            self.path.renew_budgets();
        }
        self.metrics.add(Counter::DirectiveBatches, 1);
        self.metrics.add(
            Counter::DirectivesRejected,
            u64::try_from(outcome.rejected).unwrap_or(u64::MAX),
        );
        let provenance = self.path.directives.provenance();
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
                self.path.directives.len(),
                self.path.directives.shedding()
            ),
        );
        let stored = host
            .get_shared_data(DIRECTIVES_META_KEY)
            .ok()
            .flatten()
            .and_then(|value| DirectivesMeta::decode(&value.bytes));
        let mut sequence = stored
            .map(|meta| meta.sequence)
            .max(self.sync.directives_sequence)
            .unwrap_or(0);
        // A VM that just became leader may hold a table other than the
        // shared one: write it whenever the sequence is not its own.
        if changes || self.sync.directives_sequence != stored.map(|meta| meta.sequence) {
            sequence = sequence.wrapping_add(1);
            if let Err(err) =
                host.set_shared_data(DIRECTIVES_KEY, &self.path.directives.encode(), None)
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
            stream_lost: false,
        };
        if let Err(err) = host.set_shared_data(DIRECTIVES_META_KEY, &meta.encode(), None) {
            host.log(
                LogLevel::Warn,
                &format!("cannot publish directive freshness to other VMs: {err}"),
            );
            return;
        }
        self.sync.directives_sequence = Some(sequence);
        self.sync.freshness.received_at_ms = Some(now_ms);
        self.sync.freshness.ttl_ms = effective_ttl(ttl_ms, self.settings.directive_ttl.as_millis());
        self.update_regime(host, now_ms);
    }
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
