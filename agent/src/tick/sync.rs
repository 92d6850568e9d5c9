//! How the VMs of one Envoy process stay in step through shared data: the
//! leader lease, the counts queue from followers to the leader, the shared
//! directive table every VM polls, and the freshness regime it implies.

use crate::agent::{Agent, LEASE_TTL_MS, Leadership, Role};
use crate::directives::DirectiveTable;
use crate::host::{Host, LogLevel};
use crate::identity::process_proxy_id;
use crate::leader::process_rates::ProcessRates;
use crate::leader::report_window::ReportWindows;
use crate::leader::stream::ControlStream;
use crate::metrics::Counter;
use crate::shared;
use crate::shared::{
    COUNTS_QUEUE, DIRECTIVES_KEY, DIRECTIVES_META_KEY, DirectivesMeta, Handoff, INSTANCE_ID_KEY,
    InstanceId, LEASE_KEY, Lease, PROCESS_RATES_KEY, WINDOW_END_KEY, WORKERS_KEY, WindowEnd,
    WorkerCount,
};
use crate::tick::freshness::Freshness;
use crate::tick::lease::{LeaseStep, next_step};
use crate::upstream::UpstreamSignals;
use sluice_core::allowance::LOST_AFTER_MS;
use sluice_core::decision::{Fallback, Regime};

/// What a VM keeps to stay in step with the rest of its process: the
/// shared table it holds and how fresh it is, its hand-offs to the leader,
/// and the worker count the leader publishes.
#[derive(Debug)]
pub(crate) struct VmSync {
    /// Sequence of the shared table last decoded (or written).
    pub(crate) directives_sequence: Option<u64>,
    pub(crate) freshness: Freshness,
    pub(crate) last_slow_ms: Option<u64>,
    /// End of the span the next hand-off starts at.
    pub(crate) handoff_from_ms: Option<u64>,
    pub(crate) handed_off_last: bool,
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
}

impl Agent {
    /// An unnamed proxy's VM takes the name its process's instance id
    /// gives, once the first leader has drawn it: one small read per tick
    /// until then, before the directive table is read, so that canary
    /// membership is decided for that name. The leader draws the id before
    /// it opens the stream, so no directive arrives before.
    pub(crate) fn learn_process_name(&mut self, host: &impl Host) {
        if let Ok(Some(value)) = host.get_shared_data(INSTANCE_ID_KEY)
            && let Some(InstanceId(id)) = InstanceId::decode(&value.bytes)
        {
            self.adopt_name(process_proxy_id(id));
        }
    }

    /// Names the proxy `name` from now on.
    pub(crate) fn adopt_name(&mut self, name: String) {
        self.path.directives.set_proxy_id(&name);
        self.name = Some(name);
    }

    pub(crate) fn ensure_queue(&mut self, host: &mut impl Host) {
        if self.sync.queue_id.is_some() {
            return;
        }
        match host.register_shared_queue(COUNTS_QUEUE) {
            Ok(id) => self.sync.queue_id = Some(id),
            Err(err) => host.log(
                LogLevel::Warn,
                &format!("cannot register the counts queue: {err}"),
            ),
        }
    }

    /// Runs the lease step; returns whether some VM holds a live lease.
    pub(crate) fn run_lease(&mut self, host: &mut impl Host, now_ms: u64) -> bool {
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

    pub(crate) fn become_leader(&mut self, host: &impl Host, now_ms: u64) {
        if self.is_leader() {
            return;
        }
        host.log(LogLevel::Info, "this VM now owns the control-plane stream");
        self.role = Role::Leader(Box::new(Leadership {
            stream: ControlStream::new(),
            windows: ReportWindows::new(self.settings.max_buckets, now_ms),
            published_workers: None,
            process: ProcessRates::new(self.settings.max_buckets),
            own_counted_from_ms: now_ms,
            upstream: UpstreamSignals::default(),
        }));
    }

    pub(crate) fn step_down(&mut self, host: &mut impl Host) {
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
        let kept = leadership.windows.drain_all().drain();
        let directives = &self.path.directives;
        self.path.cells.merge(kept, |key| directives.covers(key));
    }

    /// The short-tick check: one small read; the table only if it changed.
    pub(crate) fn poll_directives(&mut self, host: &mut impl Host, now_ms: u64) {
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
            let heartbeat = !meta.stream_lost
                && self.sync.freshness.received_at_ms != Some(meta.received_at_ms);
            self.sync.freshness.received_at_ms = Some(meta.received_at_ms);
            self.sync.freshness.ttl_ms =
                effective_ttl(meta.ttl_ms, self.settings.directive_ttl.as_millis());
            // Whether the control plane is there before the batch is used:
            // the first batch after an outage derives the budgets, which a
            // pacer that still counted itself lost would leave frozen.
            self.path.pacer.set_control_plane_lost(
                meta.stream_lost || self.sync.freshness.age_ms(now_ms) > LOST_AFTER_MS,
            );
            if self.sync.directives_sequence != Some(meta.sequence) {
                self.read_table(host, meta.sequence);
            } else if heartbeat {
                // A batch that changed nothing reached the leader.
                self.path.renew_budgets();
            }
            let directives = &self.path.directives;
            self.path
                .pacer
                .freeze_budgets(|key| directives.rates_for_cell(key));
        }
        self.update_regime(host, now_ms);
    }

