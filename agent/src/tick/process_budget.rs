//! What a whole Envoy process may admit of one cell while the caps decide
//! (during an outage, or always with `engage: always`): the allowance of
//! the process's offered rate under the cell's directive, which each VM
//! scales by its share of the process's traffic.
//!
//! Below the limit the allowance adds a margin for counting noise
//! ([`LocalRate::upper_rps`]). The process's rate is known over a second,
//! and a margin that wide is what a load step meets before the control
//! plane's next directive; one as narrow as ten seconds' counts would give
//! cuts the Poisson clusters of a cell running just under its limit (the
//! simulator's zipf buckets, tenths of a percent of their traffic each).
//! So a budget holds both: the second's margin while the cell offers what
//! it offered when the budget was derived, the narrow one from the first
//! sign that it grew, until the next budget.

use sluice_core::allowance::{AllowanceSettings, DirectiveRates, LocalRate, allowance_rps};

/// One cell's budget, derived from the process's offered rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ProcessBudget {
    /// With the margin of ten seconds' counts of the rate.
    narrow_rps: f64,
    /// With the margin of one second's count (equal to `narrow_rps` when
    /// the directive sheds: the share then has no margin).
    wide_rps: f64,
    /// The process's offered rate it was derived from.
    derived_from_rps: f64,
    /// The process rate above which the cell has grown: its second's count
    /// one standard deviation (and one request) above the derived rate.
    grown_above_rps: f64,
    /// Whether the cell grew since (kept until the next budget).
    grown: bool,
}

impl ProcessBudget {
    /// The budget of a process offered `total_rps` of a cell under
    /// `rates`; `None` where the allowance sets no cap (unlimited, or no
    /// traffic).
    pub(crate) fn derive(
        total_rps: f64,
        rates: DirectiveRates,
        settings: AllowanceSettings,
    ) -> Option<Self> {
        // Tenths of a request per second over ten seconds: the rate as a
        // count the allowance takes, with ten seconds' margin.
        let tenths = LocalRate {
            requests: (total_rps * 10.0).round() as u64,
            window_ms: 10_000,
        };
        let narrow_rps = allowance_rps(tenths, rates, settings)?;
        let second = LocalRate {
            requests: total_rps.round() as u64,
            window_ms: 1_000,
        };
        let wide_rps = if rates.drop_ratio.get() > 0.0 {
            narrow_rps
        } else {
            allowance_rps(second, rates, settings).map_or(narrow_rps, |wide| wide.max(narrow_rps))
        };
        Some(Self {
            narrow_rps,
            wide_rps,
            derived_from_rps: total_rps,
            grown_above_rps: second.upper_rps(),
            grown: false,
        })
    }

    /// What the process may admit now, given its offered rate over the last
    /// second (`total_rps`, as the leader published it), this VM's `share`
    /// of it and the VM's own count of its last tick (`last_tick`). Either
    /// says first that the cell grew: the process's second only after a
    /// slow tick and a tenth of a second's change, the VM's own tick at the
    /// next tick after a step.
    pub(crate) fn rps_at(
        &mut self,
        total_rps: f64,
        share: f64,
        last_tick: Option<LocalRate>,
    ) -> f64 {
        if total_rps > self.grown_above_rps {
            self.grown = true;
        }
        if let Some(tick) = last_tick
            && tick.window_ms > 0
        {
            let expected = self.derived_from_rps * share * tick.window_ms as f64 / 1000.0;
            if tick.requests as f64 > expected + expected.sqrt() + 1.0 {
                self.grown = true;
            }
        }
        if self.grown {
            self.narrow_rps
        } else {
            self.wide_rps
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::DropRatio;
    use sluice_core::allowance::Engage;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const SETTINGS: AllowanceSettings = AllowanceSettings {
        headroom: 0.0,
        burst_ms: 20,
        engage: Engage::Always,
    };

    fn rates(ratio: f64, limit_rps: Option<f64>, fleet_offered_rps: f64) -> DirectiveRates {
        DirectiveRates {
            drop_ratio: DropRatio::new(ratio).unwrap(),
            limit_rps,
            fleet_offered_rps,
        }
    }

    fn tick(requests: u64) -> Option<LocalRate> {
        Some(LocalRate {
            requests,
            window_ms: 100,
        })
    }

    #[test]
    fn under_the_limit_a_steady_cell_keeps_a_seconds_margin() {
        // 90 rps offered of a 200 rps limit the fleet offers 180 of: ten
        // seconds' margin (900 + 30 + 1) / 10 × 200 / 180 = 103.4, a
        // second's (90 + 9.5 + 1) × 200 / 180 = 111.7.
        let mut under =
            ProcessBudget::derive(90.0, rates(0.0, Some(200.0), 180.0), SETTINGS).unwrap();
        let wide = under.rps_at(92.0, 0.5, tick(5));
        assert!((wide - 111.66).abs() < 0.1, "{wide}");
        // Either margin is cut at the limit.
        let mut at_limit =
            ProcessBudget::derive(100.0, rates(0.0, Some(100.0), 100.0), SETTINGS).unwrap();
        assert!((at_limit.rps_at(100.0, 1.0, tick(10)) - 100.0).abs() < 1e-9);
    }

    #[test]
    fn a_cell_that_grew_gets_the_narrow_margin_until_the_next_budget() {
        let under =
            || ProcessBudget::derive(90.0, rates(0.0, Some(200.0), 180.0), SETTINGS).unwrap();
        // The process's second above 90 + 9.5 + 1.
        let mut by_process = under();
        let narrow = by_process.rps_at(101.0, 0.5, tick(4));
        assert!((narrow - 103.4).abs() < 0.1, "{narrow}");
        // Back under: still narrow, the step may go on.
        assert!((by_process.rps_at(90.0, 0.5, tick(4)) - narrow).abs() < 1e-9);
        // This VM's tick: expected 90 × 0.5 / 10 = 4.5, grown above
        // 4.5 + 2.1 + 1 = 7.6.
        let mut by_tick = under();
        assert!(by_tick.rps_at(90.0, 0.5, tick(7)) > 111.0);
        assert!((by_tick.rps_at(90.0, 0.5, tick(8)) - narrow).abs() < 1e-9);
        assert!((by_tick.rps_at(90.0, 0.5, tick(3)) - narrow).abs() < 1e-9);
    }

    #[test]
    fn a_shedding_cell_has_one_budget() {
        // Shedding half: the share of the process's rate, no margin either way.
        let mut budget =
            ProcessBudget::derive(300.0, rates(0.5, Some(300.0), 600.0), SETTINGS).unwrap();
        assert!((budget.rps_at(300.0, 1.0, tick(30)) - 150.0).abs() < 1e-9);
        assert!((budget.rps_at(900.0, 1.0, tick(90)) - 150.0).abs() < 1e-9);
    }

    #[test]
    fn no_budget_without_a_limit_or_traffic() {
        assert_eq!(
            ProcessBudget::derive(100.0, rates(0.0, None, 100.0), SETTINGS),
            None
        );
        assert_eq!(
            ProcessBudget::derive(0.0, rates(0.0, Some(100.0), 100.0), SETTINGS),
            None
        );
    }
}
