//! The request path: the state requests read and write (the directive
//! table, the cells, each one record of this VM's counts and decision
//! state, and what the last tick derived for them) and the agent's part of
//! the decision, around the core's ([`sluice_core::decision::decide`]):
//! find the cell's record and directive, decide, apply the mode, count.
//! The ticks keep it in step ([`crate::tick::sync`]); nothing here makes a
//! host call or reads a clock.

use crate::directives::DirectiveTable;
use crate::metrics::Metrics;
use crate::request::cell_table::CellTable;
use crate::request::classify::CellKeyBuf;
use crate::request::new_cells::NewCellRule;
use crate::request::record::TableStatus;
use crate::request::reject::RejectResponse;
use crate::settings::{AgentSettings, TICK_MS};
use crate::tick::freshness::Freshness;
use crate::tick::pacing::Pacer;
use crate::upstream::ResponseSampler;
use rand::rngs::SmallRng;
use sluice_core::DropReason;
use sluice_core::decision::{self, CellState, Decision, Directed, Now, Outcome, Rules};
use sluice_core::directive::CountedCost;
use sluice_core::regime::Regime;
use std::sync::Arc;

/// What the request path reads and writes.
#[derive(Debug)]
pub(crate) struct RequestPath {
    /// One record per cell: its counts not yet handed on, its directive,
    /// its decision state.
    pub(crate) cells: CellTable,
    pub(crate) directives: DirectiveTable,
    /// The tick side of the cells' strategies, and the process's budgets
    /// and shares.
    pub(crate) pacer: Pacer,
    /// When the pacer's next 100 ms window closes.
    pacer_due_ms: Option<u64>,
    new_cells: NewCellRule,
    /// The decision state of every cell that found no room in [`Self::cells`].
    unrecorded: CellState,
    /// The VM's clock: its last tick (the request path reads no clock),
    /// with the workers a local limit is split between.
    pub(crate) now: Now,
    /// What requests decide by until something changes; its regime is the
    /// freshness regime of the directives.
    pub(crate) rules: Rules,
    /// The table requests are decided under, as of the last change.
    pub(crate) table: TableStatus,
    /// Whether this proxy enforces the local limits (new cells), by the
    /// table's modes.
    enforces_local: bool,
    /// The request's cell, built in reused buffers.
    pub(crate) cell: CellKeyBuf,
    /// The last request's decision.
    pub(crate) last: Decision,
    /// What the last request with an estimate was counted, and what a
    /// usage may still add; written only for such a request, so a request
    /// without a cost rule pays nothing for it.
    pub(crate) last_cost: CountedCost,
    /// The 429 of the last dropped request.
    pub(crate) rejection: Option<Arc<RejectResponse>>,
    /// The reused buffer of the last request's record.
    pub(crate) record: String,
    /// Admitted requests followed to their responses, and what they said.
    pub(crate) responses: ResponseSampler,
}

impl RequestPath {
    /// An empty table and no state, sized by `settings`.
    pub(crate) fn new(settings: &AgentSettings) -> Self {
        let pacer = Pacer::new(settings.decision, settings.allowance, TICK_MS);
        let new_cells = NewCellRule::new(settings.new_bucket, Arc::clone(&settings.responses));
        Self {
            cells: CellTable::new(settings.max_buckets),
            directives: DirectiveTable::with_settings(
                settings.max_buckets,
                Arc::clone(&settings.responses),
                settings.proxy_id.name().unwrap_or_default(),
            ),
            rules: Rules {
                mode: pacer.mode(),
                caps_engaged: pacer.caps_engaged(),
                new_cell_rps: new_cells.rate_rps(1),
                regime: Regime::Fresh,
                has_directives: false,
            },
            pacer,
            pacer_due_ms: None,
            new_cells,
            unrecorded: CellState {
                shared: true,
                ..CellState::default()
            },
            now: Now {
                workers: 1,
                ..Now::default()
            },
            table: TableStatus::default(),
            enforces_local: true,
            cell: CellKeyBuf::default(),
            last: Decision::default(),
            last_cost: CountedCost::default(),
            rejection: None,
            record: String::new(),
            responses: ResponseSampler::new(settings.upstream_sample_every),
        }
    }

    /// Derives what requests decide by from what the ticks and batches
    /// changed: the directives' `freshness`, the `workers` local limits
    /// are split between, and the pacer's and the table's state. The agent
    /// calls it after everything that may change them, so a request reads
    /// them as plain fields.
    pub(crate) fn refresh(&mut self, freshness: &Freshness, workers: u32) {
        self.now.workers = workers;
        self.rules.caps_engaged = self.pacer.caps_engaged();
        self.rules.new_cell_rps = self.new_cells.rate_rps(workers);
        self.rules.has_directives = freshness.received_at_ms.is_some();
        self.table = TableStatus {
            version: self.directives.provenance().version,
            age_ms: freshness.age_ms(self.now.now_ms),
        };
        self.enforces_local = self.directives.modes().enforces_local();
    }

