//! What `/metrics` shows for the metrics the other modules record.

use super::*;
use crate::metrics::proxies::MAX_PROXY_SERIES;
use crate::types::LimitRps;
use sluice_core::DropRatio;

fn status(bucket: &str, limit: Option<f64>) -> BucketStatus {
    BucketStatus {
        bucket: Arc::from(bucket),
        floors_exceed_limit: false,
        limit_rps: limit.map(|l| LimitRps::new(l).unwrap()),
        offered_rps: 600.0,
        admitted_rps: 200.0,
        drop_ratio: DropRatio::saturating(2.0 / 3.0),
        proxies_reporting: 1,
        shadow_dropped_rps: 0.0,
        cells: Vec::new(),
        proxy_cap: None,
        cost: None,
    }
}

fn samples(metrics: &ControlPlaneMetrics, prefix: &str) -> Vec<String> {
    metrics
        .encode()
        .unwrap()
        .lines()
        .filter(|line| line.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

#[test]
fn bucket_series_follow_the_tracked_buckets() {
    let metrics = ControlPlaneMetrics::new(1);
    metrics.observe_buckets(&[status("a", Some(200.0)), status("b", None)]);
    assert_eq!(
        samples(&metrics, "sluice_bucket_limit_rps{"),
        [r#"sluice_bucket_limit_rps{bucket="a"} 200.0"#]
    );
    assert_eq!(samples(&metrics, "sluice_bucket_offered_rps{").len(), 2);

    // `a` loses its limit, `b` stops: only `a` is left, without a limit.
    metrics.observe_buckets(&[status("a", None)]);
    assert!(samples(&metrics, "sluice_bucket_limit_rps{").is_empty());
    assert_eq!(
        samples(&metrics, "sluice_bucket_offered_rps{"),
        [r#"sluice_bucket_offered_rps{bucket="a"} 600.0"#]
    );
    assert_eq!(
        samples(&metrics, "sluice_buckets_tracked "),
        ["sluice_buckets_tracked 1"]
    );

    metrics.observe_buckets(&[]);
    assert_eq!(
        samples(&metrics, "sluice_bucket_"),
        ["sluice_bucket_series_omitted 0"]
    );
}

#[test]
fn a_replaced_stream_does_not_remove_its_successor() {
    let metrics = ControlPlaneMetrics::new(1);
    let old = metrics.proxy_connected("envoy-a", StreamId(1), true);
    let new = metrics.proxy_connected("envoy-a", StreamId(2), true);
    // Both streams are open until the superseded one is closed.
    assert_eq!(
        samples(&metrics, "sluice_connected_proxies "),
        ["sluice_connected_proxies 2"]
    );
    drop(old);
    assert_eq!(
        samples(&metrics, "sluice_connected_proxies "),
        ["sluice_connected_proxies 1"]
    );
    assert_eq!(
        samples(&metrics, "sluice_proxy_report_age_seconds{").len(),
        1
    );
    new.report_received(None);
    drop(new);
    assert!(samples(&metrics, "sluice_proxy_report_age_seconds{").is_empty());
    assert_eq!(
        samples(&metrics, "sluice_connected_proxies "),
        ["sluice_connected_proxies 0"]
    );
}

#[test]
fn a_second_live_instance_has_no_series_of_its_own() {
    let metrics = ControlPlaneMetrics::new(1);
    let first = metrics.proxy_connected("twin", StreamId(1), true);
    let second = metrics.proxy_connected("twin", StreamId(2), false);
    first.report_received(Some(1_000));
    second.report_received(Some(9_000));
    assert_eq!(
        samples(&metrics, "sluice_proxy_directive_age_seconds{"),
        [r#"sluice_proxy_directive_age_seconds{proxy="twin"} 1.0"#]
    );
    assert_eq!(
        samples(&metrics, "sluice_connected_proxies "),
        ["sluice_connected_proxies 2"]
    );
    drop(second);
    assert_eq!(
        samples(&metrics, "sluice_proxy_report_age_seconds{").len(),
        1
    );
    drop(first);
    // Alone, a stream that does not own the series takes them.
    let alone = metrics.proxy_connected("twin", StreamId(3), false);
    assert_eq!(
        samples(&metrics, "sluice_proxy_report_age_seconds{").len(),
        1
    );
    drop(alone);
}

#[test]
fn per_proxy_series_are_capped() {
    let metrics = ControlPlaneMetrics::new(1);
    let guards: Vec<_> = (0..MAX_PROXY_SERIES + 25)
        .map(|i| metrics.proxy_connected(&format!("p{i:05}"), StreamId(i as u64), true))
        .collect();
    assert_eq!(
        samples(&metrics, "sluice_proxy_report_age_seconds{").len(),
        MAX_PROXY_SERIES
    );
    assert_eq!(
        samples(&metrics, "sluice_proxy_series_omitted"),
        ["sluice_proxy_series_omitted 25"]
    );
    // The first in proxy id order have them.
    assert!(
        samples(&metrics, "sluice_proxy_report_age_seconds{")
            .iter()
            .any(|line| line.contains("p00000"))
    );
    assert_eq!(
        samples(&metrics, "sluice_connected_proxies "),
        [format!(
            "sluice_connected_proxies {}",
            MAX_PROXY_SERIES + 25
        )]
    );
    drop(guards);
    assert_eq!(
        samples(&metrics, "sluice_proxy_series_omitted"),
        ["sluice_proxy_series_omitted 0"]
    );
}

#[test]
fn a_proxy_directive_age_follows_its_reports() {
    let metrics = ControlPlaneMetrics::new(1);
    let guard = metrics.proxy_connected("envoy-a", StreamId(1), true);
    let series = "sluice_proxy_directive_age_seconds{";
    assert!(
        samples(&metrics, series).is_empty(),
        "unknown before a report"
    );
    guard.report_received(Some(1_250));
    assert_eq!(
        samples(&metrics, series),
        [r#"sluice_proxy_directive_age_seconds{proxy="envoy-a"} 1.25"#]
    );
    // A proxy that lost its table (a restart) has no age to show.
    guard.report_received(None);
    assert!(samples(&metrics, series).is_empty());
    guard.report_received(Some(0));
    assert_eq!(samples(&metrics, series).len(), 1);
    drop(guard);
    assert!(samples(&metrics, series).is_empty(), "gone with the stream");
}

#[test]
fn histogram_buckets_are_cumulative_in_the_exposition() {
    let metrics = ControlPlaneMetrics::new(1);
    metrics.batch_pushed(Sent::Snapshot);
    metrics.control_tick(Duration::from_micros(30));
    metrics.control_tick(Duration::from_secs(5));
    let text = metrics.encode().unwrap();
    for line in [
        "# TYPE sluice_control_loop_tick_duration_seconds histogram",
        r#"sluice_control_loop_tick_duration_seconds_bucket{le="0.000025"} 0"#,
        r#"sluice_control_loop_tick_duration_seconds_bucket{le="0.00005"} 1"#,
        r#"sluice_control_loop_tick_duration_seconds_bucket{le="0.1"} 1"#,
        r#"sluice_control_loop_tick_duration_seconds_bucket{le="+Inf"} 2"#,
        "sluice_control_loop_tick_duration_seconds_count 2",
        r#"sluice_directive_batches_pushed_total{kind="snapshot"} 1"#,
        r#"sluice_directive_batches_pushed_total{kind="delta"} 0"#,
        "sluice_push_latency_seconds_count 0",
        r#"sluice_build_info{version=""#,
        r#"sluice_epoch_info{epoch="1"} 1"#,
    ] {
        assert!(text.contains(line), "{line:?} missing from\n{text}");
    }
    assert!(text.ends_with("# EOF\n"));
}

#[test]
fn a_flood_of_buckets_keeps_the_series_bounded_and_limited_buckets_first() {
    let metrics = ControlPlaneMetrics::new(1);
    let mut buckets: Vec<BucketStatus> = (0..MAX_BUCKET_SERIES + 500)
        .map(|i| status(&format!("flood-{i}"), None))
        .collect();
    buckets.push(status("paid", Some(100.0)));
    metrics.observe_buckets(&buckets);
    let offered = samples(&metrics, "sluice_bucket_offered_rps{");
    assert_eq!(offered.len(), MAX_BUCKET_SERIES);
    assert!(
        offered.iter().any(|line| line.contains(r#"bucket="paid""#)),
        "the limited bucket lost its series"
    );
    assert_eq!(
        samples(&metrics, "sluice_bucket_series_omitted "),
        ["sluice_bucket_series_omitted 501"]
    );
}
