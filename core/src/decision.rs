//! The one per-request decision, and the one result every data plane
//! hands from it to its host: [`decide`] takes a cell's state, its
//! directive (if it has one), the [`Rules`] of the moment and the clock,
//! and returns the [`Decision`]: drop or not, why, and what decided it. The
//! coin, the credit, the allowance's cap, the stale-directive fallback and
//! the new-cell limit are its cases.
//!
//! A directive of a cost budget (its `cost_unit` set) states its rates in
//! cost per second: the request weighs its estimate there
//! ([`Directed::weight`]) in the allowance's cap, the stale-directive
//! limit and the offered rate the cap is derived from. Its drop ratio is
//! applied by the coin in either mode (independent of the cost, so
//! unbiased; the control plane's balance repays the costs' noise, and a
//! credit would repay it again: `Pace::drops`); the new-cell limit stays
//! in requests (such a cell has no directive, so no unit).
//!
//! The state is the data plane's to keep (the agent keeps it in each
//! cell's record); what changes it between requests ([`Pace`]'s slots and
//! caps) runs on the data plane's tick. Modes are the caller's: shadow
//! runs the same decision, and the caller turns its drop into a
//! [`Outcome::ShadowDropped`].

use crate::allowance::{AllowanceSettings, DirectiveRates, RateWindow, allowance_rps};
use crate::coin;
use crate::credit::Credit;
use crate::gcra::Gcra;
use crate::regime::{Fallback, Regime};
use crate::{DropRatio, DropReason, DropThreshold};
use rand::Rng;

/// How a drop ratio is applied to single requests. The default is the
/// configuration's (docs/accuracy.md, "Why these defaults").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecisionMode {
    /// Independent coin flips ([`crate::coin`]).
    Coin,
    /// Deterministic error diffusion ([`crate::credit`]).
    #[default]
    Credit,
}

/// What one data plane decides by until something changes (its tick, a
/// new batch): the mode, whether caps decide, the new-cell limit and the
/// regime of its directives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rules {
    /// How a directive's drop ratio is applied.
    pub mode: DecisionMode,
    /// Whether allowance caps decide now ([`crate::allowance::Engage`]).
    pub caps_engaged: bool,
    /// The local limit of a cell without a directive, requests per second
    /// on this VM (`None`: such cells pass).
    pub new_cell_rps: Option<f64>,
    /// Whether the directives are current.
    pub regime: Regime,
    /// Whether any directive table arrived yet.
    pub has_directives: bool,
}

impl Rules {
    /// Whether the directives are fresh, so a cell seen
    /// [`NEW_CELL_GRACE_MS`] ago is known to the control plane, which chose
    /// not to direct it.
    #[inline]
    pub fn directed(&self) -> bool {
        self.has_directives && self.regime == Regime::Fresh
    }

    /// What decides a request without a directive of its own (`as_new_cell`:
    /// the new-cell limit did), by precedence: no table yet, stale
    /// directives, the new-cell rule.
    #[inline]
    fn source(&self, as_new_cell: bool) -> Source {
        if !self.has_directives {
            Source::NoDirectives
        } else if matches!(self.regime, Regime::Stale(_)) {
            Source::Fallback
        } else if as_new_cell {
            Source::NewBucket
        } else {
            Source::Directive
        }
    }
}

/// The clock of a decision: the data plane's last tick, not a clock read
/// per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Now {
    /// The last tick, Unix ms.
    pub now_ms: u64,
    /// How far the clock moved at that tick (a stall the caps forgive).
    pub last_step_ms: u64,
    /// VMs of this proxy that serve requests (at least 1): a local limit is
    /// split between them.
    pub workers: u32,
}

impl Now {
    /// Moves the clock to `now_ms`, never back. A data plane calls it on
    /// every timer tick, more often than rate slots close, so that the caps
    /// see time advance in small steps even when a slot closes late.
    pub fn advance(&mut self, now_ms: u64) {
        if now_ms > self.now_ms {
            // The first reading has no previous one to measure a stall from.
            if self.now_ms > 0 {
                self.last_step_ms = now_ms - self.now_ms;
            }
            self.now_ms = now_ms;
        }
    }
}

