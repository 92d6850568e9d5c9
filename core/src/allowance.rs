//! The local allowance: a per-VM rate cap per bucket, derived from the
//! pushed drop ratio and this VM's own offered rate, so that a load step
//! cannot overshoot the limit for the whole interval until the next
//! directive.
//!
//! When a directive arrives, a VM that was offered `r` requests/s of a
//! bucket over the last second may admit `r × (1 − drop_ratio)` (its share
//! of the limit, as the control plane computed it from the same traffic);
//! below the limit, where the ratio is 0, `r × limit / fleet offered`. That
//! rate is frozen until the next directive: if this VM's traffic doubles in
//! between, it still admits only its share. A generic cell rate algorithm
//! (GCRA) enforces it in integer microseconds, with time injected by the
//! caller (the VM's last tick, so the request path never reads a clock).

use crate::DropRatio;

/// When the caps decide rather than the drop ratio. The default is the
/// filter configuration's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Engage {
    /// Always: a load step is held before the next directive arrives too.
    Always,
    /// Only while the control plane is lost (its stream closed, or no batch
    /// for [`LOST_AFTER_MS`]); while it is connected the ratio decides. The
    /// caps are per VM and frozen between directives, so with several
    /// workers they do not follow load moving between workers; the ratio
    /// does. Losing the control plane during a surge is what the caps are
    /// indispensable for.
    #[default]
    WhenLost,
}

/// With no batch (heartbeats included, sent at least every second) for this
/// long, the control plane counts as lost even if its stream is open.
pub const LOST_AFTER_MS: u64 = 2_500;

/// The allowance knobs of the filter configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AllowanceSettings {
    /// Fraction added on top of the derived rate, in `[0, 1]`.
    pub headroom: f64,
    /// Requests that may arrive at once beyond the rate, as milliseconds of
    /// the allowance.
    pub burst_ms: u64,
    /// When the caps decide.
    pub engage: Engage,
}

impl Default for AllowanceSettings {
    fn default() -> Self {
        Self {
            headroom: 0.0,
            burst_ms: 20,
            engage: Engage::WhenLost,
        }
    }
}

/// What a directive says about a bucket, as far as the allowance cares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DirectiveRates {
    /// The pushed drop ratio.
    pub drop_ratio: DropRatio,
    /// The bucket's fleet-wide limit; 0 or less means unlimited.
    pub limit_rps: f64,
    /// The fleet offered rate the ratio was computed from; 0 if unknown.
    pub fleet_offered_rps: f64,
}

/// What this VM was offered of a bucket over its recent window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalRate {
    /// Requests counted.
    pub requests: u64,
    /// Over this many milliseconds.
    pub window_ms: u64,
}

impl LocalRate {
    /// The measured rate.
    pub fn rps(self) -> f64 {
        if self.window_ms == 0 {
            return 0.0;
        }
        self.requests as f64 * 1000.0 / self.window_ms as f64
    }

    /// A rate this VM's traffic is unlikely to exceed given the count: one
    /// standard deviation of a Poisson count above it (plus one request).
    /// A few requests a second say little about a VM's real share.
    pub fn upper_rps(self) -> f64 {
        if self.window_ms == 0 {
            return 0.0;
        }
        let n = self.requests as f64;
        (n + n.sqrt() + 1.0) * 1000.0 / self.window_ms as f64
    }
}

/// The rate this VM may admit, or `None` for "no cap": the bucket is
/// unlimited, or this VM saw no traffic of it, so it has no share to scale.
///
/// Shedding (ratio > 0): `local × (1 − ratio)`, the share the control plane
/// computed from the same traffic. Below the limit: the generous end of the
/// local rate times `limit / fleet offered`, so counting noise does not cut
/// a bucket that is within its limit.
pub fn allowance_rps(
    local: LocalRate,
    directive: DirectiveRates,
    settings: AllowanceSettings,
) -> Option<f64> {
    let limit = directive.limit_rps;
    if !(limit > 0.0 && limit.is_finite() && local.requests > 0 && local.window_ms > 0) {
        return None;
    }
    let ratio = directive.drop_ratio.get();
    let rate = if ratio > 0.0 {
        local.rps() * (1.0 - ratio)
    } else if directive.fleet_offered_rps > 0.0 {
        local.upper_rps() * (limit / directive.fleet_offered_rps).max(1.0)
    } else {
        return None;
    };
    let rate = rate.min(limit) * (1.0 + settings.headroom.clamp(0.0, 1.0));
    rate.is_finite().then_some(rate)
}

/// Microseconds per millisecond.
const US_PER_MS: u64 = 1_000;
/// Requests a cap lets through at once besides the first, up to
/// [`MAX_BURST_FLOOR_MS`] of its rate. Poisson arrivals at a few requests
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
        };
        gcra.set_rate(rate_rps, slack_ms, now_ms);
        gcra
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
        self.tolerance_us = slack_us.max(
            self.interval_us
                .saturating_mul(MIN_BURST_REQUESTS)
                .min(MAX_BURST_FLOOR_MS.saturating_mul(US_PER_MS)),
        );
        // A debt run up at an older, faster rate (or one that admitted
        // nothing) is cut to what the new rate could owe.
        let now_us = now_ms.saturating_mul(US_PER_MS);
        let cap = now_us
            .saturating_add(self.tolerance_us)
            .saturating_add(self.interval_us.min(slack_us.max(US_PER_MS)));
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
        if self.interval_us == u64::MAX {
            return false;
        }
        let now_us = now_ms.saturating_mul(US_PER_MS);
        let still_us = stood_still_ms.min(MAX_STILL_MS).saturating_mul(US_PER_MS);
        let tolerance_us = self.tolerance_us.max(still_us);
        if self.tat_us > now_us.saturating_add(tolerance_us) {
            return false;
        }
        self.tat_us = self.tat_us.max(now_us).saturating_add(self.interval_us);
        true
    }
}

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

