//! The control plane dies: Envoy keeps serving and keeps enforcing the last
//! directive. A new control plane on the same gRPC port gets the streams back,
//! and a limit set through its admin API applies.
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
async fn enforcement_survives_a_control_plane_restart() {
    enforcement_survives_a_control_plane_restart_on(DataPlane::Wasm).await;
}

/// The same with the native dynamic module in every Envoy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_enforcement_survives_a_control_plane_restart() {
    enforcement_survives_a_control_plane_restart_on(DataPlane::Native).await;
}

async fn enforcement_survives_a_control_plane_restart_on(data_plane: DataPlane) {
    let mut options = FleetOptions::new(LIMITS, 2).with_data_plane(data_plane);
    // One worker per Envoy, as in long_outage.rs: this test is about the
    // restart. With two, each worker caps the cell at its current share of
    // the Envoy's budget while the control plane is down, the shares lag
    // the load as it moves between workers, and this test's ±20 % band was
    // missed on a busy two-core machine in three runs out of many (Envoy A
    // admitted 82 and 101 rps of its 150 with the wasm filter, 192 once
    // with the native module). outage_surge.rs holds the two-worker outage
    // to ±10 % (docs/accuracy.md, "Several workers per Envoy").
    options.concurrency = 1;
    let mut fleet = Fleet::start(options).await.unwrap();
    let interval = fleet.options.control_interval();
    let grpc = fleet.control_plane.grpc_addr();
    // An upper bound: the test stops the load once it has measured the new limit.
    let duration = Duration::from_secs(20);
    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("A/acme", &fleet.url(0).unwrap(), "acme", 300.0),
            StreamSpec::new("B/acme", &fleet.url(1).unwrap(), "acme", 100.0),
        ],
        duration,
    ))
    .unwrap();

    // Converge, then crash the control plane.
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(load.elapsed())).await;
    fleet.control_plane.kill().unwrap();
    let killed_at = load.elapsed();

    // Down for 2.5 s; then a new process on the same gRPC port.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let restart_at = load.elapsed();
    fleet.control_plane.restart().await.unwrap();
    assert_eq!(fleet.control_plane.grpc_addr(), grpc);

    // Both streams back: the new process hears from both proxies. The filter
    // retries with jittered exponential backoff capped at 5 s, so allow 7 s.
    let admin = fleet.control_plane.admin().clone();
    let reconnected = admin
        .wait_for_bucket(
            "acme",
            "both proxies to report to the new control plane",
            Duration::from_secs(7),
            Duration::from_millis(100),
            |b| (b.proxies_reporting == 2).then_some(()),
        )
        .await;
    let reconnected_at = load.elapsed();
    admin.put_limit("acme", 100.0).await.unwrap();
    let put_at = load.elapsed();
    // A new control-plane process starts its drop policy's smoothing from
    // scratch: give it ten intervals to settle on the new limit.
    let settled = put_at + interval * 10;
    // Measure 3 s at the new limit, then stop early (the schedule is only an upper bound).
    let measured = Duration::from_secs(3);
    tokio::time::sleep((settled + measured).saturating_sub(load.elapsed())).await;
    let buckets = admin.buckets().await.unwrap();
    let stopped_at = load.elapsed().min(duration);
    load.stop();
    let result = load.finish().await.unwrap();

    let outage = Window {
        from: killed_at + Duration::from_millis(300),
        to: restart_at,
    };
    let after = Window {
        from: settled,
        to: stopped_at,
    };
    let whole = Window {
        from: Duration::ZERO,
        to: stopped_at,
    };
    let summary = format!(
        "killed at {killed_at:?}, restarted at {restart_at:?}, reconnected at {reconnected_at:?} ({reconnected:?}), \
         PUT 100 at {put_at:?}\noutage: {}after: {}new control plane: {buckets:?}\n{}",
        result.summary(outage),
        result.summary(after),
        result.timeline(Duration::from_millis(500))
    );
    println!("{summary}");

    let all = result.tenant_counts(whole, "acme");
    assert_eq!(all.server_errors, 0, "no 5xx at any time\n{summary}");
    assert_eq!(all.errors, 0, "no failed requests at any time\n{summary}");

    let down = result.tenant_counts(outage, "acme");
    assert!(
        down.ok > 0 && down.limited > 0,
        "during the outage: {down}\n{summary}"
    );
    let admitted_down = rate(down.ok, outage);
    assert!(
        within(admitted_down, 200.0, 0.2),
        "during the outage admitted {admitted_down:.1} rps, last limit 200\n{summary}"
    );

    reconnected.unwrap();
    let admitted_after = rate(result.tenant_counts(after, "acme").ok, after);
    assert!(
        after.len_secs() >= 2.0,
        "too little time left to measure the new limit\n{summary}"
    );
    assert!(
        within(admitted_after, 100.0, 0.15),
        "after the new limit admitted {admitted_after:.1} rps, limit 100\n{summary}"
    );
}
