//! The three quota algorithms, pure and on an injected clock (milliseconds
//! from any origin): each keeps a small state per counter key and decides
//! one request of `hits` units.
//!
//! - **Fixed window** (the default, envoyproxy/ratelimit's): counts per
//!   window aligned to the clock (`[k·W, (k+1)·W)`); at most `limit` hits
//!   are admitted per window, exactly `limit` when more are offered, and
//!   refused hits count too (an over-limit client stays over). Two
//!   windows' worth can pass around a boundary.
//! - **Sliding window counter**: the current window's count plus the
//!   previous window's, weighted by how much of it still overlaps the last
//!   `W`; a request is admitted while that estimate stays at most `limit`.
//! - **GCRA**: a virtual schedule of one hit every `W/limit` with `burst`
//!   hits of tolerance: in any interval of length `t` at most
//!   `burst + t·limit/W` hits pass, so there is no boundary spike.
//!
//! A refused request always has nothing remaining and a reset in the
//! future. Clocks may jump backwards (an NTP step): a decision never
//! admits more than the state allows, it only stops the clock from
//! refilling.
//!
//! Hits arrive in one of three [`Direction`]s: taken (a request asking to
//! pass: counted if admitted, and by the fixed window when refused too),
//! charged (a cost already spent, such as tokens charged when a stream
//! ends: counted whether it fits or not, so a quota already over its limit
//! never loses it) or refunded (Envoy's `is_negative_hits`: given back,
//! never refused, never below zero).

/// Which algorithm a quota uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Virtual scheduling with a burst tolerance.
    Gcra,
    /// Current and previous window, weighted.
    SlidingWindow,
    /// Windows aligned to the clock (envoyproxy/ratelimit's).
    #[default]
    FixedWindow,
}

/// How a request's hits change a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Direction {
    /// Asked for: counted when admitted (the fixed window counts refused
    /// hits too, as envoyproxy/ratelimit does).
    #[default]
    Take,
    /// Already spent: counted whether admitted or not (the answer still
    /// says whether they fitted).
    Charge,
    /// Given back: subtracted down to zero at most, always admitted.
    Refund,
}

/// `limit` hits per `window_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Hits per window (0 admits nothing).
    pub limit: u32,
    /// Window length in milliseconds (> 0).
    pub window_ms: u64,
    /// GCRA only: hits that may pass at once (at least 1; the limit by
    /// default).
    pub burst: u32,
}

/// One counter's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct State {
    /// Fixed and sliding: start of the current window. GCRA: theoretical
    /// arrival time of the next hit, in microseconds.
    mark: u64,
    /// Fixed and sliding: hits admitted in the current window.
    current: u64,
    /// Sliding: hits admitted in the previous window.
    previous: u64,
    /// Fixed: the window length the count is for (a limit whose unit
    /// changed counts afresh, as its windows are others).
    window: u64,
}

/// What a decision says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaOutcome {
    /// Whether the hits are admitted.
    pub admitted: bool,
    /// Hits left before the next refusal (as the algorithm counts them);
    /// 0 when refused.
    pub(crate) remaining: u32,
    /// Milliseconds until the quota is whole again (fixed and sliding: the
    /// current window's end; GCRA: until the schedule is back at now, or
    /// when refused until these hits would pass); more than 0 when
    /// refused.
    pub(crate) reset_ms: u64,
    /// The count after this request, for "near limit" metrics: the fixed
    /// window's counter (refused hits included, as envoyproxy/ratelimit
    /// counts them), the sliding estimate, GCRA's hits in flight.
    pub(crate) used: u64,
}

impl Algorithm {
    /// Decides `hits` units taken at `now_ms` against `quota`, updating
    /// `state`.
    pub(crate) fn decide(
        self,
        state: &mut State,
        quota: Quota,
        now_ms: u64,
        hits: u32,
    ) -> QuotaOutcome {
        self.apply(state, quota, now_ms, hits, Direction::Take)
    }

    /// Applies `hits` units in `direction` at `now_ms` against `quota`,
    /// updating `state`.
    pub fn apply(
        self,
        state: &mut State,
        quota: Quota,
        now_ms: u64,
        hits: u32,
        direction: Direction,
    ) -> QuotaOutcome {
        let window = quota.window_ms.max(1);
        match self {
            Algorithm::FixedWindow => fixed(state, quota, window, now_ms, hits, direction),
            Algorithm::SlidingWindow => sliding(state, quota, window, now_ms, hits, direction),
            Algorithm::Gcra => gcra(state, quota, window, now_ms, hits, direction),
        }
    }
}