/// The directive side of a decision.
#[derive(Debug)]
pub struct Directed<'a> {
    /// The directive's drop ratio.
    pub drop_ratio: DropRatio,
    /// The drop threshold the ratio stands for.
    pub threshold: DropThreshold,
    /// Why its drops happen.
    pub reason: DropReason,
    /// The limit it states for the cell (`None`: unlimited; 0: blocked),
    /// fleet-wide, in what a request weighs per second: requests, or under
    /// a budget estimated cost
    /// ([`crate::directive::CellDirective::limit_in_weight_rps`]).
    pub limit_rps: Option<f64>,
    /// Proxies that reported the cell (0: unknown): the stale-directive
    /// local limit is the limit over them.
    pub reporting_proxies: u32,
    /// The stale-directive limiter: the directive's, shared by every cell
    /// it governs (a bucket-wide directive's limit is not multiplied by its
    /// tenants).
    pub fallback: &'a mut Option<Gcra>,
    /// What the request weighs in the directive's unit: 1 under a limit in
    /// requests; under a cost budget its estimated cost (1 for a request
    /// without a cost rule). Any value is safe, 0 and `u64::MAX` included.
    pub weight: u64,
    /// Whether the request weighs its estimate under a cost budget: its
    /// drop ratio is then applied by the coin whatever the mode
    /// (`Pace::drops` says why).
    pub costed: bool,
}

/// How long after a cell is first seen, while the directives are fresh,
/// the control plane has had to direct it: a report interval, a control
/// interval and a push with room to spare (defaults 250 + 500 + a few ms).
pub const NEW_CELL_GRACE_MS: u64 = 5_000;

/// What became of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Let through.
    Admitted,
    /// Would have been dropped, but its cell is shadowed: let through.
    ShadowDropped,
    /// Answered with 429.
    Dropped,
}

/// What decided a request: a fresh directive, or what applies without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A fresh directive (or a cell the control plane chose not to direct).
    Directive,
    /// The directives are older than their TTL: the fallback decided.
    Fallback,
    /// The cell has no directive yet: the `new_bucket` behaviour decided.
    NewBucket,
    /// No directive table has arrived yet.
    NoDirectives,
}

impl Source {
    /// The wire name (the decision record's `source`, the upstream header's
    /// value).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Directive => "directive",
            Self::Fallback => "fallback",
            Self::NewBucket => "new_bucket",
            Self::NoDirectives => "no_directives",
        }
    }

    /// Whether no fresh directive decided (the request is flagged
    /// upstream and recorded).
    pub const fn is_undirected(self) -> bool {
        !matches!(self, Self::Directive)
    }
}

/// One request's decision: from [`decide`] (which says [`Outcome::Dropped`]
/// or [`Outcome::Admitted`]) through the data plane (which shadows a drop
/// its mode does not enforce) to the host (which answers 429, records it,
/// flags it upstream).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// What becomes of the request.
    pub outcome: Outcome,
    /// Why it was (or would have been) dropped.
    pub reason: Option<DropReason>,
    /// What decided it.
    pub source: Source,
    /// The governing directive's drop ratio (0 without one), to the
    /// precision a record prints. Single precision keeps the decision
    /// within eight bytes, which a call returns in a register: a caller
    /// that copies a decision written field by field into memory whole
    /// stalls on the copy.
    pub drop_ratio: f32,
    /// Whether the new-cell limit decided it: the cell has no directive
    /// and is limited locally (its [`Source`] says so only while the
    /// directives are fresh).
    pub new_cell: bool,
}

impl Default for Decision {
    fn default() -> Self {
        Self {
            outcome: Outcome::Admitted,
            reason: None,
            source: Source::Directive,
            drop_ratio: 0.0,
            new_cell: false,
        }
    }
}

impl Decision {
    /// Whether the request goes on (admitted or shadow-dropped).
    #[inline]
    pub fn admits(&self) -> bool {
        self.outcome != Outcome::Dropped
    }
}

