//! The one rate limiter of the data planes: a generic cell rate algorithm
//! (GCRA, "virtual scheduling") in integer microseconds, with time
//! injected by the caller (a VM's last tick, so the request path never
//! reads a clock). The allowance's per-VM caps, the fallback after the
//! directive TTL and the limit of new buckets all use it. Under a cost
//! budget the rate is cost per second and a request is charged its
//! estimate ([`Gcra::admit_weighted`]).

/// How much of a local limit's rate may pass at once ([`Gcra::per_second`]).
pub const LOCAL_LIMIT_BURST_MS: u64 = 1_000;

/// Microseconds per millisecond.
const US_PER_MS: u64 = 1_000;
/// Requests a cap lets through at once besides the first, up to
/// [`MAX_BURST_FLOOR_MS`] of its rate; under a cost budget, requests of
/// the mean weight it admits ([`Gcra::mean_weight`]). Poisson arrivals at a few requests
/// per second per VM clump: with 3, caps cut buckets within a few percent
/// of their limit by about 5 % over 10 s windows (the simulator's zipf
/// scenario, 4.5 % p95 against the baseline's 3.3 %). A step can pass at
/// most this many extra requests per VM.
pub const MIN_BURST_REQUESTS: u64 = 6;
/// The longest span of a cap's rate that [`MIN_BURST_REQUESTS`] may stand
/// for: a cell of a few requests a second saved up more than its share
/// (a tenant at 5 requests per second per VM got 4 % over its fair share
/// with 1.2 s).
pub const MAX_BURST_FLOOR_MS: u64 = 600;
/// The slowest allowance held as a rate; below it the cap admits nothing.
const MIN_RATE_RPS: f64 = 1e-6;

/// A rate cap (GCRA, "virtual scheduling"): a request is admitted when its
/// theoretical arrival time is at most `tolerance` ahead of now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    /// Time one request uses up, in µs; `u64::MAX` admits nothing.
    interval_us: u64,
    /// How far ahead of now the schedule may run, in µs.
    tolerance_us: u64,
    /// Theoretical arrival time of the next request, in µs.
    tat_us: u64,
    /// The weight the last admitted request was charged (at least 1): the
    /// most the schedule may run beyond its tolerance, which a new rate
    /// keeps ([`Gcra::set_rate`]).
    last_weight: u64,
    /// The weight of the requests it admits, in sixteenths, averaged over
    /// about the last eight ([`Gcra::mean_weight`]).
    mean_weight_x16: u64,
}

impl Gcra {
    /// A cap of `rate_rps` that starts full. `slack_ms` is how long time may
    /// stand still for the caller (its tick) plus the burst: with time
    /// advancing in ticks, a whole tick's worth must fit at one instant.
    pub fn new(rate_rps: f64, slack_ms: u64, now_ms: u64) -> Self {
        let mut gcra = Self {
            interval_us: u64::MAX,
            tolerance_us: 0,
            tat_us: now_ms.saturating_mul(US_PER_MS),
            last_weight: 1,
            mean_weight_x16: WEIGHT_ONE_X16,
        };
        gcra.set_rate(rate_rps, slack_ms, now_ms);
        gcra
    }

    /// A local limit of `rate_rps` enforced over seconds, starting full:
    /// one second of the rate (at least one request) may pass at once. The
    /// fallback after the directive TTL and the limit of new buckets use
    /// it, with [`Gcra::admit`]'s `stood_still_ms` at 0 (a second's
    /// tolerance covers any tick).
    pub fn per_second(rate_rps: f64, now_ms: u64) -> Self {
        let mut gcra = Self {
            interval_us: u64::MAX,
            tolerance_us: 0,
            tat_us: now_ms.saturating_mul(US_PER_MS),
            last_weight: 1,
            mean_weight_x16: WEIGHT_ONE_X16,
        };
        gcra.set_rate_per_second(rate_rps, now_ms);
        gcra
    }

