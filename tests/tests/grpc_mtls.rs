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

use serde_json::json;
use sluice_integration_tests::certs::DevCerts;
use sluice_integration_tests::fleet::{EnvoySpec, Fleet, FleetOptions};
use sluice_integration_tests::load::{LoadPlan, LoadRun, StreamSpec, Window};

const LIMITS: &str = r#"
limits:
  - bucket: "acme"
    limit_rps: 50
"#;

/// `envoy-<proxy_id>` on `demo-mtls.yaml`.
fn mtls_envoy(certs: &DevCerts, proxy_id: &str, client_cert: bool) -> EnvoySpec {
    EnvoySpec::mutual_tls(&format!("envoy-{proxy_id}"), certs, client_cert)
        .filter(json!({ "proxy_id": proxy_id, "report_interval_ms": 100 }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directives_flow_over_mutual_tls() {
    let mut fleet = Fleet::start(FleetOptions::control_plane_only(LIMITS).mutual_tls())
        .await
        .unwrap();
    let certs = fleet.certs().unwrap().clone();
    let trusted = fleet
        .start_envoy(&mtls_envoy(&certs, "trusted", true))
        .await
        .unwrap();
    fleet
        .start_envoy(&mtls_envoy(&certs, "untrusted", false))
        .await
        .unwrap();
    let (trusted, control_plane) = (&fleet.envoys[trusted], &fleet.control_plane);

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
