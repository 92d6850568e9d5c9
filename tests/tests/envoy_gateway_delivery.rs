//! The filter under Envoy Gateway's delivery, in real Envoy 1.40: deploy/'s
//! EnvoyExtensionPolicy inlined in the listener Envoy Gateway sends over
//! LDS, as its translator builds it (`tests/src/mesh.rs` cites the files):
//! the filter disabled on the listener and enabled on the route, `vm_id` the
//! extension's IR name, the module fetched over HTTP from the gateway's
//! module server and checked against its sha256, the configuration a JSON
//! StringValue, and the control plane reached through the cluster deploy/'s
//! EnvoyProxy adds to the bootstrap. deploy/'s limits file.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value as Json, json};
use sluice_integration_tests::certs;
use sluice_integration_tests::fleet::{EnvoySpec, Fleet, FleetOptions};
use sluice_integration_tests::load::{LoadPlan, LoadRun, StreamSpec, Window, rate, within};
use sluice_integration_tests::mesh::{
    GATEWAY_BACKEND_CLUSTER, GATEWAY_LISTENER, GatewayDynamicModule, GatewayWasm, LISTENER_TYPE,
    ModuleServer, envoy_proxy_bootstrap_clusters, envoy_proxy_dynamic_module_path,
    gateway_backend_cluster, gateway_bootstrap, gateway_control_plane_cluster,
    gateway_module_server_cluster, header_of_a_429,
};
use sluice_integration_tests::oci;
use sluice_integration_tests::paths;
use sluice_integration_tests::sidecars::deploy_limits_yaml;
use sluice_integration_tests::token_fleet::deployed;
use sluice_integration_tests::xds::{XdsServer, to_any};

const ACME_LIMIT: f64 = 200.0;
const ACK_TIMEOUT: Duration = Duration::from_secs(15);

/// The control plane, Envoy Gateway's module server and xDS, and one Envoy
/// per node id, serving one of deploy/'s policies.
struct Gateway {
    /// The control plane and the Envoys (first: they stop before the
    /// servers they talk to).
    fleet: Fleet,
    node_ids: Vec<String>,
    extension: GatewayWasm,
    xds: XdsServer,
    modules: ModuleServer,
    sha256: String,
    /// The route's backend, if it has one (else it answers 200 itself).
    backend: Option<SocketAddr>,
}

impl Gateway {
    /// deploy/'s policy on the whole Gateway, on a route that answers 200.
    async fn start(node_ids: &[&str]) -> Self {
        Self::start_with(node_ids, "envoy-gateway/extension-policy-wasm.yaml", None).await
    }

    /// The first wasm extension of `policy` (under deploy/), on a route to
    /// `backend` if given.
    async fn start_with(node_ids: &[&str], policy: &str, backend: Option<SocketAddr>) -> Self {
        let fleet = Fleet::start(FleetOptions::control_plane_only(
            &deploy_limits_yaml().unwrap(),
        ))
        .await
        .unwrap();
        let wasm = std::fs::read(paths::sluice_wasm().unwrap()).unwrap();
        let sha256 = oci::digest(&wasm).trim_start_matches("sha256:").to_owned();
        let modules = ModuleServer::start(wasm).await.unwrap();
        let mut extension = GatewayWasm::from_repo(policy).unwrap().remove(0);
        extension.config["report_interval_ms"] = 100.into();
        let envoy_proxy = std::fs::read_to_string(
            paths::from_root("deploy/envoy-gateway/envoyproxy.yaml").unwrap(),
        )
        .unwrap();
        let clusters = envoy_proxy_bootstrap_clusters(&envoy_proxy).unwrap();
        let cluster: Json = clusters
            .into_iter()
            .find(|c| c["name"] == extension.config["control_plane_cluster"])
            .expect("the EnvoyProxy's bootstrap has the cluster the policy names");
        let xds = XdsServer::start().await.unwrap();
        let mut gateway = Self {
            fleet,
            node_ids: node_ids.iter().map(|id| (*id).to_owned()).collect(),
            extension,
            xds,
            modules,
            sha256,
            backend,
        };
        let version = gateway.publish();
        for (index, node_id) in node_ids.iter().enumerate() {
            let mut clusters = vec![
                gateway_module_server_cluster(gateway.modules.addr()),
                gateway_control_plane_cluster(&cluster, gateway.fleet.control_plane.grpc_addr())
                    .unwrap(),
            ];
            clusters.extend(backend.map(gateway_backend_cluster));
            let config = gateway_bootstrap(node_id, gateway.xds.addr(), clusters).unwrap();
            gateway
                .fleet
                .start_envoy(&EnvoySpec::generated(&format!("gateway-{index}"), config))
                .await
                .unwrap();
            gateway
                .xds
                .wait_for_ack(node_id, LISTENER_TYPE, version, ACK_TIMEOUT)
                .await
                .unwrap();
        }
        gateway
    }

