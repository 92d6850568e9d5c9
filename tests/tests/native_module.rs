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
use sluice_integration_tests::certs::{self, DevCerts};
use sluice_integration_tests::control_plane::{ControlPlane, ControlPlaneOptions};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_module_reaches_a_control_plane_that_requires_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let certs = DevCerts::generate(&dir.path().join("certs")).unwrap();
    let control_plane = ControlPlane::start(
        ControlPlaneOptions::new(
            "limits:\n  - bucket: blocked\n    limit_rps: 0\n",
            dir.path(),
        )
        .control_interval_ms(200)
        .args(certs.serve_args()),
    )
    .await
    .unwrap();
    let path = |name| certs.path(name).display().to_string();
    let config = native_config(json!({
        "proxy_id": "native-tls",
        "report_interval_ms": 100,
        "control_plane_uri": format!("https://{}", control_plane.grpc_addr()),
        "control_plane_tls": {
            "ca_file": path(certs::CA),
            "cert_file": path(certs::CLIENT_CERT),
            "key_file": path(certs::CLIENT_KEY),
        },
    }));
    let envoy = Envoy::start(&config, &EnvoyOptions::new("envoy-native-tls", dir.path()))
        .await
        .unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    let control_plane = ControlPlane::start(
        ControlPlaneOptions::new(
            "limits:\n  - bucket: default/acme\n    limit_rps: 0\n",
            dir.path(),
        )
        .control_interval_ms(200),
    )
    .await
    .unwrap();
    // The example's only route is named `default`: the module reads the
    // name through Envoy 1.40's attribute id for `xds.route_name`.
    let mut config = envoy::load_repo_config("native-module.yaml").unwrap();
    let patch = json!({
        "proxy_id": "native-route",
        "report_interval_ms": 100,
        "bucket_key": [
            {"source": "route_name"},
            {"source": "header", "name": "x-tenant", "default": "anonymous"}
        ],
    });
    envoy::rewrite(
        &mut config,
        &Rewrite::for_native(control_plane.grpc_addr(), patch).unwrap(),
    )
    .unwrap();
    let envoy = Envoy::start(
        &config,
        &EnvoyOptions::new("envoy-native-route", dir.path()),
    )
    .await
    .unwrap();
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
