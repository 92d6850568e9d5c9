//! The request path's state: the directive table requests read, the
//! cells (each one record: this VM's counts, the pacer's credit and
//! allowance, the new-cell limiter), and the decision itself. The ticks keep it in
//! step ([`crate::tick::sync`]); nothing here makes a host call.

use crate::directives::DirectiveTable;
use crate::leader::counters::Outcome;
use crate::metrics::Metrics;
use crate::request::cell::CellKeyBuf;
use crate::request::cell_table::CellTable;
use crate::request::new_cells::NewCellRule;
use crate::request::record::{LastDecision, Undirected};
use crate::request::reject::RejectResponse;
use crate::settings::{AgentSettings, TICK_MS};
use crate::tick::pacing::Pacer;
use crate::tick::sync::VmSync;
use crate::upstream::ResponseSampler;
use rand::rngs::SmallRng;
use sluice_core::DropReason;
use sluice_core::cell_decision::{self, CellState, Directed};
use sluice_core::decision::Regime;
use std::sync::Arc;

/// What the request path does with a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Let it through (also a shadow drop).
    Admit,
    /// Answer with this prepared 429.
    Reject(Arc<RejectResponse>),
}

/// What the request path reads and writes.
#[derive(Debug)]
pub(crate) struct RequestPath {
    /// One record per cell: its counts not yet handed on, its directive,
    /// its decision state.
    pub(crate) cells: CellTable,
    pub(crate) directives: DirectiveTable,
    /// The decision strategy, and the process's budgets and shares.
    pub(crate) pacer: Pacer,
    /// When the pacer's next 100 ms window closes.
    pub(crate) pacer_due_ms: Option<u64>,
    pub(crate) new_cells: NewCellRule,
    /// The decision state of every cell that found no room in [`Self::cells`].
    pub(crate) unrecorded: CellState,
    pub(crate) regime: Regime,
    /// The request's cell, built in reused buffers.
    pub(crate) cell: CellKeyBuf,
    /// The VM's clock as of its last tick (the request path reads no clock).
    pub(crate) clock_ms: u64,
    /// The last request's decision, for its record.
    pub(crate) last: LastDecision,
    /// The reused buffer of [`crate::agent::Agent::last_record`].
    pub(crate) record: String,
    /// Admitted requests followed to their responses, and what they said.
    pub(crate) responses: ResponseSampler,
}

impl RequestPath {
    /// An empty table and no state, sized by `settings`.
    pub(crate) fn new(settings: &AgentSettings) -> Self {
        Self {
            cells: CellTable::new(settings.max_buckets),
            directives: DirectiveTable::with_settings(
                settings.max_buckets,
                Arc::clone(&settings.responses),
                settings.proxy_id.name().unwrap_or_default(),
            ),
            pacer: Pacer::new(settings.decision, settings.allowance, TICK_MS),
            pacer_due_ms: None,
            new_cells: NewCellRule::new(settings.new_bucket, Arc::clone(&settings.responses)),
            unrecorded: CellState {
                shared: true,
                ..CellState::default()
            },
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
    pub(crate) fn decide(
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
        let now = self.pacer.now(sync.workers);
        // A cell met before remembers its directive: one probe (its
        // record's) for everything the decision reads and writes.
        let generation = self.directives.generation();
        let directives = &self.directives;
        let (mut record, found) = self.cells.record(exact, generation, || {
            directives.find((!wide).then_some(exact), bucket)
        });
        let directed = sync.freshness.received_at_ms.is_some() && self.regime == Regime::Fresh;
        let rules = self
            .pacer
            .rules(self.new_cells.rate_rps(sync.workers), directed);
        // A cell without a record (a full table) decides with the state
        // they all share.
        let (state, new_cell_response) = match record.as_deref_mut() {
            Some(record) => (&mut record.state, Some(&mut record.new_cell_response)),
            None => (&mut self.unrecorded, None),
        };
        let mut entry = found.and_then(|i| self.directives.entry_mut(i));
        let drop_ratio = entry
            .as_ref()
            .map_or(0.0, |entry| entry.directive.drop_ratio.get());
        let directive = entry.as_deref_mut().map(|entry| Directed {
            threshold: entry.directive.threshold,
            reason: entry.directive.reason,
            limit_rps: entry.directive.stated_limit_rps(),
            reporting_proxies: entry.directive.reporting_proxies,
            fallback: &mut entry.state.fallback,
        });
        let decided = cell_decision::decide(state, directive, self.regime, &rules, now, rng);
        let reason = decided.drop;
        // A new cell's 429 is rendered with its state, at its first request
        // (allocating then, not at a warm cell's first drop).
        let new_cell_response = match (decided.as_new_cell, new_cell_response) {
            (true, Some(cached)) => Some(self.new_cells.response(cached, exact)),
            _ => None,
        };
        let (enforce, response) = match (reason, entry) {
            (None, _) => (false, None),
            (Some(DropReason::FallbackLimit), Some(entry)) => {
                (entry.enforce, Some(Arc::clone(&entry.fallback_response)))
            }
            (Some(_), Some(entry)) => (entry.enforce, Some(Arc::clone(&entry.response))),
            (Some(_), None) => (
                self.directives.modes().enforces_local(),
                Some(
                    new_cell_response.unwrap_or_else(|| self.new_cells.response(&mut None, exact)),
                ),
            ),
        };
        let new_bucket = decided.as_new_cell;
        let (outcome, decision) = match (reason, response) {
            (Some(_), Some(response)) if enforce => (Outcome::Dropped, Decision::Reject(response)),
            (Some(_), _) => (Outcome::ShadowDropped, Decision::Admit),
            (None, _) => (Outcome::Admitted, Decision::Admit),
        };
        match record {
            Some(record) => record.count(outcome),
            None => self.cells.count_untracked(),
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
    pub(crate) fn close_pacer_window(&mut self, now_ms: u64, rng: &mut SmallRng) {
        self.pacer.advance_clock(now_ms);
        let due = *self.pacer_due_ms.get_or_insert(now_ms);
        if now_ms < due {
            return;
        }
        self.pacer.on_tick(now_ms, &mut self.cells, rng);
        let directives = &self.directives;
        self.pacer
            .resolve_new(&mut self.cells, |key| directives.rates_for_cell(key));
        self.pacer.rescale_caps(&mut self.cells);
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
    /// ([`crate::tick::pacing::Pacer::budgets_at_batch`]).
    pub(crate) fn renew_budgets(&mut self) {
        let directives = &self.directives;
        self.pacer
            .budgets_at_batch(|key| directives.rates_for_cell(key));
    }

    /// Replaces the directive table with `table`, keeping the per-cell
    /// state of cells both hold, and derives the allowances of cells whose
    /// directive changed.
    pub(crate) fn replace_directives(&mut self, mut table: DirectiveTable) {
        table.adopt_state(&mut self.directives);
        self.directives = table;
        self.pace_directives();
    }

    /// Lets the pacer derive allowances of cells whose directive changed.
    pub(crate) fn pace_directives(&mut self) {
        let directives = &self.directives;
        self.pacer
            .resolve_all(&mut self.cells, |key| directives.rates_for_cell(key));
        self.pacer
            .budgets_for_directives(|key| directives.rates_for_cell(key));
    }
}
