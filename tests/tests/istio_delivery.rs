//! The filter under Istio's delivery contract, in real Envoy: deploy/'s
//! WasmPlugin turned into exactly what istiod sends (ECDS over ADS, the
//! configuration as a JSON StringValue, root id = pluginName, no vm_id, the
//! module from a local file, istiod's environment variable; see
//! `tests/src/mesh.rs` for the istiod source each choice mirrors), two
//! sidecars reaching the control plane through the cluster Istio names
//! `outbound|50051||sluice.sluice-system.svc.cluster.local`, with deploy/'s
//! limits file.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use serde_json::json;
use sluice_integration_tests::envoy::decisions_in;
use sluice_integration_tests::load::{LoadPlan, LoadRun, StreamSpec, Window, rate, within};
use sluice_integration_tests::mesh::header_of_a_429;
use sluice_integration_tests::sidecars::{SidecarMesh, SidecarOptions};
use sluice_integration_tests::token_fleet::deployed;

/// deploy/base/configmap-limits.yaml's limit for `acme`, enforced there.
const ACME_LIMIT: f64 = 200.0;
/// Its limit for each `ingress/*` bucket, in shadow mode there.
const INGRESS_LIMIT: f64 = 250.0;

fn options(pods: &[&str]) -> SidecarOptions {
    let mut options = SidecarOptions::new(pods);
    // Faster than deploy/'s values, so the test converges in seconds.
    options.control_interval_ms = Some(200);
    options
        .plugin_patch
        .insert("report_interval_ms".into(), json!(100));
    options
}

/// Two sidecars, each with a second wasm plugin without vm_id beside
/// Sluice: the fleet admits the limit, each sidecar reports under its own
/// node id without any proxy_id configured, and both plugins run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_hold_the_fleet_limit_beside_another_plugin_without_vm_id() {
    let mut options = options(&["checkout-7d9f-a", "checkout-7d9f-b"]);
    options.other_plugin = true;
    let mesh = SidecarMesh::start(options).await.unwrap();
    assert!(
        mesh.plugin.plugin_config.get("proxy_id").is_none(),
        "deploy/'s WasmPlugin must not set proxy_id: {}",
        mesh.plugin.plugin_config
    );

    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("A/acme", &mesh.url(0).unwrap(), "acme", 450.0),
            StreamSpec::new("B/acme", &mesh.url(1).unwrap(), "acme", 150.0),
            StreamSpec::new("A/globex", &mesh.url(0).unwrap(), "globex", 40.0),
        ],
        Duration::from_secs(10),
    ))
    .unwrap();
    let admin = mesh.fleet.control_plane.admin();
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
        "converged at {converged_at:?}: {converged:?}\n{}{}\nproxies: {proxies:?}\nacks: {:?}",
        result.summary(window),
        result.timeline(Duration::from_millis(500)),
        mesh.xds.acks(),
    );
    println!("{summary}");
    if converged.is_err() {
        mesh.print_logs();
    }
    converged.unwrap();

    let acme = result.tenant_counts(window, "acme");
    assert_eq!(acme.server_errors + acme.errors, 0, "{summary}");
    assert_eq!(acme.skipped, 0, "the load generator fell behind\n{summary}");
    let admitted = rate(acme.ok, window);
    assert!(
        within(admitted, ACME_LIMIT, 0.10),
        "the sidecars admitted {admitted:.1} rps of acme, limit {ACME_LIMIT}\n{summary}"
    );
    // globex has no limit: both plugins let all of it through.
    let globex = result.tenant_counts(window, "globex");
    assert_eq!(globex.ok, globex.offered(), "{summary}");

    // The proxy id is the node id, unique per pod, with no configuration.
    let mut ids: Vec<String> = proxies.proxies.iter().map(|p| p.proxy_id.clone()).collect();
    ids.sort();
    let mut expected: Vec<String> = mesh.sidecars.iter().map(|s| s.node_id()).collect();
    expected.sort();
    assert_eq!(ids, expected, "{summary}");
    assert_eq!(proxies.connected, 2, "{summary}");
}

/// A pluginConfig change pushed through ECDS while traffic flows at 3x the
/// limit: it applies (the 429s carry the new reason header) in the same
/// Envoy processes, and the limit holds through the swap: no second
/// admits much more than the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_config_pushed_through_ecds_applies_without_restart_or_burst() {
    let mut mesh = SidecarMesh::start(options(&["cart-5c6b-a"])).await.unwrap();
    let pid = mesh.fleet.envoys[0].pid();
    let url = mesh.url(0).unwrap();
    let load = LoadRun::start(LoadPlan::new(
        vec![StreamSpec::new("acme", &url, "acme", 3.0 * ACME_LIMIT)],
        Duration::from_secs(16),
    ))
    .unwrap();
    let admin = mesh.fleet.control_plane.admin();
    admin
        .wait_for_convergence("acme", ACME_LIMIT, 0.10, 1, Duration::from_secs(6))
        .await
        .unwrap();
    assert_eq!(
        header_of_a_429(&url, "acme", "x-ratelimit-reason")
            .await
            .unwrap()
            .as_deref(),
        Some("cluster_overload")
    );

    // A steady second of enforcement before the push, to compare with.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut config = mesh.plugin.plugin_config.clone();
    config["response"] = json!({"reason_header": "x-sluice-reason"});
    let pushed_at = load.elapsed();
    mesh.push_plugin_config(config).await.unwrap();
    let acked_at = load.elapsed();
    // The new configuration decides: its header, not the old one.
    assert_eq!(
        header_of_a_429(&url, "acme", "x-sluice-reason")
            .await
            .unwrap()
            .as_deref(),
        Some("cluster_overload")
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    load.stop();
    let result = load.finish().await.unwrap();
    let summary = format!(
        "pushed at {pushed_at:?}, acknowledged at {acked_at:?}\n{}\nacks: {:?}",
        result.timeline(Duration::from_millis(500)),
        mesh.xds.acks()
    );
    println!("{summary}");

    // The same Envoy process served throughout.
    assert!(mesh.fleet.envoys[0].is_running(), "{summary}");
    assert_eq!(mesh.fleet.envoys[0].pid(), pid);
    // No burst: every whole second from one before the push to three
    // after it admits the limit within 15 %.
    let start = (pushed_at.as_secs_f64().floor() - 1.0).max(0.0);
    for second in 0..5 {
        let from = start + f64::from(second);
        let window = Window::secs(from, from + 1.0);
        let counts = result.tenant_counts(window, "acme");
        assert_eq!(counts.server_errors + counts.errors, 0, "{summary}");
        let admitted = rate(counts.ok, window);
        assert!(
            admitted <= ACME_LIMIT * 1.15,
            "{admitted:.0} rps admitted in [{from}, {}) s around the push, limit {ACME_LIMIT}\n{summary}",
            from + 1.0
        );
    }
    let after = Window::secs(acked_at.as_secs_f64() + 1.0, acked_at.as_secs_f64() + 4.0);
    let admitted = result.admitted_rps(after, "acme");
    assert!(
        within(admitted, ACME_LIMIT, 0.10),
        "{admitted:.1} rps after the push, limit {ACME_LIMIT}\n{summary}"
    );
}

