//! Two Envoys share one limit: 200 rps on a bucket offered ~600 rps split
//! 450 / 150. After convergence the fleet admits 200 rps ± 10%, counted from
//! the responses, and each Envoy admits in proportion to its offered load.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use sluice_integration_tests::fleet::{DataPlane, Fleet, FleetOptions};
use sluice_integration_tests::load::{LoadPlan, LoadRun, StreamSpec, Window, rate, within};

const LIMITS: &str = r#"
limits:
  - bucket: "acme"
    limit_rps: 200
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_converge_to_the_fleet_limit() {
    two_envoys_converge_to_the_fleet_limit_on(DataPlane::Wasm).await;
}

/// The same with the native dynamic module in every Envoy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_envoys_converge_to_the_fleet_limit() {
    two_envoys_converge_to_the_fleet_limit_on(DataPlane::Native).await;
}

async fn two_envoys_converge_to_the_fleet_limit_on(data_plane: DataPlane) {
    let fleet = Fleet::start(FleetOptions::new(LIMITS, 2).with_data_plane(data_plane))
        .await
        .unwrap();
    // An upper bound: the load stops after the window below.
    let duration = Duration::from_secs(10);
    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("A/acme", &fleet.url(0).unwrap(), "acme", 450.0),
            StreamSpec::new("B/acme", &fleet.url(1).unwrap(), "acme", 150.0),
        ],
        duration,
    ))
    .unwrap();
    // Measured for 5 s from a second after the control plane sees the fleet
    // admit the limit, which it must within the 4 s the window used to
    // start at.
    let admin = fleet.control_plane.admin();
    let converged = admin
        .wait_for_convergence("acme", 200.0, 0.10, 2, Duration::from_secs(4))
        .await;
    let converged_at = load.elapsed();
    let window = Window {
        from: converged_at + Duration::from_secs(1),
        to: converged_at + Duration::from_secs(6),
    };
    tokio::time::sleep((window.from + Duration::from_secs(1)).saturating_sub(load.elapsed())).await;
    let buckets = admin.buckets().await.unwrap();
    tokio::time::sleep(window.to.saturating_sub(load.elapsed())).await;
    load.stop();
    let result = load.finish().await.unwrap();

    let summary = format!(
        "converged at {converged_at:?}: {converged:?}\n{}control plane 1 s into the window: {buckets:?}\n{}",
        result.summary(window),
        result.timeline(Duration::from_millis(500))
    );
    println!("{summary}");
    converged.unwrap();

    let fleet_counts = result.tenant_counts(window, "acme");
    assert_eq!(
        fleet_counts.server_errors + fleet_counts.errors,
        0,
        "{summary}"
    );
    assert_eq!(
        fleet_counts.skipped, 0,
        "the load generator fell behind\n{summary}"
    );
    let admitted = rate(fleet_counts.ok, window);
    assert!(
        within(admitted, 200.0, 0.10),
        "fleet admitted {admitted:.1} rps, limit 200\n{summary}"
    );

    // A uniform drop ratio admits each Envoy in proportion to its offered load.
    let per_envoy = |prefix: &str| {
        rate(
            result.counts(window, |s| s.label.starts_with(prefix)).ok,
            window,
        )
    };
    let (a, b) = (per_envoy("A/"), per_envoy("B/"));
    assert!(
        within(a, 150.0, 0.2),
        "Envoy A admitted {a:.1} rps, expected ~150\n{summary}"
    );
    assert!(
        within(b, 50.0, 0.3),
        "Envoy B admitted {b:.1} rps, expected ~50\n{summary}"
    );

    let bucket = buckets
        .bucket("acme")
        .expect("the control plane must know acme");
    assert_eq!(bucket.proxies_reporting, 2, "{summary}");
    assert!(within(bucket.offered_rps, 600.0, 0.15), "{summary}");
    assert!(within(bucket.drop_ratio, 2.0 / 3.0, 0.1), "{summary}");
}
