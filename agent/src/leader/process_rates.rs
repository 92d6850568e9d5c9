//! Each VM's share of the process's recent traffic per limited cell, so
//! that the allowance can follow load that moves between VMs while the
//! control plane is lost.
//!
//! A VM's cap is derived from its own offered rate when a directive
//! arrives. While the control plane is lost no directive arrives, and with
//! several workers the load moves between VMs (connections come and go, and
//! Envoy balances them per connection): caps frozen per VM then under-admit,
//! one VM starved at its old share while another leaves its own unused.
//! The leader sees every VM's counts (its own and the hand-offs), keeps each
//! source's rate per cell over the last second here, and publishes them;
//! once the control plane is lost, each VM freezes the process's budget per
//! cell (the allowance of the process's offered rate) and caps itself at
//! its current share of it ([`crate::tick::pacing::Pacer::rescale_caps`]).
//! Shares come from the leader's one view of every source, so they lag
//! alike and add up to one.
//! Each source's rate is its counts over the time its hand-offs covered
//! ([`ProcessRates::add_span`]), not over the leader's slots: a follower
//! hands off on its slow ticks and again when a report window closes, so a
//! slot may hold one, two or no hand-off of it, and counts over slot time
//! swung a share by a hand-off's worth.
//! Under a cost budget a cell's rate is its request rate over the last
//! second times its mean estimate per request over a longer horizon
//! ([`MEAN_COST_HORIZON_MS`]), as the control plane estimates a budget's
//! demand: a second of a cell of a few requests holds one or two costs
//! drawn from a heavy tail, and a process budget frozen on that second
//! was as often a fraction of the cell's share as several times it.
//! The published form is [`crate::shared::process_rates`].

use crate::fast_map::{self, FastMap};
use crate::shared::process_rates::PublishedRates;
#[cfg(test)]
use crate::shared::process_rates::shares_of;

/// Slots of the rolling window; the open one is not counted, so the rate
/// covers the last `SLOTS - 1` closed slots (slow ticks).
const SLOTS: usize = 11;
/// Slot length assumed before the first close measured one.
const DEFAULT_SPAN_MS: u64 = 100;
/// Most sources kept per cell (VMs of one Envoy process).
const MAX_SOURCES: usize = 64;
/// The mean age of the estimates a cost cell's mean per request is taken
/// over: the control plane's horizon for the same mean (40 intervals of
/// 500 ms). Its relative error is about 1.8/√n for LLM token counts, a
/// few percent at a request a second; the mean does not move with the
/// load, so the long horizon costs no reaction to a load step.
const MEAN_COST_HORIZON_MS: f64 = 20_000.0;
/// A cost cell's mean is forgotten once its requests have faded below
/// this (a minute or so after its last one).
const MEAN_FORGOTTEN_BELOW: f64 = 0.05;

type Slots = [u64; SLOTS];

/// A cell's sources, and for how many slots it has had traffic.
#[derive(Debug, Default)]
struct Cell {
    sources: Vec<(u64, Slots)>,
    slots_seen: usize,
    /// Counted under a cost budget ([`ProcessRates::add`] with a cost):
    /// its rate is published in the budget's unit.
    costed: bool,
}

/// Exponentially faded sums of a cost cell's estimates and requests.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct MeanCost {
    cost: f64,
    requests: f64,
}

impl MeanCost {
    fn per_request(self) -> Option<f64> {
        let mean = self.cost / self.requests;
        (self.requests > 0.0 && mean.is_finite()).then_some(mean)
    }
}

/// Counts of the last second per cell and source (leader side).
#[derive(Debug)]
pub(crate) struct ProcessRates {
    cells: FastMap<String, Cell>,
    /// Per cost cell, its mean estimate per request; kept beyond the
    /// window, since a cell of a request every second or two leaves it
    /// now and then.
    means: FastMap<String, MeanCost>,
    /// Per source, the time its counts covered in each slot.
    covered_ms: FastMap<u64, Slots>,
    spans_ms: [u64; SLOTS],
    /// The open slot.
    current: usize,
    closed_at_ms: Option<u64>,
    max_cells: usize,
}

impl ProcessRates {
    /// Rates of at most `max_cells` cells.
    pub(crate) fn new(max_cells: usize) -> Self {
        Self {
            cells: fast_map::new(),
            means: fast_map::new(),
            covered_ms: fast_map::new(),
            spans_ms: [0; SLOTS],
            current: 0,
            closed_at_ms: None,
            max_cells,
        }
    }

