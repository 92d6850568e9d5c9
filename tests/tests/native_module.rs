//! The native dynamic module in Envoy 1.40 itself: the example config loads
//! (`envoy --mode validate` runs the module's configuration hook), a bad
//! filter configuration makes Envoy refuse the listener with the field
//! named, and requests go through it. The fleet tests (`fleet_convergence`,
//! `limits_enforced`, `control_plane_outage`, `control_plane_restart`,
//! `filter_contract`, `filter_metrics`) run for the module too.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use serde_json::json;
use sluice_integration_tests::envoy::{self, Envoy, EnvoyOptions, Rewrite};

fn native_config(patch: serde_json::Value) -> serde_yaml_ng::Value {
    let mut config = envoy::load_repo_config("native-module.yaml").unwrap();
    let addr = "127.0.0.1:9".parse().unwrap();
    envoy::rewrite(&mut config, &Rewrite::for_native(addr, patch).unwrap()).unwrap();
    config
}

#[tokio::test]
async fn the_example_loads_and_a_bad_configuration_names_its_field() {
    envoy::validate(&native_config(json!({}))).await.unwrap();

    let err = envoy::validate(&native_config(json!({"report_interval_ms": 1})))
        .await
        .expect_err("a report interval of 1 ms must be refused");
    let message = format!("{err:#}");
    assert!(message.contains("report_interval_ms"), "{message}");

    let err = envoy::validate(&native_config(json!({"control_plane_uri": "grpc://x"})))
        .await
        .expect_err("a URI that is not http:// must be refused");
    let message = format!("{err:#}");
    assert!(message.contains("control_plane_uri"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_pass_through_the_module_without_a_control_plane() {
    let dir = tempfile::tempdir().unwrap();
    let envoy = Envoy::start(
        &native_config(json!({"proxy_id": "native-alone"})),
        &EnvoyOptions::new("envoy-native", dir.path()),
    )
    .await
    .unwrap();
    let client = reqwest::Client::new();
    for tenant in ["a", "b", "c"] {
        let response = client
            .get(format!("{}/", envoy.base_url()))
            .header("x-tenant", tenant)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "tenant {tenant}");
        assert_eq!(response.text().await.unwrap(), "ok\n");
    }
    let stats = envoy.stats("sluice").await.unwrap();
    assert!(stats.contains("dynamicmodulescustom.sluice."), "{stats}");
}
