//! The tick side of the directed cells' strategies on one VM: when a
//! cell's state ([`Pace`], in its record, [`crate::request::cell_table`]) is made,
//! its rate slots closed, its allowance derived from its directive, and its
//! cap rescaled to the process's budget. The request path's decision over
//! that state is the core's ([`sluice_core::decision::decide`]).
//!
//! - [`DecisionMode::Coin`]: an independent biased coin per request (the
//!   original behaviour);
//! - [`DecisionMode::Credit`]: error diffusion ([`sluice_core::credit`]), the
//!   same ratio without the coin's noise;
//! - with [`AllowanceSettings`], a bucket whose directive gives this VM a
//!   share ([`sluice_core::allowance`]) is decided by that local cap instead, so
//!   a load step is held at the limit before the next directive arrives.
//!
//! A cell's state is created on the tick for cells counted since the last
//! report, never on the request path, and kept while the cell is capped or
//! less than 10 s idle.

use rand::Rng;

use crate::fast_map::{self, FastMap};
use crate::request::cell_table::CellTable;
use crate::shared::process_rates::ProcessShare;
use crate::tick::process_budget::ProcessBudget;
use sluice_core::allowance::{AllowanceSettings, DirectiveRates, Engage};
pub use sluice_core::decision::DecisionMode;
use sluice_core::decision::Pace;

/// Ticks without a request after which an uncapped bucket is forgotten.
const IDLE_TICKS: u32 = 100;

/// The decision strategy of one VM, and what it knows of its process; the
/// cells' own state is in their records.
#[derive(Debug, Clone)]
pub struct Pacer {
    mode: DecisionMode,
    allowance: Option<AllowanceSettings>,
    tick_ms: u64,
    /// When the rate slots were last closed.
    closed_at_ms: Option<u64>,
    /// Cells the last tick started tracking whose directive has not been
    /// looked up yet ([`Self::resolve_new`]).
    unresolved: Vec<String>,
    /// Whether the caps decide now ([`Engage`]).
    caps_engaged: bool,
    /// Whether the control plane is lost.
    lost: bool,
    /// This VM's share of each cell's process traffic, and that traffic,
    /// as the leader last published them ([`crate::leader::process_rates`]).
    process: FastMap<String, ProcessShare>,
    /// What the whole process may admit per cell, derived at each
    /// directive while the control plane is there and frozen when it is
    /// lost ([`Self::freeze_budgets`]).
    budgets: FastMap<String, ProcessBudget>,
    /// Whether this outage's budgets are frozen.
    budgets_frozen: bool,
}

impl Pacer {
    /// A pacer for VMs ticking every `tick_ms`.
    pub fn new(mode: DecisionMode, allowance: Option<AllowanceSettings>, tick_ms: u64) -> Self {
        Self {
            mode,
            allowance,
            tick_ms,
            closed_at_ms: None,
            unresolved: Vec::new(),
            caps_engaged: allowance.is_some_and(|a| a.engage == Engage::Always),
            lost: false,
            process: fast_map::new(),
            budgets: fast_map::new(),
            budgets_frozen: false,
        }
    }

    /// This VM's share of each cell's process traffic, as the leader
    /// published it.
    pub fn set_process_shares(&mut self, process: FastMap<String, ProcessShare>) {
        self.process = process;
    }

    /// Once the control plane is lost (and the caps decide), freezes what
    /// the whole process may admit of each cell: the budget derived at the
    /// last batch ([`Self::budgets_for_directives`],
    /// [`Self::budgets_at_batch`]), or for a cell that has none the
    /// allowance of the process's offered rate now under its last directive
    /// (`rates_of`). Until the control plane is back,
    /// [`Self::rescale_caps`] splits it between the VMs.
    ///
    /// Deriving the budgets at the loss instead would count the first
    /// moments after it: when the loss comes with a surge (the control
    /// plane killed by the load that follows), the process's rate of the
    /// last second already holds some of the surge, and the budget grows
    /// with how late the VM noticed (+7 % of the process's rate measured
    /// for 30 ms of a tripled load).
    pub fn freeze_budgets(&mut self, rates_of: impl FnMut(&str) -> Option<DirectiveRates>) {
        if !(self.lost && self.caps_engaged) || self.budgets_frozen {
            return;
        }
        self.budgets_frozen = true;
        self.derive_budgets(rates_of);
    }

