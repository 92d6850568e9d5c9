//! The fleet totals of the last minutes, one per control interval, kept so
//! an operator can replay them through a proposed configuration
//! ([`super::whatif`]).

use std::collections::VecDeque;
use std::time::Duration;

use crate::fleet::FleetLoad;

/// How far back the history reaches by default.
pub const DEFAULT_SPAN: Duration = Duration::from_secs(5 * 60);
/// Most cell-intervals held (cells summed over the recorded intervals):
/// about 100 bytes each, so the history stays under about 100 MB however
/// many cells the fleet has; a large fleet keeps a shorter span.
pub const MAX_CELL_INTERVALS: usize = 1_000_000;

/// Recorded fleet totals, oldest first.
#[derive(Debug)]
pub struct History {
    loads: VecDeque<FleetLoad>,
    cells: usize,
    max_intervals: usize,
    max_cells: usize,
}

impl History {
    /// A history of `span` at `interval`, bounded by
    /// [`MAX_CELL_INTERVALS`].
    pub fn new(span: Duration, interval: Duration) -> Self {
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

    /// Records one interval's fleet total, forgetting the oldest past the
    /// bounds.
    pub fn record(&mut self, load: &FleetLoad) {
        let cells = cell_count(load);
        self.loads.push_back(FleetLoad {
            buckets: load.buckets.clone(),
            stats: Default::default(),
        });
        self.cells += cells;
        while self.loads.len() > self.max_intervals
            || (self.cells > self.max_cells && self.loads.len() > 1)
        {
            if let Some(oldest) = self.loads.pop_front() {
                self.cells -= cell_count(&oldest);
            }
        }
    }

    /// The last `intervals` recorded totals (all of them if fewer), oldest
    /// first.
    pub fn last(&self, intervals: usize) -> Vec<FleetLoad> {
        let skip = self.loads.len().saturating_sub(intervals);
        self.loads.iter().skip(skip).cloned().collect()
    }

    /// Intervals recorded.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.loads.len()
    }
}

fn cell_count(load: &FleetLoad) -> usize {
    load.buckets
        .iter()
        .map(|bucket| bucket.cells.len().max(1))
        .sum()
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
            history.record(&load(1));
        }
        assert_eq!(history.len(), 4, "2 s of 500 ms intervals");
        assert_eq!(history.last(2).len(), 2);
        assert_eq!(history.last(100).len(), 4);

        let mut bounded = History::with_bounds(100, 10);
        for _ in 0..10 {
            bounded.record(&load(3));
        }
        assert_eq!(bounded.len(), 3, "3 intervals of 3 cells fit in 10");
        // One interval larger than the whole budget is still kept alone.
        bounded.record(&load(20));
        assert_eq!(bounded.len(), 1);
    }
}