/// One cell's decision state.
#[derive(Debug, Clone, Default)]
pub struct CellState {
    /// The directive's strategies' state, made on the data plane's tick.
    /// Boxed: a table of cells stays small in memory (a [`Pace`] holds a
    /// second of rate slots), and cells without one pay nothing for it.
    pub pace: Option<Box<Pace>>,
    /// A cell without a directive: its local limit.
    pub new_cell: Option<NewCellLimit>,
    /// Whether this state stands in for every cell that has none of its own
    /// (a full table): its new-cell limit never expires, since the control
    /// plane never hears of those cells.
    pub shared: bool,
}

/// The one decision for a request of a cell whose state is `state`.
#[inline]
pub fn decide(
    state: &mut CellState,
    directive: Option<Directed<'_>>,
    rules: &Rules,
    now: Now,
    rng: &mut impl Rng,
) -> Decision {
    let Some(directive) = directive else {
        return decide_new(state, rules, now);
    };
    let drop = match rules.regime {
        Regime::Fresh | Regime::Stale(Fallback::KeepLast) => {
            let drops = match &mut state.pace {
                Some(pace) => pace.drops(&directive, rules, now, rng),
                None => coin::flip(directive.threshold, rng),
            };
            drops.then_some(directive.reason)
        }
        Regime::Stale(Fallback::Allow) => None,
        Regime::Stale(Fallback::LocalLimit) => {
            // This proxy's part of the limit, split evenly between its
            // VMs; an unlimited cell passes, a blocked one (limit 0)
            // admits nothing.
            directive
                .limit_rps
                .is_some_and(|limit| {
                    let rate = limit
                        / f64::from(directive.reporting_proxies.max(1))
                        / f64::from(now.workers.max(1));
                    !admit_at(directive.fallback, rate, directive.weight, now.now_ms)
                })
                .then_some(DropReason::FallbackLimit)
        }
    };
    Decision {
        outcome: outcome_of(drop),
        reason: drop,
        source: rules.source(false),
        drop_ratio: directive.drop_ratio.get() as f32,
        new_cell: false,
    }
}

/// A drop or not.
#[inline]
fn outcome_of(drop: Option<DropReason>) -> Outcome {
    if drop.is_some() {
        Outcome::Dropped
    } else {
        Outcome::Admitted
    }
}

/// A cell without a directive: passes, or is limited locally until the
/// control plane has had time to direct it.
fn decide_new(state: &mut CellState, rules: &Rules, now: Now) -> Decision {
    let passes = Decision {
        source: rules.source(false),
        ..Decision::default()
    };
    let Some(rate) = rules.new_cell_rps else {
        return passes;
    };
    let cell = state
        .new_cell
        .get_or_insert_with(|| NewCellLimit::new(rate, now.now_ms));
    if !state.shared
        && rules.directed()
        && now.now_ms.saturating_sub(cell.first_seen_ms) >= NEW_CELL_GRACE_MS
    {
        return passes;
    }
    let limiter = &mut cell.limiter;
    if !limiter.has_rate(rate) {
        limiter.set_rate_per_second(rate, now.now_ms);
    }
    let drop = (!limiter.admit(now.now_ms, 0)).then_some(DropReason::NewBucketLimit);
    Decision {
        outcome: outcome_of(drop),
        reason: drop,
        source: rules.source(true),
        drop_ratio: 0.0,
        new_cell: true,
    }
}

/// Admits one request of `weight` against `limiter` at `rate` per second
/// (made or re-rated as needed).
fn admit_at(limiter: &mut Option<Gcra>, rate: f64, weight: u64, now_ms: u64) -> bool {
    let limiter = limiter.get_or_insert_with(|| Gcra::per_second(rate, now_ms));
    if !limiter.has_rate(rate) {
        limiter.set_rate_per_second(rate, now_ms);
    }
    limiter.admit_weighted(now_ms, 0, weight)
}