    /// While the control plane is there, the budgets follow each new
    /// directive table and hold between directives. With caps that always
    /// decide ([`Engage::Always`]) a step spread over several workers then
    /// meets the process's budget rather than each worker's frozen cap (a
    /// worker that had no traffic before the step has none); with
    /// [`Engage::WhenLost`] they are also renewed at every heartbeat
    /// ([`Self::budgets_at_batch`]) and wait to be frozen at the loss.
    pub fn budgets_for_directives(&mut self, rates_of: impl FnMut(&str) -> Option<DirectiveRates>) {
        if !self.lost {
            self.budgets.clear();
            self.derive_budgets(rates_of);
        }
    }

    /// At every batch the control plane sends while it is there,
    /// heartbeats included: with [`Engage::WhenLost`], re-derives every
    /// budget from the process's rate now, so the one frozen at a loss is at
    /// most a heartbeat old. A steady cell's directive is pushed once, then
    /// only heartbeats come: a budget derived at that push, or when the
    /// cell's process rate was first established, kept whatever that one
    /// moment's rate said for the rest of the run, and a loss an hour later
    /// froze it. With [`Engage::Always`] the caps decide now and the
    /// budgets move with directives only: re-derived at a heartbeat during a
    /// load step, a budget would grow with the step under the old ratio
    /// until the control plane's next directive.
    pub fn budgets_at_batch(&mut self, rates_of: impl FnMut(&str) -> Option<DirectiveRates>) {
        if self
            .allowance
            .is_some_and(|settings| settings.engage == Engage::WhenLost)
        {
            self.budgets_for_directives(rates_of);
        }
    }

    /// Gives a budget to the cells that have none yet (their traffic was
    /// not established at the last directive); the others keep theirs
    /// until the next directive (with [`Engage::WhenLost`], the next
    /// batch). VMs call it when new process shares arrive.
    pub fn budgets_for_new_cells(&mut self, rates_of: impl FnMut(&str) -> Option<DirectiveRates>) {
        if !self.lost {
            self.derive_budgets(rates_of);
        }
    }

    /// Derives the budget of every established cell that has none.
    fn derive_budgets(&mut self, mut rates_of: impl FnMut(&str) -> Option<DirectiveRates>) {
        let Some(settings) = self.allowance else {
            return;
        };
        for (key, process) in &self.process {
            if self.budgets.contains_key(key) {
                continue;
            }
            // A cell just starting has no rate to hold the process to; its
            // VMs keep deriving their caps from their own traffic.
            if !process.established {
                continue;
            }
            let Some(rates) = rates_of(key) else {
                continue;
            };
            if let Some(budget) = ProcessBudget::derive(process.total_rps, rates, settings) {
                self.budgets.insert(key.clone(), budget);
            }
        }
    }

    /// While the caps decide, sets each cell's cap to the process's budget
    /// (frozen at the loss, or derived at the last directive with
    /// [`Engage::Always`]) times this VM's share of the process's traffic
    /// now. Caps frozen per VM would under-admit as the load moves between
    /// workers (connections come and go); a surge spread over the VMs
    /// leaves the shares, and so the caps, where they were. A cell without a
    /// budget or a share keeps the cap it has.
    pub fn rescale_caps(&mut self, cells: &mut CellTable, now_ms: u64) {
        let Some(settings) = self.allowance else {
            return;
        };
        if !self.caps_engaged || self.budgets.is_empty() {
            return;
        }
        let slack_ms = self.tick_ms.saturating_add(settings.burst_ms);
        for (key, pace) in paces(cells) {
            if !pace.is_directed() {
                continue;
            }
            let (Some(budget), Some(process)) = (self.budgets.get_mut(key), self.process.get(key))
            else {
                continue;
            };
            let rate =
                budget.rps_at(process.total_rps, process.share, pace.last_rate()) * process.share;
            pace.set_cap_rate(rate, slack_ms, now_ms);
        }
    }

    /// Tells the pacer whether the control plane is lost: with
    /// [`Engage::WhenLost`], the caps decide only then.
    pub fn set_control_plane_lost(&mut self, lost: bool) {
        if !lost {
            self.budgets_frozen = false;
        }
        self.lost = lost;
        self.caps_engaged = match self.allowance {
            Some(settings) => settings.engage == Engage::Always || lost,
            None => false,
        };
    }

    /// Whether the caps decide now.
    pub fn caps_engaged(&self) -> bool {
        self.caps_engaged
    }

