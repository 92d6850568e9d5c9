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
pub struct Decision {
    /// Whether the hits are admitted.
    pub admitted: bool,
    /// Hits left before the next refusal (as the algorithm counts them);
    /// 0 when refused.
    pub remaining: u32,
    /// Milliseconds until the quota is whole again (fixed and sliding: the
    /// current window's end; GCRA: until the schedule is back at now, or
    /// when refused until these hits would pass); more than 0 when
    /// refused.
    pub reset_ms: u64,
    /// The count after this request, for "near limit" metrics: the fixed
    /// window's counter (refused hits included, as envoyproxy/ratelimit
    /// counts them), the sliding estimate, GCRA's hits in flight.
    pub used: u64,
}

impl Algorithm {
    /// Decides `hits` units at `now_ms` against `quota`, updating `state`.
    pub fn decide(self, state: &mut State, quota: Quota, now_ms: u64, hits: u32) -> Decision {
        let window = quota.window_ms.max(1);
        match self {
            Algorithm::FixedWindow => fixed(state, quota, window, now_ms, hits),
            Algorithm::SlidingWindow => sliding(state, quota, window, now_ms, hits),
            Algorithm::Gcra => gcra(state, quota, window, now_ms, hits),
        }
    }
}

fn window_start(now_ms: u64, window: u64) -> u64 {
    now_ms - now_ms % window
}

fn fixed(state: &mut State, quota: Quota, window: u64, now_ms: u64, hits: u32) -> Decision {
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
    let after = state.current.saturating_add(u64::from(hits));
    // As envoyproxy/ratelimit: the counter counts refused hits too.
    state.current = after;
    let admitted = after <= limit;
    Decision {
        admitted,
        remaining: to_u32(limit.saturating_sub(after)),
        reset_ms: (state.mark + window).saturating_sub(now_ms),
        used: after,
    }
}

fn sliding(state: &mut State, quota: Quota, window: u64, now_ms: u64, hits: u32) -> Decision {
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
    let admitted = estimate + f64::from(hits) <= limit;
    if admitted {
        state.current = state.current.saturating_add(u64::from(hits));
    }
    let used = state.previous as f64 * weight + state.current as f64;
    let remaining = if admitted {
        to_u32((limit - used).max(0.0).floor() as u64)
    } else {
        0
    };
    Decision {
        admitted,
        remaining,
        reset_ms: (state.mark + window).saturating_sub(now_ms),
        used: used.ceil() as u64,
    }
}

fn gcra(state: &mut State, quota: Quota, window: u64, now_ms: u64, hits: u32) -> Decision {
    let now = now_ms.saturating_mul(1_000);
    if quota.limit == 0 {
        return Decision {
            admitted: hits == 0,
            remaining: 0,
            reset_ms: window,
            used: 0,
        };
    }
    // One hit every `interval` µs; `burst` hits of tolerance.
    let interval = (window.saturating_mul(1_000) / u64::from(quota.limit)).max(1);
    let burst = u64::from(quota.burst.max(1));
    let tolerance = interval.saturating_mul(burst - 1);
    let tat = state.mark.max(now);
    let new_tat = tat.saturating_add(interval.saturating_mul(u64::from(hits)));
    // Admitted while the schedule runs at most `tolerance + interval` ahead
    // of now (the first hit's own slot plus the burst).
    let admitted = hits == 0 || new_tat.saturating_sub(now) <= tolerance.saturating_add(interval);
    if admitted {
        state.mark = new_tat;
    }
    let ahead = state.mark.max(now) - now;
    let in_flight = ahead.div_ceil(interval);
    if !admitted {
        // When these hits would pass: once the schedule is back within the
        // allowance; never if they are more than the burst (then a window).
        let wait = if u64::from(hits) > burst {
            window.saturating_mul(1_000)
        } else {
            new_tat.saturating_sub(now.saturating_add(tolerance.saturating_add(interval)))
        };
        return Decision {
            admitted,
            remaining: 0,
            reset_ms: wait.div_ceil(1_000).max(1),
            used: in_flight,
        };
    }
    Decision {
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
