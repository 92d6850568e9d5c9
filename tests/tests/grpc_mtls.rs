//! The gRPC stream over mutual TLS: the control plane started with
//! `--grpc-tls-*` and Envoy with `envoy/demo-mtls.yaml` (certificates from a
//! fresh test CA). Directives flow and are enforced; a proxy without a
//! client certificate is refused and never appears in the fleet.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use sluice_integration_tests::certs::{self, DevCerts};
use sluice_integration_tests::control_plane::{ControlPlane, ControlPlaneOptions};
use sluice_integration_tests::envoy::{Envoy, EnvoyOptions};
use sluice_integration_tests::load::{LoadPlan, LoadRun, StreamSpec, Window};

const LIMITS: &str = r#"
limits:
  - bucket: "acme"
    limit_rps: 50
"#;

fn mtls_config(
    control_plane: &ControlPlane,
    certs: &DevCerts,
    proxy_id: &str,
    client_cert: bool,
) -> serde_yaml_ng::Value {
    certs::demo_mtls_config(certs, control_plane.grpc_addr(), proxy_id, client_cert).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directives_flow_over_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let certs = DevCerts::generate(&dir.path().join("certs")).unwrap();
    let control_plane = ControlPlane::start(
        ControlPlaneOptions::new(LIMITS, dir.path())
            .control_interval_ms(200)
            .args(certs.serve_args()),
    )
    .await
    .unwrap();
    let trusted = Envoy::start(
        &mtls_config(&control_plane, &certs, "trusted", true),
        &EnvoyOptions::new("envoy-trusted", dir.path()),
    )
    .await
    .unwrap();
    let _untrusted = Envoy::start(
        &mtls_config(&control_plane, &certs, "untrusted", false),
        &EnvoyOptions::new("envoy-untrusted", dir.path()),
    )
    .await
    .unwrap();

    let load = LoadRun::start(LoadPlan::new(
        vec![StreamSpec::new("acme", &trusted.base_url(), "acme", 150.0)],
        Duration::from_secs(6),
    ))
    .unwrap();
    let admin = control_plane.admin().clone();
    let shed = admin
        .wait_for_bucket(
            "acme",
            "the control plane to shed acme for the trusted proxy",
            Duration::from_secs(5),
            Duration::from_millis(100),
            |b| (b.drop_ratio > 0.3).then_some(b.proxies_reporting),
        )
        .await;
    // The load ends once the control plane sheds, with at least a second
    // of it in the window below.
    tokio::time::sleep(Duration::from_secs(4).saturating_sub(load.elapsed())).await;
    load.stop();
    let result = load.finish().await.unwrap();
    if shed.is_err() {
        control_plane.print_log();
        trusted.print_log();
    }
    assert_eq!(
        shed.unwrap(),
        1,
        "only the proxy with a certificate reports"
    );
    let counts = result.tenant_counts(Window::secs(3.0, 3600.0), "acme");
    assert!(counts.limited > 0, "directives enforced: {counts}");
    assert_eq!(counts.server_errors + counts.errors, 0, "{counts}");

    let proxies = reqwest::get(format!("http://{}/v1/proxies", control_plane.admin_addr()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(proxies.contains("\"trusted\""), "{proxies}");
    assert!(
        !proxies.contains("\"untrusted\""),
        "a proxy without a client certificate is refused: {proxies}"
    );
}
