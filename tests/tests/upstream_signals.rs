//! The filters follow admitted requests to their responses and report
//! what the upstream answered; the control plane sums the fleet's signals
//! per limited bucket. Two Envoys in front of a real upstream
//! ([`CappedUpstream`]): first it answers every request after 60 ms, then
//! its capacity drops under the offered load and it rejects part of it
//! with 503. The control plane's metrics show the latency, then an error
//! ratio close to the one the upstream itself counted. Once with the wasm
//! filter, once with the native module.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use serde_json::json;
use sluice_core::histogram::{bucket_bound_us, bucket_of};
use sluice_integration_tests::capped_upstream::{Capacity, CappedUpstream};
use sluice_integration_tests::control_plane::sample;
use sluice_integration_tests::fleet::{DataPlane, Fleet, FleetOptions};
use sluice_integration_tests::load::{LoadPlan, LoadRun, Outcome, StreamSpec};

const LIMITS: &str = r#"
limits:
  - bucket: "acme"
    limit_rps: 100000
"#;
const RESPONSES: &str = r#"sluice_upstream_responses_total{bucket="acme"}"#;
const ERRORS: &str = r#"sluice_upstream_errors_total{bucket="acme"}"#;
const P99: &str = r#"sluice_upstream_latency_p99_seconds{bucket="acme"}"#;
/// The upstream answers every request of phase 1 after this long.
const BASE_LATENCY: Duration = Duration::from_millis(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_reports_the_upstreams_latency_and_errors() {
    reports_latency_and_errors(DataPlane::Wasm).await;
}

/// The same through the native module: it follows the same requests
/// (its own per-request state between the two header hooks) and reports
/// the same signals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_module_reports_the_upstreams_latency_and_errors() {
    reports_latency_and_errors(DataPlane::Native).await;
}

async fn reports_latency_and_errors(data_plane: DataPlane) {
    let slow = Capacity {
        rps: 10_000.0,
        queue: 1_000,
        base_latency: BASE_LATENCY,
    };
    let upstream = CappedUpstream::start(slow).await.unwrap();
    let mut options = FleetOptions::new(LIMITS, 2).with_data_plane(data_plane);
    options.upstream = Some(upstream.addr());
    options.filter = json!({"upstream_sample_every": 2});
    let fleet = Fleet::start(options).await.unwrap();
    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("A/acme", &fleet.url(0).unwrap(), "acme", 100.0),
            StreamSpec::new("B/acme", &fleet.url(1).unwrap(), "acme", 100.0),
        ],
        Duration::from_secs(9),
    ))
    .unwrap();
    let admin = fleet.control_plane.admin();

    // Phase 1, every request answered after about 60 ms: the p99 the
    // control plane shows is that (its histogram bucket's bound, 64 ms),
    // and nothing failed. A busy test machine delays some responses: the
    // filter times each one inside the client's own round trip, so the
    // p99 is never above the bound holding the slowest round trip the
    // client saw in phase 1.
    let mut p99 = 0.0;
    let mut responses = 0.0;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let metrics = admin.metrics().await.unwrap();
        (p99, responses) = (sample(&metrics, P99), sample(&metrics, RESPONSES));
        if responses >= 100.0 && p99 > 0.0 {
            break;
        }
    }
    let phase_1_end = load.elapsed();
    let errors_before = sample(&admin.metrics().await.unwrap(), ERRORS);

    // Phase 2: capacity 80 rps against 200 offered, almost no queue: the
    // upstream answers 503 to most of it. Then the load stops and the last
    // reports come in, so the fleet's sampled responses and the upstream's
    // own counts cover the same requests.
    upstream.set_capacity(Capacity {
        rps: 80.0,
        queue: 2,
        base_latency: Duration::from_millis(1),
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    load.stop();
    let result = load.finish().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let metrics = admin.metrics().await.unwrap();
    let served = upstream.served();
    let sampled_errors = sample(&metrics, ERRORS);
    let sampled = sample(&metrics, RESPONSES);
    let (ok, rejected) = (served.ok, served.rejected);
    let upstream_ratio = rejected as f64 / (ok + rejected).max(1) as f64;
    let reported_ratio = sampled_errors / sampled.max(1.0);
    let slowest = result
        .samples
        .iter()
        .filter(|s| s.outcome == Outcome::Ok && s.done_at <= phase_1_end)
        .map(|s| s.done_at.saturating_sub(s.sent_at))
        .max()
        .unwrap_or_default();
    let p99_range = BASE_LATENCY.as_secs_f64()..=histogram_bound_at_or_above(slowest);
    let summary = format!(
        "phase 1: {responses} sampled responses, p99 {p99} s (expected in {p99_range:?}, the \
         slowest round trip the client saw {slowest:?}); whole run: {sampled} sampled, \
         {sampled_errors} errors (ratio {reported_ratio:.3}); the upstream answered {ok} and \
         rejected {rejected} (ratio {upstream_ratio:.3})\n{}",
        result.timeline(Duration::from_millis(500))
    );
    println!("{summary}");
    if !p99_range.contains(&p99) {
        fleet.print_logs();
    }
    assert!(responses >= 100.0, "{summary}");
    assert!(
        p99_range.contains(&p99),
        "p99 {p99} s for a 60 ms upstream\n{summary}"
    );
    assert_eq!(errors_before, 0.0, "{summary}");
    assert!(
        upstream_ratio > 0.2,
        "the upstream was not overloaded\n{summary}"
    );
    assert!(sampled >= 100.0, "{summary}");
    assert!(
        (reported_ratio - upstream_ratio).abs() < 0.05,
        "the fleet saw an error ratio of {reported_ratio:.3}, the upstream {upstream_ratio:.3}\n{summary}"
    );
}

/// The bound of the latency histogram's bucket holding `latency`, in
/// seconds, with a little room for float rounding.
fn histogram_bound_at_or_above(latency: Duration) -> f64 {
    let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
    bucket_bound_us(bucket_of(micros)) * 1e-6 * 1.001
}

#[test]
fn the_bound_above_60_ms_is_64_ms() {
    let bound = histogram_bound_at_or_above(Duration::from_millis(60));
    assert!((bound - 0.064).abs() < 1e-3, "{bound}");
    let bound = histogram_bound_at_or_above(Duration::from_millis(70));
    assert!((bound - 0.0761).abs() < 1e-3, "{bound}");
}