/// Counts of the last [`RateWindow::SLOTS`] ticks and how long each one
/// really lasted: this VM's offered rate of one bucket over the last second.
///
/// Envoy's timers run late under load, so a tick is not assumed to last its
/// nominal period: a window that closed 150 ms after the previous one holds
/// 150 ms of requests, and counting it as 100 ms would overstate the rate
/// (and the allowance derived from it) by half.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RateWindow {
    slots: [Slot; Self::SLOTS],
    next: usize,
    filled: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Slot {
    requests: u64,
    span_ms: u64,
}

impl RateWindow {
    /// Ticks remembered.
    pub const SLOTS: usize = 10;

    /// Closes one tick that lasted `span_ms` and saw `count` requests.
    pub fn push(&mut self, count: u64, span_ms: u64) {
        if let Some(slot) = self.slots.get_mut(self.next) {
            *slot = Slot {
                requests: count,
                span_ms,
            };
        }
        self.next = (self.next + 1) % Self::SLOTS;
        self.filled = (self.filled + 1).min(Self::SLOTS);
    }

    /// Requests per second over the ticks remembered.
    pub fn rate_rps(&self) -> f64 {
        self.local().rps()
    }

    /// The requests of the ticks remembered, and the time they covered.
    pub fn local(&self) -> LocalRate {
        let filled = self.slots.iter().take(self.filled);
        LocalRate {
            requests: filled
                .clone()
                .fold(0_u64, |a, slot| a.saturating_add(slot.requests)),
            window_ms: filled.fold(0_u64, |a, slot| a.saturating_add(slot.span_ms)),
        }
    }

    /// Whether every slot has been closed at least once: only then does the
    /// window say what this VM's rate is.
    pub fn is_full(&self) -> bool {
        self.filled == Self::SLOTS
    }

    /// Whether the last second saw no request.
    pub fn is_idle(&self) -> bool {
        self.slots.iter().all(|slot| slot.requests == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn rates(ratio: f64, limit_rps: f64, fleet_offered_rps: f64) -> DirectiveRates {
        DirectiveRates {
            drop_ratio: DropRatio::new(ratio).unwrap(),
            limit_rps,
            fleet_offered_rps,
        }
    }

    const EXACT: AllowanceSettings = AllowanceSettings {
        headroom: 0.0,
        burst_ms: 0,
        engage: Engage::Always,
    };

    fn per_second(requests: u64) -> LocalRate {
        LocalRate {
            requests,
            window_ms: 1_000,
        }
    }

    #[test]
    fn share_of_the_limit() {
        // 3000 offered, limit 1000: a VM offered 300 may admit 100.
        let got = allowance_rps(per_second(300), rates(2.0 / 3.0, 1_000.0, 3_000.0), EXACT);
        assert!((got.unwrap() - 100.0).abs() < 1e-9, "{got:?}");
        // Below the limit: 800 offered, limit 1000, a VM offered 100 gets
        // (100 + 10 + 1) × 1.25.
        let got = allowance_rps(per_second(100), rates(0.0, 1_000.0, 800.0), EXACT);
        assert!((got.unwrap() - 138.75).abs() < 1e-9, "{got:?}");
        let headroom = AllowanceSettings {
            headroom: 0.1,
            ..EXACT
        };
        let got = allowance_rps(per_second(300), rates(0.5, 1_000.0, 800.0), headroom);
        assert!((got.unwrap() - 165.0).abs() < 1e-9, "{got:?}");
    }

    #[test]
    fn no_cap_without_a_share() {
        assert_eq!(
            allowance_rps(per_second(0), rates(0.5, 10.0, 20.0), EXACT),
            None
        );
        assert_eq!(
            allowance_rps(per_second(5), rates(0.5, 0.0, 20.0), EXACT),
            None
        );
        assert_eq!(
            allowance_rps(per_second(5), rates(0.0, 10.0, 0.0), EXACT),
            None
        );
        // Never more than the whole limit.
        assert_eq!(
            allowance_rps(per_second(500), rates(0.0, 10.0, 1.0), EXACT),
            Some(10.0)
        );
    }

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
    fn rate_window_averages_the_last_second() {
        let mut window = RateWindow::default();
        assert_eq!(window.rate_rps(), 0.0);
        assert!(window.is_idle());
        window.push(10, 100);
        assert!((window.rate_rps() - 100.0).abs() < 1e-9);
        for _ in 0..20 {
            window.push(5, 100);
        }
        assert!((window.rate_rps() - 50.0).abs() < 1e-9);
        window.push(u64::MAX, 100);
        window.push(u64::MAX, u64::MAX);
        assert!(window.rate_rps().is_finite());
    }

    #[test]
    fn late_ticks_do_not_overstate_the_rate() {
        // 100 rps, but the timer fires every 150 ms instead of 100 ms.
        let mut window = RateWindow::default();
        for _ in 0..RateWindow::SLOTS {
            window.push(15, 150);
        }
        assert!((window.rate_rps() - 100.0).abs() < 1e-9);
        let local = window.local();
        assert_eq!((local.requests, local.window_ms), (150, 1_500));
    }
}
