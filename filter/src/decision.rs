//! The whole decision for a request whose cell has a directive:
//! [`decide_cell`] takes the cell's entry (directive and per-cell state) and
//! the regime the table is in, and says whether to drop and why. It is the
//! one place a different decision strategy plugs in; the strategies
//! themselves are the core's ([`sluice_core::decision`]).

use crate::directives::CellEntry;
use crate::pacing::{Pace, Pacer};
use rand::Rng;
use sluice_core::DropReason;
use sluice_core::decision::{Fallback, Local, Regime, Verdict};
use sluice_core::gcra::Gcra;

/// The decision for a request of a cell with a directive: `Some(reason)`
/// to drop it (or, in shadow mode, to count a would-be drop).
///
/// A fresh (or kept) directive is applied by `pacer` with the cell's state
/// `pace`: the coin or the credit decision, under the cell's local
/// allowance when one is configured.
pub fn decide_cell(
    entry: &mut CellEntry,
    regime: Regime,
    local: Local,
    pacer: &mut Pacer,
    pace: Option<&mut Pace>,
    rng: &mut impl Rng,
) -> Option<DropReason> {
    match regime {
        Regime::Fresh | Regime::Stale(Fallback::KeepLast) => {
            (pacer.decide(pace, entry.directive.threshold, rng) == Verdict::Drop)
                .then_some(entry.directive.reason)
        }
        Regime::Stale(Fallback::Allow) => None,
        Regime::Stale(Fallback::LocalLimit) => {
            let rate = entry.directive.per_proxy_rps()? / f64::from(local.workers.max(1));
            let limiter = entry
                .state
                .fallback
                .get_or_insert_with(|| Gcra::per_second(rate, local.now_ms));
            if !limiter.has_rate(rate) {
                limiter.set_rate_per_second(rate, local.now_ms);
            }
            (!limiter.admit(local.now_ms, 0)).then_some(DropReason::FallbackLimit)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directives::DirectiveTable;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;
    use sluice_proto::v1::{Directive, DirectiveBatch, Reason};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn coin() -> Pacer {
        Pacer::new(crate::pacing::DecisionMode::Coin, None, 100)
    }

    fn entry(drop_ratio: f64, limit_rps: f64, reporting_proxies: u32) -> CellEntry {
        let mut table = DirectiveTable::new(10);
        table.merge(DirectiveBatch {
            directives: vec![Directive {
                bucket: "b".into(),
                drop_ratio,
                limit_rps,
                reporting_proxies,
                reason: Reason::PriorityShed as i32,
                ..Default::default()
            }],
            ..Default::default()
        });
        let index = table.find(None, "b").unwrap();
        table.entry_mut(index).unwrap().clone()
    }

    const LOCAL: Local = Local {
        now_ms: 0,
        workers: 1,
    };

    #[test]
    fn fresh_and_keep_last_flip_the_directive_coin() {
        let mut rng = SmallRng::seed_from_u64(3);
        let mut always = entry(1.0, 10.0, 1);
        for regime in [Regime::Fresh, Regime::Stale(Fallback::KeepLast)] {
            assert_eq!(
                decide_cell(&mut always, regime, LOCAL, &mut coin(), None, &mut rng),
                Some(DropReason::PriorityShed)
            );
        }
        assert_eq!(
            decide_cell(
                &mut always,
                Regime::Stale(Fallback::Allow),
                LOCAL,
                &mut coin(),
                None,
                &mut rng
            ),
            None
        );
        let mut never = entry(0.0, 10.0, 1);
        assert_eq!(
            decide_cell(
                &mut never,
                Regime::Fresh,
                LOCAL,
                &mut coin(),
                None,
                &mut rng
            ),
            None
        );
    }

    #[test]
    fn local_limit_splits_the_limit_over_proxies_and_workers() {
        let mut rng = SmallRng::seed_from_u64(4);
        // 100 rps over 5 proxies over 2 workers: 10 rps on this VM.
        let mut cell = entry(1.0, 100.0, 5);
        let regime = Regime::Stale(Fallback::LocalLimit);
        let mut admitted = 0;
        for ms in (0..10_000u64).step_by(20) {
            for _ in 0..10 {
                let local = Local {
                    now_ms: ms,
                    workers: 2,
                };
                match decide_cell(&mut cell, regime, local, &mut coin(), None, &mut rng) {
                    None => admitted += 1,
                    Some(reason) => assert_eq!(reason, DropReason::FallbackLimit),
                }
            }
        }
        // 10 s at 10 rps plus a one-second burst.
        assert!((100..=111).contains(&admitted), "{admitted}");
        // Unlimited cells pass.
        let mut unlimited = entry(1.0, 0.0, 5);
        assert_eq!(
            decide_cell(&mut unlimited, regime, LOCAL, &mut coin(), None, &mut rng),
            None
        );
    }
}
