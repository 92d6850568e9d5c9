//! The filter under Envoy Gateway's delivery, in real Envoy 1.40: deploy/'s
//! EnvoyExtensionPolicy inlined as Envoy Gateway's translator builds it
//! (`tests/src/mesh.rs` cites the files): the filter disabled on the
//! listener and enabled on the route, `vm_id` the extension's IR name, the
//! module fetched over HTTP from the gateway's module server and checked
//! against its sha256, the configuration a JSON StringValue, and the
//! control plane reached through the cluster deploy/'s EnvoyProxy adds to
//! the bootstrap. Two gateway Envoys hold deploy/'s limit, each under its
//! own node id.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use sluice_integration_tests::control_plane::{ControlPlane, ControlPlaneOptions};
use sluice_integration_tests::envoy::{Envoy, EnvoyOptions};
use sluice_integration_tests::load::{LoadPlan, LoadRun, StreamSpec, Window, rate, within};
use sluice_integration_tests::mesh::{GatewayWasm, ModuleServer, envoy_proxy_bootstrap_clusters};
use sluice_integration_tests::oci;
use sluice_integration_tests::paths;
use sluice_integration_tests::sidecars::deploy_limits_yaml;

const ACME_LIMIT: f64 = 200.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_envoys_hold_the_fleet_limit_with_the_filter_inlined() {
    let dir = tempfile::tempdir().unwrap();
    let control_plane = ControlPlane::start(
        ControlPlaneOptions::new(&deploy_limits_yaml().unwrap(), dir.path())
            .control_interval_ms(200),
    )
    .await
    .unwrap();
    let wasm = std::fs::read(paths::sluice_wasm().unwrap()).unwrap();
    let sha256 = oci::digest(&wasm).trim_start_matches("sha256:").to_owned();
    let modules = ModuleServer::start(wasm).await.unwrap();

    let mut extension = GatewayWasm::from_repo("envoy-gateway/extension-policy-wasm.yaml")
        .unwrap()
        .remove(0);
    extension.config["report_interval_ms"] = 100.into();
    let envoy_proxy =
        std::fs::read_to_string(paths::from_root("deploy/envoy-gateway/envoyproxy.yaml").unwrap())
            .unwrap();
    let clusters = envoy_proxy_bootstrap_clusters(&envoy_proxy).unwrap();
    let cluster = clusters
        .iter()
        .find(|c| c["name"] == extension.config["control_plane_cluster"])
        .expect("the EnvoyProxy's bootstrap has the cluster the policy names");

    let node_ids = [
        "envoy-default-eg-e41e7b31-7c9d8f6b5-a1b2c",
        "envoy-default-eg-e41e7b31-7c9d8f6b5-d3e4f",
    ];
    let mut envoys = Vec::new();
    for (index, node_id) in node_ids.iter().enumerate() {
        let config = extension
            .bootstrap(
                node_id,
                modules.addr(),
                &sha256,
                cluster,
                control_plane.grpc_addr(),
            )
            .unwrap();
        let options = EnvoyOptions::new(&format!("gateway-{index}"), dir.path());
        envoys.push(Envoy::start(&config, &options).await.unwrap());
    }

    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("A/acme", &envoys[0].base_url(), "acme", 450.0),
            StreamSpec::new("B/acme", &envoys[1].base_url(), "acme", 150.0),
        ],
        Duration::from_secs(10),
    ))
    .unwrap();
    let admin = control_plane.admin();
    let converged = admin
        .wait_for_convergence("acme", ACME_LIMIT, 0.10, 2, Duration::from_secs(5))
        .await;
    let converged_at = load.elapsed();
    let window = Window {
        from: converged_at + Duration::from_secs(1),
        to: converged_at + Duration::from_secs(5),
    };
    tokio::time::sleep(window.to.saturating_sub(load.elapsed())).await;
    let proxies = admin.proxies().await.unwrap();
    load.stop();
    let result = load.finish().await.unwrap();
    let summary = format!(
        "converged at {converged_at:?}: {converged:?}\n{}{}\nproxies: {proxies:?}",
        result.summary(window),
        result.timeline(Duration::from_millis(500)),
    );
    println!("{summary}");
    if converged.is_err() {
        control_plane.print_log();
        for envoy in &envoys {
            envoy.print_log();
        }
    }
    converged.unwrap();
    let acme = result.tenant_counts(window, "acme");
    assert_eq!(acme.server_errors + acme.errors, 0, "{summary}");
    let admitted = rate(acme.ok, window);
    assert!(
        within(admitted, ACME_LIMIT, 0.10),
        "the gateways admitted {admitted:.1} rps of acme, limit {ACME_LIMIT}\n{summary}"
    );
    let mut ids: Vec<&str> = proxies
        .proxies
        .iter()
        .map(|p| p.proxy_id.as_str())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, node_ids, "{summary}");
}
