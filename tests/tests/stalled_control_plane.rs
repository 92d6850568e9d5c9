//! A control plane that accepts the stream and never answers: requests keep
//! flowing untouched, the filter gives up on the silent stream and tries
//! again (so what Envoy buffers for it is released), and Envoy's memory
//! does not grow with the reports it cannot deliver.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use serde_json::json;
use sluice_integration_tests::envoy::Envoy;
use sluice_integration_tests::fleet::{ControlPlaneTarget, DataPlane, EnvoySpec, TestDir};
use sluice_integration_tests::load::{LoadPlan, LoadRun, StreamSpec, Window};
use sluice_integration_tests::stalled::StalledControlPlane;
use sluice_integration_tests::wait;

/// Distinct buckets per second of load, so every report is sizeable.
const TENANTS: usize = 200;

async fn allocated_bytes(envoy: &Envoy) -> u64 {
    let url = format!("http://{}/memory", envoy.admin_addr());
    let body: serde_json::Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
    body["allocated"].as_str().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_control_plane_harms_no_request() {
    let stalled = StalledControlPlane::start().await.unwrap();
    let dir = TestDir::new("sluice-it-", "test").unwrap();
    let envoy = EnvoySpec::demo("envoy", DataPlane::Wasm)
        .filter(json!({
            "proxy_id": "stalled-test",
            "report_interval_ms": 100,
            // The shortest allowed: the filter gives up soonest.
            "stream_idle_timeout_ms": 2000,
        }))
        .start(dir.path(), &ControlPlaneTarget::One(stalled.addr()))
        .await
        .unwrap();
    let url = envoy.base_url();

    let streams: Vec<StreamSpec> = (0..TENANTS)
        .map(|i| StreamSpec::new(&format!("t{i}"), &url, &format!("tenant-{i}"), 2.0))
        .collect();
    // An upper bound: the load stops once the heap is measured.
    let duration = Duration::from_secs(16);
    let load = LoadRun::start(LoadPlan::new(streams, duration)).unwrap();

    // The heap is measured from the filter's first reconnect (every
    // bucket is known by then, and the first silent stream let go of)
    // over 11 s of reports that cannot be delivered.
    let reconnected = wait::until(
        "the filter to give up on the silent stream and reconnect",
        Duration::from_secs(5),
        Duration::from_millis(50),
        || async { Ok((stalled.streams_opened() >= 2).then_some(())) },
    )
    .await;
    let early = allocated_bytes(&envoy).await;
    tokio::time::sleep(Duration::from_secs(11)).await;
    let late = allocated_bytes(&envoy).await;
    load.stop();
    let result = load.finish().await.unwrap();

    let whole = Window::secs(0.0, 3600.0);
    let mut ok = 0;
    let mut bad = 0;
    for i in 0..TENANTS {
        let counts = result.tenant_counts(whole, &format!("tenant-{i}"));
        ok += counts.ok;
        bad += counts.limited + counts.server_errors + counts.errors + counts.other_status;
    }
    let summary = format!(
        "ok {ok}, not ok {bad}, streams opened {}, allocated {early} -> {late} bytes",
        stalled.streams_opened()
    );
    println!("{summary}");
    if bad > 0 || reconnected.is_err() {
        envoy.print_log();
    }
    assert!(ok > 0, "{summary}");
    assert_eq!(bad, 0, "every request passes untouched: {summary}");
    if let Err(err) = reconnected {
        panic!("{err:#}: {summary}");
    }
    // Reports to nowhere must not pile up: ~11 s of them at 200 buckets is
    // megabytes if nothing lets go of them.
    assert!(
        late < early + 4 * 1024 * 1024,
        "Envoy's heap grew by {} bytes while the control plane stalled: {summary}",
        late.saturating_sub(early)
    );
}
