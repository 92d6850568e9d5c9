//! How a VM stays in step with the rest of its process through shared
//! data, on its ticks: the shared directive table it polls and the
//! freshness regime it implies, its hand-offs of counts to the leader, and
//! what the leader publishes (the worker count, the process's rates, the
//! process's instance id). The lease that picks the leader is the agent's
//! ([`crate::agent`]).

use crate::directives::DirectiveTable;
use crate::host::{Host, LogLevel};
use crate::identity::process_proxy_id;
use crate::metrics::Counter;
use crate::request::path::RequestPath;
use crate::settings::TICK_MS;
use crate::shared::process_rates::shares_of;
use crate::shared::{
    COUNTS_QUEUE, DIRECTIVES_KEY, DIRECTIVES_META_KEY, DirectivesMeta, Handoff, INSTANCE_ID_KEY,
    InstanceId, PROCESS_RATES_KEY, WINDOW_END_KEY, WORKERS_KEY, WindowEnd, WorkerCount,
};
use crate::tick::freshness::Freshness;
use crate::vm::Vm;
use sluice_core::allowance::LOST_AFTER_MS;
use sluice_core::regime::{Fallback, Regime};

/// A slow tick is due this long after the previous one (a little less than
/// [`TICK_MS`], so short ticks that jitter do not skip a beat).
const SLOW_TICK_DUE_MS: u64 = TICK_MS - TICK_MS / 4;

/// What a VM keeps to stay in step with the rest of its process: the
/// shared table it holds and how fresh it is, its hand-offs to the leader,
/// and the worker count the leader publishes.
#[derive(Debug)]
pub(crate) struct VmSync {
    /// Sequence of the shared table last decoded (or written).
    pub(crate) directives_sequence: Option<u64>,
    pub(crate) freshness: Freshness,
    last_slow_ms: Option<u64>,
    /// End of the span the next hand-off starts at.
    handoff_from_ms: Option<u64>,
    handed_off_last: bool,
    /// Whether a leader held a live lease at the last slow tick (someone
    /// drains the queue).
    pub(crate) leader_alive: bool,
    /// VMs serving requests, as the leader last published it.
    pub(crate) workers: u32,
    pub(crate) queue_id: Option<u32>,
}

impl VmSync {
    /// A VM that has read nothing yet; `ttl_ms` until a batch says.
    pub(crate) fn new(ttl_ms: u64) -> Self {
        Self {
            directives_sequence: None,
            freshness: Freshness {
                received_at_ms: None,
                ttl_ms,
            },
            last_slow_ms: None,
            handoff_from_ms: None,
            handed_off_last: false,
            leader_alive: false,
            workers: 1,
            queue_id: None,
        }
    }

    /// Whether a slow tick (lease, hand-offs, metrics) is due at `now_ms`.
    pub(crate) fn slow_tick_due(&self, now_ms: u64) -> bool {
        self.last_slow_ms
            .is_none_or(|last| now_ms.saturating_sub(last) >= SLOW_TICK_DUE_MS)
    }

    /// Starts a slow tick at `now_ms`.
    pub(crate) fn start_slow_tick(&mut self, now_ms: u64) {
        // Counts of a VM that has not handed off yet cover at most the
        // time since its previous slow tick.
        if self.handoff_from_ms.is_none() {
            self.handoff_from_ms = self.last_slow_ms;
        }
        self.last_slow_ms = Some(now_ms);
    }

    /// The name an unnamed proxy's process has, once its first leader drew
    /// the process's instance id: one small read per tick until then,
    /// before the directive table is read, so that canary membership is
    /// decided for that name. The leader draws the id before it opens the
    /// stream, so no directive arrives before.
    pub(crate) fn process_name(&self, host: &impl Host) -> Option<String> {
        let value = host.get_shared_data(INSTANCE_ID_KEY).ok()??;
        let InstanceId(id) = InstanceId::decode(&value.bytes)?;
        Some(process_proxy_id(id))
    }