/// A cell's local limit while it has no directive.
#[derive(Debug, Clone, Copy)]
pub struct NewCellLimit {
    limiter: Gcra,
    /// When the cell was first seen.
    first_seen_ms: u64,
}

impl NewCellLimit {
    /// The limit of a cell first seen at `now_ms`: `rate_rps`, with a
    /// second's burst.
    pub fn new(rate_rps: f64, now_ms: u64) -> Self {
        Self {
            limiter: Gcra::per_second(rate_rps, now_ms),
            first_seen_ms: now_ms,
        }
    }
}

/// The state of a directed cell's strategies: its credit, its offered rate
/// over the last second, and its allowance's cap.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    credit: Credit,
    window: RateWindow,
    /// Requests since the last tick, each of its weight (cost under a
    /// cost budget).
    pending: u64,
    cap: Option<Gcra>,
    idle_ticks: u32,
    /// What the cap was last derived from, so re-reading an unchanged
    /// table leaves the allowance frozen.
    applied: Option<DirectiveRates>,
    /// Whether the window was not yet full before the last tick.
    filling: bool,
}

impl Pace {
    /// A cell's state, made on the tick that first saw it: the request
    /// that made the tick track it is credited to that tick (`span_ms`).
    pub fn new(credit_phase: u64, span_ms: u64) -> Self {
        let mut window = RateWindow::default();
        window.push(1, span_ms);
        Self {
            credit: Credit::new(credit_phase),
            window,
            pending: 0,
            cap: None,
            idle_ticks: 0,
            applied: None,
            filling: true,
        }
    }

    /// The request path's case: whether a request under `directive`
    /// drops, by the cap while caps decide, else by the mode, except that
    /// a costed request takes the coin.
    ///
    /// Under a cost budget the control plane's balance pays back what the
    /// costs let through beyond each cell's share, one interval later
    /// (control/controller/balance.rs). The credit would pay the same
    /// excess back a second time on this VM: a large request leaves the
    /// cell's credit in a debt that `1 − ratio` of the next estimates
    /// repay, seconds in a cell of a few requests a second, while the
    /// control plane is already lowering the cell's target for it. The two
    /// repayments together swing the cell under its share, and the
    /// balance then pays that back too. The coin is independent of the
    /// cost and keeps no memory, so the balance alone repays, once; in the
    /// controller's simulation of the benchmark's fleet and tenants the
    /// credit left more than half again the coin's spread over 10 s
    /// windows (`cost_tests.rs`, `a_budget_s_requests_take_the_coin`).
    #[inline]
    fn drops(
        &mut self,
        directive: &Directed<'_>,
        rules: &Rules,
        now: Now,
        rng: &mut impl Rng,
    ) -> bool {
        let weight = directive.weight;
        self.pending = self.pending.saturating_add(weight);
        if let Some(cap) = &mut self.cap
            && rules.caps_engaged
        {
            return !cap.admit_weighted(now.now_ms, now.last_step_ms, weight);
        }
        match rules.mode {
            DecisionMode::Credit if !directive.costed => {
                self.credit.drops_weighted(directive.threshold, weight)
            }
            DecisionMode::Credit | DecisionMode::Coin => coin::flip(directive.threshold, rng),
        }
    }

    /// Closes a tick of `span_ms`: the requests since the last one become
    /// a slot of the window. Whether the state is still worth keeping: a
    /// cap, or fewer than `idle_ticks` idle ticks in a row.
    pub fn close_slot(&mut self, span_ms: u64, idle_ticks: u32) -> bool {
        self.filling = !self.window.is_full();
        self.window.push(std::mem::take(&mut self.pending), span_ms);
        self.idle_ticks = if self.window.is_idle() {
            self.idle_ticks.saturating_add(1)
        } else {
            0
        };
        self.cap.is_some() || self.idle_ticks < idle_ticks
    }

