//! A restarted control plane does not disturb a fleet at its limit: the
//! proxies reconnect on their own jittered backoff, and from two control
//! intervals after the new process's first report the fleet admits within
//! ±2% of the limit.
//!
//! The filter decides with `"decision": "credit"` (error diffusion), so the
//! admitted rate is the pushed ratio applied to the offered rate, without a
//! coin's sampling noise, which alone is about ±3% over a few seconds at a
//! few hundred requests a second.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use serde_json::json;
use sluice_integration_tests::control_plane::AdminClient;
use sluice_integration_tests::fleet::{DataPlane, Fleet, FleetOptions};
use sluice_integration_tests::load::{LoadPlan, LoadRun, StreamSpec, Window, rate, within};

const LIMITS: &str = r#"
limits:
  - bucket: "acme"
    limit_rps: 200
"#;
const LIMIT_RPS: f64 = 200.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_control_plane_holds_the_limit_from_its_second_interval() {
    a_restarted_control_plane_holds_the_limit_from_its_second_interval_on(DataPlane::Wasm).await;
}

/// The same with the native dynamic module in every Envoy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_a_restarted_control_plane_holds_the_limit_from_its_second_interval() {
    a_restarted_control_plane_holds_the_limit_from_its_second_interval_on(DataPlane::Native).await;
}

async fn a_restarted_control_plane_holds_the_limit_from_its_second_interval_on(
    data_plane: DataPlane,
) {
    // What this test is about is the restart (the start-up hold), so the
    // proxies keep applying their last ratio while the control plane is
    // down. With the default allowance the caps engage during the outage:
    // with two workers each VM now caps at its share of the process's
    // budget (190.4 rps over the outage, 195.0 after the restart measured
    // here, where frozen per-VM caps gave 125-187), but the shares lag the
    // load by a slow tick and cost a few percent, outside this test's ±2 %
    // band; `outage_surge.rs` and `long_outage.rs` measure the allowance.
    let mut options = FleetOptions::new(LIMITS, 2).with_data_plane(data_plane);
    options.filter = json!({"decision": "credit", "allowance": null});
    let mut fleet = Fleet::start(options).await.unwrap();
    let interval = fleet.options.control_interval();
    // An upper bound: the test stops the load once it has measured.
    let duration = Duration::from_secs(20);
    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("A/acme", &fleet.url(0).unwrap(), "acme", 300.0),
            StreamSpec::new("B/acme", &fleet.url(1).unwrap(), "acme", 100.0),
        ],
        duration,
    ))
    .unwrap();

    // Converge, then crash the control plane for 2 s.
    tokio::time::sleep(Duration::from_secs(4).saturating_sub(load.elapsed())).await;
    fleet.control_plane.kill().unwrap();
    let killed_at = load.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    fleet.control_plane.restart().await.unwrap();
    let restarted_at = load.elapsed();

    // The new process's first report: the first time its bucket view has a
    // reporting proxy.
    let admin = fleet.control_plane.admin();
    let first_report = reporting(admin, 1, Duration::from_millis(10)).await;
    let first_report_at = load.elapsed();
    let reconnected = reporting(admin, 2, Duration::from_millis(50)).await;
    let reconnected_at = load.elapsed();

    // Measure 4 s, from two control intervals after the first report.
    let back = Window {
        from: first_report_at + interval * 2,
        to: first_report_at + interval * 2 + Duration::from_secs(4),
    };
    tokio::time::sleep(back.to.saturating_sub(load.elapsed())).await;
    let buckets = admin.buckets().await.unwrap();
    load.stop();
    let result = load.finish().await.unwrap();

    let before = Window {
        from: killed_at.saturating_sub(Duration::from_secs(2)),
        to: killed_at,
    };
    let outage = Window {
        from: killed_at,
        to: first_report_at,
    };
    let whole = Window {
        from: Duration::ZERO,
        to: back.to,
    };
    let summary = format!(
        "killed at {killed_at:?}, restarted at {restarted_at:?}, first report at \
         {first_report_at:?}, both reporting at {reconnected_at:?}\n\
         before: {}outage: {}back: {}new control plane: {buckets:?}\n{}",
        result.summary(before),
        result.summary(outage),
        result.summary(back),
        result.timeline(Duration::from_millis(500))
    );
    println!("{summary}");
    let admitted = |window: Window| rate(result.tenant_counts(window, "acme").ok, window);
    let (admitted_before, admitted_outage, admitted_back) =
        (admitted(before), admitted(outage), admitted(back));
    let holds = within(admitted_back, LIMIT_RPS, 0.02)
        && first_report.is_ok()
        && reconnected.is_ok()
        && result.tenant_counts(whole, "acme").server_errors == 0;
    if !holds {
        fleet.print_logs();
    }

    first_report.unwrap();
    reconnected.unwrap();
    let all = result.tenant_counts(whole, "acme");
    assert_eq!(all.server_errors, 0, "no 5xx at any time\n{summary}");
    assert_eq!(all.errors, 0, "no failed requests at any time\n{summary}");
    // Context for the bound below: the fleet was at the limit before the
    // crash and stayed there on its last directives.
    assert!(
        within(admitted_before, LIMIT_RPS, 0.05) && within(admitted_outage, LIMIT_RPS, 0.05),
        "before {admitted_before:.1} rps, during the outage {admitted_outage:.1} rps\n{summary}"
    );
    assert!(
        within(admitted_back, LIMIT_RPS, 0.02),
        "from two intervals after the first report admitted {admitted_back:.1} rps, \
         limit {LIMIT_RPS}\n{summary}"
    );
}

/// Waits until at least `proxies` proxies report acme to the control plane;
/// the filter's reconnect backoff is capped at 5 s, so 7 s is plenty.
async fn reporting(admin: &AdminClient, proxies: u32, every: Duration) -> anyhow::Result<()> {
    admin
        .wait_for_bucket(
            "acme",
            &format!("{proxies} proxies to report to the new control plane"),
            Duration::from_secs(7),
            every,
            |b| (b.proxies_reporting >= proxies).then_some(()),
        )
        .await
}