    pub(crate) fn ensure_queue(&mut self, host: &mut impl Host) {
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

    /// The short-tick check: one small read; the table only if it changed.
    pub(crate) fn poll_directives(
        &mut self,
        host: &mut impl Host,
        vm: &mut Vm,
        path: &mut RequestPath,
        leading: bool,
        now_ms: u64,
    ) {
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
            let heartbeat =
                !meta.stream_lost && self.freshness.received_at_ms != Some(meta.received_at_ms);
            self.freshness.received_at_ms = Some(meta.received_at_ms);
            self.freshness
                .set_ttl(meta.ttl_ms, vm.settings.directive_ttl.as_millis());
            // Whether the control plane is there before the batch is used:
            // the first batch after an outage derives the budgets, which a
            // pacer that still counted itself lost would leave frozen.
            path.pacer.set_control_plane_lost(
                meta.stream_lost || self.freshness.age_ms(now_ms) > LOST_AFTER_MS,
            );
            if self.directives_sequence != Some(meta.sequence) {
                self.read_table(host, path, meta.sequence);
            } else if heartbeat {
                // A batch that changed nothing reached the leader.
                path.renew_budgets();
            }
            let directives = &path.directives;
            path.pacer
                .freeze_budgets(|key| directives.rates_for_cell(key));
        }
        self.update_regime(host, vm, path, leading, now_ms);
    }

    fn read_table(&mut self, host: &mut impl Host, path: &mut RequestPath, sequence: u64) {
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
        match DirectiveTable::decode_replacing(&value.bytes, &path.directives) {
            Ok((table, outcome)) => {
                if outcome.rejected > 0 {
                    host.log(
                        LogLevel::Warn,
                        &format!(
                            "shared directive table had {} invalid entries",
                            outcome.rejected
                        ),
                    );
                }
                path.replace_directives(table);
            }
            Err(err) => host.log(
                LogLevel::Warn,
                &format!("keeping last-known directives: {err}"),
            ),
        }
    }

    /// Moves between fresh and fallback; the leader logs and counts each
    /// transition once for the process.
    pub(crate) fn update_regime(
        &self,
        host: &mut impl Host,
        vm: &mut Vm,
        path: &mut RequestPath,
        leading: bool,
        now_ms: u64,
    ) {
        let regime = self.freshness.regime(now_ms, vm.settings.fallback);
        if regime == path.rules.regime {
            return;
        }
        let was_stale = matches!(path.rules.regime, Regime::Stale(_));
        path.rules.regime = regime;
        let stale = matches!(regime, Regime::Stale(_));
        if stale == was_stale {
            return;
        }
        let level = if leading {
            LogLevel::Warn
        } else {
            LogLevel::Debug
        };
        let age = self.freshness.age_ms(now_ms);
        if stale {
            if leading {
                vm.metrics.add(Counter::FallbackEntered, 1);
            }
            host.log(
                level,
                &format!(
                    "directives are stale ({age} ms since the last batch, TTL {} ms): fallback {} applies",
                    self.freshness.ttl_ms,
                    fallback_name(vm.settings.fallback)
                ),
            );
        } else {
            host.log(
                if leading {
                    LogLevel::Info
                } else {
                    LogLevel::Debug
                },
                "directives are fresh again: leaving the fallback",
            );
        }
    }

    /// A follower's slow tick with a live leader: its counts to the
    /// leader, and what the leader published.
    pub(crate) fn follow(
        &mut self,
        host: &mut impl Host,
        vm: &Vm,
        path: &mut RequestPath,
        now_ms: u64,
    ) {
        let owed = self.owes_closed_window(host);
        self.hand_off(host, vm.id, path, now_ms, owed);
        self.read_workers(host);
        self.read_process_rates(host, vm, path);
    }

