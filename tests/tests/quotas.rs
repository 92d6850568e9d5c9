//! Exact quotas through Envoy's own `ratelimit` filter and the control
//! plane's rate limit service (`sluice serve --quotas`), behind the Sluice
//! filter (`envoy/quotas.yaml`): three Envoys, 16 requests in flight at
//! most, a quota of 100 per second and one of 1,000 per minute, fixed
//! windows (envoyproxy/ratelimit's algorithm): every window admits the
//! quota exactly when offered more, counted from the clients' answers.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_integration_tests::control_plane::{ControlPlane, ControlPlaneOptions};
use sluice_integration_tests::load::{LoadPlan, LoadRun, StreamSpec, Window};
use sluice_integration_tests::quotas;

const QUOTAS: &str = r#"
domain: api
descriptors:
  - key: tenant
    value: per-second
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: tenant
    value: per-minute
    rate_limit: {unit: minute, requests_per_unit: 1000}
"#;

fn unix_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_envoys_admit_each_fixed_window_exactly_its_quota() {
    let dir = tempfile::tempdir().unwrap();
    let quota_dir = dir.path().join("quotas");
    std::fs::create_dir_all(&quota_dir).unwrap();
    std::fs::write(quota_dir.join("api.yaml"), QUOTAS).unwrap();
    let control_plane =
        ControlPlane::start(ControlPlaneOptions::new("limits: []\n", dir.path()).args([
            "--quotas".to_owned(),
            quota_dir.display().to_string(),
            "--quota-algorithm".to_owned(),
            "fixed_window".to_owned(),
        ]))
        .await
        .unwrap();
    let grpc = control_plane.grpc_addr();
    let mut envoys = Vec::new();
    for id in ["quota-a", "quota-b", "quota-c"] {
        envoys.push(quotas::start(grpc, id, dir.path()).await.unwrap());
    }
    // The per-minute quota is checked over one whole minute window: start
    // with at least 8 s left in the current minute.
    let into_minute = unix_ms() % 60_000;
    if into_minute > 51_000 {
        tokio::time::sleep(Duration::from_millis(60_000 - into_minute + 100)).await;
    }
    let duration = Duration::from_secs(5);
    let mut streams = Vec::new();
    for (i, envoy) in envoys.iter().enumerate() {
        // 180 rps per second-quota (100), 450 rps per minute-quota (1,000
        // in 5 s: offered 2,250).
        streams.push(StreamSpec::new(
            &format!("{i}/s"),
            &envoy.base_url(),
            "per-second",
            60.0,
        ));
        streams.push(StreamSpec::new(
            &format!("{i}/m"),
            &envoy.base_url(),
            "per-minute",
            150.0,
        ));
    }
    let mut plan = LoadPlan::new(streams, duration);
    plan.max_in_flight = 16;
    let load = LoadRun::start(plan).unwrap();
    let start_ms = unix_ms() - u64::try_from(load.elapsed().as_millis()).unwrap();
    let result = load.finish().await.unwrap();
    let stats = envoys[0].stats("ratelimit").await.unwrap_or_default();

    let all = Window::secs(0.0, 3600.0);
    let minute = result.tenant_counts(all, "per-minute");
    let second = result.tenant_counts(all, "per-second");
    // Whole seconds of the run, as the service's windows cut them.
    let first_boundary = (1_000 - start_ms % 1_000) % 1_000;
    let mut per_window = Vec::new();
    let mut from = first_boundary;
    while from + 1_000 <= duration.as_millis() as u64 {
        let window = Window::secs(from as f64 / 1000.0, (from + 1_000) as f64 / 1000.0);
        per_window.push(result.tenant_counts(window, "per-second").ok);
        from += 1_000;
    }
    let summary = format!(
        "envoy stats: {stats}\nper-minute: {minute}\nper-second: {second}\nper whole second: {per_window:?}\n{}",
        result.timeline(Duration::from_secs(1))
    );
    println!("{summary}");
    assert_eq!(
        minute.server_errors + minute.errors + second.server_errors + second.errors,
        0,
        "{summary}"
    );
    // 16 requests in flight may fall a few behind the schedule; the
    // offered load stays far above both quotas.
    let sent = minute.sent + second.sent;
    assert!(
        (minute.skipped + second.skipped) * 100 <= sent,
        "the load generator fell behind\n{summary}"
    );
    // One minute window, offered 2,250: exactly 1,000.
    assert_eq!(minute.ok, 1_000, "{summary}");
    // Each whole second: 100, give or take the requests in flight at a
    // boundary (the client's clock cuts windows a few ms from the
    // service's).
    assert!(per_window.len() >= 3, "{summary}");
    for ok in &per_window {
        assert!((97..=103).contains(ok), "{summary}");
    }
    // Over the whole run, never more than 100 per window touched.
    let touched = (start_ms + duration.as_millis() as u64 + 100) / 1_000 - start_ms / 1_000 + 1;
    assert!(second.ok <= 100 * touched, "{summary}");
}