    /// Until the window is full, the cap follows it on every tick instead
    /// of freezing: a cap derived from the first few slots rests on a
    /// handful of requests and, with the directive unchanged while the load
    /// is steady, would stay there, cutting a cell within its limit.
    pub fn follow_window(&mut self, settings: AllowanceSettings, slack_ms: u64, now_ms: u64) {
        if let Some(rates) = self.applied
            && (self.filling || self.cap.is_none())
        {
            self.derive_cap(rates, settings, slack_ms, now_ms);
        }
    }

    /// Applies the directive `rates` (none: the cell has no directive),
    /// unless it is what the cap was last derived from.
    pub fn reconcile(
        &mut self,
        rates: Option<DirectiveRates>,
        settings: AllowanceSettings,
        slack_ms: u64,
        now_ms: u64,
    ) {
        if self.applied == rates {
            return;
        }
        self.applied = rates;
        match rates {
            Some(rates) => self.derive_cap(rates, settings, slack_ms, now_ms),
            None => self.cap = None,
        }
    }

    /// Derives the cap from `rates` and the offered rate over the slots the
    /// window has (the last second once it is full).
    fn derive_cap(
        &mut self,
        rates: DirectiveRates,
        settings: AllowanceSettings,
        slack_ms: u64,
        now_ms: u64,
    ) {
        self.cap = match (
            allowance_rps(self.window.local(), rates, settings),
            &mut self.cap,
        ) {
            (None, _) => None,
            (Some(rate), Some(cap)) => {
                cap.set_rate(rate, slack_ms, now_ms);
                Some(*cap)
            }
            (Some(rate), None) => Some(Gcra::new(rate, slack_ms, now_ms)),
        };
    }

    /// Sets the cap to `rate` (the process's budget split by share), if a
    /// directive was applied.
    pub fn set_cap_rate(&mut self, rate: f64, slack_ms: u64, now_ms: u64) {
        if self.applied.is_none() || !rate.is_finite() {
            return;
        }
        match &mut self.cap {
            Some(cap) => cap.set_rate(rate, slack_ms, now_ms),
            None => self.cap = Some(Gcra::new(rate, slack_ms, now_ms)),
        }
    }

    /// Whether a directive was applied to the cap.
    pub fn is_directed(&self) -> bool {
        self.applied.is_some()
    }

    /// The offered rate of the last closed slot.
    pub fn last_rate(&self) -> Option<crate::allowance::LocalRate> {
        self.window.last()
    }

    /// Whether a cap decides the cell's requests (then the state is kept).
    pub fn is_capped(&self) -> bool {
        self.cap.is_some()
    }

