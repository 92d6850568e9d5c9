//! An unlimited bucket passes everything; a bucket offered more than its limit
//! gets 429s that carry `Retry-After`, while the unlimited one stays untouched.
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
  - bucket: "limited"
    limit_rps: 50
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlimited_passes_and_over_limit_gets_429_with_retry_after() {
    unlimited_passes_and_over_limit_gets_429_with_retry_after_on(DataPlane::Wasm).await;
}

/// The same with the native dynamic module in every Envoy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_unlimited_passes_and_over_limit_gets_429_with_retry_after() {
    unlimited_passes_and_over_limit_gets_429_with_retry_after_on(DataPlane::Native).await;
}

async fn unlimited_passes_and_over_limit_gets_429_with_retry_after_on(data_plane: DataPlane) {
    let fleet = Fleet::start(FleetOptions::new(LIMITS, 1).with_data_plane(data_plane))
        .await
        .unwrap();
    let url = fleet.url(0).unwrap();
    let duration = Duration::from_secs(6);
    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("free", &url, "free", 100.0),
            StreamSpec::new("limited", &url, "limited", 200.0),
        ],
        duration,
    ))
    .unwrap();

    // While the limit is enforced, look at one 429 in full.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let client = reqwest::Client::new();
    let mut dropped = None;
    for _ in 0..100 {
        let response = client
            .get(format!("{url}/"))
            .header("x-tenant", "limited")
            .send()
            .await
            .unwrap();
        if response.status() == 429 {
            dropped = Some(response);
            break;
        }
    }
    let buckets = fleet.control_plane.admin().buckets().await.unwrap();
    let result = load.finish().await.unwrap();

    let whole = Window::secs(0.0, duration.as_secs_f64());
    let steady = Window::secs(2.0, duration.as_secs_f64());
    let summary = format!(
        "{}{}\ncontrol plane: {buckets:?}\n{}",
        result.summary(whole),
        result.summary(steady),
        result.timeline(Duration::from_millis(500))
    );
    println!("{summary}");

    let free = result.tenant_counts(whole, "free");
    assert!(
        free.sent >= 500,
        "the unlimited stream barely ran\n{summary}"
    );
    assert_eq!(
        free.ok, free.sent,
        "the unlimited bucket must pass everything\n{summary}"
    );

    let limited = result.tenant_counts(steady, "limited");
    assert!(
        limited.limited > 0,
        "no 429 for a bucket at 4x its limit\n{summary}"
    );
    assert_eq!(
        limited.limited_with_retry_after, limited.limited,
        "every 429 must carry Retry-After\n{summary}"
    );
    assert_eq!(
        limited.server_errors + limited.errors + limited.other_status,
        0,
        "{summary}"
    );
    let admitted = rate(limited.ok, steady);
    assert!(
        within(admitted, 50.0, 0.3),
        "admitted {admitted:.1} rps, limit 50\n{summary}"
    );

    let bucket = buckets
        .bucket("limited")
        .expect("the control plane must know the limited bucket");
    assert_eq!(bucket.limit_rps, Some(50.0), "{summary}");
    assert!(bucket.drop_ratio > 0.5, "{summary}");

    let dropped = dropped.expect("no 429 among 100 requests at 4x the limit");
    let header = |name: &str| {
        dropped
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(header("retry-after").as_deref(), Some("1"));
    assert_eq!(
        header("x-ratelimit-reason").as_deref(),
        Some("cluster_overload")
    );
}
