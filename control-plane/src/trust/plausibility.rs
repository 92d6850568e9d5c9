//! What one report may say: windows that add up to the time that passed,
//! and rates no single Envoy can serve.
//!
//! A report's counts are turned into rates by its window, so a proxy could
//! claim any rate by claiming a tiny window; and a count of 10^12 requests
//! in a second is a lie whatever the window. Both are clamped, not refused:
//! an honest proxy's report is never touched, and a bent one still says
//! which cells it saw.

use std::time::Duration;

use sluice_proto::v1::Report;

/// Most a report may claim, in requests per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Ceilings {
    /// Σ offered over a report's cells.
    pub(crate) max_proxy_rps: f64,
    /// Offered of any one cell.
    pub(crate) max_cell_rps: f64,
}

impl Ceilings {
    /// A large Envoy serves a few hundred thousand requests per second;
    /// 1,000,000 leaves room for the largest and stops absurd claims.
    pub(crate) const DEFAULT_MAX_RPS: f64 = 1_000_000.0;
}

impl Default for Ceilings {
    fn default() -> Self {
        Self {
            max_proxy_rps: Self::DEFAULT_MAX_RPS,
            max_cell_rps: Self::DEFAULT_MAX_RPS,
        }
    }
}

/// The windows a stream has claimed against the time it has been open.
///
/// Windows are checked in total, not one by one: reports queued while the
/// control plane was busy arrive together, each with an honest window, and
/// a first report may cover time before the stream opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WindowLedger {
    claimed_ms: u64,
}

impl WindowLedger {
    /// A stream's windows may fall short of the time it has been open by
    /// this much before its reports are stretched (reports in flight, and
    /// the first window starting at the stream's Hello).
    pub(crate) const SLACK_MS: u64 = 2_000;
}

/// What [`Ceilings::check`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Checked {
    /// The window was shorter than the time that passed and was stretched.
    pub(crate) window_stretched: bool,
    /// Cells whose counts were cut to the per-cell ceiling.
    pub(crate) cells_clamped: u32,
    /// Counts scaled down to the per-proxy ceiling.
    pub(crate) proxy_clamped: bool,
}

impl Checked {
    /// Whether anything was changed.
    pub(crate) fn changed(&self) -> bool {
        self.window_stretched || self.cells_clamped > 0 || self.proxy_clamped
    }
}

impl Ceilings {
    /// Clamps `report` in place. `open_for` is how long the stream has been
    /// open (since its Hello); `ledger` is the stream's.
    pub(crate) fn check(
        &self,
        report: &mut Report,
        open_for: Duration,
        ledger: &mut WindowLedger,
    ) -> Checked {
        let mut checked = Checked::default();
        let open_ms = u64::try_from(open_for.as_millis()).unwrap_or(u64::MAX);
        let owed_ms = open_ms.saturating_sub(WindowLedger::SLACK_MS);
        let claimed = ledger.claimed_ms.saturating_add(report.window_ms);
        if claimed < owed_ms {
            report.window_ms = owed_ms - ledger.claimed_ms;
            checked.window_stretched = true;
        }
        ledger.claimed_ms = ledger.claimed_ms.saturating_add(report.window_ms);
        if report.window_ms == 0 {
            return checked;
        }
        let seconds = report.window_ms as f64 / 1000.0;
        let most_per_cell = to_count(self.max_cell_rps * seconds);
        let mut total: u64 = 0;
        for cell in &mut report.buckets {
            // What a proxy admits or lets through in shadow mode is part of
            // what it was offered.
            cell.admitted = cell.admitted.min(cell.offered);
            cell.shadow_dropped = cell.shadow_dropped.min(cell.offered);
            if cell.offered > most_per_cell {
                scale(cell, most_per_cell as f64 / cell.offered as f64);
                checked.cells_clamped += 1;
            }
            total = total.saturating_add(cell.offered);
        }
        let most_per_proxy = to_count(self.max_proxy_rps * seconds);
        if total > most_per_proxy {
            let factor = most_per_proxy as f64 / total as f64;
            for cell in &mut report.buckets {
                scale(cell, factor);
            }
            checked.proxy_clamped = true;
        }
        checked
    }
}