    /// How a drop ratio is applied.
    pub fn mode(&self) -> DecisionMode {
        self.mode
    }

    /// Whether any bucket state is used: a coin without allowances reads
    /// none, so it keeps none and the request path skips the probe.
    fn keeps_state(&self) -> bool {
        self.mode == DecisionMode::Credit || self.allowance.is_some()
    }

    /// The tick: closes every cell's rate slot, and starts tracking the
    /// cells of `cells` counted since the last report that have no state
    /// yet, so that their rate is known when their first directive arrives.
    /// Each slot holds the time it really covered, however late the tick.
    /// A flood of one-off keys cannot keep a limited cell from getting its
    /// allowance: records are what the table bounds, with a quarter kept for
    /// cells with a directive.
    pub fn on_tick(&mut self, now_ms: u64, cells: &mut CellTable, rng: &mut impl Rng) {
        let span_ms = match self.closed_at_ms {
            Some(closed) if now_ms > closed => now_ms - closed,
            _ => self.tick_ms,
        };
        self.closed_at_ms = Some(now_ms);
        let derive = self
            .allowance
            .map(|settings| (settings, self.tick_ms.saturating_add(settings.burst_ms)));
        let keeps_state = self.keeps_state();
        let track = self.allowance.is_some();
        let unresolved = &mut self.unresolved;
        cells.retain(|key, record| {
            let counted = record.counts().offered > 0;
            let pace = &mut record.state.pace;
            if let Some(kept) = pace
                && !kept.close_slot(span_ms, IDLE_TICKS)
            {
                *pace = None;
            }
            if let (Some(pace), Some((settings, slack_ms))) = (pace.as_mut(), derive) {
                pace.follow_window(settings, slack_ms, now_ms);
            }
            if keeps_state && pace.is_none() && counted {
                // Counted by the caller, not here: the request that made
                // this tick track the cell is credited to it.
                *pace = Some(Box::new(Pace::new(rng.next_u64(), span_ms)));
                if track {
                    unresolved.push(key.to_owned());
                }
            }
            true
        });
    }

    /// Reconciles every cell's allowance with the directive `rates_of`
    /// finds for it now (the cell's own, else its bucket's): a cell whose
    /// directive changed is derived again, one that lost its directive
    /// loses its cap, and the others stay frozen. VMs call it whenever their
    /// directive table changes. Resolving from the cells, not from the
    /// directives, also caps a tenant's cell that a bucket-wide directive
    /// governs.
    pub fn resolve_all(
        &mut self,
        cells: &mut CellTable,
        mut rates_of: impl FnMut(&str) -> Option<DirectiveRates>,
        now_ms: u64,
    ) {
        let Some(settings) = self.allowance else {
            return;
        };
        self.unresolved.clear();
        let slack_ms = self.tick_ms.saturating_add(settings.burst_ms);
        for (key, pace) in paces(cells) {
            pace.reconcile(rates_of(key), settings, slack_ms, now_ms);
        }
    }

    /// Reconciles the cells the last tick started tracking, as
    /// [`Self::resolve_all`] does for all. Without it, a VM that meets a
    /// cell for the first time (a new connection on another worker) would
    /// hold no cap for it until its directive next changes.
    pub fn resolve_new(
        &mut self,
        cells: &mut CellTable,
        mut rates_of: impl FnMut(&str) -> Option<DirectiveRates>,
        now_ms: u64,
    ) {
        let Some(settings) = self.allowance else {
            return;
        };
        let slack_ms = self.tick_ms.saturating_add(settings.burst_ms);
        for key in self.unresolved.drain(..) {
            if let Some(pace) = cells
                .get_mut(&key)
                .and_then(|record| record.state.pace.as_deref_mut())
            {
                pace.reconcile(rates_of(&key), settings, slack_ms, now_ms);
            }
        }
    }
}