    /// Changes a local limit's rate ([`Gcra::per_second`]), keeping what
    /// was already used.
    pub fn set_rate_per_second(&mut self, rate_rps: f64, now_ms: u64) {
        self.interval_us = interval_us(rate_rps);
        // A second holds the first request and `tolerance / interval` more:
        // the rate's worth of requests, at least one.
        self.tolerance_us = LOCAL_LIMIT_BURST_MS
            .saturating_mul(US_PER_MS)
            .saturating_sub(self.interval_us);
        let now_us = now_ms.saturating_mul(US_PER_MS);
        let cap = now_us.saturating_add(self.tolerance_us).saturating_add(
            self.interval_us
                .min(LOCAL_LIMIT_BURST_MS * US_PER_MS)
                .saturating_mul(self.last_weight),
        );
        self.tat_us = self.tat_us.min(cap);
    }

    /// Whether the cap runs at `rate_rps` already (after rounding to whole
    /// microseconds), so a caller re-deriving the same rate keeps it as is.
    pub fn has_rate(&self, rate_rps: f64) -> bool {
        self.interval_us == interval_us(rate_rps)
    }

    /// Changes the rate, keeping what was already used: a new directive
    /// does not hand out a fresh burst.
    pub fn set_rate(&mut self, rate_rps: f64, slack_ms: u64, now_ms: u64) {
        self.interval_us = interval_us(rate_rps);
        let slack_us = slack_ms.saturating_mul(US_PER_MS);
        // At least a few requests' worth: a cap barely below a slow VM's
        // Poisson arrivals would otherwise waste the allowance of every gap.
        // But at most MAX_BURST_FLOOR_MS of it: a cell of a few requests a
        // second would otherwise save up more than its share of a second.
        // A request's worth is what the requests it admits weigh: under a
        // cost budget, hundreds of units. Counted in units, the floor was a
        // few tokens and a tenant of a request a second per VM lost the
        // allowance of each gap between its requests longer than the slack.
        self.tolerance_us = slack_us.max(
            self.interval_us
                .saturating_mul(MIN_BURST_REQUESTS)
                .saturating_mul(self.mean_weight())
                .min(MAX_BURST_FLOOR_MS.saturating_mul(US_PER_MS)),
        );
        // A debt run up at an older, faster rate is cut to what the new
        // rate could owe: its tolerance and one request (a schedule just
        // admitted at the edge), of the last admitted request's weight.
        // Cutting it to less forgave a slow cap part of each request
        // whenever its rate was set again: VMs that rescale their caps every
        // 100 ms let a cell at a few requests a second through at up to
        // twice its rate (a tenant of 4.8 requests a second per VM got 7 %
        // over its fair share in the simulator). Under a cost budget one
        // request is thousands of units: cut to one unit, its debt was
        // forgiven at every rescale, and a cap admitted about a request per
        // tick whatever its rate.
        let now_us = now_ms.saturating_mul(US_PER_MS);
        let cap = now_us
            .saturating_add(self.tolerance_us)
            .saturating_add(self.interval_us.saturating_mul(self.last_weight));
        self.tat_us = self.tat_us.min(cap);
    }

    /// Whether a request at `now_ms` fits; if so it is counted.
    ///
    /// `stood_still_ms` is how long the caller's clock last stood still
    /// between two readings: the requests it decides at one frozen instant
    /// really arrive over about that long, so the schedule may run that far
    /// ahead as well (up to [`MAX_STILL_MS`]). Without it, a timer that
    /// fires later than the burst tolerance would lose the allowance of the
    /// difference on every tick.
    #[inline]
    pub fn admit(&mut self, now_ms: u64, stood_still_ms: u64) -> bool {
        self.admit_weighted(now_ms, stood_still_ms, 1)
    }