    /// Serves the listener with the extension as it is now.
    fn publish(&self) -> u64 {
        let listener = self
            .extension
            .listener(
                self.modules.addr(),
                &self.sha256,
                self.backend.map(|_| GATEWAY_BACKEND_CLUSTER),
            )
            .unwrap();
        self.xds.set(
            LISTENER_TYPE,
            vec![(GATEWAY_LISTENER.to_owned(), to_any(&listener))],
        )
    }

    fn print_logs(&self) {
        self.fleet.print_logs();
    }
}

/// Two gateway Envoys hold the fleet limit, each under its own node id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_envoys_hold_the_fleet_limit_with_the_filter_inlined() {
    let gateway = Gateway::start(&[
        "envoy-default-eg-e41e7b31-7c9d8f6b5-a1b2c",
        "envoy-default-eg-e41e7b31-7c9d8f6b5-d3e4f",
    ])
    .await;
    let ids = holds_the_fleet_limit(&gateway.fleet).await;
    assert_eq!(ids, gateway.node_ids);
}

/// Two Envoys of `fleet` offered 3x the limit of acme together (450 and
/// 150 rps) admit it within ±10 % once the fleet converged, with no
/// errors; the proxy ids the control plane lists, sorted.
async fn holds_the_fleet_limit(fleet: &Fleet) -> Vec<String> {
    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("A/acme", &fleet.envoys[0].base_url(), "acme", 450.0),
            StreamSpec::new("B/acme", &fleet.envoys[1].base_url(), "acme", 150.0),
        ],
        Duration::from_secs(10),
    ))
    .unwrap();
    let admin = fleet.control_plane.admin();
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
        fleet.print_logs();
    }
    converged.unwrap();
    let acme = result.tenant_counts(window, "acme");
    assert_eq!(acme.server_errors + acme.errors, 0, "{summary}");
    let admitted = rate(acme.ok, window);
    assert!(
        within(admitted, ACME_LIMIT, 0.10),
        "the gateways admitted {admitted:.1} rps of acme, limit {ACME_LIMIT}\n{summary}"
    );
    let mut ids: Vec<String> = proxies.proxies.iter().map(|p| p.proxy_id.clone()).collect();
    ids.sort_unstable();
    ids
}

/// deploy/'s native policy as Envoy Gateway delivers it: the
/// `DynamicModuleFilter` inlined in the listener sent over LDS, disabled
/// there and enabled on the route, the module loaded from the file the
/// EnvoyProxy's allow-list names (here the built module), its `config` a
/// JSON StringValue, the control plane reached over mutual TLS as the
/// policy says (its address and certificate files the test's). Two gateway
/// Envoys hold the fleet limit, each under a name of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_policy_holds_the_fleet_limit_as_envoy_gateway_delivers_it() {
    let mut fleet =
        Fleet::start(FleetOptions::control_plane_only(&deploy_limits_yaml().unwrap()).mutual_tls())
            .await
            .unwrap();
    let mut module = GatewayDynamicModule::from_repo("envoy-gateway/extension-policy-native.yaml")
        .unwrap()
        .remove(0);
    let envoy_proxy =
        std::fs::read_to_string(paths::from_root("deploy/envoy-gateway/envoyproxy.yaml").unwrap())
            .unwrap();
    let allowed = envoy_proxy_dynamic_module_path(&envoy_proxy, &module.name).unwrap();
    assert!(
        allowed.ends_with("/libsluice_native.so"),
        "the allow-list loads {allowed}"
    );
    let uri = module.config["control_plane_uri"].as_str().unwrap();
    assert!(uri.starts_with("https://"), "{uri}");
    module.config["control_plane_uri"] =
        format!("https://{}", fleet.control_plane.grpc_addr()).into();
    let certs = fleet.certs().unwrap();
    for (field, name) in [
        ("ca_file", certs::CA),
        ("cert_file", certs::CLIENT_CERT),
        ("key_file", certs::CLIENT_KEY),
    ] {
        assert!(
            module.config["control_plane_tls"][field].is_string(),
            "{field}"
        );
        module.config["control_plane_tls"][field] = certs.path(name).display().to_string().into();
    }
    module.config["report_interval_ms"] = 100.into();
    let listener = module
        .listener(&paths::native_module().unwrap(), None)
        .unwrap();
    let xds = XdsServer::start().await.unwrap();
    let version = xds.set(
        LISTENER_TYPE,
        vec![(GATEWAY_LISTENER.to_owned(), to_any(&listener))],
    );
    let node_ids = [
        "envoy-default-eg-native-5b7c9d2e-6f8a9b-a1b2c",
        "envoy-default-eg-native-5b7c9d2e-6f8a9b-d3e4f",
    ];
    for (index, node_id) in node_ids.iter().enumerate() {
        let config = gateway_bootstrap(node_id, xds.addr(), Vec::new()).unwrap();
        fleet
            .start_envoy(&EnvoySpec::generated(
                &format!("gateway-native-{index}"),
                config,
            ))
            .await
            .unwrap();
        if let Err(err) = xds
            .wait_for_ack(node_id, LISTENER_TYPE, version, ACK_TIMEOUT)
            .await
        {
            fleet.print_logs();
            panic!("{err:#}");
        }
    }
    let ids = holds_the_fleet_limit(&fleet).await;
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_ne!(ids[0], ids[1]);
}

