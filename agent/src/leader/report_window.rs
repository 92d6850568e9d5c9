//! Aligning the counts of every VM to the leader's report windows.
//!
//! Followers hand their counts to the leader on their own ticks, which are
//! not aligned with the leader's report windows. Merged as they arrive, a
//! 250 ms report would carry two or three 100 ms hand-offs of a follower,
//! and the control plane's rate estimate would swing by ±20% with steady
//! load. So every hand-off carries the span it covers (`start_ms` to
//! `end_ms`, the follower's previous and current tick), and the leader:
//! - closes a window at its tick (its own counts are exact up to then) but
//!   sends it only once every live source has handed off past the window's
//!   end, or a deadline passed;
//! - splits a hand-off that straddles the window's end in proportion to
//!   the time on each side (integer counts, totals kept exactly), and puts
//!   the rest into the next window.
//!
//! Each report then counts the fleet's requests of exactly its window, up to
//! the interpolation within one hand-off.

use crate::leader::counters::BucketCounters;
use crate::request::cell_table::CellTable;
use crate::request::cell_table::Counts;
use crate::request::classify::key_of;
use crate::shared::Handoff;
use sluice_core::Priority;
use sluice_proto::v1::BucketCount;
use std::collections::HashMap;

/// A source is waited for if it handed off this recently.
pub(crate) const SOURCE_LIVE_MS: u64 = 250;
/// Longest wait for stragglers after a window's end.
pub(crate) const MAX_WAIT_MS: u64 = 150;
/// A source counts as a worker (for splitting local limits) if it had
/// traffic this recently.
pub(crate) const WORKER_LIVE_MS: u64 = 2_000;

#[derive(Debug)]
struct Closing {
    counts: BucketCounters,
    start_ms: u64,
    end_ms: u64,
}

#[derive(Debug, Clone, Copy)]
struct Source {
    last_end_ms: u64,
    last_seen_ms: u64,
    last_traffic_ms: Option<u64>,
}

/// A report ready to send.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ReadyWindow {
    /// Length of the window.
    pub window_ms: u64,
    /// Counts of the window.
    pub counts: Vec<BucketCount>,
}

/// The leader's windows.
#[derive(Debug)]
pub(crate) struct ReportWindows {
    current: BucketCounters,
    current_start_ms: u64,
    closing: Option<Closing>,
    sources: HashMap<u64, Source>,
    own_traffic_ms: Option<u64>,
    max_cells: usize,
}

impl ReportWindows {
    /// A first window starting at `now_ms`.
    pub(crate) fn new(max_cells: usize, now_ms: u64) -> Self {
        Self {
            current: BucketCounters::new(max_cells),
            current_start_ms: now_ms,
            closing: None,
            sources: HashMap::new(),
            own_traffic_ms: None,
            max_cells,
        }
    }

    /// When the current window started.
    pub(crate) fn current_start_ms(&self) -> u64 {
        self.current_start_ms
    }