    /// Counts the requests `key` was offered from VM `source` in the open
    /// slot, and under a cost budget their estimated `cost`: the cell's
    /// rate is then published in the budget's unit (its requests times
    /// their mean estimate), so that the budgets derived from it compare
    /// with the directive's rates. The unit of the latest count is the
    /// cell's: a bucket whose limit changes between requests and a budget
    /// is published in the new one from its next count.
    pub(crate) fn add(&mut self, key: &str, source: u64, offered: u64, cost: Option<u64>) {
        if offered == 0 {
            return;
        }
        let current = self.current;
        if !self.cells.contains_key(key) {
            if self.cells.len() >= self.max_cells {
                return;
            }
            self.cells.insert(key.to_owned(), Cell::default());
        }
        let Some(cell) = self.cells.get_mut(key) else {
            return;
        };
        cell.costed = cost.is_some();
        let sources = &mut cell.sources;
        let slots = match sources.iter().position(|(id, _)| *id == source) {
            Some(index) => sources.get_mut(index).map(|(_, slots)| slots),
            None if sources.len() >= MAX_SOURCES => None,
            None => {
                sources.push((source, [0; SLOTS]));
                sources.last_mut().map(|(_, slots)| slots)
            }
        };
        if let Some(slot) = slots.and_then(|slots| slots.get_mut(current)) {
            *slot = slot.saturating_add(offered);
        }
        let Some(cost) = cost else {
            return;
        };
        // Looked up before it is inserted: the entry API would copy the key
        // at every hand-off of a cell it already holds.
        let (cost, requests) = (cost as f64, offered as f64);
        if let Some(mean) = self.means.get_mut(key) {
            mean.cost += cost;
            mean.requests += requests;
        } else if self.means.len() < self.max_cells {
            self.means
                .insert(key.to_owned(), MeanCost { cost, requests });
        }
    }

    /// Records that `source`'s counts added in the open slot (one
    /// hand-off, or the leader's own since it last added them) cover
    /// `span_ms`. A source with no span recorded is measured over the
    /// slots' own time.
    pub(crate) fn add_span(&mut self, source: u64, span_ms: u64) {
        if span_ms == 0
            || (!self.covered_ms.contains_key(&source) && self.covered_ms.len() >= MAX_SOURCES)
        {
            return;
        }
        let current = self.current;
        let covered = self.covered_ms.entry(source).or_insert([0; SLOTS]);
        if let Some(slot) = covered.get_mut(current) {
            *slot = slot.saturating_add(span_ms);
        }
    }

    /// Closes the open slot at `now_ms` and opens the next (the oldest
    /// leaves the window); sources and cells with no count left are
    /// forgotten.
    pub(crate) fn close_slot(&mut self, now_ms: u64) {
        let span = match self.closed_at_ms {
            Some(closed) if now_ms > closed => now_ms - closed,
            _ => DEFAULT_SPAN_MS,
        };
        self.closed_at_ms = Some(now_ms);
        if let Some(slot) = self.spans_ms.get_mut(self.current) {
            *slot = span;
        }
        self.current = (self.current + 1) % SLOTS;
        let current = self.current;
        if let Some(slot) = self.spans_ms.get_mut(current) {
            *slot = 0;
        }
        self.covered_ms.retain(|_, covered| {
            if let Some(slot) = covered.get_mut(current) {
                *slot = 0;
            }
            covered.iter().any(|&ms| ms > 0)
        });
        let fade = (-(span as f64) / MEAN_COST_HORIZON_MS).exp();
        self.means.retain(|_, mean| {
            mean.cost *= fade;
            mean.requests *= fade;
            mean.requests >= MEAN_FORGOTTEN_BELOW
        });
        self.cells.retain(|_, cell| {
            cell.slots_seen = cell.slots_seen.saturating_add(1);
            cell.sources.retain_mut(|(_, slots)| {
                if let Some(slot) = slots.get_mut(current) {
                    *slot = 0;
                }
                slots.iter().any(|&count| count > 0)
            });
            !cell.sources.is_empty()
        });
    }

