//! Standing block directives: a bucket whose limit is 0 keeps a
//! bucket-wide directive that drops everything in force, traffic or not.
//!
//! The filters look a request's directive up as its own cell's, else its
//! bucket's bucket-wide one; a cell they meet first (a tenant name or a
//! priority the control plane has not seen yet) has no directive of its
//! own and would get the `new_bucket` behaviour until one arrives. With
//! the standing block it falls back on the bucket's and is refused from
//! its first request, while the directives are fresh, under the stale
//! fallbacks and under the outage allowance alike (each reads the 0
//! limit as "nothing"). The bucket-wide cell itself takes the standing
//! directive as its own: the controller pushes nothing else for it.
//!
//! Which buckets: every exact key and aggregate pattern whose limit is 0
//! (known before any traffic), and any bucket with traffic whose limit is
//! 0 (a plain pattern's members and a blocked default, known once the
//! filters report them).

use std::collections::HashSet;
use std::sync::Arc;

use sluice_core::{Priority, Reason};
use sluice_proto::v1::Directive;

use super::decision::{IntervalOutcome, lift};
use crate::config::limits::LimitTable;
use crate::config::policy::{Mode, Modes};
use sluice_core::directive::is_lift;

/// A standing block in force.
#[derive(Debug, Clone, PartialEq)]
struct Standing {
    bucket: Arc<str>,
    /// The bucket's mode as last pushed (`modes.buckets`).
    mode: Option<Mode>,
}

/// The standing blocks the proxies hold, kept sorted by bucket.
#[derive(Debug, Default)]
pub(super) struct Blocks {
    standing: Vec<Standing>,
    /// Blocked buckets with traffic this interval.
    with_traffic: Vec<Arc<str>>,
    /// Scratch: the blocked buckets of this interval, sorted.
    wanted: Vec<Arc<str>>,
}

impl Blocks {
    /// Starts an interval: no bucket with traffic seen yet.
    pub(super) fn begin(&mut self) {
        self.with_traffic.clear();
    }

    /// Notes a blocked bucket with traffic.
    pub(super) fn saw(&mut self, bucket: &Arc<str>) {
        self.with_traffic.push(Arc::clone(bucket));
    }

    /// Pushes the blocks that are new or whose mode changed, lifts those
    /// no longer blocked (unless the bucket-wide cell got a directive of
    /// its own this interval), and keeps `decision.retired` from taking a
    /// standing block out of the snapshot when the bucket's traffic stops.
    pub(super) fn finish(
        &mut self,
        limits: &LimitTable,
        modes: &Modes,
        retry_after_ms: u64,
        decision: &mut IntervalOutcome,
    ) {
        self.collect_wanted(limits);
        let previous = std::mem::take(&mut self.standing);
        let mut previous = previous.into_iter().peekable();
        let mut lifted: Vec<Arc<str>> = Vec::new();
        for bucket in &self.wanted {
            while let Some(gone) = previous.next_if(|s| s.bucket.as_ref() < bucket.as_ref()) {
                lifted.push(gone.bucket);
            }
            let mode = modes.buckets.get(bucket.as_ref()).copied();
            let kept = previous.next_if(|s| s.bucket.as_ref() == bucket.as_ref());
            if kept.is_none_or(|kept| kept.mode != mode) {
                decision.changed.push(block(bucket, mode, retry_after_ms));
            }
            self.standing.push(Standing {
                bucket: Arc::clone(bucket),
                mode,
            });
        }
        lifted.extend(previous.map(|gone| gone.bucket));
        if !lifted.is_empty() {
            // A bucket-wide cell with traffic and a limit (or a mode) got a
            // directive of its own this interval: lifting after it would
            // remove it.
            let own: HashSet<&str> = decision
                .changed
                .iter()
                .filter(|d| is_bucket_wide(d) && !is_lift(d))
                .map(|d| d.bucket.as_str())
                .collect();
            let lifts: Vec<Directive> = lifted
                .iter()
                .filter(|bucket| !own.contains(bucket.as_ref()))
                .map(|bucket| lift(bucket, "", Priority::Unspecified))
                .collect();
            decision.changed.extend(lifts);
        }
        if !self.standing.is_empty() {
            let standing = &self.standing;
            decision.retired.retain(|cell| {
                !(cell.tenant.is_empty()
                    && cell.priority == Priority::Unspecified
                    && standing
                        .binary_search_by(|s| s.bucket.as_ref().cmp(cell.bucket.as_ref()))
                        .is_ok())
            });
        }
    }

    /// The standing blocks as directives: part of what a proxy connecting
    /// now receives.
    pub(super) fn directives(&self, retry_after_ms: u64) -> impl Iterator<Item = Directive> + '_ {
        self.standing
            .iter()
            .map(move |s| block(&s.bucket, s.mode, retry_after_ms))
    }

    /// The blocked buckets of this interval: the limit table's blocked keys
    /// and the blocked buckets with traffic, sorted, without repeats.
    fn collect_wanted(&mut self, limits: &LimitTable) {
        self.wanted.clear();
        for key in limits.blocked_keys() {
            // Reuse the text a standing block already holds.
            let bucket = self
                .standing
                .binary_search_by(|s| s.bucket.as_ref().cmp(key))
                .ok()
                .and_then(|at| self.standing.get(at))
                .map_or_else(|| Arc::from(key), |s| Arc::clone(&s.bucket));
            self.wanted.push(bucket);
        }
        self.wanted.append(&mut self.with_traffic);
        self.wanted.sort_unstable();
        self.wanted.dedup();
    }
}

fn is_bucket_wide(directive: &Directive) -> bool {
    directive.tenant.is_empty() && Priority::from_wire(directive.priority) == Priority::Unspecified
}

/// The standing block of `bucket`: drop everything, limit 0.
fn block(bucket: &str, mode: Option<Mode>, retry_after_ms: u64) -> Directive {
    Directive {
        bucket: bucket.to_owned(),
        drop_ratio: 1.0,
        limit_rps: Some(0.0),
        mode: mode.map_or(0, |mode| mode.to_wire() as i32),
        reason: Reason::ClusterOverload.to_wire() as i32,
        retry_after_ms,
        burst: 1.0,
        ..Directive::default()
    }
}
