//! An RLQS usage report as a Sluice report: the same fleet aggregation,
//! caps and ceilings as the wasm filter's reports.
//!
//! Each bucket of a usage report has its own `time_elapsed`: a bucket's
//! first report comes alone when Envoy first sees it, with 0 s elapsed, and
//! Envoy 1.40 truncates every elapsed time to whole seconds, so a 5 s
//! report interval often reads as 4 s (a rate 25 % too high). The stream's
//! own clock is better: a bucket in a periodic report is taken to cover the
//! time since the previous periodic report as the control plane received
//! them, unless its own elapsed time says it is newer than that. A Sluice
//! report has one window, so counts are rescaled to the longest elapsed
//! time in the message, which keeps each bucket's rate.

use std::collections::HashMap;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use sluice_core::allowance::LocalRate;
use sluice_proto::v1::{BucketCount, Report};

use super::bucket_id::{CellOfBucket, cell_of};

/// One bucket id of a usage report, mapped.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SeenBucket {
    /// The cell it stands for.
    pub(crate) cell: CellOfBucket,
    /// The id as Envoy sent it; assignments must name it exactly.
    pub(crate) id: HashMap<String, String>,
    /// What this Envoy was offered of it over the report's window; `None`
    /// for a bucket's first report (no time elapsed yet).
    pub(crate) local: Option<LocalRate>,
}

/// Usages that could not be counted, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Refused {
    /// No bucket id, or one that names no bucket.
    pub(crate) no_bucket: u32,
    /// A negative `time_elapsed`.
    pub(crate) negative_elapsed: u32,
}

/// A usage report, converted.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Converted {
    /// The counts as a Sluice report; `None` when no usage had time elapsed.
    pub(crate) report: Option<Report>,
    /// Every bucket the message named.
    pub(crate) seen: Vec<SeenBucket>,
    /// What was refused.
    pub(crate) refused: Refused,
}

/// Whether a message is a periodic report (some bucket has time elapsed),
/// as opposed to the lone first report of a new bucket.
pub(crate) fn is_periodic(usages: &[BucketQuotaUsage]) -> bool {
    usages
        .iter()
        .any(|u| u.time_elapsed.is_some_and(|d| d.seconds > 0 || d.nanos > 0))
}

/// Converts one message's usages; `sequence` numbers the report.
/// `since_previous` is the time since the stream's previous periodic report
/// arrived (`None` for the first).
pub(crate) fn convert(
    usages: &[BucketQuotaUsage],
    sequence: u64,
    since_previous: Option<std::time::Duration>,
) -> Converted {
    let stream_ms = since_previous.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let mut converted = Converted::default();
    let mut counted: Vec<(CellOfBucket, u64, u64, u64)> = Vec::new();
    for usage in usages {
        let Some(cell) = usage.bucket_id.as_ref().and_then(|id| cell_of(&id.bucket)) else {
            converted.refused.no_bucket += 1;
            continue;
        };
        let elapsed_ms = match usage.time_elapsed {
            None => 0,
            Some(d) if d.seconds < 0 || d.nanos < 0 => {
                converted.refused.negative_elapsed += 1;
                continue;
            }
            Some(d) => u64::try_from(d.seconds)
                .unwrap_or(0)
                .saturating_mul(1000)
                .saturating_add(u64::try_from(d.nanos).unwrap_or(0) / 1_000_000),
        };
        let elapsed_ms = match stream_ms {
            // Truncated to whole seconds: the true time is up to 1 s more.
            Some(stream) if elapsed_ms > 0 && elapsed_ms.saturating_add(1_000) >= stream => stream,
            _ if elapsed_ms > 0 => elapsed_ms.saturating_add(500),
            _ => 0,
        };
        let offered = usage
            .num_requests_allowed
            .saturating_add(usage.num_requests_denied);
        let local = (elapsed_ms > 0).then_some(LocalRate {
            requests: offered,
            window_ms: elapsed_ms,
        });
        if elapsed_ms > 0 && offered > 0 {
            counted.push((
                cell.clone(),
                offered,
                usage.num_requests_allowed,
                elapsed_ms,
            ));
        }
        let id = usage
            .bucket_id
            .as_ref()
            .map(|id| id.bucket.clone())
            .unwrap_or_default();
        converted.seen.push(SeenBucket { cell, id, local });
    }
    let Some(window_ms) = counted.iter().map(|c| c.3).max() else {
        return converted;
    };
    let buckets = counted
        .into_iter()
        .map(|(cell, offered, admitted, elapsed_ms)| {
            let scale = |count: u64| {
                // Same rate over the common window.
                (count as f64 * window_ms as f64 / elapsed_ms as f64).round() as u64
            };
            BucketCount {
                bucket: cell.bucket,
                tenant: cell.tenant,
                priority: cell.priority.to_wire() as i32,
                offered: scale(offered),
                admitted: scale(admitted),
                shadow_dropped: 0,
                ..BucketCount::default()
            }
        })
        .collect();
    converted.report = Some(Report {
        sequence,
        window_ms,
        buckets,
        directive_age_ms: None,
        // Envoy's rate_limit_quota filter reports no response signals.
        upstream: Vec::new(),
    });
    converted
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
    use envoy_types::pb::google::protobuf::Duration;

    use super::*;

    fn usage(bucket: &str, seconds: i64, allowed: u64, denied: u64) -> BucketQuotaUsage {
        BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: HashMap::from([("bucket".to_owned(), bucket.to_owned())]),
            }),
            time_elapsed: Some(Duration { seconds, nanos: 0 }),
            num_requests_allowed: allowed,
            num_requests_denied: denied,
        }
    }

    #[test]
    fn usages_become_one_report_at_the_longest_window() {
        // Envoy says 4 s (truncated); the stream saw 5 s between reports.
        let converted = convert(
            &[
                usage("a", 4, 400, 600),
                usage("b", 2, 10, 0),
                usage("new", 0, 1, 0),
            ],
            7,
            Some(std::time::Duration::from_millis(5_000)),
        );
        let report = converted.report.unwrap();
        assert_eq!((report.sequence, report.window_ms), (7, 5_000));
        // a: 1000 offered in 5 s; b (new since the last report): 10 in
        // 2.5 s is 20 in 5 s.
        assert_eq!(
            report
                .buckets
                .iter()
                .map(|b| (b.bucket.as_str(), b.offered, b.admitted))
                .collect::<Vec<_>>(),
            [("a", 1_000, 400), ("b", 20, 20)]
        );
        assert_eq!(
            converted.seen.len(),
            3,
            "the new bucket gets an assignment too"
        );
        assert_eq!(converted.seen[2].local, None);
        assert_eq!(
            converted.seen[0].local,
            Some(LocalRate {
                requests: 1_000,
                window_ms: 5_000
            })
        );
        assert!(is_periodic(&[usage("a", 4, 1, 0)]));
        assert!(!is_periodic(&[usage("new", 0, 1, 0)]));
    }

    #[test]
    fn bad_usages_are_refused_and_the_rest_counts() {
        let mut no_id = usage("x", 5, 1, 1);
        no_id.bucket_id = None;
        let converted = convert(
            &[no_id, usage("neg", -1, 5, 5), usage("ok", 5, 5, 0)],
            1,
            None,
        );
        assert_eq!(
            converted.refused,
            Refused {
                no_bucket: 1,
                negative_elapsed: 1
            }
        );
        assert_eq!(converted.report.unwrap().buckets.len(), 1);
        assert!(convert(&[usage("zero", 0, 1, 0)], 1, None).report.is_none());
    }
}