    /// The sum of the closed slots.
    fn closed(&self, slots: &Slots) -> u64 {
        slots
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != self.current)
            .map(|(_, value)| *value)
            .sum()
    }

    /// `source`'s rate from its `slots` of counts: over the time its counts
    /// covered, else over the slots' `span_ms`; times `per_request` (a
    /// cost cell's mean estimate).
    fn rate(&self, source: u64, slots: &Slots, span_ms: u64, per_request: f64) -> f64 {
        let covered = self
            .covered_ms
            .get(&source)
            .map_or(0, |covered| self.closed(covered));
        let span_ms = if covered > 0 { covered } else { span_ms };
        self.closed(slots) as f64 * 1000.0 / span_ms as f64 * per_request
    }

    /// What one request of `key` weighs in its published rate: 1, or a
    /// cost cell's mean estimate; `None` for a cost cell whose mean is not
    /// kept (its rate in requests would not compare with the budget's).
    fn per_request(&self, key: &str, cell: &Cell) -> Option<f64> {
        if cell.costed {
            self.means.get(key).and_then(|mean| mean.per_request())
        } else {
            Some(1.0)
        }
    }

    #[cfg(test)]
    /// The rate of `key` from `source` over the closed slots, in requests
    /// per second (a cost cell's in its unit).
    pub(crate) fn rate_rps(&self, key: &str, source: u64) -> Option<f64> {
        let span: u64 = self.spans_ms.iter().sum();
        let cell = self.cells.get(key)?;
        let per_request = self.per_request(key, cell)?;
        let (_, slots) = cell.sources.iter().find(|(id, _)| *id == source)?;
        (span > 0).then(|| self.rate(source, slots, span, per_request))
    }

    /// The published form: every cell's per-source rates (at most
    /// [`crate::shared::process_rates::MAX_PUBLISHED`] cells).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let span: u64 = self.spans_ms.iter().sum();
        let mut written = PublishedRates::new();
        if span > 0 {
            for (key, cell) in &self.cells {
                let Some(per_request) = self.per_request(key, cell) else {
                    continue;
                };
                let rates = cell
                    .sources
                    .iter()
                    .map(|(source, slots)| (*source, self.rate(*source, slots, span, per_request)));
                written.push(key, cell.slots_seen >= SLOTS - 1, rates);
            }
        }
        written.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Without spans recorded (as here), a source is measured over the
    /// slots' own time.
    #[test]
    fn the_rate_covers_the_closed_slots() {
        let mut rates = ProcessRates::new(10);
        for tick in 0..20_u64 {
            rates.add("a", 1, 10, None);
            rates.close_slot(1_000 + tick * 100);
        }
        // 10 closed slots of 100 ms with 10 requests each: 100 rps.
        let rate = rates.rate_rps("a", 1).unwrap_or_default();
        assert!((rate - 100.0).abs() < 1e-9, "{rate}");
        assert_eq!(rates.rate_rps("a", 2), None);
        assert_eq!(rates.rate_rps("b", 1), None);
    }

    #[test]
    fn a_source_is_measured_over_the_time_its_hand_offs_covered() {
        let mut rates = ProcessRates::new(10);
        // 100 rps handed off in 80 ms spans (8 requests each), landing in
        // the leader's 100 ms slots as they come: eleven spans in the ten
        // slots the rate covers, so 880 ms of traffic in 1 s of slots.
        for tick in 0..11_u64 {
            let handoffs = if tick == 0 {
                0
            } else if tick == 5 {
                2
            } else {
                1
            };
            for _ in 0..handoffs {
                rates.add("a", 1, 8, None);
                rates.add_span(1, 80);
            }
            rates.close_slot(1_000 + tick * 100);
        }
        let rate = rates.rate_rps("a", 1).unwrap_or_default();
        assert!((rate - 100.0).abs() < 1e-9, "{rate}");
    }

    #[test]
    fn idle_cells_are_forgotten_and_the_table_is_bounded() {
        let mut rates = ProcessRates::new(2);
        rates.add("a", 1, 1, None);
        rates.add("b", 1, 1, None);
        rates.add("c", 1, 1, None);
        assert_eq!(rates.cells.len(), 2);
        for tick in 0..SLOTS as u64 {
            rates.close_slot(tick * 100);
        }
        assert!(rates.cells.is_empty());
    }

    #[test]
    fn each_source_reads_its_share() {
        let mut rates = ProcessRates::new(10);
        rates.add("a", 1, 30, None);
        rates.add("a", 2, 10, None);
        rates.add("b", 2, 5, None);
        rates.close_slot(100);
        rates.close_slot(200);
        let bytes = rates.encode();
        let share = |source, key| {
            shares_of(&bytes, source)
                .unwrap_or_default()
                .get(key)
                .map(|p| (p.share, p.total_rps))
        };
        let close = |got: Option<(f64, f64)>, want: (f64, f64)| {
            got.is_some_and(|(s, t)| (s - want.0).abs() < 1e-6 && (t - want.1).abs() < 1e-3)
        };
        // 40 requests over two closed 100 ms slots: 200 rps.
        assert!(close(share(1, "a"), (0.75, 200.0)), "{:?}", share(1, "a"));
        assert!(close(share(1, "b"), (0.0, 25.0)), "{:?}", share(1, "b"));
        assert!(close(share(2, "a"), (0.25, 200.0)), "{:?}", share(2, "a"));
        assert!(close(share(2, "b"), (1.0, 25.0)), "{:?}", share(2, "b"));
    }

    #[test]
    fn a_cell_is_established_after_a_whole_window_of_traffic() {
        let mut rates = ProcessRates::new(10);
        let established = |rates: &ProcessRates| {
            shares_of(&rates.encode(), 1)
                .unwrap_or_default()
                .get("a")
                .is_some_and(|p| p.established)
        };
        for tick in 0..SLOTS as u64 {
            rates.add("a", 1, 5, None);
            rates.close_slot(tick * 100);
            assert_eq!(
                established(&rates),
                tick as usize >= SLOTS - 2,
                "tick {tick}"
            );
        }
    }

    /// A cost cell's rate is its requests over the window times its mean
    /// estimate over the horizon: one heavy request moves it by its share
    /// of the horizon's estimates, not by a second's budget.
    #[test]
    fn a_cost_cell_weighs_its_requests_by_their_mean_estimate() {
        let mut rates = ProcessRates::new(10);
        // 20 s of a request of 100 tokens every 100 ms: 1,000 tokens/s.
        for tick in 0..200_u64 {
            rates.add("a", 1, 1, Some(100));
            rates.close_slot(tick * 100);
        }
        let steady = rates.rate_rps("a", 1).unwrap_or_default();
        assert!((steady - 1_000.0).abs() < 1.0, "{steady}");
        // Then one of 50,000: the last second's estimates are 50,900
        // tokens; the mean over the horizon (some 200 requests' worth of
        // faded sums) moves by about 50,000 / 200, to about 350.
        rates.add("a", 1, 1, Some(50_000));
        rates.close_slot(20_000);
        let heavy = rates.rate_rps("a", 1).unwrap_or_default();
        assert!((3_000.0..6_000.0).contains(&heavy), "{heavy}");
        // Published in the budget's unit.
        let published = shares_of(&rates.encode(), 1)
            .unwrap_or_default()
            .get("a")
            .map(|p| p.total_rps);
        assert!(
            published.is_some_and(|rate| (rate - heavy).abs() < 1.0),
            "{published:?}"
        );
    }

    /// A cell of a request every second or two leaves the window now and
    /// then; its mean does not go with it.
    #[test]
    fn a_cost_cell_keeps_its_mean_through_a_quiet_second() {
        let mut rates = ProcessRates::new(10);
        for tick in 0..100_u64 {
            rates.add("a", 1, 1, Some(1_000));
            rates.close_slot(tick * 100);
        }
        for tick in 100..115_u64 {
            rates.close_slot(tick * 100);
        }
        assert!(rates.cells.is_empty(), "the cell left the window");
        rates.add("a", 1, 1, Some(10));
        rates.close_slot(11_500);
        // One request in the window, weighed at about 1,000 tokens (the
        // faded mean of 100 requests of 1,000 and one of 10).
        let rate = rates.rate_rps("a", 1).unwrap_or_default();
        assert!((800.0..1_000.0).contains(&rate), "{rate}");
    }

    /// A cost cell whose mean the table could not keep is not published:
    /// its rate in requests would not compare with the budget's rates.
    #[test]
    fn a_cost_cell_without_a_mean_is_left_out() {
        let mut rates = ProcessRates::new(1);
        rates.add("a", 1, 1, Some(500));
        rates.close_slot(100);
        // "a" leaves the window; its mean stays and fills the table.
        for tick in 2..13_u64 {
            rates.close_slot(tick * 100);
        }
        rates.add("b", 1, 3, Some(900));
        rates.close_slot(1_300);
        let published = shares_of(&rates.encode(), 1).unwrap_or_default();
        assert!(published.is_empty(), "{published:?}");
        // A request cell is published in requests as before.
        let mut rates = ProcessRates::new(1);
        rates.add("c", 1, 3, None);
        rates.close_slot(100);
        rates.close_slot(200);
        let published = shares_of(&rates.encode(), 1).unwrap_or_default();
        assert!(
            published
                .get("c")
                .is_some_and(|p| (p.total_rps - 15.0).abs() < 1e-3)
        );
    }

    /// A bucket whose limit changes from a budget to requests is
    /// published in requests from its next count: weighed by its mean
    /// estimate against a limit in requests, its budget would be hundreds
    /// of times the limit.
    #[test]
    fn a_cell_is_published_in_the_unit_of_its_latest_count() {
        let mut rates = ProcessRates::new(10);
        for tick in 0..10_u64 {
            rates.add("a", 1, 2, Some(1_000));
            rates.close_slot(tick * 100);
        }
        let budget = rates.rate_rps("a", 1).unwrap_or_default();
        assert!((budget - 10_000.0).abs() < 1.0, "{budget}");
        rates.add("a", 1, 2, None);
        rates.close_slot(1_000);
        let requests = rates.rate_rps("a", 1).unwrap_or_default();
        assert!((requests - 20.0).abs() < 1e-6, "{requests}");
    }
}