/// A changed `config` reaches the gateway as Envoy Gateway sends it, a new
/// listener over LDS, while traffic flows at 3x the limit: it applies in the
/// same Envoy process (the 429s of new connections carry the new reason
/// header) and the limit holds through the swap, since the new filter's VMs
/// share the old ones' `vm_id` and so their directives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_config_change_applies_without_restart_or_burst() {
    let mut gateway = Gateway::start(&["envoy-default-eg-e41e7b31-7c9d8f6b5-a1b2c"]).await;
    let pid = gateway.fleet.envoys[0].pid();
    let url = gateway.fleet.envoys[0].base_url();
    let load = LoadRun::start(LoadPlan::new(
        vec![StreamSpec::new("acme", &url, "acme", 3.0 * ACME_LIMIT)],
        Duration::from_secs(16),
    ))
    .unwrap();
    let admin = gateway.fleet.control_plane.admin();
    admin
        .wait_for_convergence("acme", ACME_LIMIT, 0.10, 1, Duration::from_secs(6))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        header_of_a_429(&url, "acme", "x-ratelimit-reason")
            .await
            .unwrap()
            .as_deref(),
        Some("cluster_overload")
    );

    gateway.extension.config["response"] = json!({"reason_header": "x-sluice-reason"});
    let pushed_at = load.elapsed();
    let version = gateway.publish();
    gateway
        .xds
        .wait_for_ack(&gateway.node_ids[0], LISTENER_TYPE, version, ACK_TIMEOUT)
        .await
        .unwrap();
    let acked_at = load.elapsed();
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
        "pushed at {pushed_at:?}, acknowledged at {acked_at:?}\n{}",
        result.timeline(Duration::from_millis(500)),
    );
    println!("{summary}");
    assert!(gateway.fleet.envoys[0].is_running(), "{summary}");
    assert_eq!(gateway.fleet.envoys[0].pid(), pid);
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
}

/// deploy/examples' LLM token budget as Envoy Gateway delivers it, on a
/// route to the fake LLM upstream: streamed completions are charged from
/// the response body the tokens the upstream reported; two tenants
/// offering 3x deploy/base's budget (1,200,000 tokens a minute) are held
/// to about it, and the 429s say the unit and the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_llm_policy_charges_streamed_tokens_and_holds_the_budget() {
    let upstream = deployed::start_upstream().await.unwrap();
    let gateway = Gateway::start_with(
        &["envoy-default-eg-e41e7b31-7c9d8f6b5-a1b2c"],
        "examples/llm-token-budget.yaml",
        Some(upstream.addr()),
    )
    .await;
    let url = format!("{}/v1/chat/completions", gateway.fleet.envoys[0].base_url());
    let held = deployed::holds_the_budget(
        &url,
        &gateway.fleet.envoys[0],
        &upstream,
        gateway.fleet.control_plane.admin(),
    )
    .await;
    match held {
        Ok(summary) => println!("{summary}"),
        Err(err) => {
            gateway.print_logs();
            panic!("{err:#}");
        }
    }
}