fn window_start(now_ms: u64, window: u64) -> u64 {
    now_ms - now_ms % window
}

fn fixed(
    state: &mut State,
    quota: Quota,
    window: u64,
    now_ms: u64,
    hits: u32,
    direction: Direction,
) -> QuotaOutcome {
    let start = window_start(now_ms, window);
    // A clock that went back stays in the window it had reached.
    if start > state.mark || state.window != window {
        *state = State {
            mark: start,
            current: 0,
            previous: 0,
            window,
        };
    }
    let limit = u64::from(quota.limit);
    let (after, admitted) = if direction == Direction::Refund {
        let after = state.current.saturating_sub(u64::from(hits));
        (after, true)
    } else {
        // As envoyproxy/ratelimit: the counter counts refused hits too.
        let after = state.current.saturating_add(u64::from(hits));
        (after, after <= limit)
    };
    state.current = after;
    QuotaOutcome {
        admitted,
        remaining: to_u32(limit.saturating_sub(after)),
        reset_ms: (state.mark + window).saturating_sub(now_ms),
        used: after,
    }
}

fn sliding(
    state: &mut State,
    quota: Quota,
    window: u64,
    now_ms: u64,
    hits: u32,
    direction: Direction,
) -> QuotaOutcome {
    let start = window_start(now_ms, window);
    if start > state.mark {
        let previous = if start - state.mark == window {
            state.current
        } else {
            0
        };
        *state = State {
            mark: start,
            current: 0,
            previous,
            window: 0,
        };
    }
    let into = now_ms.saturating_sub(state.mark).min(window);
    let weight = (window - into) as f64 / window as f64;
    let estimate = state.previous as f64 * weight + state.current as f64;
    let limit = f64::from(quota.limit);
    let admitted = match direction {
        Direction::Refund => {
            // The current window's hits first, then the previous one's.
            let hits = u64::from(hits);
            let from_current = hits.min(state.current);
            state.current -= from_current;
            state.previous = state.previous.saturating_sub(hits - from_current);
            true
        }
        Direction::Take | Direction::Charge => {
            let admitted = estimate + f64::from(hits) <= limit;
            if admitted || direction == Direction::Charge {
                state.current = state.current.saturating_add(u64::from(hits));
            }
            admitted
        }
    };
    let used = state.previous as f64 * weight + state.current as f64;
    let remaining = if admitted {
        to_u32((limit - used).max(0.0).floor() as u64)
    } else {
        0
    };
    QuotaOutcome {
        admitted,
        remaining,
        reset_ms: (state.mark + window).saturating_sub(now_ms),
        used: used.ceil() as u64,
    }
}

fn gcra(
    state: &mut State,
    quota: Quota,
    window: u64,
    now_ms: u64,
    hits: u32,
    direction: Direction,
) -> QuotaOutcome {
    let now = now_ms.saturating_mul(1_000);
    if quota.limit == 0 {
        return QuotaOutcome {
            admitted: hits == 0 || direction == Direction::Refund,
            remaining: 0,
            reset_ms: window,
            used: 0,
        };
    }
    // One hit every `interval` µs; `burst` hits of tolerance.
    let interval = (window.saturating_mul(1_000) / u64::from(quota.limit)).max(1);
    let burst = u64::from(quota.burst.max(1));
    let tolerance = interval.saturating_mul(burst - 1);
    let allowance = tolerance.saturating_add(interval);
    let spread = interval.saturating_mul(u64::from(hits));
    let (admitted, new_tat) = if direction == Direction::Refund {
        // Back by the refunded hits' slots (a schedule behind now is whole:
        // the next hit starts from now).
        state.mark = state.mark.saturating_sub(spread);
        (true, state.mark)
    } else {
        let tat = state.mark.max(now);
        let new_tat = tat.saturating_add(spread);
        // Admitted while the schedule runs at most `tolerance + interval`
        // ahead of now (the first hit's own slot plus the burst); a charge
        // beyond it is a debt that refuses what follows until it is paid.
        let admitted = new_tat.saturating_sub(now) <= allowance;
        if admitted || direction == Direction::Charge {
            state.mark = new_tat;
        }
        (admitted, new_tat)
    };
    let ahead = state.mark.max(now) - now;
    let in_flight = ahead.div_ceil(interval);
    if !admitted {
        // When these hits would pass: once the schedule is back within the
        // allowance; never if they are more than the burst (then a
        // window). A charge is counted already: until its debt is paid.
        let wait = if direction == Direction::Take && u64::from(hits) > burst {
            window.saturating_mul(1_000)
        } else {
            new_tat.saturating_sub(now.saturating_add(allowance))
        };
        return QuotaOutcome {
            admitted,
            remaining: 0,
            reset_ms: wait.div_ceil(1_000).max(1),
            used: in_flight,
        };
    }
    QuotaOutcome {
        admitted,
        remaining: to_u32(burst.saturating_sub(in_flight)),
        reset_ms: ahead.div_ceil(1_000),
        used: in_flight,
    }
}

