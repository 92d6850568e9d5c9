//! The start-up hold: a control plane that has just started pushes no
//! directives until it has heard from the fleet.
//!
//! After a restart the proxies reconnect one by one, each on its own
//! jittered backoff (up to 5 s apart). A drop ratio computed while only
//! some of them have reported counts only their traffic: pushed, it would
//! let the whole fleet admit far over the limit (or cut it far under) until
//! the rest reconnect. Meanwhile every proxy still enforces the directives
//! of the previous process, computed from the whole fleet, so the safe move
//! is to push nothing until the new view is as complete as the old one.
//!
//! Each proxy says in its `Hello` how many proxies its last-known
//! directives counted (`known_proxies`). The hold ends one control interval
//! after as many proxies as the largest such count have reported (the extra
//! interval lets the last one's report fill a whole window), or when the
//! grace period runs out (a proxy that left during the outage never comes
//! back). A fleet that held no directives has nothing to protect: no hold.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Default grace period: the filter's longest reconnect delay (5 s) plus a
/// report interval and a control interval of margin.
pub(crate) const DEFAULT_GRACE: Duration = Duration::from_secs(6);

/// Whether the start-up hold is still on.
#[derive(Debug)]
pub(crate) struct Warmup {
    over: AtomicBool,
    state: Mutex<HoldState>,
}

#[derive(Debug)]
struct HoldState {
    deadline: Instant,
    /// The largest `known_proxies` any Hello carried.
    expected: u32,
    /// Proxies that reported since this process started.
    reported: HashSet<String>,
    /// Whether the previous check found enough proxies.
    complete_at_last_check: bool,
}

/// Why the hold ended, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldEnded {
    /// As many proxies reported as the fleet had before.
    FleetComplete {
        /// Proxies heard from.
        reported: usize,
        /// Proxies the fleet had, as the proxies remembered it.
        expected: u32,
    },
    /// The grace period ran out first.
    GraceElapsed {
        /// Proxies heard from.
        reported: usize,
        /// Proxies the fleet had, as the proxies remembered it.
        expected: u32,
    },
}

impl Warmup {
    /// A hold starting at `now` for at most `grace`; a zero grace means no
    /// hold at all.
    pub(crate) fn new(now: Instant, grace: Duration) -> Self {
        Self {
            over: AtomicBool::new(grace.is_zero()),
            state: Mutex::new(HoldState {
                deadline: now + grace,
                expected: 0,
                reported: HashSet::new(),
                complete_at_last_check: false,
            }),
        }
    }

    /// Whether the hold is over; cheap, for every report.
    pub(crate) fn is_over(&self) -> bool {
        self.over.load(Ordering::Acquire)
    }

    /// A proxy said Hello, remembering a fleet of `known_proxies`.
    pub(crate) fn hello(&self, known_proxies: u32) {
        if self.is_over() {
            return;
        }
        let mut state = self.lock();
        state.expected = state.expected.max(known_proxies);
    }

    /// A proxy reported.
    pub(crate) fn reported(&self, proxy_id: &str) {
        if self.is_over() {
            return;
        }
        let mut state = self.lock();
        if !state.reported.contains(proxy_id) {
            state.reported.insert(proxy_id.to_owned());
        }
    }

    /// Called once per control interval: whether directives may be pushed
    /// now, and, the first time they may, why.
    pub(crate) fn check(&self, now: Instant) -> (bool, Option<HoldEnded>) {
        if self.is_over() {
            return (true, None);
        }
        let mut state = self.lock();
        let reported = state.reported.len();
        let expected = state.expected;
        let complete = reported > 0 && reported >= expected as usize;
        let ended = if complete && state.complete_at_last_check {
            Some(HoldEnded::FleetComplete { reported, expected })
        } else if now >= state.deadline {
            Some(HoldEnded::GraceElapsed { reported, expected })
        } else if expected == 0 && reported > 0 {
            // The proxies held no directives: nothing to protect.
            Some(HoldEnded::FleetComplete { reported, expected })
        } else {
            None
        };
        state.complete_at_last_check = complete;
        if ended.is_some() {
            state.reported = HashSet::new();
            self.over.store(true, Ordering::Release);
        }
        (ended.is_some(), ended)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HoldState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(6);

    #[test]
    fn holds_until_the_remembered_fleet_reported_and_one_more_interval() {
        let start = Instant::now();
        let warmup = Warmup::new(start, GRACE);
        warmup.hello(2);
        warmup.reported("a");
        assert_eq!(warmup.check(start), (false, None), "one of two");
        warmup.hello(2);
        warmup.reported("b");
        warmup.reported("b");
        assert_eq!(warmup.check(start), (false, None), "a window for b first");
        let ended = HoldEnded::FleetComplete {
            reported: 2,
            expected: 2,
        };
        assert_eq!(warmup.check(start), (true, Some(ended)));
        assert!(warmup.is_over());
        assert_eq!(warmup.check(start), (true, None), "said once");
    }

    #[test]
    fn a_proxy_that_never_returns_holds_until_the_grace_runs_out() {
        let start = Instant::now();
        let warmup = Warmup::new(start, GRACE);
        warmup.hello(3);
        warmup.reported("a");
        warmup.reported("b");
        assert!(!warmup.check(start + GRACE / 2).0);
        let ended = HoldEnded::GraceElapsed {
            reported: 2,
            expected: 3,
        };
        assert_eq!(warmup.check(start + GRACE), (true, Some(ended)));
    }

    #[test]
    fn a_fleet_without_directives_is_not_held() {
        let start = Instant::now();
        let warmup = Warmup::new(start, GRACE);
        assert!(!warmup.check(start).0, "nobody heard from yet");
        warmup.hello(0);
        warmup.reported("a");
        assert!(warmup.check(start).0);
    }

    #[test]
    fn zero_grace_is_no_hold() {
        let start = Instant::now();
        let warmup = Warmup::new(start, Duration::ZERO);
        assert!(warmup.is_over());
        assert_eq!(warmup.check(start), (true, None));
    }
}
