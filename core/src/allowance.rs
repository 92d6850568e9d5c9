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
//! between, it still admits only its share. The core's one limiter
//! ([`crate::gcra::Gcra`]) enforces it.

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
    /// The bucket's fleet-wide limit in the unit of `fleet_offered_rps`
    /// (under a budget, estimated cost): `None` when unlimited, 0 when
    /// blocked.
    pub limit_rps: Option<f64>,
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
    let limit = directive.limit_rps?;
    if !(limit.is_finite() && local.requests > 0 && local.window_ms > 0) {
        return None;
    }
    if limit <= 0.0 {
        // Blocked: nothing, whatever the ratio says.
        return Some(0.0);
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

    /// The requests of the tick closed last, and the time it covered.
    pub fn last(&self) -> Option<LocalRate> {
        if self.filled == 0 {
            return None;
        }
        let index = (self.next + Self::SLOTS - 1) % Self::SLOTS;
        self.slots.get(index).map(|slot| LocalRate {
            requests: slot.requests,
            window_ms: slot.span_ms,
        })
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

    fn rates(ratio: f64, limit_rps: Option<f64>, fleet_offered_rps: f64) -> DirectiveRates {
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
        let got = allowance_rps(
            per_second(300),
            rates(2.0 / 3.0, Some(1_000.0), 3_000.0),
            EXACT,
        );
        assert!((got.unwrap() - 100.0).abs() < 1e-9, "{got:?}");
        // Below the limit: 800 offered, limit 1000, a VM offered 100 gets
        // (100 + 10 + 1) × 1.25.
        let got = allowance_rps(per_second(100), rates(0.0, Some(1_000.0), 800.0), EXACT);
        assert!((got.unwrap() - 138.75).abs() < 1e-9, "{got:?}");
        let headroom = AllowanceSettings {
            headroom: 0.1,
            ..EXACT
        };
        let got = allowance_rps(per_second(300), rates(0.5, Some(1_000.0), 800.0), headroom);
        assert!((got.unwrap() - 165.0).abs() < 1e-9, "{got:?}");
    }

    #[test]
    fn no_cap_without_a_share() {
        assert_eq!(
            allowance_rps(per_second(0), rates(0.5, Some(10.0), 20.0), EXACT),
            None
        );
        assert_eq!(
            allowance_rps(per_second(5), rates(0.5, None, 20.0), EXACT),
            None
        );
        assert_eq!(
            allowance_rps(per_second(5), rates(0.0, Some(10.0), 0.0), EXACT),
            None
        );
        // A blocked bucket (limit 0) admits nothing, whatever the ratio.
        assert_eq!(
            allowance_rps(per_second(5), rates(0.0, Some(0.0), 20.0), EXACT),
            Some(0.0)
        );
        assert_eq!(
            allowance_rps(per_second(5), rates(0.5, Some(0.0), 0.0), EXACT),
            Some(0.0)
        );
        // Never more than the whole limit.
        assert_eq!(
            allowance_rps(per_second(500), rates(0.0, Some(10.0), 1.0), EXACT),
            Some(10.0)
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
    fn the_last_tick_is_the_one_closed_last() {
        let mut window = RateWindow::default();
        assert_eq!(window.last(), None);
        for count in 0..(RateWindow::SLOTS as u64 + 3) {
            window.push(count, 100 + count);
            let last = window.last().unwrap();
            assert_eq!((last.requests, last.window_ms), (count, 100 + count));
        }
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
