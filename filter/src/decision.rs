//! The per-request decision.
//!
//! [`decide`] is the coin flip against a threshold. [`decide_cell`] is the
//! whole decision for a request whose cell has a directive: it takes the
//! cell's entry (directive and per-cell state) and the regime the table is
//! in, and says whether to drop and why. It is the one place a different
//! decision strategy plugs in; modes (shadow or enforce) are applied by the
//! caller, so shadow runs exactly the same decision.

use crate::directives::CellEntry;
use crate::pacing::Pacer;
use crate::token_bucket::TokenBucket;
use rand::Rng;
use sluice_core::{DropReason, DropThreshold};

/// What a VM does with the directives it holds once they are older than
/// their TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Keep applying the last directives.
    KeepLast,
    /// Enforce each cell's limit locally: its stated limit over the
    /// reporting proxies, split evenly between the VMs serving requests.
    LocalLimit,
    /// Let everything through.
    Allow,
}

/// Whether the directives are current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Regime {
    /// Within the TTL.
    Fresh,
    /// Past the TTL: the configured fallback applies.
    Stale(Fallback),
}

/// The local context of a decision: the VM's tick clock and how many VMs
/// of this proxy share a local limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Local {
    /// The VM's clock (its last tick), Unix ms.
    pub now_ms: u64,
    /// VMs of this proxy that serve requests (at least 1).
    pub workers: u32,
}

/// The decision for a request of a cell with a directive: `Some(reason)`
/// to drop it (or, in shadow mode, to count a would-be drop).
///
/// A fresh (or kept) directive is applied by `pacer` for the cell
/// `cell_key`: the coin or the credit decision, under the cell's local
/// allowance when one is configured.
pub fn decide_cell(
    entry: &mut CellEntry,
    regime: Regime,
    local: Local,
    pacer: &mut Pacer,
    cell_key: &str,
    rng: &mut impl Rng,
) -> Option<DropReason> {
    match regime {
        Regime::Fresh | Regime::Stale(Fallback::KeepLast) => {
            (pacer.decide(cell_key, entry.directive.threshold, rng) == Verdict::Drop)
                .then_some(entry.directive.reason)
        }
        Regime::Stale(Fallback::Allow) => None,
        Regime::Stale(Fallback::LocalLimit) => {
            let rate = entry.directive.per_proxy_rps()? / f64::from(local.workers.max(1));
            let limiter = entry
                .state
                .fallback
                .get_or_insert_with(|| TokenBucket::new(rate, local.now_ms));
            if limiter.rate_per_s() != rate {
                limiter.set_rate(rate);
            }
            (!limiter.try_take(local.now_ms)).then_some(DropReason::FallbackLimit)
        }
    }
}

/// What to do with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Let the request through.
    Admit,
    /// Answer it locally with 429.
    Drop,
}

/// Flips the coin: [`Verdict::Drop`] with the probability `threshold` stands
/// for. Costs one PRNG step, and none when the bucket never drops.
pub fn decide(threshold: DropThreshold, rng: &mut impl Rng) -> Verdict {
    if threshold.is_never() {
        return Verdict::Admit;
    }
    if threshold.drops(rng.next_u64()) {
        Verdict::Drop
    } else {
        Verdict::Admit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directives::DirectiveTable;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;
    use sluice_core::DropRatio;
    use sluice_proto::v1::{Directive, DirectiveBatch, Reason};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn coin() -> Pacer {
        Pacer::new(crate::pacing::DecisionMode::Coin, None, 100, 10)
    }

    fn drop_fraction(ratio: f64, draws: u32, seed: u64) -> f64 {
        let threshold = DropRatio::new(ratio).unwrap().threshold();
        let mut rng = SmallRng::seed_from_u64(seed);
        let drops = (0..draws)
            .filter(|_| decide(threshold, &mut rng) == Verdict::Drop)
            .count();
        drops as f64 / f64::from(draws)
    }

    #[test]
    fn zero_never_drops_and_one_always_drops() {
        assert_eq!(drop_fraction(0.0, 10_000, 1), 0.0);
        assert_eq!(drop_fraction(1.0, 10_000, 2), 1.0);
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
                decide_cell(&mut always, regime, LOCAL, &mut coin(), "b", &mut rng),
                Some(DropReason::PriorityShed)
            );
        }
        assert_eq!(
            decide_cell(
                &mut always,
                Regime::Stale(Fallback::Allow),
                LOCAL,
                &mut coin(),
                "b",
                &mut rng
            ),
            None
        );
        let mut never = entry(0.0, 10.0, 1);
        assert_eq!(
            decide_cell(&mut never, Regime::Fresh, LOCAL, &mut coin(), "b", &mut rng),
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
                match decide_cell(&mut cell, regime, local, &mut coin(), "b", &mut rng) {
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
            decide_cell(&mut unlimited, regime, LOCAL, &mut coin(), "b", &mut rng),
            None
        );
    }

    #[test]
    fn frequency_follows_the_ratio() {
        for ratio in [0.01, 0.25, 0.5, 0.9] {
            let observed = drop_fraction(ratio, 100_000, 7);
            // 100k draws: the standard deviation is at most 0.0016.
            assert!((observed - ratio).abs() < 0.01, "{ratio}: {observed}");
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod proptests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;
    use sluice_core::DropRatio;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn frequency_is_close_to_the_ratio(ratio in 0.0f64..=1.0, seed in any::<u64>()) {
            let threshold = DropRatio::new(ratio).map_err(|e| TestCaseError::fail(e.to_string()))?.threshold();
            let mut rng = SmallRng::seed_from_u64(seed);
            let draws = 20_000u32;
            let drops = (0..draws).filter(|_| decide(threshold, &mut rng) == Verdict::Drop).count();
            let observed = drops as f64 / f64::from(draws);
            // Six standard deviations of a binomial proportion (at most 0.0035 here).
            prop_assert!((observed - ratio).abs() < 0.022, "ratio {} observed {}", ratio, observed);
        }
    }
}
