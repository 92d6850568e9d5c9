//! Two Envoys whose configurations name no `proxy_id` and that have no node
//! id share one limit: each names itself (the wasm filter after its
//! process's random instance id, the native module after its host, process
//! id and a random part), so the control plane counts both. When both were
//! called `envoy`, each replaced the other at the control plane, which saw
//! half the fleet's rate, and the fleet admitted twice its limit.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use sluice_integration_tests::fleet::{DataPlane, EnvoySpec, Fleet, FleetOptions};
use sluice_integration_tests::load::{LoadPlan, LoadRun, StreamSpec, Window, rate, within};
use sluice_integration_tests::wait;

const LIMIT_RPS: f64 = 100.0;
const LIMITS: &str = r#"
limits:
  - bucket: "acme"
    limit_rps: 100
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_unnamed_envoys_hold_one_limit() {
    two_unnamed_envoys_hold_one_limit_on(DataPlane::Wasm).await;
}

/// The same with the native dynamic module in both Envoys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_unnamed_native_envoys_hold_one_limit() {
    two_unnamed_envoys_hold_one_limit_on(DataPlane::Native).await;
}

async fn two_unnamed_envoys_hold_one_limit_on(data_plane: DataPlane) {
    let mut options = FleetOptions::new(LIMITS, 2).with_data_plane(data_plane);
    // The example configs name their proxy; null leaves it unset, and the
    // Envoys are started without a node id.
    options.filter = serde_json::json!({"proxy_id": null});
    let fleet = Fleet::start(options).await.unwrap();
    let duration = Duration::from_secs(12);
    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("A/acme", &fleet.url(0).unwrap(), "acme", 150.0),
            StreamSpec::new("B/acme", &fleet.url(1).unwrap(), "acme", 150.0),
        ],
        duration,
    ))
    .unwrap();
    // Measured for 5 s from a second after the control plane sees both
    // proxies admit the limit, or from 6 s in if it never does (as when
    // the two replaced each other).
    let admin = fleet.control_plane.admin();
    let converged = admin
        .wait_for_convergence("acme", LIMIT_RPS, 0.10, 2, Duration::from_secs(5))
        .await;
    let from = load.elapsed() + Duration::from_secs(1);
    let window = Window {
        from,
        to: from + Duration::from_secs(5),
    };
    tokio::time::sleep(window.to.saturating_sub(load.elapsed())).await;
    let proxies = admin.proxies().await.unwrap();
    let buckets = admin.buckets().await.unwrap();
    load.stop();
    let result = load.finish().await.unwrap();

    let summary = format!(
        "convergence: {converged:?}\n{}proxies: {proxies:?}\nbuckets: {buckets:?}\n{}",
        result.summary(window),
        result.timeline(Duration::from_millis(500))
    );
    println!("{summary}");
    let counts = result.tenant_counts(window, "acme");
    assert_eq!(counts.server_errors + counts.errors, 0, "{summary}");
    assert_eq!(
        counts.skipped, 0,
        "the load generator fell behind\n{summary}"
    );
    let admitted = rate(counts.ok, window);
    if !within(admitted, LIMIT_RPS, 0.15) {
        fleet.print_logs();
    }
    assert!(
        within(admitted, LIMIT_RPS, 0.15),
        "the fleet admitted {admitted:.1} rps against a limit of {LIMIT_RPS}\n{summary}"
    );

    let mut ids: Vec<&str> = proxies
        .proxies
        .iter()
        .filter(|proxy| proxy.connected)
        .map(|proxy| proxy.proxy_id.as_str())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 2, "two distinct proxies\n{summary}");
    for (index, envoy) in fleet.envoys.iter().enumerate() {
        match data_plane {
            DataPlane::Wasm => {
                let hex = |id: &str| {
                    id.strip_prefix("envoy-").is_some_and(|hex| {
                        hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit())
                    })
                };
                assert!(ids.iter().all(|id| hex(id)), "{ids:?}");
            }
            DataPlane::Native => {
                let pid = format!("-{}-", envoy.pid());
                assert!(
                    ids.iter().any(|id| id.contains(&pid)),
                    "Envoy {index} (pid {}) is not among {ids:?}",
                    envoy.pid()
                );
            }
        }
        // Each says, once, that its name is made up and how to set one.
        let log = std::fs::read_to_string(envoy.log_path()).unwrap();
        assert!(
            log.lines()
                .any(|line| line.contains("no proxy_id") && ids.iter().any(|id| line.contains(id))),
            "Envoy {index} did not warn about its made-up name"
        );
    }
}

/// An Envoy with a node id (Istio gives every sidecar one) and no
/// `proxy_id` reports as its node id, in its node's zone, and does not
/// warn. (Envoy 1.40 answers the node's properties under `xds.node`, not
/// `node`, where the filter read them before: every such Envoy reported as
/// `envoy`, without a zone.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_with_a_node_id_reports_as_it() {
    const NODE_ID: &str = "sidecar~10.1.2.3~pod-abc-1.ns~ns.svc.cluster.local";
    const ZONE: &str = "eu-west-1a";
    let mut fleet =
        Fleet::start(FleetOptions::control_plane_only(LIMITS).control_interval_ms(None))
            .await
            .unwrap();
    let node: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&format!("id: \"{NODE_ID}\"\nlocality: {{zone: {ZONE}}}")).unwrap();
    let envoy = EnvoySpec::demo("envoy-node", DataPlane::Wasm)
        .filter(serde_json::json!({"proxy_id": null}))
        .edit(move |config| {
            config
                .as_mapping_mut()
                .unwrap()
                .insert("node".into(), node.clone());
            Ok(())
        });
    let envoy = fleet.start_envoy(&envoy).await.unwrap();
    let (control_plane, envoy) = (&fleet.control_plane, &fleet.envoys[envoy]);
    let admin = control_plane.admin().clone();
    let connected = wait::until(
        "the Envoy to connect",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || {
            let admin = admin.clone();
            async move {
                let reply = admin.proxies().await?;
                Ok((reply.connected > 0).then_some(reply))
            }
        },
    )
    .await;
    if connected.is_err() {
        control_plane.print_log();
        envoy.print_log();
    }
    let seen: Vec<(String, String)> = connected
        .unwrap()
        .proxies
        .into_iter()
        .map(|proxy| (proxy.proxy_id, proxy.zone))
        .collect();
    assert_eq!(seen, [(NODE_ID.to_owned(), ZONE.to_owned())]);
    let log = std::fs::read_to_string(envoy.log_path()).unwrap();
    assert!(
        !log.contains("no proxy_id"),
        "an Envoy with a node id warned"
    );
}