    /// Enqueues the counts since the last hand-off; with nothing counted,
    /// only if `even_empty` or the last hand-off had counts.
    fn hand_off(
        &mut self,
        host: &mut impl Host,
        vm_id: u64,
        path: &mut RequestPath,
        now_ms: u64,
        even_empty: bool,
    ) {
        let Some(queue_id) = self.queue_id else {
            return;
        };
        let from_ms = self.handoff_from_ms.unwrap_or(now_ms);
        if path.cells.has_no_counts()
            && path.responses.signals.is_empty()
            && !self.handed_off_last
            && !even_empty
        {
            // Nothing counted since `now_ms`: the next span starts here.
            self.handoff_from_ms = Some(now_ms);
            return;
        }
        let handoff = Handoff {
            source: vm_id,
            start_ms: from_ms,
            end_ms: now_ms,
            counts: path.cells.drain(),
            upstream: path.responses.signals.drain(),
        };
        let had_counts = !handoff.counts.is_empty();
        if let Err(err) = host.enqueue_shared_queue(queue_id, &handoff.encode()) {
            host.log(LogLevel::Warn, &format!("cannot enqueue counts: {err}"));
            let directives = &path.directives;
            path.cells
                .merge(handoff.counts, |key| directives.covers(key));
            return;
        }
        self.handoff_from_ms = Some(now_ms);
        // One empty hand-off after traffic tells the leader this VM is
        // idle, so it need not wait for it at the next window's end.
        self.handed_off_last = had_counts;
    }

    /// Hands the counts over at once when the leader closed a report
    /// window this VM has not handed off past: the window is sent when
    /// every VM has, and waiting for the next slow tick (every 80 ms with a
    /// 20 ms poll) delayed each report, and the control plane's view of a
    /// step, by up to that long.
    pub(crate) fn hand_off_for_closed_window(
        &mut self,
        host: &mut impl Host,
        vm_id: u64,
        path: &mut RequestPath,
        now_ms: u64,
    ) {
        if self.owes_closed_window(host) {
            self.hand_off(host, vm_id, path, now_ms, true);
        }
    }

    /// Whether the leader closed a report window this VM has not handed
    /// off past. Then it hands off even with nothing counted: the leader
    /// waits for every VM that handed off recently, and an idle one would
    /// keep it waiting.
    fn owes_closed_window(&self, host: &impl Host) -> bool {
        if !self.leader_alive {
            return false;
        }
        let Ok(Some(value)) = host.get_shared_data(WINDOW_END_KEY) else {
            return false;
        };
        WindowEnd::decode(&value.bytes)
            .is_some_and(|WindowEnd(end_ms)| self.handoff_from_ms.is_some_and(|from| from < end_ms))
    }

    /// This VM's share of each limited cell's process traffic, as the
    /// leader sees it, for the allowance (only kept when an allowance is
    /// configured).
    pub(crate) fn read_process_rates(&self, host: &impl Host, vm: &Vm, path: &mut RequestPath) {
        if vm.settings.allowance.is_none() {
            return;
        }
        if let Ok(Some(value)) = host.get_shared_data(PROCESS_RATES_KEY)
            && let Some(shares) = shares_of(&value.bytes, vm.id)
        {
            path.pacer.set_process_shares(shares);
            let directives = &path.directives;
            path.pacer
                .budgets_for_new_cells(|key| directives.rates_for_cell(key));
        }
    }

    fn read_workers(&mut self, host: &impl Host) {
        if let Ok(Some(value)) = host.get_shared_data(WORKERS_KEY)
            && let Some(WorkerCount(workers)) = WorkerCount::decode(&value.bytes)
        {
            self.workers = workers;
        }
    }
}

fn fallback_name(fallback: Fallback) -> &'static str {
    match fallback {
        Fallback::KeepLast => "keep_last",
        Fallback::LocalLimit => "local_limit",
        Fallback::Allow => "allow",
    }
}
