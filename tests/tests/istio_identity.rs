//! deploy/istio's identity rules against the real control plane: the
//! `--grpc-identity` flags of deploy/istio/deployment.yaml, verbatim, with
//! client certificates named as Istio names workloads
//! (`spiffe://cluster.local/ns/<namespace>/sa/<account>`) claiming proxy
//! ids as Istio names sidecars (their node ids). A workload of `shop` may
//! report as a pod of `shop` and nothing else; a namespace without a rule
//! may not report at all.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use sluice_integration_tests::certs;
use sluice_integration_tests::fake_proxy::{ClientTls, FakeProxy};
use sluice_integration_tests::fleet::{Fleet, FleetOptions, GrpcTls};
use sluice_integration_tests::paths;

/// The `--grpc-identity` arguments of deploy/istio's Deployment.
fn deploy_identity_rules() -> Vec<String> {
    let path = paths::from_root("deploy/istio/deployment.yaml").unwrap();
    let text = std::fs::read_to_string(path).unwrap();
    let rules: Vec<String> = text
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- --grpc-identity="))
        .map(|rule| format!("--grpc-identity={rule}"))
        .collect();
    assert!(
        !rules.is_empty(),
        "deploy/istio's Deployment has no --grpc-identity"
    );
    rules
}

/// What the control plane answers a proxy that claims `proxy_id` with `tls`.
async fn outcome(
    grpc: std::net::SocketAddr,
    tls: ClientTls<'_>,
    proxy_id: &str,
) -> Result<(), tonic::Status> {
    let mut proxy = FakeProxy::connect(grpc, proxy_id, Some(tls)).await.unwrap();
    proxy.first_reply(Duration::from_secs(5)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istio_workload_identities_claim_only_their_namespaces_node_ids() {
    let fleet = Fleet::start(
        FleetOptions::control_plane_only("limits:\n  - bucket: acme\n    limit_rps: 50\n")
            .control_interval_ms(None)
            .grpc_tls(GrpcTls::MutualOwnRules)
            .args(deploy_identity_rules()),
    )
    .await
    .unwrap();
    let (control_plane, certs) = (&fleet.control_plane, fleet.certs().unwrap());
    let ca = certs.path(certs::CA);
    let (shop_cert, shop_key) = (
        certs.path(certs::ISTIO_SHOP_CERT),
        certs.path(certs::ISTIO_SHOP_KEY),
    );
    let (billing_cert, billing_key) = (
        certs.path(certs::ISTIO_BILLING_CERT),
        certs.path(certs::ISTIO_BILLING_KEY),
    );
    let shop = || ClientTls {
        ca: &ca,
        cert: &shop_cert,
        key: &shop_key,
    };
    let billing = ClientTls {
        ca: &ca,
        cert: &billing_cert,
        key: &billing_key,
    };
    let grpc = control_plane.grpc_addr();

    let own = outcome(
        grpc,
        shop(),
        "sidecar~10.1.2.3~checkout-7d9f-a.shop~shop.svc.cluster.local",
    )
    .await;
    assert!(
        own.is_ok(),
        "a shop workload reporting as a shop pod: {own:?}"
    );
    for (tls, proxy_id) in [
        (
            shop(),
            "sidecar~10.1.2.4~api-5b8c-x.billing~billing.svc.cluster.local",
        ),
        (
            shop(),
            "router~10.1.2.9~istio-ingressgateway-6c9f-z.istio-system~istio-system.svc.cluster.local",
        ),
        (
            billing,
            "sidecar~10.1.2.4~api-5b8c-x.billing~billing.svc.cluster.local",
        ),
    ] {
        let refused = outcome(grpc, tls, proxy_id).await;
        match refused {
            Err(status) if status.code() == tonic::Code::PermissionDenied => {}
            other => panic!("{proxy_id} was not refused: {other:?}"),
        }
    }
    let proxies = control_plane.admin().proxies().await.unwrap();
    let ids: Vec<&str> = proxies
        .proxies
        .iter()
        .map(|p| p.proxy_id.as_str())
        .collect();
    assert_eq!(
        ids,
        ["sidecar~10.1.2.3~checkout-7d9f-a.shop~shop.svc.cluster.local"]
    );
}