    /// The cap, if any.
    pub fn cap(&self) -> Option<Gcra> {
        self.cap
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DropRatio;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const COIN: Rules = Rules {
        mode: DecisionMode::Coin,
        caps_engaged: false,
        new_cell_rps: None,
        regime: Regime::Fresh,
        has_directives: true,
    };

    fn at(now_ms: u64, workers: u32) -> Now {
        Now {
            now_ms,
            last_step_ms: 0,
            workers,
        }
    }

    /// The drop, if any, of one request of a cell with `state` under a
    /// directive of `ratio` and `limit_rps` over `proxies`.
    fn drop_of(
        state: &mut CellState,
        fallback: &mut Option<Gcra>,
        (ratio, limit_rps, proxies): (f64, Option<f64>, u32),
        regime: Regime,
        now: Now,
        rng: &mut SmallRng,
    ) -> Option<DropReason> {
        let drop_ratio = DropRatio::new(ratio).unwrap();
        let directive = Directed {
            drop_ratio,
            threshold: drop_ratio.threshold(),
            reason: DropReason::PriorityShed,
            limit_rps,
            reporting_proxies: proxies,
            fallback,
            weight: 1,
            costed: false,
        };
        decide(state, Some(directive), &Rules { regime, ..COIN }, now, rng).reason
    }

    #[test]
    fn fresh_and_keep_last_flip_the_directive_coin() {
        let mut rng = SmallRng::seed_from_u64(3);
        let mut state = CellState::default();
        for regime in [Regime::Fresh, Regime::Stale(Fallback::KeepLast)] {
            let drop = drop_of(
                &mut state,
                &mut None,
                (1.0, Some(10.0), 1),
                regime,
                at(0, 1),
                &mut rng,
            );
            assert_eq!(drop, Some(DropReason::PriorityShed));
        }
        let allow = Regime::Stale(Fallback::Allow);
        assert_eq!(
            drop_of(
                &mut state,
                &mut None,
                (1.0, Some(10.0), 1),
                allow,
                at(0, 1),
                &mut rng
            ),
            None
        );
        let fresh = Regime::Fresh;
        assert_eq!(
            drop_of(
                &mut state,
                &mut None,
                (0.0, Some(10.0), 1),
                fresh,
                at(0, 1),
                &mut rng
            ),
            None
        );
    }

    #[test]
    fn local_limit_splits_the_limit_over_proxies_and_workers() {
        let mut rng = SmallRng::seed_from_u64(4);
        let regime = Regime::Stale(Fallback::LocalLimit);
        // 100 rps over 5 proxies over 2 workers: 10 rps on this VM, one
        // limiter for the directive whatever the cell.
        let mut fallback = None;
        let mut admitted = 0;
        for ms in (0..10_000u64).step_by(20) {
            for cell in 0..10 {
                let mut state = CellState::default();
                let directive = (1.0, Some(100.0), 5);
                match drop_of(
                    &mut state,
                    &mut fallback,
                    directive,
                    regime,
                    at(ms, 2),
                    &mut rng,
                ) {
                    None => admitted += 1,
                    Some(reason) => assert_eq!(reason, DropReason::FallbackLimit, "{cell}"),
                }
            }
        }
        // 10 s at 10 rps plus a one-second burst.
        assert!((100..=111).contains(&admitted), "{admitted}");
        // A blocked cell (limit 0) admits nothing once stale either.
        let mut fallback = None;
        let mut state = CellState::default();
        for ms in (0..10_000).step_by(10) {
            assert_eq!(
                drop_of(
                    &mut state,
                    &mut fallback,
                    (0.0, Some(0.0), 1),
                    regime,
                    at(ms, 1),
                    &mut rng
                ),
                Some(DropReason::FallbackLimit),
                "at {ms} ms"
            );
        }
        // Unlimited cells pass.
        let mut state = CellState::default();
        assert_eq!(
            drop_of(
                &mut state,
                &mut None,
                (1.0, None, 5),
                regime,
                at(0, 1),
                &mut rng
            ),
            None
        );
    }

    #[test]
    fn a_new_cell_is_limited_until_the_grace_and_a_shared_state_for_good() {
        let mut rng = SmallRng::seed_from_u64(5);
        let rules = Rules {
            new_cell_rps: Some(1.0),
            ..COIN
        };
        let dropped = |state: &mut CellState, from_ms: u64, rng: &mut SmallRng| {
            (from_ms..from_ms + 1_000)
                .step_by(10)
                .filter(|ms| {
                    let decision = decide(state, None, &rules, at(*ms, 1), rng);
                    assert!(decision.new_cell || decision.reason.is_none());
                    assert_eq!(decision.new_cell, decision.source == Source::NewBucket);
                    decision.reason == Some(DropReason::NewBucketLimit)
                })
                .count()
        };
        let mut own = CellState::default();
        let mut shared = CellState {
            shared: true,
            ..CellState::default()
        };
        assert!(dropped(&mut own, 0, &mut rng) > 90);
        assert!(dropped(&mut shared, 0, &mut rng) > 90);
        assert_eq!(dropped(&mut own, NEW_CELL_GRACE_MS, &mut rng), 0);
        assert!(dropped(&mut shared, NEW_CELL_GRACE_MS, &mut rng) > 90);
        // Without a new-cell limit, nothing is kept.
        let mut state = CellState::default();
        let decision = decide(&mut state, None, &COIN, at(0, 1), &mut rng);
        assert_eq!((decision.reason, decision.new_cell), (None, false));
        assert_eq!(decision.source, Source::Directive);
        assert!(state.new_cell.is_none());
    }

    #[test]
    fn the_source_says_what_decided_without_a_fresh_directive() {
        let mut rng = SmallRng::seed_from_u64(7);
        let limited = Rules {
            new_cell_rps: Some(1.0),
            ..COIN
        };
        let source_of = |rules: Rules, rng: &mut SmallRng| {
            let decision = decide(&mut CellState::default(), None, &rules, at(0, 1), rng);
            (decision.source, decision.new_cell)
        };
        assert_eq!(source_of(COIN, &mut rng), (Source::Directive, false));
        assert_eq!(source_of(limited, &mut rng), (Source::NewBucket, true));
        // No table yet, then stale directives, take precedence.
        let unknown = Rules {
            has_directives: false,
            ..limited
        };
        assert_eq!(source_of(unknown, &mut rng), (Source::NoDirectives, true));
        let stale = Rules {
            regime: Regime::Stale(Fallback::KeepLast),
            ..limited
        };
        assert_eq!(source_of(stale, &mut rng), (Source::Fallback, true));
        let directive = Directed {
            drop_ratio: DropRatio::new(0.25).unwrap(),
            threshold: DropRatio::new(0.25).unwrap().threshold(),
            reason: DropReason::ClusterOverload,
            limit_rps: None,
            reporting_proxies: 1,
            fallback: &mut None,
            weight: 1,
            costed: false,
        };
        let decision = decide(
            &mut CellState::default(),
            Some(directive),
            &stale,
            at(0, 1),
            &mut rng,
        );
        assert_eq!(
            (decision.source, decision.drop_ratio, decision.new_cell),
            (Source::Fallback, 0.25, false)
        );
    }

    /// Admitted weight of `weights` under a directive of `ratio` and
    /// `limit_rps` in `regime` and `rules`, one request every 10 ms.
    fn admitted_weight(
        state: &mut CellState,
        (ratio, limit_rps): (f64, Option<f64>),
        rules: Rules,
        weights: impl Iterator<Item = u64>,
    ) -> u64 {
        let mut rng = SmallRng::seed_from_u64(8);
        let mut fallback = None;
        let drop_ratio = DropRatio::new(ratio).unwrap();
        weights
            .enumerate()
            .filter(|(i, weight)| {
                let directive = Directed {
                    drop_ratio,
                    threshold: drop_ratio.threshold(),
                    reason: DropReason::ClusterOverload,
                    limit_rps,
                    reporting_proxies: 1,
                    fallback: &mut fallback,
                    weight: *weight,
                    costed: true,
                };
                decide(
                    state,
                    Some(directive),
                    &rules,
                    at(*i as u64 * 10, 1),
                    &mut rng,
                )
                .reason
                .is_none()
            })
            .map(|(_, weight)| weight)
            .sum()
    }

    #[test]
    fn a_cost_directive_weighs_each_request_by_its_estimate() {
        let credit = Rules {
            mode: DecisionMode::Credit,
            ..COIN
        };
        // Under the credit's mode a costed request takes the coin: a
        // third of the offered cost, 1,000 requests of 10 and 1,000
        // tokens alternating, within the coin's noise (one standard
        // deviation is about 10,500 tokens), and the same requests one by
        // one as a bare coin on the same generator decides them.
        let mut state = CellState {
            pace: Some(Box::new(Pace::new(0, 100))),
            ..CellState::default()
        };
        let weights = || (0..1_000u64).map(|i| if i % 2 == 0 { 10 } else { 1_000 });
        let admitted = admitted_weight(&mut state, (2.0 / 3.0, Some(1.0)), credit, weights());
        let offered: u64 = weights().sum();
        let error = admitted as f64 - offered as f64 / 3.0;
        assert!(error.abs() <= 35_000.0, "{admitted} of {offered}");
        let mut rng = SmallRng::seed_from_u64(8);
        let threshold = DropRatio::new(2.0 / 3.0).unwrap().threshold();
        let by_coin: u64 = weights().filter(|_| !coin::flip(threshold, &mut rng)).sum();
        assert_eq!(admitted, by_coin);
        // The stale-directive limit: 1,000 tokens a second over 10 s of
        // requests of 100 tokens every 10 ms (10,000 a second offered).
        let stale = Rules {
            regime: Regime::Stale(Fallback::LocalLimit),
            ..credit
        };
        let admitted = admitted_weight(
            &mut CellState::default(),
            (0.0, Some(1_000.0)),
            stale,
            std::iter::repeat_n(100, 1_000),
        );
        assert!((10_000..=11_100).contains(&admitted), "{admitted}");
        // The cap: charged the weight, and the window counts it.
        let settings = AllowanceSettings {
            headroom: 0.0,
            burst_ms: 0,
            engage: crate::allowance::Engage::Always,
        };
        let mut pace = Pace::new(1, 100);
        for _ in 0..10 {
            pace.pending = 2_000;
            pace.close_slot(100, 100);
        }
        let rates = DirectiveRates {
            drop_ratio: DropRatio::new(0.5).unwrap(),
            limit_rps: Some(10_000.0),
            fleet_offered_rps: 20_000.0,
        };
        pace.reconcile(Some(rates), settings, 100, 0);
        let mut state = CellState {
            pace: Some(Box::new(pace)),
            ..CellState::default()
        };
        let capped = Rules {
            caps_engaged: true,
            ..credit
        };
        // 10,000 tokens a second allowed; 20,000 offered over 10 s.
        let admitted = admitted_weight(
            &mut state,
            (0.5, Some(10_000.0)),
            capped,
            std::iter::repeat_n(200, 1_000),
        );
        assert!((100_000..=102_000).contains(&admitted), "{admitted}");
        let pace = state.pace.as_mut().unwrap();
        pace.close_slot(100, 100);
        assert_eq!(pace.last_rate().map(|rate| rate.requests), Some(200_000));
    }

    #[test]
    fn a_cap_decides_while_caps_are_engaged_and_the_mode_otherwise() {
        let mut rng = SmallRng::seed_from_u64(6);
        let settings = AllowanceSettings {
            headroom: 0.0,
            burst_ms: 0,
            engage: crate::allowance::Engage::Always,
        };
        // A second of 10 requests a tick, then a directive at ratio 0.5:
        // a cap of 50 rps.
        let mut pace = Pace::new(1, 100);
        for _ in 0..10 {
            for _ in 0..10 {
                pace.pending += 1;
            }
            pace.close_slot(100, 100);
        }
        let rates = DirectiveRates {
            drop_ratio: DropRatio::new(0.5).unwrap(),
            limit_rps: Some(50.0),
            fleet_offered_rps: 100.0,
        };
        pace.reconcile(Some(rates), settings, 100, 1_000);
        assert!(pace.is_capped() && pace.is_directed());
        let mut state = CellState {
            pace: Some(Box::new(pace)),
            ..CellState::default()
        };
        let threshold = DropRatio::new(0.0).unwrap().threshold();
        let admitted = |state: &mut CellState, rules: Rules, rng: &mut SmallRng| {
            (0..100)
                .filter(|_| {
                    let directive = Directed {
                        drop_ratio: DropRatio::new(0.0).unwrap(),
                        threshold,
                        reason: DropReason::PriorityShed,
                        limit_rps: Some(50.0),
                        reporting_proxies: 1,
                        fallback: &mut None,
                        weight: 1,
                        costed: false,
                    };
                    decide(state, Some(directive), &rules, at(1_000, 1), rng)
                        .reason
                        .is_none()
                })
                .count()
        };
        // Ratio 0: the credit admits all; the cap holds the cell to its
        // allowance.
        let credit = Rules {
            mode: DecisionMode::Credit,
            ..COIN
        };
        assert_eq!(admitted(&mut state, credit, &mut rng), 100);
        let capped = Rules {
            caps_engaged: true,
            ..credit
        };
        // At one instant: the 100 ms slack of a cap of about 50 rps, and
        // the request at the edge.
        let capped = admitted(&mut state, capped, &mut rng);
        assert!((5..=8).contains(&capped), "{capped}");
    }
}