    pub(crate) fn read_table(&mut self, host: &mut impl Host, sequence: u64) {
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
        self.sync.directives_sequence = Some(sequence);
        match DirectiveTable::decode_replacing(&value.bytes, &self.path.directives) {
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
                table.adopt_state(&mut self.path.directives);
                self.path.directives = table;
                self.path.pace_directives();
            }
            Err(err) => host.log(
                LogLevel::Warn,
                &format!("keeping last-known directives: {err}"),
            ),
        }
    }

    /// Moves between fresh and fallback; the leader logs and counts each
    /// transition once for the process.
    pub(crate) fn update_regime(&mut self, host: &mut impl Host, now_ms: u64) {
        let regime = self.sync.freshness.regime(now_ms, self.settings.fallback);
        if regime == self.path.regime {
            return;
        }
        let was_stale = matches!(self.path.regime, Regime::Stale(_));
        self.path.regime = regime;
        let stale = matches!(regime, Regime::Stale(_));
        if stale == was_stale {
            return;
        }
        let level = if self.is_leader() {
            LogLevel::Warn
        } else {
            LogLevel::Debug
        };
        let age = self.sync.freshness.age_ms(now_ms);
        if stale {
            if self.is_leader() {
                self.metrics.add(Counter::FallbackEntered, 1);
            }
            host.log(
                level,
                &format!(
                    "directives are stale ({age} ms since the last batch, TTL {} ms): fallback {} applies",
                    self.sync.freshness.ttl_ms,
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

    pub(crate) fn hand_counts_to_leader(&mut self, host: &mut impl Host, now_ms: u64) {
        let owed = self.owes_closed_window(host);
        self.hand_off(host, now_ms, owed);
    }

    /// Enqueues the counts since the last hand-off; with nothing counted,
    /// only if `even_empty` or the last hand-off had counts.
    fn hand_off(&mut self, host: &mut impl Host, now_ms: u64, even_empty: bool) {
        let Some(queue_id) = self.sync.queue_id else {
            return;
        };
        let from_ms = self.sync.handoff_from_ms.unwrap_or(now_ms);
        if self.path.cells.has_no_counts()
            && self.path.responses.signals.is_empty()
            && !self.sync.handed_off_last
            && !even_empty
        {
            // Nothing counted since `now_ms`: the next span starts here.
            self.sync.handoff_from_ms = Some(now_ms);
            return;
        }
        let handoff = Handoff {
            source: self.vm_id,
            start_ms: from_ms,
            end_ms: now_ms,
            counts: self.path.cells.drain(),
            upstream: self.path.responses.signals.drain(),
        };
        let had_counts = !handoff.counts.is_empty();
        if let Err(err) = host.enqueue_shared_queue(queue_id, &handoff.encode()) {
            host.log(LogLevel::Warn, &format!("cannot enqueue counts: {err}"));
            let directives = &self.path.directives;
            self.path
                .cells
                .merge(handoff.counts, |key| directives.covers(key));
            return;
        }
        self.sync.handoff_from_ms = Some(now_ms);
        // One empty hand-off after traffic tells the leader this VM is
        // idle, so it need not wait for it at the next window's end.
        self.sync.handed_off_last = had_counts;
    }

    /// Hands the counts over at once when the leader closed a report
    /// window this VM has not handed off past: the window is sent when
    /// every VM has, and waiting for the next slow tick (every 80 ms with a
    /// 20 ms poll) delayed each report, and the control plane's view of a
    /// step, by up to that long.
    pub(crate) fn hand_off_for_closed_window(&mut self, host: &mut impl Host, now_ms: u64) {
        if self.owes_closed_window(host) {
            self.hand_off(host, now_ms, true);
        }
    }

    /// Whether the leader closed a report window this VM has not handed
    /// off past. Then it hands off even with nothing counted: the leader
    /// waits for every VM that handed off recently, and an idle one would
    /// keep it waiting.
    fn owes_closed_window(&self, host: &impl Host) -> bool {
        if !self.sync.leader_alive {
            return false;
        }
        let Ok(Some(value)) = host.get_shared_data(WINDOW_END_KEY) else {
            return false;
        };
        WindowEnd::decode(&value.bytes).is_some_and(|WindowEnd(end_ms)| {
            self.sync.handoff_from_ms.is_some_and(|from| from < end_ms)
        })
    }

    /// This VM's share of each limited cell's process traffic, as the
    /// leader sees it, for the allowance (only kept when an allowance is
    /// configured).
    pub(crate) fn read_process_rates(&mut self, host: &mut impl Host) {
        if self.settings.allowance.is_none() {
            return;
        }
        if let Ok(Some(value)) = host.get_shared_data(PROCESS_RATES_KEY)
            && let Some(shares) = shared::process_rates::shares_of(&value.bytes, self.vm_id)
        {
            self.path.pacer.set_process_shares(shares);
            let directives = &self.path.directives;
            self.path
                .pacer
                .budgets_for_new_cells(|key| directives.rates_for_cell(key));
        }
    }

    pub(crate) fn read_workers(&mut self, host: &mut impl Host) {
        if let Ok(Some(value)) = host.get_shared_data(WORKERS_KEY)
            && let Some(WorkerCount(workers)) = WorkerCount::decode(&value.bytes)
        {
            self.sync.workers = workers;
        }
    }
}

/// The batch's TTL, else the configured one.
pub(crate) fn effective_ttl(batch_ttl_ms: u64, configured_ms: u64) -> u64 {
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
