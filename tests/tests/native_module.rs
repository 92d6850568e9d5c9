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

use std::time::Duration;

use serde_json::json;
use sluice_integration_tests::certs;
use sluice_integration_tests::envoy;
use sluice_integration_tests::fleet::{
    ControlPlaneTarget, DataPlane, EnvoySpec, Fleet, FleetOptions, TestDir,
};

/// `native-module.yaml` as Envoy `name` with `keys`.
fn native(name: &str, keys: serde_json::Value) -> EnvoySpec {
    EnvoySpec::demo(name, DataPlane::Native).filter(keys)
}

/// The discard port: nothing listens there.
fn nowhere() -> ControlPlaneTarget {
    ControlPlaneTarget::One("127.0.0.1:9".parse().unwrap())
}

fn native_config(keys: serde_json::Value) -> serde_yaml_ng::Value {
    native("envoy-native", keys).config(&nowhere()).unwrap()
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
    let dir = TestDir::new("sluice-it-", "test").unwrap();
    let envoy = native("envoy-native", json!({"proxy_id": "native-alone"}))
        .start(dir.path(), &nowhere())
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_module_reaches_a_control_plane_that_requires_mutual_tls() {
    let mut fleet = Fleet::start(
        FleetOptions::control_plane_only("limits:\n  - bucket: blocked\n    limit_rps: 0\n")
            .mutual_tls(),
    )
    .await
    .unwrap();
    let certs = fleet.certs().unwrap();
    let path = |name| certs.path(name).display().to_string();
    let envoy = native(
        "envoy-native-tls",
        json!({
            "proxy_id": "native-tls",
            "report_interval_ms": 100,
            "control_plane_uri": format!("https://{}", fleet.control_plane.grpc_addr()),
            "control_plane_tls": {
                "ca_file": path(certs::CA),
                "cert_file": path(certs::CLIENT_CERT),
                "key_file": path(certs::CLIENT_KEY),
            },
        }),
    );
    let envoy = fleet.start_envoy(&envoy).await.unwrap();
    let (control_plane, envoy) = (&fleet.control_plane, &fleet.envoys[envoy]);
    // Requests of a bucket limited to 0 pass until the module's leader has
    // reported them over TLS and received the directive back.
    let client = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut dropped = false;
    while !dropped && tokio::time::Instant::now() < deadline {
        let response = client
            .get(format!("{}/", envoy.base_url()))
            .header("x-tenant", "blocked")
            .send()
            .await
            .unwrap();
        dropped = response.status() == 429;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if !dropped {
        control_plane.print_log();
        envoy.print_log();
    }
    assert!(dropped, "no directive reached the module over mutual TLS");
    let proxies = control_plane.admin().proxies().await.unwrap();
    assert!(
        proxies.proxies.iter().any(|p| p.proxy_id == "native-tls"),
        "{proxies:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_can_be_keyed_by_the_route_name() {
    let mut fleet = Fleet::start(FleetOptions::control_plane_only(
        "limits:\n  - bucket: default/acme\n    limit_rps: 0\n",
    ))
    .await
    .unwrap();
    // The example's only route is named `default`: the module reads the
    // name through Envoy 1.40's attribute id for `xds.route_name`.
    let envoy = native(
        "envoy-native-route",
        json!({
            "proxy_id": "native-route",
            "report_interval_ms": 100,
            "bucket_key": [
                {"source": "route_name"},
                {"source": "header", "name": "x-tenant", "default": "anonymous"}
            ],
        }),
    );
    let envoy = fleet.start_envoy(&envoy).await.unwrap();
    let (control_plane, envoy) = (&fleet.control_plane, &fleet.envoys[envoy]);
    let client = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut dropped = None;
    while dropped.is_none() && tokio::time::Instant::now() < deadline {
        let response = client
            .get(format!("{}/", envoy.base_url()))
            .header("x-tenant", "acme")
            .send()
            .await
            .unwrap();
        if response.status() == 429 {
            dropped = Some(response.json::<serde_json::Value>().await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if dropped.is_none() {
        control_plane.print_log();
        envoy.print_log();
    }
    let body = dropped.expect("the limit of bucket default/acme never applied");
    assert_eq!(body["bucket"], "default/acme");
}
