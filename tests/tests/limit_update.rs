//! `PUT /v1/limits/{bucket}` on the admin API changes what the fleet admits
//! within a few control intervals (200 → 100 rps).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use sluice_integration_tests::fleet::{Fleet, FleetOptions};
use sluice_integration_tests::load::{LoadPlan, LoadRun, StreamSpec, Window, rate, within};

const LIMITS: &str = r#"
limits:
  - bucket: "acme"
    limit_rps: 200
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_limit_changes_the_admitted_rate() {
    let options = FleetOptions::new(LIMITS, 2);
    let interval = options.control_interval();
    let fleet = Fleet::start(options).await.unwrap();
    let duration = Duration::from_secs(10);
    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("A/acme", &fleet.url(0).unwrap(), "acme", 300.0),
            StreamSpec::new("B/acme", &fleet.url(1).unwrap(), "acme", 100.0),
        ],
        duration,
    ))
    .unwrap();

    let change_at = Duration::from_secs(4);
    tokio::time::sleep(change_at.saturating_sub(load.elapsed())).await;
    let put_at = load.elapsed();
    fleet
        .control_plane
        .admin()
        .put_limit("acme", 100.0)
        .await
        .unwrap();
    // "A few control intervals": the next tick computes the new ratio and pushes it.
    let settled = put_at + interval * 5;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let buckets = fleet.control_plane.admin().buckets().await.unwrap();
    let result = load.finish().await.unwrap();

    let before = Window::secs(2.0, put_at.as_secs_f64());
    let after = Window {
        from: settled,
        to: duration,
    };
    let summary = format!(
        "PUT at {put_at:?}\nbefore: {}after: {}control plane: {buckets:?}\n{}",
        result.summary(before),
        result.summary(after),
        result.timeline(Duration::from_millis(250))
    );
    println!("{summary}");

    let admitted_before = rate(result.tenant_counts(before, "acme").ok, before);
    let admitted_after = rate(result.tenant_counts(after, "acme").ok, after);
    assert!(
        within(admitted_before, 200.0, 0.15),
        "before the PUT: admitted {admitted_before:.1} rps, limit 200\n{summary}"
    );
    assert!(
        within(admitted_after, 100.0, 0.15),
        "from {settled:?}: admitted {admitted_after:.1} rps, limit 100\n{summary}"
    );
    let all = result.tenant_counts(
        Window {
            from: Duration::ZERO,
            to: duration,
        },
        "acme",
    );
    assert_eq!(all.server_errors + all.errors, 0, "{summary}");
    assert_eq!(
        buckets.bucket("acme").and_then(|b| b.limit_rps),
        Some(100.0),
        "{summary}"
    );
}