    /// Decides and counts a request of the cell in [`Self::cell`], of
    /// estimated cost `estimate` (`None`: the request has no cost rule),
    /// which is what it weighs under a cost directive; with an estimate,
    /// what it was counted is left in [`Self::last_cost`].
    pub(crate) fn decide(
        &mut self,
        metrics: &mut Metrics,
        rng: &mut SmallRng,
        estimate: Option<u64>,
    ) -> Decision {
        // A bucket an aggregate pattern matches is decided and counted as
        // the bucket the pattern names.
        if let Some(pattern) = self.directives.aggregate_of(&self.cell.bucket) {
            self.cell.bucket.clear();
            self.cell.bucket.push_str(pattern);
        }
        let wide = self.cell.is_bucket_wide();
        let (exact, bucket) = self.cell.keys();
        // A cell met before remembers its directive: one probe (its
        // record's) for everything the decision reads and writes.
        let generation = self.directives.generation();
        let directives = &self.directives;
        let (mut record, found) = self.cells.record(exact, generation, || {
            directives.find((!wide).then_some(exact), bucket)
        });
        // A cell without a record (a full table) decides with the state
        // they all share.
        let (state, new_cell_response) = match record.as_deref_mut() {
            Some(record) => (&mut record.state, Some(&mut record.new_cell_response)),
            None => (&mut self.unrecorded, None),
        };
        let mut entry = found.and_then(|i| self.directives.entry_mut(i));
        // A request without a cost rule weighs 1 under any directive, so
        // a request limit's decision never reads the directive's unit (a
        // cache line of its own in a table of many cells). A costed one
        // counts what its directive lets an estimate count.
        // A costed request under a budget takes the coin
        // ([`decision::Directed::costed`]).
        let (weight, cost, costed) = match (estimate, entry.as_deref()) {
            (Some(estimate), Some(entry)) => (
                entry.directive.weight(Some(estimate)),
                entry.directive.count(estimate),
                entry.directive.cost_unit.is_some(),
            ),
            (Some(estimate), None) => (1, CountedCost::whole(estimate), false),
            (None, _) => (1, CountedCost::default(), false),
        };
        if estimate.is_some() {
            self.last_cost = cost;
        }
        let counted_cost = cost.counted;
        let directive = entry.as_deref_mut().map(|entry| Directed {
            drop_ratio: entry.directive.drop_ratio,
            threshold: entry.directive.threshold,
            reason: entry.directive.reason,
            // Only a costed request reads the directive's unit (its
            // estimate is compared with the budget over the charge factor).
            limit_rps: if estimate.is_some() {
                entry.directive.limit_in_weight_rps()
            } else {
                entry.directive.stated_limit_rps()
            },
            reporting_proxies: entry.directive.reporting_proxies,
            fallback: &mut entry.state.fallback,
            weight,
            costed,
        });
        let decided = decision::decide(state, directive, &self.rules, self.now, rng);
        // A new cell's 429 is rendered with its state, at its first request
        // (allocating then, not at a warm cell's first drop).
        let new_cell_response = match (decided.new_cell, new_cell_response) {
            (true, Some(cached)) => Some(self.new_cells.response(cached, exact)),
            _ => None,
        };
        // The mode: a drop this proxy does not enforce is a shadow drop.
        let outcome = match (decided.reason, entry) {
            (None, _) => Outcome::Admitted,
            (Some(reason), Some(entry)) if entry.enforce => {
                let fallback = reason == DropReason::FallbackLimit;
                keep_rejection(&mut self.rejection, entry.response_for(fallback, weight));
                Outcome::Dropped
            }
            (Some(_), None) if self.enforces_local => {
                self.rejection = Some(
                    new_cell_response.unwrap_or_else(|| self.new_cells.response(&mut None, exact)),
                );
                Outcome::Dropped
            }
            (Some(_), _) => Outcome::ShadowDropped,
        };
        match record {
            Some(record) => record.count(outcome, counted_cost),
            None => self.cells.count_untracked(),
        }
        metrics.count_decision(outcome, decided.reason);
        // Returned from the value, not read back from `self.last`: a read
        // of the whole decision just written field by field would wait for
        // the writes to land.
        let last = Decision { outcome, ..decided };
        self.last = last;
        last
    }

    /// Closes the pacer's rate window every [`TICK_MS`] of clock, whatever
    /// the tick period, so its per-window counts are rates. Counts are
    /// taken before the slow tick hands them on.
    pub(crate) fn close_pacer_window(&mut self, now_ms: u64, rng: &mut SmallRng) {
        self.now.advance(now_ms);
        let due = *self.pacer_due_ms.get_or_insert(now_ms);
        if now_ms < due {
            return;
        }
        self.pacer.on_tick(now_ms, &mut self.cells, rng);
        let directives = &self.directives;
        let clock_ms = self.now.now_ms;
        self.pacer.resolve_new(
            &mut self.cells,
            |key| directives.rates_for_cell(key),
            clock_ms,
        );
        self.pacer.rescale_caps(&mut self.cells, clock_ms);
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
        self.pacer.resolve_all(
            &mut self.cells,
            |key| directives.rates_for_cell(key),
            self.now.now_ms,
        );
        self.pacer
            .budgets_for_directives(|key| directives.rates_for_cell(key));
    }
}

/// Keeps `response` as the 429 of the last drop. A cell's drops in a row
/// answer with the one already kept: its reference count is left alone
/// (two atomic operations a drop saved).
#[inline]
fn keep_rejection(kept: &mut Option<Arc<RejectResponse>>, response: &Arc<RejectResponse>) {
    if !kept
        .as_ref()
        .is_some_and(|kept| Arc::ptr_eq(kept, response))
    {
        *kept = Some(Arc::clone(response));
    }
}