    /// [`Gcra::admit`] for a request that uses `weight` units of the rate
    /// (its estimated cost, when the rate is cost per second): it fits when
    /// the schedule has room for one unit, and then is charged all of
    /// them. A request larger than the burst is not shut out for good; the
    /// schedule runs into debt instead, which the requests after it wait
    /// out, so the limiter overshoots its rate by at most one request.
    /// Weight 1 is [`Gcra::admit`]; weight 0 passes whenever one unit
    /// would and charges nothing.
    #[inline]
    pub fn admit_weighted(&mut self, now_ms: u64, stood_still_ms: u64, weight: u64) -> bool {
        if self.interval_us == u64::MAX {
            return false;
        }
        let now_us = now_ms.saturating_mul(US_PER_MS);
        let still_us = stood_still_ms.min(MAX_STILL_MS).saturating_mul(US_PER_MS);
        let tolerance_us = self.tolerance_us.max(still_us);
        if self.tat_us > now_us.saturating_add(tolerance_us) {
            return false;
        }
        self.tat_us = self
            .tat_us
            .max(now_us)
            .saturating_add(self.interval_us.saturating_mul(weight));
        self.last_weight = weight.max(1);
        // An average over about the last eight admitted, exact for a
        // steady weight.
        self.mean_weight_x16 = self
            .mean_weight_x16
            .saturating_sub(self.mean_weight_x16 / 8)
            .saturating_add(self.last_weight.saturating_mul(WEIGHT_ONE_X16 / 8));
        true
    }

    /// What the requests it admitted lately weighed, on average (at least
    /// 1; 1 before any).
    pub fn mean_weight(&self) -> u64 {
        (self.mean_weight_x16 / WEIGHT_ONE_X16).max(1)
    }
}

/// A weight of 1 in [`Gcra`]'s sixteenths.
const WEIGHT_ONE_X16: u64 = 16;

/// The longest clock stall [`Gcra::admit`] makes up for.
pub const MAX_STILL_MS: u64 = 1_000;