/// deploy/examples' LLM token budget for Istio, delivered as istiod
/// delivers it to the sidecar of a model server in the namespace `models`
/// labelled as its selector says, in front of the fake LLM upstream:
/// streamed completions are charged from the body exactly the tokens the
/// upstream reported, two tenants offering 3x deploy/base's budget are held
/// to about it, and the 429s say the unit and the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_llm_plugin_charges_streamed_tokens_and_holds_the_budget() {
    let upstream = deployed::start_upstream().await.unwrap();
    let mut options = options(&["llm-server-6c8d-a"]);
    options.plugin = "examples/llm-token-budget-istio.yaml".to_owned();
    options.app = Some(upstream.addr());
    let mesh = SidecarMesh::start(options).await.unwrap();
    let sidecar = &mesh.sidecars[0];
    assert_eq!(sidecar.namespace, "models");
    assert_eq!(
        sidecar.labels.get("app").map(String::as_str),
        Some("llm-server")
    );
    let url = format!("{}/v1/chat/completions", mesh.url(0).unwrap());
    let held = deployed::holds_the_budget(
        &url,
        &mesh.fleet.envoys[0],
        &upstream,
        mesh.fleet.control_plane.admin(),
    )
    .await;
    match held {
        Ok(summary) => println!("{summary}"),
        Err(err) => {
            mesh.print_logs();
            panic!("{err:#}");
        }
    }
}

/// deploy/istio's ingress-gateway plugin as istiod delivers it to a
/// gateway (node id `router~…`, labelled `istio: ingressgateway`, in
/// istio-system): its requests count in the buckets `ingress/<tenant>`
/// under its node id, which deploy/base's limits run in shadow mode.
/// Offered twice the `ingress/*` limit, the gateway refuses nothing while
/// the control plane drops half on paper and the filter counts those
/// requests as shadow drops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ingress_gateway_counts_its_tenants_in_shadow_mode() {
    let mut options = options(&["istio-ingressgateway-6c9f-a"]);
    options.plugin = "istio/wasmplugin-ingressgateway.yaml".to_owned();
    options.gateways = true;
    let mesh = SidecarMesh::start(options).await.unwrap();
    let gateway = mesh.sidecars[0].node_id();
    assert!(
        gateway.starts_with("router~")
            && gateway.ends_with("istio-system~istio-system.svc.cluster.local"),
        "{gateway}"
    );
    let load = LoadRun::start(LoadPlan::new(
        vec![StreamSpec::new(
            "acme",
            &mesh.url(0).unwrap(),
            "acme",
            2.0 * INGRESS_LIMIT,
        )],
        Duration::from_secs(6),
    ))
    .unwrap();
    let admin = mesh.fleet.control_plane.admin();
    let shadowed = admin
        .wait_for_bucket(
            "ingress/acme",
            "ingress/acme limited on paper",
            Duration::from_secs(5),
            Duration::from_millis(100),
            |b| (b.limit_rps == Some(INGRESS_LIMIT) && b.drop_ratio > 0.3).then(|| b.clone()),
        )
        .await;
    let proxies = admin.proxies().await.unwrap();
    let result = load.finish().await.unwrap();
    let stats = mesh.fleet.envoys[0].stats("sluice.result=").await.unwrap();
    let summary = format!(
        "{shadowed:?}\nproxies: {proxies:?}\n{}\n{stats}",
        result.timeline(Duration::from_millis(500))
    );
    if shadowed.is_err() {
        mesh.print_logs();
    }
    shadowed.expect(&summary);
    let counts = result.tenant_counts(Window::secs(0.0, 6.0), "acme");
    assert_eq!(
        (counts.limited, counts.server_errors, counts.errors),
        (0, 0, 0),
        "{summary}"
    );
    assert!(counts.ok > 0, "{summary}");
    assert!(decisions_in(&stats, "shadow_drop") > 0, "{summary}");
    let ids: Vec<&str> = proxies
        .proxies
        .iter()
        .map(|p| p.proxy_id.as_str())
        .collect();
    assert_eq!(ids, [gateway.as_str()], "{summary}");
}
