//! The request path's state: the directive table requests read, the
//! per-cell decision state (the pacer's credits and allowances, new
//! cells), this VM's counts, and the decision itself. The ticks keep it in
//! step ([`super::sync`]); nothing here makes a host call.

use super::sync::VmSync;
use super::{AgentSettings, Decision, TICK_MS};
use crate::audit::{LastDecision, Undirected};
use crate::cell::CellKeyBuf;
use crate::counters::{BucketCounters, Outcome};
use crate::decision::decide_cell;
use crate::directives::DirectiveTable;
use crate::metrics::Metrics;
use crate::new_cells::NewCells;
use crate::pacing::Pacer;
use crate::upstream::ResponseSampler;
use rand::rngs::SmallRng;
use sluice_core::DropReason;
use sluice_core::decision::{Local, Regime};
use std::sync::Arc;

/// What the request path reads and writes.
#[derive(Debug)]
pub(super) struct RequestPath {
    /// Requests counted on this VM and not yet handed on.
    pub(super) local: BucketCounters,
    pub(super) directives: DirectiveTable,
    /// Per-cell decision state: credit balances and local allowances.
    pub(super) pacer: Pacer,
    /// When the pacer's next 100 ms window closes.
    pub(super) pacer_due_ms: Option<u64>,
    pub(super) new_cells: NewCells,
    pub(super) regime: Regime,
    /// The request's cell, built in reused buffers.
    pub(super) cell: CellKeyBuf,
    /// The VM's clock as of its last tick (the request path reads no clock).
    pub(super) clock_ms: u64,
    /// The last request's decision, for its record.
    pub(super) last: LastDecision,
    /// The reused buffer of [`super::Agent::last_record`].
    pub(super) record: String,
    /// Admitted requests followed to their responses, and what they said.
    pub(super) responses: ResponseSampler,
}

impl RequestPath {
    /// An empty table and no state, sized by `settings`.
    pub(super) fn new(settings: &AgentSettings) -> Self {
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
            regime: Regime::Fresh,
            cell: CellKeyBuf::default(),
            clock_ms: 0,
            last: LastDecision::default(),
            record: String::new(),
            responses: ResponseSampler::new(settings.upstream_sample_every),
        }
    }

    /// Decides and counts a request of the cell in [`Self::cell`], with
    /// what the VM knows of its process (`sync`).
    pub(super) fn decide(
        &mut self,
        sync: &VmSync,
        metrics: &mut Metrics,
        rng: &mut SmallRng,
    ) -> Decision {
        // A bucket an aggregate pattern matches is decided and counted as
        // the bucket the pattern names.
        if let Some(pattern) = self.directives.aggregate_of(&self.cell.bucket) {
            self.cell.bucket.clear();
            self.cell.bucket.push_str(pattern);
        }
        let wide = self.cell.is_bucket_wide();
        let (exact, bucket) = self.cell.keys();
        let local = Local {
            now_ms: self.clock_ms,
            workers: sync.workers,
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
        let mut drop_ratio = 0.0;
        let mut new_bucket = false;
        let (reason, enforce, response) = match found.and_then(|i| self.directives.entry_mut(i)) {
            Some(entry) => {
                drop_ratio = entry.directive.drop_ratio.get();
                let verdict = decide_cell(entry, self.regime, local, &mut self.pacer, exact, rng);
                match verdict {
                    None => (None, false, None),
                    Some(reason) => {
                        let response = if reason == DropReason::FallbackLimit {
                            &entry.fallback_response
                        } else {
                            &entry.response
                        };
                        (Some(reason), entry.enforce, Some(Arc::clone(response)))
                    }
                }
            }
            None => {
                let verdict = self.new_cells.decide(
                    exact,
                    local.now_ms,
                    local.workers,
                    sync.freshness.received_at_ms.is_some() && self.regime == Regime::Fresh,
                );
                new_bucket = self.new_cells.last_was_new();
                match verdict {
                    None => (None, false, None),
                    Some((reason, response)) => (
                        Some(reason),
                        self.directives.modes().enforces_local(),
                        Some(response),
                    ),
                }
            }
        };
        let (outcome, decision) = match (reason, response) {
            (Some(_), Some(response)) if enforce => (Outcome::Dropped, Decision::Reject(response)),
            (Some(_), _) => (Outcome::ShadowDropped, Decision::Admit),
            (None, _) => (Outcome::Admitted, Decision::Admit),
        };
        match slot {
            Some(slot) => slot.count(outcome),
            None => self.local.record_cell(exact, outcome, found.is_some()),
        }
        metrics.count_decision(outcome, reason);
        self.last = LastDecision {
            outcome,
            reason,
            drop_ratio,
            undirected: if sync.freshness.received_at_ms.is_none() {
                Some(Undirected::NoDirectives)
            } else if matches!(self.regime, Regime::Stale(_)) {
                Some(Undirected::Fallback)
            } else if new_bucket {
                Some(Undirected::NewBucket)
            } else {
                None
            },
            version: self.directives.provenance().version,
            age_ms: sync.freshness.age_ms(self.clock_ms),
        };
        decision
    }

    /// Closes the pacer's rate window every [`TICK_MS`] of clock, whatever
    /// the tick period, so its per-window counts are rates. Counts are
    /// taken before the slow tick hands them on.
    pub(super) fn close_pacer_window(&mut self, now_ms: u64, rng: &mut SmallRng) {
        self.pacer.advance_clock(now_ms);
        let due = *self.pacer_due_ms.get_or_insert(now_ms);
        if now_ms < due {
            return;
        }
        let directives = &self.directives;
        self.pacer.on_tick_with(
            now_ms,
            self.local.buckets(),
            |key| directives.covers(key),
            rng,
        );
        self.pacer.resolve_new(|key| directives.rates_for_cell(key));
        self.pacer.rescale_caps();
        // After a stall, restart the cadence rather than closing a burst of
        // empty windows.
        let next = due.saturating_add(TICK_MS);
        self.pacer_due_ms = Some(if next <= now_ms {
            now_ms.saturating_add(TICK_MS)
        } else {
            next
        });
    }

    /// A batch that changed nothing (a heartbeat): the control plane is
    /// there, so the budgets a loss would freeze follow the process's rate
    /// ([`crate::pacing::Pacer::budgets_at_batch`]).
    pub(super) fn renew_budgets(&mut self) {
        let directives = &self.directives;
        self.pacer
            .budgets_at_batch(|key| directives.rates_for_cell(key));
    }

    /// Lets the pacer derive allowances of cells whose directive changed.
    pub(super) fn pace_directives(&mut self) {
        let directives = &self.directives;
        self.pacer.resolve_all(|key| directives.rates_for_cell(key));
        self.pacer
            .budgets_for_directives(|key| directives.rates_for_cell(key));
    }
}