/// The cells of `cells` with state, and their state.
fn paces(cells: &mut CellTable) -> impl Iterator<Item = (&str, &mut Pace)> {
    cells
        .iter_mut()
        .filter_map(|(key, record)| record.state.pace.as_deref_mut().map(|pace| (key, pace)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::cell_table::unlimited_cap;
    use sluice_core::decision::Outcome;
    use sluice_core::decision::{CellState, Directed, Now, Rules, decide};
    use sluice_core::regime::Regime;
    use sluice_core::{DropReason, DropThreshold};
    use std::ops::{Deref, DerefMut};

    /// A pacer with the cells it paces, driven as the request path drives
    /// them: a tick counts each cell it is given once, closes the pacer's
    /// window and hands the counts on.
    struct Paced {
        pacer: Pacer,
        cells: CellTable,
        /// The clock, as the request path keeps it.
        now: Now,
    }

    impl Deref for Paced {
        type Target = Pacer;
        fn deref(&self) -> &Pacer {
            &self.pacer
        }
    }

    impl DerefMut for Paced {
        fn deref_mut(&mut self) -> &mut Pacer {
            &mut self.pacer
        }
    }

    impl Paced {
        fn new(
            mode: DecisionMode,
            allowance: Option<AllowanceSettings>,
            tick_ms: u64,
            max_cells: usize,
        ) -> Self {
            Self {
                pacer: Pacer::new(mode, allowance, tick_ms),
                cells: CellTable::new(max_cells),
                now: Now {
                    workers: 1,
                    ..Now::default()
                },
            }
        }

        fn on_tick<'a>(
            &mut self,
            now_ms: u64,
            seen: impl IntoIterator<Item = &'a str>,
            rng: &mut SmallRng,
        ) {
            self.on_tick_with(now_ms, seen, |_| true, rng);
        }

        /// [`Self::on_tick`], where `limited` says which cells have a
        /// directive.
        fn on_tick_with<'a>(
            &mut self,
            now_ms: u64,
            seen: impl IntoIterator<Item = &'a str>,
            limited: impl Fn(&str) -> bool,
            rng: &mut SmallRng,
        ) {
            for key in seen {
                match self.cells.record(key, 0, || limited(key).then_some(0)).0 {
                    Some(record) => record.count(Outcome::Admitted, 0),
                    None => self.cells.count_untracked(),
                }
            }
            self.now.advance(now_ms);
            self.pacer.on_tick(now_ms, &mut self.cells, rng);
            self.cells.drain();
        }

        /// Moves the clock, as the request path's tick does.
        fn advance_clock(&mut self, now_ms: u64) {
            self.now.advance(now_ms);
        }

        /// Decides a request of `key` as the request path does, under a
        /// fresh directive of `threshold`: whether it is admitted.
        fn decide(&mut self, key: &str, threshold: DropThreshold, rng: &mut SmallRng) -> bool {
            let rules = Rules {
                mode: self.pacer.mode(),
                caps_engaged: self.pacer.caps_engaged(),
                new_cell_rps: None,
                regime: Regime::Fresh,
                has_directives: true,
            };
            let directive = Directed {
                drop_ratio: sluice_core::DropRatio::saturating(0.0),
                threshold,
                reason: DropReason::PriorityShed,
                limit_rps: None,
                reporting_proxies: 0,
                fallback: &mut None,
                weight: 1,
                costed: false,
            };
            let mut stateless = CellState::default();
            let state = match self.cells.get_mut(key) {
                Some(record) => &mut record.state,
                None => &mut stateless,
            };
            decide(state, Some(directive), &rules, self.now, rng).admits()
        }

        fn resolve_all(&mut self, rates_of: impl FnMut(&str) -> Option<DirectiveRates>) {
            self.pacer
                .resolve_all(&mut self.cells, rates_of, self.now.now_ms);
        }

        fn resolve_new(&mut self, rates_of: impl FnMut(&str) -> Option<DirectiveRates>) {
            self.pacer
                .resolve_new(&mut self.cells, rates_of, self.now.now_ms);
        }

        fn rescale_caps(&mut self) {
            self.pacer.rescale_caps(&mut self.cells, self.now.now_ms);
        }

        fn pace(&mut self, key: &str) -> Option<Pace> {
            self.cells
                .get_mut(key)
                .and_then(|record| record.state.pace.as_deref().copied())
        }

        /// Cells with state.
        fn len(&mut self) -> usize {
            paces(&mut self.cells).count()
        }

        fn is_empty(&mut self) -> bool {
            self.len() == 0
        }
    }
    use rand::SeedableRng;
    use rand::rngs::SmallRng;
    use sluice_core::DropRatio;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// No headroom and no burst beyond one tick.
    const EXACT: AllowanceSettings = AllowanceSettings {
        headroom: 0.0,
        burst_ms: 0,
        engage: Engage::Always,
    };

    /// Offers `per_tick` requests a tick for `ticks` ticks; returns admitted.
    fn run(pacer: &mut Paced, ratio: f64, per_tick: u32, ticks: u64, start: u64) -> u32 {
        let mut rng = SmallRng::seed_from_u64(1);
        let threshold = DropRatio::new(ratio).unwrap().threshold();
        let mut admitted = 0;
        for tick in start..start + ticks {
            pacer.on_tick(tick * 100, ["a"], &mut rng);
            for _ in 0..per_tick {
                admitted += u32::from(pacer.decide("a", threshold, &mut rng));
            }
        }
        admitted
    }

    #[test]
    fn credit_admits_the_share_exactly() {
        let mut pacer = Paced::new(DecisionMode::Credit, None, 100, 10);
        let admitted = run(&mut pacer, 0.75, 40, 100, 0);
        assert!((999..=1_001).contains(&admitted), "{admitted}");
    }

    #[test]
    fn allowance_holds_a_load_step_at_the_share() {
        let mut pacer = Paced::new(DecisionMode::Coin, Some(EXACT), 100, 10);
        // 200 rps here, 800 fleet-wide against a limit of 1000: ratio 0,
        // this VM's share of the limit is 250 rps.
        run(&mut pacer, 0.0, 20, 20, 0);
        pacer.resolve_all(|_| Some(rates(0.0, Some(1_000.0), 800.0)));
        // The load quadruples before the next directive: held at the share
        // plus the counting margin below the limit, (200 + √200 + 1) × 1.25.
        let admitted = run(&mut pacer, 0.0, 80, 10, 20);
        assert!((268..=280).contains(&admitted), "{admitted}");
    }

    #[test]
    fn a_cap_follows_the_window_until_it_is_full() {
        let mut pacer = Paced::new(DecisionMode::Credit, Some(EXACT), 100, 10);
        // Two slots of a 100 rps cell, then a directive: ratio 0, the fleet
        // exactly at its limit, so this VM may admit what it is offered plus
        // a counting margin. From two slots (11 requests) that margin is
        // below 100 rps; frozen there, the cap would cut the cell.
        run(&mut pacer, 0.0, 10, 2, 0);
        pacer.resolve_all(|_| Some(rates(0.0, Some(1_000.0), 1_000.0)));
        // Following the window, at most a request or two is lost while it
        // fills; frozen at two slots, a quarter would be.
        let admitted = run(&mut pacer, 0.0, 10, 8, 2);
        assert!((76..=80).contains(&admitted), "{admitted}");
        // Once the second is full the cap stays: the load quadruples and is
        // held at the local rate plus its counting margin.
        let admitted = run(&mut pacer, 0.0, 40, 10, 10);
        assert!((95..=130).contains(&admitted), "{admitted}");
    }

    fn rates(ratio: f64, limit_rps: Option<f64>, fleet_offered_rps: f64) -> DirectiveRates {
        DirectiveRates {
            drop_ratio: DropRatio::new(ratio).unwrap(),
            limit_rps,
            fleet_offered_rps,
        }
    }

    #[test]
    fn a_cell_met_after_its_directive_is_capped_from_its_first_tick() {
        let mut pacer = Paced::new(DecisionMode::Coin, Some(EXACT), 100, 10);
        // The directive arrived before this VM saw the cell: nothing to cap.
        pacer.resolve_all(|_| Some(rates(0.5, Some(1_000.0), 2_000.0)));
        assert!(pacer.is_empty());
        let mut rng = SmallRng::seed_from_u64(1);
        let threshold = DropRatio::new(0.5).unwrap().threshold();
        let mut admitted = [0_u32; 2];
        for tick in 0..20_u64 {
            pacer.on_tick(tick * 100, ["a"], &mut rng);
            pacer.resolve_new(|key| (key == "a").then(|| rates(0.5, Some(1_000.0), 2_000.0)));
            // 200 rps for a second, then 800 rps before the next directive.
            let per_tick = if tick < 10 { 20 } else { 80 };
            for _ in 0..per_tick {
                let admit = pacer.decide("a", threshold, &mut rng);
                admitted[usize::from(tick >= 10)] += u32::from(admit);
            }
        }
        // Half of this VM's 200 rps; the coin alone would admit 400 of the
        // second second. The first second admits less: its first slot
        // credits only the request that made the tick track the cell.
        assert!((60..=110).contains(&admitted[0]), "{admitted:?}");
        assert!((85..=110).contains(&admitted[1]), "{admitted:?}");
    }

    #[test]
    fn a_cell_that_loses_its_directive_loses_its_cap() {
        let mut pacer = Paced::new(DecisionMode::Coin, Some(EXACT), 100, 10);
        run(&mut pacer, 0.0, 20, 10, 0);
        pacer.resolve_all(|_| Some(rates(1.0, Some(1_000.0), 2_000.0)));
        assert_eq!(run(&mut pacer, 0.0, 20, 10, 10), 0);
        // Unchanged rates leave the frozen cap alone.
        pacer.resolve_all(|_| Some(rates(1.0, Some(1_000.0), 2_000.0)));
        assert_eq!(run(&mut pacer, 0.0, 20, 1, 20), 0);
        pacer.resolve_all(|_| None);
        assert_eq!(run(&mut pacer, 0.0, 20, 10, 21), 200);
    }

    #[test]
    fn late_ticks_keep_the_allowance_at_the_share() {
        let settings = AllowanceSettings {
            headroom: 0.0,
            burst_ms: 20,
            engage: Engage::Always,
        };
        let mut pacer = Paced::new(DecisionMode::Credit, Some(settings), 100, 10);
        let mut rng = SmallRng::seed_from_u64(1);
        let threshold = DropRatio::new(0.5).unwrap().threshold();
        // 200 rps offered, but the timer fires every 150 ms: 30 a tick.
        let mut admitted = 0;
        for tick in 0..=200_u64 {
            if tick == 20 {
                // Half of this VM's 200 rps: 100 rps.
                pacer.resolve_all(|_| Some(rates(0.5, Some(1_000.0), 2_000.0)));
            }
            pacer.on_tick(tick * 150, ["a"], &mut rng);
            for _ in 0..30 {
                let verdict = pacer.decide("a", threshold, &mut rng);
                admitted += u32::from(tick > 20 && verdict);
            }
        }
        // 180 ticks of 150 ms: 27 s at 100 rps.
        assert!((2_650..=2_750).contains(&admitted), "{admitted}");
    }

    #[test]
    fn the_clock_advances_between_slots() {
        let mut pacer = Paced::new(DecisionMode::Credit, Some(EXACT), 100, 10);
        let mut rng = SmallRng::seed_from_u64(1);
        let threshold = DropRatio::new(0.0).unwrap().threshold();
        for tick in 0..10_u64 {
            pacer.on_tick(tick * 100, ["a"], &mut rng);
            pacer.decide("a", threshold, &mut rng);
        }
        // 10 rps here, 20 fleet-wide against a limit of 10: 5 rps.
        pacer.resolve_all(|_| Some(rates(0.5, Some(10.0), 20.0)));
        while pacer.decide("a", threshold, &mut rng) {}
        assert!(!pacer.decide("a", threshold, &mut rng));
        // 200 ms later, without a slot closing, one more request fits.
        pacer.advance_clock(1_100);
        assert!(pacer.decide("a", threshold, &mut rng));
        pacer.advance_clock(500);
        assert!(!pacer.decide("a", threshold, &mut rng));
    }

    #[test]
    fn without_allowance_the_coin_decides() {
        let mut pacer = Paced::new(DecisionMode::Coin, None, 100, 10);
        assert_eq!(run(&mut pacer, 0.0, 10, 10, 0), 100);
        assert_eq!(run(&mut pacer, 1.0, 10, 10, 10), 0);
    }

    #[test]
    fn a_coin_without_allowance_keeps_no_state() {
        let mut pacer = Paced::new(DecisionMode::Coin, None, 100, 10);
        let mut rng = SmallRng::seed_from_u64(1);
        pacer.on_tick(0, ["a", "b"], &mut rng);
        assert!(pacer.is_empty());
    }

    #[test]
    fn state_is_bounded() {
        let mut pacer = Paced::new(DecisionMode::Credit, None, 100, 2);
        let mut rng = SmallRng::seed_from_u64(1);
        pacer.on_tick(0, ["a", "b", "c"], &mut rng);
        assert_eq!(pacer.len(), 2);
    }

    #[test]
    fn caps_engaged_only_when_lost_decide_only_then() {
        let settings = AllowanceSettings {
            engage: Engage::WhenLost,
            ..EXACT
        };
        let mut pacer = Paced::new(DecisionMode::Credit, Some(settings), 100, 10);
        let mut rng = SmallRng::seed_from_u64(1);
        assert!(!pacer.caps_engaged());
        // A second at 10 a tick, a directive at ratio 0.5: a cap of 50/s.
        for tick in 0..10u64 {
            for _ in 0..10 {
                pacer.decide("a", DropThreshold::NEVER, &mut rng);
            }
            pacer.on_tick(tick * 100, ["a"], &mut rng);
        }
        pacer.resolve_all(|_| Some(rates(0.5, Some(50.0), 100.0)));
        let threshold = DropRatio::new(0.5).unwrap().threshold();
        // Connected: the load doubles and the ratio admits half of it.
        let admitted = |pacer: &mut Paced, rng: &mut SmallRng, start: u64| {
            let mut admitted = 0;
            for tick in 0..10u64 {
                for _ in 0..20 {
                    admitted += u32::from(pacer.decide("a", threshold, rng));
                }
                pacer.on_tick(start + tick * 100, ["a"], rng);
            }
            admitted
        };
        let connected = admitted(&mut pacer, &mut rng, 1_000);
        assert!((95..=105).contains(&connected), "{connected}");
        // Lost: the cap holds the share the last directive gave.
        pacer.set_control_plane_lost(true);
        assert!(pacer.caps_engaged());
        let lost = admitted(&mut pacer, &mut rng, 2_000);
        assert!((45..=62).contains(&lost), "{lost}");
    }

    fn process_of(total_rps: f64) -> FastMap<String, ProcessShare> {
        let mut process = fast_map::new();
        process.insert(
            "a".to_owned(),
            ProcessShare {
                share: 1.0,
                total_rps,
                established: true,
            },
        );
        process
    }

    /// The process offers `total_rps` of cell `a` and its directive
    /// arrives (`directive`): caps and budgets derived from it.
    fn directed(
        pacer: &mut Paced,
        total_rps: f64,
        directive: impl Fn(&str) -> Option<DirectiveRates> + Copy,
    ) {
        pacer.set_process_shares(process_of(total_rps));
        pacer.resolve_all(directive);
        pacer.budgets_for_directives(directive);
    }

    #[test]
    fn a_budget_frozen_at_a_loss_is_the_last_directives_not_the_surges() {
        let settings = AllowanceSettings {
            engage: Engage::WhenLost,
            ..EXACT
        };
        let (mut pacer, mut rng) = warmed_up(settings, 10);
        // The process offers 100/s and the directive halves it (the fleet
        // offers twice the limit): a budget of 50/s, derived now and kept.
        directed(&mut pacer, 100.0, |_| {
            Some(rates(0.5, Some(1_000.0), 2_000.0))
        });
        // The loss is noticed after the surge began: the process's rate of
        // the last second has grown to 300/s. Derived from it, the budget
        // would be 150/s.
        pacer.set_process_shares(process_of(300.0));
        pacer.set_control_plane_lost(true);
        pacer.freeze_budgets(|_| Some(rates(0.5, Some(1_000.0), 2_000.0)));
        let admitted = admitted_at_thirty_a_tick(&mut pacer, &mut rng, 1_000);
        assert!((45..=62).contains(&admitted), "{admitted}");
    }

    /// Whether cell `a`'s cap admits `rps` a second.
    fn capped_at(pacer: &mut Paced, rps: f64) -> bool {
        let cap = pacer.pace("a").and_then(|pace| pace.cap());
        cap.is_some_and(|cap| cap.has_rate(rps))
    }

    #[test]
    fn a_steady_cell_under_its_limit_keeps_a_seconds_margin_until_it_grows() {
        // The process offers 90/s of a 200/s limit the fleet offers 180/s
        // of ([`crate::tick::process_budget`]): budgets of 111.7/s (a second's
        // margin) and 103.4/s (ten seconds').
        let under = |_: &str| Some(rates(0.0, Some(200.0), 180.0));
        let (mut pacer, mut rng) = warmed_up(EXACT, 9);
        directed(&mut pacer, 90.0, under);
        let wide = (90.0 + 90f64.sqrt() + 1.0) * 200.0 / 180.0;
        let narrow = (900.0 + 900f64.sqrt() + 1.0) / 10.0 * 200.0 / 180.0;
        let mut tick = |pacer: &mut Paced, requests: u32, at_ms: u64| {
            for _ in 0..requests {
                pacer.decide("a", DropThreshold::NEVER, &mut rng);
            }
            pacer.on_tick(at_ms, ["a"], &mut rng);
            pacer.rescale_caps();
        };
        for (i, requests) in [9, 11, 8, 12, 9].into_iter().enumerate() {
            tick(&mut pacer, requests, 1_000 + i as u64 * 100);
            assert!(capped_at(&mut pacer, wide), "tick {i}");
        }
        // A step: the tick after it says the cell grew, and the budget
        // stays narrow after the step too, until the next directive.
        tick(&mut pacer, 30, 1_500);
        assert!(capped_at(&mut pacer, narrow));
        tick(&mut pacer, 9, 1_600);
        assert!(capped_at(&mut pacer, narrow));
        pacer.budgets_for_directives(under);
        tick(&mut pacer, 9, 1_700);
        assert!(capped_at(&mut pacer, wide));
    }

    /// A pacer whose cell `a` was offered `per_tick` requests a tick for a
    /// second (ten 100 ms ticks), with no directive yet.
    fn warmed_up(settings: AllowanceSettings, per_tick: u32) -> (Paced, SmallRng) {
        let mut pacer = Paced::new(DecisionMode::Credit, Some(settings), 100, 10);
        let mut rng = SmallRng::seed_from_u64(1);
        for tick in 0..10u64 {
            for _ in 0..per_tick {
                pacer.decide("a", DropThreshold::NEVER, &mut rng);
            }
            pacer.on_tick(tick * 100, ["a"], &mut rng);
        }
        (pacer, rng)
    }

    /// Admitted of 30 requests a tick over ten 100 ms ticks from `from_ms`,
    /// with the caps rescaled at every tick, under a ratio of one half.
    fn admitted_at_thirty_a_tick(pacer: &mut Paced, rng: &mut SmallRng, from_ms: u64) -> u32 {
        let threshold = DropRatio::new(0.5).unwrap().threshold();
        let mut admitted = 0;
        for tick in 0..10u64 {
            for _ in 0..30 {
                admitted += u32::from(pacer.decide("a", threshold, rng));
            }
            pacer.on_tick(from_ms + tick * 100, ["a"], rng);
            pacer.rescale_caps();
        }
        admitted
    }

    #[test]
    fn a_heartbeat_renews_the_budget_a_loss_will_freeze() {
        let directive = |_: &str| Some(rates(0.5, Some(1_000.0), 2_000.0));
        let settings = AllowanceSettings {
            engage: Engage::WhenLost,
            ..EXACT
        };
        let (mut pacer, mut rng) = warmed_up(settings, 30);
        // The directive came when the process's rate read 400/s (a moment's
        // miscount): a budget of 200/s.
        directed(&mut pacer, 400.0, directive);
        // The rate reads 300/s since; the directive is unchanged, so only
        // heartbeats come, and the budget they leave is 150/s.
        pacer.set_process_shares(process_of(300.0));
        pacer.budgets_at_batch(directive);
        pacer.set_control_plane_lost(true);
        pacer.freeze_budgets(directive);
        let admitted = admitted_at_thirty_a_tick(&mut pacer, &mut rng, 1_000);
        assert!((140..=160).contains(&admitted), "{admitted}");
    }

    #[test]
    fn with_caps_that_always_decide_a_heartbeat_leaves_the_budget() {
        let directive = |_: &str| Some(rates(0.5, Some(1_000.0), 2_000.0));
        assert_eq!(EXACT.engage, Engage::Always);
        let (mut pacer, mut rng) = warmed_up(EXACT, 10);
        directed(&mut pacer, 100.0, directive);
        // A step to 300/s before the next directive: a heartbeat does not
        // let the budget grow with it under the old ratio.
        pacer.set_process_shares(process_of(300.0));
        pacer.budgets_at_batch(directive);
        pacer.rescale_caps();
        let admitted = admitted_at_thirty_a_tick(&mut pacer, &mut rng, 1_000);
        assert!((45..=62).contains(&admitted), "{admitted}");
    }

    #[test]
    fn unlimited_cells_leave_room_for_limited_ones() {
        let mut pacer = Paced::new(DecisionMode::Credit, None, 100, 200);
        let mut rng = SmallRng::seed_from_u64(1);
        for tick in 0..20u64 {
            let flood: Vec<String> = (0..500).map(|i| format!("flood-{tick}-{i}")).collect();
            pacer.on_tick_with(
                tick * 100,
                flood.iter().map(String::as_str).chain(["limited"]),
                |key| key == "limited",
                &mut rng,
            );
            assert!(pacer.len() <= 200);
        }
        assert_eq!(pacer.len(), unlimited_cap(200) + 1);
        assert!(pacer.pace("limited").is_some());
    }
}