fn interval_us(rate_rps: f64) -> u64 {
    if rate_rps.is_nan() || rate_rps < MIN_RATE_RPS {
        return u64::MAX;
    }
    let interval = (1e6 / rate_rps).round();
    // Casting saturates; a rate above 10^6/s per VM still spends 1 µs.
    (interval as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;
    #[test]
    fn gcra_holds_the_rate_over_ticks() {
        // 100 rps, time advancing in 100 ms ticks, 1000 rps offered.
        let mut gcra = Gcra::new(100.0, 100, 0);
        let mut admitted = 0;
        for tick in 0..100_u64 {
            for _ in 0..100 {
                admitted += u32::from(gcra.admit(tick * 100, 0));
            }
        }
        // 10 s at 100 rps, plus the first tick's slack.
        assert!((1_000..=1_011).contains(&admitted), "{admitted}");
    }

    #[test]
    fn slow_caps_burst_six_requests_but_at_most_600_ms_of_their_rate() {
        let at_once = |rate_rps: f64| {
            let mut gcra = Gcra::new(rate_rps, 120, 0);
            (0..1_000).filter(|_| gcra.admit(0, 0)).count()
        };
        // 1000 rps: the 120 ms slack is the larger, 1 + 120.
        assert_eq!(at_once(1_000.0), 121);
        // 20 rps: six requests beyond the first (300 ms of the rate).
        assert_eq!(at_once(20.0), 7);
        // 5 rps: six would be 1.2 s of the rate; 600 ms is three.
        assert_eq!(at_once(5.0), 4);
    }

    #[test]
    fn a_weighted_cap_bursts_six_requests_of_what_it_admits() {
        // 250 units a second against requests of 500, one every 1.5 s: a
        // cell of a budget at under a request a second on one VM. Six
        // requests' worth is 12 s of the rate, so the floor is 600 ms.
        let mut cap = Gcra::new(250.0, 120, 0);
        let mut admitted = 0u64;
        for ms in (0..60_000u64).step_by(100) {
            if ms % 1_500 == 0 && cap.admit_weighted(ms, 0, 500) {
                admitted += 500;
            }
            // The tick rescales the cap to the same rate.
            cap.set_rate(250.0, 120, ms);
        }
        // The average has nearly reached the weight after some twenty.
        assert!(
            (450..=500).contains(&cap.mean_weight()),
            "{}",
            cap.mean_weight()
        );
        // Of the rate's 15,000: with a floor of six units, 120 ms, each
        // gap longer than it lost its allowance, and a request in two was
        // admitted (10,000).
        assert!((13_000..=15_500).contains(&admitted), "{admitted}");
        // Weight-one caps keep their floor in requests.
        let mut requests = Gcra::new(5.0, 120, 0);
        assert!(requests.admit(0, 0));
        assert_eq!(requests.mean_weight(), 1);
    }

    #[test]
    fn gcra_below_the_rate_admits_everything() {
        let mut gcra = Gcra::new(100.0, 100, 0);
        for ms in 0..10_000_u64 {
            if ms % 20 == 0 {
                assert!(gcra.admit(ms, 0), "at {ms}");
            }
        }
    }

    #[test]
    fn zero_rate_admits_nothing_and_recovers() {
        let mut gcra = Gcra::new(0.0, 100, 0);
        assert!(!gcra.admit(0, 0));
        assert!(!gcra.admit(1_000_000, 0));
        gcra.set_rate(10.0, 100, 2_000_000);
        assert!(gcra.admit(2_000_000, 0));
    }

    #[test]
    fn a_new_rate_does_not_refill() {
        let mut gcra = Gcra::new(10.0, 100, 0);
        while gcra.admit(0, 0) {}
        gcra.set_rate(10.0, 100, 0);
        assert!(
            !gcra.admit(0, 0),
            "no fresh burst from an unchanged directive"
        );
    }

    #[test]
    fn setting_the_same_slow_rate_again_forgives_nothing() {
        // 2 rps (500 ms per request, slower than the 120 ms slack), offered
        // every 20 ms for 10 s, the rate set again every 100 ms as VMs
        // rescale their caps.
        let mut gcra = Gcra::new(2.0, 120, 0);
        let mut admitted = 0;
        for ms in (0..10_000_u64).step_by(20) {
            if ms % 100 == 0 {
                gcra.set_rate(2.0, 120, ms);
            }
            admitted += u32::from(gcra.admit(ms, 0));
        }
        // 10 s at 2 rps plus the 600 ms burst and the first request.
        assert!((20..=22).contains(&admitted), "{admitted}");
    }

    #[test]
    fn a_local_limit_admits_its_rate_plus_a_second_of_burst() {
        let mut limit = Gcra::per_second(10.0, 0);
        let mut admitted = 0;
        // 100 requests per 20 ms tick for 10 s.
        for tick in 0..500u64 {
            for _ in 0..100 {
                admitted += usize::from(limit.admit(tick * 20, 0));
            }
        }
        // One second of burst plus ten seconds of refill.
        assert!((100..=110).contains(&admitted), "{admitted}");
        assert!(limit.has_rate(10.0));
        assert!(!limit.has_rate(10.5));
    }

    #[test]
    fn a_local_limit_of_nothing_admits_nothing() {
        assert!(!Gcra::per_second(0.0, 0).admit(0, 0));
        assert!(!Gcra::per_second(f64::NAN, 0).admit(10_000, 0));
        // Below one request a second: one at once, then the rate.
        let mut slow = Gcra::per_second(0.5, 0);
        let admitted = (0..100u64).filter(|tick| slow.admit(tick * 100, 0)).count();
        assert_eq!(admitted, 5, "one every 2 s over 10 s");
    }

    #[test]
    fn a_clock_going_backwards_adds_nothing() {
        let mut limit = Gcra::per_second(1.0, 1_000);
        while limit.admit(1_000, 0) {}
        assert!(!limit.admit(500, 0));
        assert!(limit.admit(3_000, 0));
    }

    #[test]
    fn a_weighted_limit_holds_its_rate_in_cost_and_never_shuts_out_a_large_request() {
        // 1,000 tokens a second; requests of 100 and 5,000 tokens (larger
        // than the second's burst) offered every 10 ms for 10 s.
        let mut limit = Gcra::per_second(1_000.0, 0);
        let (mut admitted, mut large_admitted) = (0u64, 0u32);
        for ms in (0..10_000u64).step_by(10) {
            let weight = if ms % 1_000 == 0 { 5_000 } else { 100 };
            if limit.admit_weighted(ms, 0, weight) {
                admitted += weight;
                large_admitted += u32::from(weight == 5_000);
            }
        }
        // 10 s at the rate, a second's burst, and at most one request of
        // debt beyond it.
        assert!((10_000..=16_000).contains(&admitted), "{admitted}");
        assert!(
            large_admitted >= 1,
            "a large request fits when the schedule has room"
        );
    }

    #[test]
    fn any_weight_is_safe() {
        let mut limit = Gcra::per_second(10.0, 0);
        assert!(limit.admit_weighted(0, 0, u64::MAX));
        assert!(!limit.admit_weighted(1_000_000, 0, 1));
        // A new rate keeps the request's debt, saturated rather than
        // wrapped.
        limit.set_rate_per_second(20.0, 2_000);
        assert!(!limit.admit_weighted(3_000, 0, 0));
        let mut cap = Gcra::new(5.0, 100, 0);
        assert!(cap.admit_weighted(0, MAX_STILL_MS, 0));
        assert!(cap.admit_weighted(0, u64::MAX, u64::MAX));
        // Large requests raise the burst floor to 600 ms of the rate, no
        // further: 300 units at 500 a second.
        let mut cap = Gcra::new(500.0, 100, 0);
        assert!(cap.admit_weighted(0, 0, u64::MAX / 2));
        assert_eq!(cap.mean_weight(), u64::MAX / 16);
        let mut cap = Gcra::new(500.0, 100, 0);
        for second in 0..20 {
            assert!(cap.admit_weighted(second * 20_000, 0, 5_000));
        }
        let now_ms = 1_000_000;
        cap.set_rate(500.0, 100, now_ms);
        let burst = (0..1_000)
            .filter(|_| cap.admit_weighted(now_ms, 0, 1))
            .count();
        assert_eq!(burst, 301, "{burst}");
    }

    #[test]
    fn a_new_rate_keeps_the_debt_of_a_large_request() {
        // 2,000 tokens a second, set again every 100 ms as the allowance's
        // caps are; requests of 100 and 8,000 tokens alternating every
        // 10 ms for 20 s.
        let mut cap = Gcra::new(2_000.0, 120, 0);
        let mut admitted = 0u64;
        for ms in (0..20_000u64).step_by(10) {
            if ms % 100 == 0 {
                cap.set_rate(2_000.0, 120, ms);
            }
            let weight = if (ms / 10) % 2 == 0 { 100 } else { 8_000 };
            if cap.admit_weighted(ms, 0, weight) {
                admitted += weight;
            }
        }
        // 20 s at the rate, the tolerance and one request of debt.
        assert!((38_000..=48_500).contains(&admitted), "{admitted}");
    }

    #[test]
    fn a_lower_rate_keeps_no_more_than_its_own_burst() {
        let mut limit = Gcra::per_second(100.0, 0);
        limit.set_rate_per_second(2.0, 0);
        let burst = (0..10).filter(|_| limit.admit(0, 0)).count();
        assert_eq!(burst, 2, "a second of 2 rps");
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    /// [`Gcra::admit`] as it was before weights, to check that weight 1
    /// decides step for step as it did.
    fn admit_by_request(gcra: &mut Gcra, now_ms: u64, stood_still_ms: u64) -> bool {
        if gcra.interval_us == u64::MAX {
            return false;
        }
        let now_us = now_ms.saturating_mul(US_PER_MS);
        let still_us = stood_still_ms.min(MAX_STILL_MS).saturating_mul(US_PER_MS);
        let tolerance_us = gcra.tolerance_us.max(still_us);
        if gcra.tat_us > now_us.saturating_add(tolerance_us) {
            return false;
        }
        gcra.tat_us = gcra.tat_us.max(now_us).saturating_add(gcra.interval_us);
        true
    }

    proptest! {
        #[test]
        fn weight_one_admits_as_requests_did(
            rate in 0.0f64..5_000.0,
            slack_ms in 0u64..2_000,
            steps in proptest::collection::vec((0u64..300, 0u64..1_500), 1..300),
        ) {
            let mut weighted = Gcra::new(rate, slack_ms, 0);
            let mut requests = weighted;
            let mut now_ms = 0;
            for (step, still) in steps {
                now_ms += step;
                prop_assert_eq!(
                    weighted.admit_weighted(now_ms, still, 1),
                    admit_by_request(&mut requests, now_ms, still)
                );
                prop_assert_eq!(weighted, requests);
            }
        }
    }
}