fn to_u32(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;
    use proptest::prelude::*;

    fn quota(limit: u32, window_ms: u64) -> Quota {
        Quota {
            limit,
            window_ms,
            burst: limit,
        }
    }

    fn run(algorithm: Algorithm, quota: Quota, times: &[u64]) -> Vec<bool> {
        let mut state = State::default();
        times
            .iter()
            .map(|&t| algorithm.decide(&mut state, quota, t, 1).admitted)
            .collect()
    }

    #[test]
    fn fixed_window_admits_exactly_the_limit_per_window() {
        let times: Vec<u64> = (0..300).map(|i| i * 10).collect(); // 100/s for 3 s
        let admitted = run(Algorithm::FixedWindow, quota(40, 1_000), &times);
        for second in 0..3 {
            let n = admitted[second * 100..(second + 1) * 100]
                .iter()
                .filter(|a| **a)
                .count();
            assert_eq!(n, 40, "second {second}");
        }
        let mut state = State::default();
        let d = Algorithm::FixedWindow.decide(&mut state, quota(40, 1_000), 250, 1);
        assert_eq!((d.remaining, d.reset_ms), (39, 750));
    }

    #[test]
    fn gcra_spreads_the_quota_without_a_boundary_spike() {
        // 10 per second, burst 1: one every 100 ms.
        let q = Quota {
            limit: 10,
            window_ms: 1_000,
            burst: 1,
        };
        let times: Vec<u64> = (0..100).map(|i| i * 10).collect();
        let admitted = run(Algorithm::Gcra, q, &times);
        assert_eq!(admitted.iter().filter(|a| **a).count(), 10);
        assert!(admitted[0] && !admitted[1] && admitted[10]);
    }

    #[test]
    fn zero_limit_admits_nothing() {
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::Gcra,
        ] {
            assert!(
                run(algorithm, quota(0, 1_000), &[0, 500, 5_000])
                    .iter()
                    .all(|a| !a)
            );
        }
    }

    /// Admission times `(t, hits)` of a run over a random arrival sequence
    /// with clock jumps (backwards too).
    fn admissions(algorithm: Algorithm, q: Quota, steps: &[(i64, u32)]) -> Vec<(u64, u64)> {
        admissions_reached(algorithm, q, steps)
            .into_iter()
            .map(|(t, hits, _)| (t, hits))
            .collect()
    }

    /// Also the latest time the clock had reached at each admission.
    fn admissions_reached(
        algorithm: Algorithm,
        q: Quota,
        steps: &[(i64, u32)],
    ) -> Vec<(u64, u64, u64)> {
        let mut state = State::default();
        let mut now: i64 = 10_000_000;
        let mut reached = 0;
        let mut out = Vec::new();
        for &(step, hits) in steps {
            now = (now + step).max(0);
            let t = u64::try_from(now).unwrap();
            reached = reached.max(t);
            if algorithm.decide(&mut state, q, t, hits).admitted {
                out.push((t, u64::from(hits), reached));
            }
        }
        out
    }

    fn steps() -> impl Strategy<Value = Vec<(i64, u32)>> {
        proptest::collection::vec(
            (
                prop_oneof![8 => 0_i64..50, 1 => -2_000_i64..0, 1 => 0_i64..3_000],
                1_u32..4,
            ),
            1..400,
        )
    }

    const ALL: [Algorithm; 3] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::Gcra,
    ];

    /// A charge on a quota already spent is counted all the same (the next
    /// check is refused for longer), where a refused take of the sliding
    /// window or GCRA is not.
    #[test]
    fn a_charge_over_the_limit_is_counted_a_take_may_not_be() {
        let q = quota(10, 1_000);
        for algorithm in ALL {
            let mut state = State::default();
            assert!(algorithm.decide(&mut state, q, 0, 10).admitted);
            let taken = {
                let mut s = state;
                let d = algorithm.apply(&mut s, q, 0, 5, Direction::Take);
                assert!(!d.admitted, "{algorithm:?}");
                s
            };
            let charged = algorithm.apply(&mut state, q, 0, 5, Direction::Charge);
            assert!(!charged.admitted, "{algorithm:?}: it did not fit");
            assert_eq!(charged.remaining, 0);
            assert!(charged.reset_ms > 0, "{algorithm:?}");
            match algorithm {
                Algorithm::FixedWindow => {
                    assert_eq!(taken, state, "the fixed window counts both");
                    assert_eq!(charged.used, 15);
                }
                _ => assert_ne!(taken, state, "{algorithm:?}: only the charge counts"),
            }
            // A zero-hit check sees the debt: refused, and refused later
            // than a full quota alone would be.
            let check = algorithm.apply(&mut state, q, 1, 0, Direction::Take);
            assert!(!check.admitted, "{algorithm:?}: {check:?}");
        }
    }

    /// A refund is always admitted, gives back what it names and never
    /// goes below zero.
    #[test]
    fn a_refund_gives_back_and_stops_at_zero() {
        let q = quota(10, 1_000);
        for algorithm in ALL {
            let mut state = State::default();
            algorithm.apply(&mut state, q, 100, 12, Direction::Charge);
            let refund = algorithm.apply(&mut state, q, 100, 7, Direction::Refund);
            assert!(refund.admitted, "{algorithm:?}");
            assert_eq!(refund.used, 5, "{algorithm:?}: {refund:?}");
            assert_eq!(refund.remaining, 5, "{algorithm:?}: {refund:?}");
            let refund = algorithm.apply(&mut state, q, 100, 1_000, Direction::Refund);
            assert_eq!((refund.used, refund.remaining), (0, 10), "{algorithm:?}");
            // Nothing is owed: the whole quota passes.
            assert!(
                algorithm.decide(&mut state, q, 100, 10).admitted,
                "{algorithm:?}"
            );
        }
        // A refund of a limit of 0 is admitted too.
        let mut state = State::default();
        assert!(
            Algorithm::Gcra
                .apply(&mut state, quota(0, 1_000), 0, 3, Direction::Refund)
                .admitted
        );
    }

    /// The sliding window gives back the current window's hits first, then
    /// the previous window's.
    #[test]
    fn a_sliding_refund_reaches_into_the_previous_window() {
        let q = quota(100, 1_000);
        let mut state = State::default();
        Algorithm::SlidingWindow.apply(&mut state, q, 500, 80, Direction::Charge);
        Algorithm::SlidingWindow.apply(&mut state, q, 1_500, 10, Direction::Charge);
        // Half the previous window still weighs: 80 / 2 + 10.
        let refund = Algorithm::SlidingWindow.apply(&mut state, q, 1_500, 30, Direction::Refund);
        // 10 from the current window, 20 from the previous: 60 / 2 + 0.
        assert_eq!(refund.used, 30);
    }

    proptest! {
        /// Whatever came before, a charge followed by a refund of the same
        /// hits at the same instant changes nothing any later decision
        /// sees.
        #[test]
        fn a_refunded_charge_leaves_no_trace(
            limit in 1_u32..50,
            steps in steps(),
            hits in 0_u32..200,
            later in proptest::collection::vec((0_u64..3_000, 0_u32..5), 1..20),
        ) {
            for algorithm in ALL {
                let q = quota(limit, 1_000);
                let mut state = State::default();
                let mut now: i64 = 10_000_000;
                for &(step, step_hits) in &steps {
                    now = (now + step).max(0);
                    algorithm.decide(&mut state, q, u64::try_from(now).unwrap(), step_hits);
                }
                let now = u64::try_from(now).unwrap();
                let mut with = state;
                algorithm.apply(&mut with, q, now, hits, Direction::Charge);
                algorithm.apply(&mut with, q, now, hits, Direction::Refund);
                let mut without = state;
                let mut t = now;
                for &(step, step_hits) in &later {
                    t += step;
                    let a = algorithm.decide(&mut with, q, t, step_hits);
                    let b = algorithm.decide(&mut without, q, t, step_hits);
                    prop_assert_eq!(a, b, "{:?} at {}", algorithm, t);
                }
            }
        }

        /// Charges are never lost: within one fixed window the count is
        /// every charge, over the limit or not, less the refunds (never
        /// below zero).
        #[test]
        fn fixed_window_counts_every_charge(
            limit in 0_u32..100,
            ops in proptest::collection::vec((0_u32..500, proptest::bool::ANY), 1..50),
        ) {
            let q = quota(limit, 60_000);
            let mut state = State::default();
            let mut expected: u64 = 0;
            for (i, (hits, refund)) in ops.into_iter().enumerate() {
                let direction = if refund { Direction::Refund } else { Direction::Charge };
                let d = Algorithm::FixedWindow.apply(&mut state, q, 1_000 + i as u64, hits, direction);
                expected = if refund {
                    expected.saturating_sub(u64::from(hits))
                } else {
                    expected + u64::from(hits)
                };
                prop_assert_eq!(d.used, expected);
                prop_assert!(d.admitted || !refund);
            }
        }
    }

    proptest! {
        /// Fixed window: never more than the limit in one aligned window
        /// (the latest window the clock has reached: a clock that goes back
        /// stays in it).
        #[test]
        fn fixed_never_exceeds_the_limit_per_window(limit in 1_u32..50, steps in steps()) {
            let q = quota(limit, 1_000);
            let mut per_window = std::collections::HashMap::new();
            for (_, hits, reached) in admissions_reached(Algorithm::FixedWindow, q, &steps) {
                *per_window.entry(reached / 1_000).or_insert(0) += hits;
            }
            prop_assert!(per_window.values().all(|n| *n <= u64::from(limit)), "{per_window:?}");
        }

        /// GCRA: in any interval of length `t` (admissions in order of the
        /// schedule), at most `burst + t/interval + 1` hits.
        #[test]
        fn gcra_never_exceeds_burst_plus_rate(limit in 1_u32..50, burst in 1_u32..20, steps in steps()) {
            let q = Quota { limit, window_ms: 1_000, burst };
            let admitted = admissions(Algorithm::Gcra, q, &steps);
            let interval = 1_000.0 / f64::from(limit);
            // Only forward-moving admissions define intervals on the clock.
            let mut forward: Vec<(u64, u64)> = Vec::new();
            for (t, hits) in admitted {
                if forward.last().is_none_or(|(last, _)| t >= *last) {
                    forward.push((t, hits));
                }
            }
            for i in 0..forward.len() {
                let mut total = 0;
                for j in i..forward.len() {
                    total += forward[j].1;
                    let span = (forward[j].0 - forward[i].0) as f64;
                    prop_assert!(
                        total as f64 <= f64::from(burst) + span / interval + 1.0,
                        "{total} hits in {span} ms"
                    );
                }
            }
        }

        /// Every algorithm: a refused request has nothing remaining and a
        /// reset in the future, whatever its hits (more than the limit
        /// too).
        #[test]
        fn a_refusal_leaves_nothing_and_resets_later(limit in 0_u32..20, hits in 0_u32..60, steps in steps()) {
            for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow, Algorithm::Gcra] {
                let q = quota(limit, 1_000);
                let mut state = State::default();
                let mut now: i64 = 10_000_000;
                for &(step, step_hits) in &steps {
                    now = (now + step).max(0);
                    let t = u64::try_from(now).unwrap();
                    for h in [step_hits, hits] {
                        let d = algorithm.decide(&mut state, q, t, h);
                        if !d.admitted {
                            prop_assert_eq!(d.remaining, 0, "{:?} {:?}", algorithm, d);
                            prop_assert!(d.reset_ms > 0, "{:?} {:?}", algorithm, d);
                        }
                    }
                }
            }
        }

        /// Sliding window: the weighted estimate at every admission stays
        /// within the limit.
        #[test]
        fn sliding_estimate_never_exceeds_the_limit(limit in 1_u32..50, steps in steps()) {
            let q = quota(limit, 1_000);
            let mut state = State::default();
            let mut now: i64 = 10_000_000;
            for (step, hits) in steps {
                now = (now + step).max(0);
                let d = Algorithm::SlidingWindow.decide(&mut state, q, u64::try_from(now).unwrap(), hits);
                if d.admitted {
                    prop_assert!(d.used <= u64::from(limit), "{d:?}");
                }
            }
        }
    }
}