fn to_count(value: f64) -> u64 {
    // `as` saturates, and NaN (a NaN ceiling) becomes 0: nothing allowed.
    value.max(0.0) as u64
}

fn scale(cell: &mut sluice_proto::v1::BucketCount, factor: f64) {
    let scaled = |count: u64| (count as f64 * factor) as u64;
    cell.offered = scaled(cell.offered);
    cell.admitted = scaled(cell.admitted);
    cell.shadow_dropped = scaled(cell.shadow_dropped);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;
    use proptest::prelude::*;
    use sluice_proto::v1::BucketCount;

    fn report(window_ms: u64, offered: &[u64]) -> Report {
        Report {
            sequence: 1,
            window_ms,
            buckets: offered
                .iter()
                .enumerate()
                .map(|(i, &offered)| BucketCount {
                    bucket: format!("b{i}"),
                    offered,
                    admitted: offered,
                    ..BucketCount::default()
                })
                .collect(),
            directive_age_ms: None,
            upstream: Vec::new(),
        }
    }

    #[test]
    fn honest_reports_are_untouched() {
        let ceilings = Ceilings::default();
        let mut ledger = WindowLedger::default();
        for n in 1..=20_u64 {
            let mut r = report(500, &[400, 1_000]);
            let before = r.clone();
            let checked = ceilings.check(&mut r, Duration::from_millis(500 * n), &mut ledger);
            assert!(!checked.changed(), "report {n}: {checked:?}");
            assert_eq!(r, before);
        }
    }

    #[test]
    fn a_window_too_short_for_the_time_open_is_stretched() {
        let ceilings = Ceilings::default();
        let mut ledger = WindowLedger::default();
        // 10 s open, claims 10 ms: the window owed is 10 s minus the slack.
        let mut r = report(10, &[1_000]);
        let checked = ceilings.check(&mut r, Duration::from_secs(10), &mut ledger);
        assert!(checked.window_stretched);
        assert_eq!(r.window_ms, 8_000);
        // Once the ledger is square, honest windows pass again.
        let mut next = report(500, &[1_000]);
        assert!(
            !ceilings
                .check(&mut next, Duration::from_millis(10_500), &mut ledger)
                .changed()
        );
    }

    #[test]
    fn absurd_counts_are_cut_to_the_ceilings() {
        let ceilings = Ceilings {
            max_proxy_rps: 1_000.0,
            max_cell_rps: 600.0,
        };
        let mut r = report(1_000, &[10_000, 500, 400]);
        r.buckets[1].admitted = 9_999;
        let checked = ceilings.check(&mut r, Duration::ZERO, &mut WindowLedger::default());
        assert_eq!(checked.cells_clamped, 1);
        assert!(checked.proxy_clamped);
        let total: u64 = r.buckets.iter().map(|c| c.offered).sum();
        assert!(total <= 1_000, "{total}");
        assert!(r.buckets.iter().all(|c| c.admitted <= c.offered));
    }

    proptest! {
        /// Whatever a report claims, the rate it yields is within the
        /// ceilings, per cell and in total.
        #[test]
        fn no_report_exceeds_the_ceilings(
            window_ms in 0_u64..100_000,
            open_ms in 0_u64..100_000,
            offered in proptest::collection::vec(0_u64..u64::MAX, 0..8),
        ) {
            let ceilings = Ceilings { max_proxy_rps: 5_000.0, max_cell_rps: 2_000.0 };
            let mut r = report(window_ms, &offered);
            ceilings.check(&mut r, Duration::from_millis(open_ms), &mut WindowLedger::default());
            if r.window_ms > 0 {
                let seconds = r.window_ms as f64 / 1000.0;
                let total: f64 = r.buckets.iter().map(|c| c.offered as f64).sum();
                prop_assert!(total / seconds <= 5_000.0 * 1.0001 + 1.0 / seconds);
                for cell in &r.buckets {
                    prop_assert!(cell.offered as f64 / seconds <= 2_000.0 * 1.0001 + 1.0 / seconds);
                    prop_assert!(cell.admitted <= cell.offered);
                }
            }
        }
    }
}
