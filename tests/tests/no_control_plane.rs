//! With no control plane reachable (and so no directive ever received), the
//! filter admits everything: a control-plane outage at start-up must not
//! take traffic down.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use serde_json::json;
use sluice_integration_tests::fleet::{
    ControlPlaneTarget, DataPlane, EnvoySpec, TestDir, free_loopback_addr,
};
use sluice_integration_tests::load::{LoadPlan, LoadRun, StreamSpec, Window};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_control_plane_everything_passes() {
    let dir = TestDir::new("sluice-it-", "test").unwrap();
    // A port nobody listens on: bind, note it, close it.
    let dead = ControlPlaneTarget::One(free_loopback_addr().unwrap());
    let mut envoy = EnvoySpec::demo("envoy-lonely", DataPlane::Wasm)
        .filter(json!({"proxy_id": "lonely", "report_interval_ms": 100}))
        .start(dir.path(), &dead)
        .await
        .unwrap();
    let url = envoy.base_url();

    let duration = Duration::from_secs(3);
    let result = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("acme", &url, "acme", 200.0),
            StreamSpec::new("free", &url, "free", 50.0),
        ],
        duration,
    ))
    .unwrap()
    .finish()
    .await
    .unwrap();
    let whole = Window {
        from: Duration::ZERO,
        to: duration,
    };
    let summary = result.summary(whole);
    println!("{summary}");
    let counts = result.counts(whole, |_| true);
    assert!(counts.sent >= 700, "{summary}");
    assert_eq!(counts.ok, counts.sent, "{summary}");
    assert!(envoy.is_running(), "Envoy died");
}
