//! The fleet totals and upstream signals of the last minutes, one per
//! control interval, kept so an operator can replay them through a
//! proposed configuration ([`super::whatif`]).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::fleet::FleetLoad;
use crate::fleet::health::UpstreamHealth;

/// How far back the history reaches by default.
pub(crate) const DEFAULT_SPAN: Duration = Duration::from_secs(5 * 60);
/// Most cell-intervals held (cells summed over the recorded intervals):
/// about 100 bytes each, so the history stays under about 100 MB however
/// many cells the fleet has; a large fleet keeps a shorter span. A
/// bucket's upstream signals (a latency histogram) count as
/// [`SIGNAL_CELLS`] cells.
pub(crate) const MAX_CELL_INTERVALS: usize = 1_000_000;
/// Cells a bucket's recorded upstream signals count as.
const SIGNAL_CELLS: usize = 2;

/// One control interval as recorded.
#[derive(Debug, Clone, Default)]
pub(crate) struct Recorded {
    /// The fleet's totals.
    pub(crate) load: FleetLoad,
    /// The fleet's sampled upstream signals per bucket (what the adaptive
    /// limits moved on).
    pub(crate) health: HashMap<String, UpstreamHealth>,
}

/// Recorded intervals, oldest first.
#[derive(Debug)]
pub(crate) struct History {
    loads: VecDeque<Recorded>,
    cells: usize,
    max_intervals: usize,
    max_cells: usize,
}

impl History {
    /// A history of `span` at `interval`, bounded by
    /// [`MAX_CELL_INTERVALS`].
    pub(crate) fn new(span: Duration, interval: Duration) -> Self {
        let per = interval.as_millis().max(1);
        let max_intervals = usize::try_from(span.as_millis() / per).unwrap_or(usize::MAX);
        Self::with_bounds(max_intervals.max(1), MAX_CELL_INTERVALS)
    }

    fn with_bounds(max_intervals: usize, max_cells: usize) -> Self {
        Self {
            loads: VecDeque::new(),
            cells: 0,
            max_intervals,
            max_cells,
        }
    }

    /// Records one interval's fleet total and upstream signals, forgetting
    /// the oldest past the bounds.
    pub(crate) fn record(&mut self, load: &FleetLoad, health: &HashMap<String, UpstreamHealth>) {
        let recorded = Recorded {
            load: FleetLoad {
                buckets: load.buckets.clone(),
                stats: Default::default(),
            },
            health: health.clone(),
        };
        let cells = cell_count(&recorded);
        self.loads.push_back(recorded);
        self.cells += cells;
        while self.loads.len() > self.max_intervals
            || (self.cells > self.max_cells && self.loads.len() > 1)
        {
            if let Some(oldest) = self.loads.pop_front() {
                self.cells -= cell_count(&oldest);
            }
        }
    }

    /// The last `intervals` recorded intervals (all of them if fewer),
    /// oldest first.
    pub(crate) fn last(&self, intervals: usize) -> Vec<Recorded> {
        let skip = self.loads.len().saturating_sub(intervals);
        self.loads.iter().skip(skip).cloned().collect()
    }

    /// Intervals recorded.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.loads.len()
    }
}

fn cell_count(recorded: &Recorded) -> usize {
    let cells: usize = recorded
        .load
        .buckets
        .iter()
        .map(|bucket| bucket.cells.len().max(1))
        .sum();
    cells + SIGNAL_CELLS * recorded.health.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{BucketLoad, BucketTraffic};

    fn load(buckets: usize) -> FleetLoad {
        FleetLoad::new(
            (0..buckets)
                .map(|b| {
                    BucketTraffic::single(
                        &format!("b{b}"),
                        BucketLoad {
                            offered_rps: 1.0,
                            admitted_rps: 1.0,
                            proxies_reporting: 1,
                            stale_share: 0.0,
                            requests_rps: 0.0,
                        },
                    )
                })
                .collect(),
        )
    }

    #[test]
    fn keeps_the_span_and_the_cell_budget() {
        let mut history = History::new(Duration::from_secs(2), Duration::from_millis(500));
        for _ in 0..10 {
            history.record(&load(1), &HashMap::new());
        }
        assert_eq!(history.len(), 4, "2 s of 500 ms intervals");
        assert_eq!(history.last(2).len(), 2);
        assert_eq!(history.last(100).len(), 4);

        let mut bounded = History::with_bounds(100, 10);
        for _ in 0..10 {
            bounded.record(&load(3), &HashMap::new());
        }
        assert_eq!(bounded.len(), 3, "3 intervals of 3 cells fit in 10");
        // One interval larger than the whole budget is still kept alone.
        bounded.record(&load(20), &HashMap::new());
        assert_eq!(bounded.len(), 1);
        // A bucket's signals count as two cells.
        let mut with_signals = History::with_bounds(100, 10);
        let signals = HashMap::from([("b0".to_owned(), UpstreamHealth::default())]);
        for _ in 0..10 {
            with_signals.record(&load(1), &signals);
        }
        assert_eq!(
            with_signals.len(),
            3,
            "3 intervals of 1 + 2 cells fit in 10"
        );
    }
}