    /// Whether a closed window waits to be sent.
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.is_some()
    }

    /// The leader's own counts up to `now_ms`.
    pub(crate) fn add_own(&mut self, own: &mut CellTable, now_ms: u64) {
        if !own.has_no_counts() {
            self.own_traffic_ms = Some(now_ms);
        }
        self.current.take_from(own);
    }

    /// A follower's hand-off, received at `now_ms`.
    /// `limited` says which cell keys have a directive (they may use the
    /// counters' reserved share).
    pub(crate) fn add_handoff(
        &mut self,
        handoff: Handoff,
        now_ms: u64,
        mut limited: impl FnMut(&str) -> bool,
    ) {
        let source = self.sources.entry(handoff.source).or_insert(Source {
            last_end_ms: 0,
            last_seen_ms: now_ms,
            last_traffic_ms: None,
        });
        source.last_end_ms = source.last_end_ms.max(handoff.end_ms);
        source.last_seen_ms = now_ms;
        if !handoff.counts.is_empty() {
            source.last_traffic_ms = Some(now_ms);
        }
        let Some(closing) = &mut self.closing else {
            self.current.merge(handoff.counts, limited);
            return;
        };
        let boundary = closing.end_ms;
        if handoff.end_ms <= boundary {
            closing.counts.merge(handoff.counts, limited);
            return;
        }
        if handoff.start_ms >= boundary {
            self.current.merge(handoff.counts, limited);
            return;
        }
        let span = handoff.end_ms.saturating_sub(handoff.start_ms).max(1);
        let fraction = boundary.saturating_sub(handoff.start_ms) as f64 / span as f64;
        for count in handoff.counts {
            let key = key_of(
                &count.bucket,
                &count.tenant,
                Priority::from_wire(count.priority),
            );
            let (before, after) = Counts::of(&count).split(fraction);
            let is_limited = limited(&key);
            closing.counts.add(key.clone(), before, is_limited);
            self.current.add(key, after, is_limited);
        }
    }

    /// Closes the current window at `now_ms` (after the leader's own counts
    /// were added). A window still waiting is folded into this one first,
    /// so counts are never lost.
    pub(crate) fn close(&mut self, now_ms: u64) {
        let mut counts = std::mem::replace(&mut self.current, BucketCounters::new(self.max_cells));
        let mut start_ms = self.current_start_ms;
        if let Some(mut older) = self.closing.take() {
            older.counts.move_into(&mut counts);
            start_ms = older.start_ms;
        }
        self.closing = Some(Closing {
            counts,
            start_ms,
            end_ms: now_ms,
        });
        self.current_start_ms = now_ms;
    }

    /// The closed window, once every live source has handed off past its
    /// end or the wait is over.
    pub(crate) fn take_ready(&mut self, now_ms: u64) -> Option<ReadyWindow> {
        let closing = self.closing.as_ref()?;
        let end = closing.end_ms;
        let waiting = self.sources.values().any(|s| {
            now_ms.saturating_sub(s.last_seen_ms) <= SOURCE_LIVE_MS && s.last_end_ms < end
        });
        if waiting && now_ms < end.saturating_add(MAX_WAIT_MS) {
            return None;
        }
        let mut closing = self.closing.take()?;
        Some(ReadyWindow {
            window_ms: closing.end_ms.saturating_sub(closing.start_ms),
            counts: closing.counts.drain(),
        })
    }

    /// Everything not yet reported (when leadership ends).
    pub(crate) fn drain_all(&mut self) -> BucketCounters {
        let mut all = std::mem::replace(&mut self.current, BucketCounters::new(self.max_cells));
        if let Some(mut closing) = self.closing.take() {
            closing.counts.move_into(&mut all);
        }
        all
    }

    /// VMs (followers and the leader) with traffic within
    /// [`WORKER_LIVE_MS`]; at least 1. Forgets sources silent for longer.
    pub(crate) fn workers(&mut self, now_ms: u64) -> u32 {
        self.sources
            .retain(|_, s| now_ms.saturating_sub(s.last_seen_ms) <= WORKER_LIVE_MS);
        let recent = |t: Option<u64>| t.is_some_and(|t| now_ms.saturating_sub(t) <= WORKER_LIVE_MS);
        let followers = self
            .sources
            .values()
            .filter(|s| recent(s.last_traffic_ms))
            .count();
        let own = usize::from(recent(self.own_traffic_ms));
        u32::try_from(followers + own).unwrap_or(u32::MAX).max(1)
    }

    /// Requests not counted because a window was full.
    pub(crate) fn take_untracked(&mut self) -> u64 {
        let mut n = self.current.take_untracked();
        if let Some(closing) = &mut self.closing {
            n = n.saturating_add(closing.counts.take_untracked());
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::decision::Outcome;

    /// Counts one admitted request of the bucket-wide cell of `bucket`.
    fn count_own(own: &mut CellTable, bucket: &str) {
        let key = key_of(bucket, "", Priority::Unspecified);
        if let (Some(record), _) = own.record(&key, 0, || None) {
            record.count(Outcome::Admitted, 0);
        }
    }
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    pub(super) fn handoff(source: u64, start_ms: u64, end_ms: u64, offered: u64) -> Handoff {
        Handoff {
            source,
            start_ms,
            end_ms,
            counts: vec![BucketCount {
                bucket: "a".into(),
                offered,
                admitted: offered,
                ..Default::default()
            }],
            upstream: Vec::new(),
        }
    }

    pub(super) fn offered(window: &ReadyWindow) -> u64 {
        window.counts.iter().map(|c| c.offered).sum()
    }

    #[test]
    fn a_straddling_handoff_is_split_at_the_boundary() {
        let mut windows = ReportWindows::new(10, 0);
        windows.add_handoff(handoff(1, 0, 100, 60), 100, |_| false);
        windows.close(250);
        assert!(windows.take_ready(250).is_none(), "waits for source 1");
        windows.add_handoff(handoff(1, 100, 200, 60), 200, |_| false);
        assert!(windows.take_ready(260).is_none());
        windows.add_handoff(handoff(1, 200, 300, 60), 300, |_| false);
        let ready = windows.take_ready(300).unwrap();
        assert_eq!(ready.window_ms, 250);
        // 0..250 of 600 rps: 150 requests.
        assert_eq!(offered(&ready), 150);
        windows.close(500);
        windows.add_handoff(handoff(1, 300, 400, 60), 400, |_| false);
        windows.add_handoff(handoff(1, 400, 500, 60), 500, |_| false);
        let ready = windows.take_ready(500).unwrap();
        assert_eq!(offered(&ready), 150);
    }

    #[test]
    fn a_silent_source_is_waited_for_only_until_the_deadline() {
        let mut windows = ReportWindows::new(10, 0);
        windows.add_handoff(handoff(1, 0, 100, 10), 100, |_| false);
        windows.close(200);
        assert!(windows.take_ready(200 + MAX_WAIT_MS - 1).is_none());
        let ready = windows.take_ready(200 + MAX_WAIT_MS).unwrap();
        assert_eq!(offered(&ready), 10);
    }

    #[test]
    fn an_unsent_window_is_folded_into_the_next() {
        let mut windows = ReportWindows::new(10, 0);
        let mut own = CellTable::new(10);
        count_own(&mut own, "a");
        windows.add_own(&mut own, 10);
        windows.close(250);
        count_own(&mut own, "a");
        windows.add_own(&mut own, 300);
        windows.close(500);
        let ready = windows.take_ready(500).unwrap();
        assert_eq!(ready.window_ms, 500);
        assert_eq!(offered(&ready), 2);
    }

    #[test]
    fn workers_counts_sources_with_recent_traffic() {
        let mut windows = ReportWindows::new(10, 0);
        assert_eq!(windows.workers(0), 1);
        windows.add_handoff(handoff(1, 0, 100, 5), 100, |_| false);
        windows.add_handoff(handoff(2, 0, 100, 5), 100, |_| false);
        windows.add_handoff(
            Handoff {
                source: 3,
                start_ms: 0,
                end_ms: 100,
                counts: vec![],
                upstream: Vec::new(),
            },
            100,
            |_| false,
        );
        let mut own = CellTable::new(10);
        count_own(&mut own, "a");
        windows.add_own(&mut own, 100);
        assert_eq!(windows.workers(200), 3);
        assert_eq!(windows.workers(100 + WORKER_LIVE_MS + 1), 1);
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod proptests {
    use super::tests::{handoff, offered};
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever a follower's spans and the leader's windows, every
        /// request and every cost it handed off reaches a report: the part
        /// of a split hand-off that holds a cost but rounds its requests
        /// away is still counted.
        #[test]
        fn every_cost_handed_off_is_reported(
            handoffs in proptest::collection::vec(
                (1u64..200, 0u64..3, 0u64..20_000, prop_oneof![Just(0u64), 1u64..5_000]),
                1..60,
            ),
            window_ms in 100u64..400,
        ) {
            let mut windows = ReportWindows::new(100, 0);
            let mut handed = Counts::default();
            let mut reported = Counts::default();
            let mut report = |ready: ReadyWindow| {
                for count in &ready.counts {
                    reported.add(Counts::of(count));
                }
            };
            let (mut now, mut next_close) = (0, window_ms);
            for (span, requests, cost, charged) in handoffs {
                let start = now;
                now += span;
                while next_close <= now {
                    if !windows.is_closing() {
                        windows.close(next_close);
                    }
                    if let Some(ready) = windows.take_ready(next_close) {
                        report(ready);
                    }
                    next_close += window_ms;
                }
                let count = BucketCount {
                    bucket: "llm".into(),
                    offered: requests,
                    admitted: requests,
                    offered_cost: cost as f64,
                    admitted_cost: cost as f64,
                    charged_cost: charged as f64,
                    settled_cost: (charged / 2) as f64,
                    ..Default::default()
                };
                handed.add(Counts::of(&count));
                let handoff = Handoff {
                    source: 1,
                    start_ms: start,
                    end_ms: now,
                    counts: vec![count],
                    upstream: Vec::new(),
                };
                windows.add_handoff(handoff, now, |_| true);
                if let Some(ready) = windows.take_ready(now) {
                    report(ready);
                }
            }
            for count in windows.drain_all().drain() {
                reported.add(Counts::of(&count));
            }
            prop_assert_eq!(reported, handed);
        }

        /// Steady load from followers with arbitrary tick phases: every
        /// report's rate is within one hand-off's rounding of the truth,
        /// and no request is lost.
        #[test]
        fn steady_load_gives_steady_reports(phases in proptest::collection::vec(0u64..100, 1..5)) {
            // Each follower: 60 requests per 100 ms (600 rps).
            let mut windows = ReportWindows::new(100, 0);
            let mut sent = 0u64;
            let mut reported = 0u64;
            let mut reports = Vec::new();
            let mut last_end: Vec<u64> = phases.clone();
            for now in 0..5_000u64 {
                for (i, phase) in phases.iter().enumerate() {
                    if now > *phase && (now - phase) % 100 == 0 {
                        let start = last_end[i];
                        windows.add_handoff(handoff(i as u64, start, now, 60), now, |_| false);
                        last_end[i] = now;
                        sent += 60;
                    }
                }
                if now > 0 && now % 250 == 0 && !windows.is_closing() {
                    windows.close(now);
                }
                if let Some(ready) = windows.take_ready(now) {
                    reported += offered(&ready);
                    reports.push(ready);
                }
            }
            let rest = windows.drain_all().drain().iter().map(|c| c.offered).sum::<u64>();
            prop_assert_eq!(reported + rest, sent);
            let followers = phases.len() as f64;
            for ready in reports.iter().skip(1) {
                let rate = offered(ready) as f64 * 1000.0 / ready.window_ms as f64;
                let expected = 600.0 * followers;
                prop_assert!((rate - expected).abs() / expected < 0.03, "rate {} expected {}", rate, expected);
            }
        }
    }
}
