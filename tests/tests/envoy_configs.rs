//! Every Envoy config in `envoy/` passes `envoy --mode validate` (with the
//! `.wasm` path made absolute, so the check does not depend on the working
//! directory), and the demo configs are laid out as the README documents.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use sluice_integration_tests::certs::{self, DevCerts};
use sluice_integration_tests::envoy::{self, CONTROL_PLANE_CLUSTER, Rewrite};
use sluice_integration_tests::paths;

fn repo_configs() -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(paths::envoy_config_dir().unwrap())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.extension()
                .is_some_and(|ext| ext == "yaml" || ext == "yml")
        })
        .collect();
    files.sort();
    files
}

#[tokio::test]
async fn every_envoy_config_validates() {
    let files = repo_configs();
    assert!(
        files.len() >= 2,
        "expected at least demo-a.yaml and demo-b.yaml, found {files:?}"
    );
    let wasm = paths::sluice_wasm().unwrap();
    // Configs with TLS name certificates under .demo/certs/ (made by
    // `just certs`); validate them against a fresh set instead.
    let cert_dir = tempfile::tempdir().unwrap();
    let certs = DevCerts::generate(cert_dir.path()).unwrap();
    let mut failures = Vec::new();
    for file in &files {
        let mut config = envoy::load_config(file).unwrap();
        certs::point_config_at(&mut config, &certs);
        // Configs without the Sluice filter (envoy/rlqs.yaml) load no wasm.
        let has_wasm = !envoy::plugin_configurations(&config)
            .unwrap_or_default()
            .is_empty();
        let rewrite = Rewrite {
            wasm: has_wasm.then(|| wasm.clone()),
            ..Rewrite::default()
        };
        envoy::rewrite(&mut config, &rewrite).unwrap();
        if let Err(err) = envoy::validate(&config).await {
            failures.push(format!("{}: {err:#}", file.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "invalid Envoy configs:\n{}",
        failures.join("\n")
    );
}

#[tokio::test]
async fn a_broken_config_fails_validation() {
    // Guards against a validate() that always succeeds.
    let mut config = envoy::load_repo_config("demo-a.yaml").unwrap();
    let rewrite = Rewrite {
        wasm: Some(paths::sluice_wasm().unwrap()),
        ..Rewrite::default()
    };
    envoy::rewrite(&mut config, &rewrite).unwrap();
    config["static_resources"]["clusters"][0]["type"] = "NOT_A_TYPE".into();
    assert!(envoy::validate(&config).await.is_err());
}

#[test]
fn demo_configs_follow_the_documented_layout() {
    for (file, proxy_id, listener, admin) in [
        ("demo-a.yaml", "demo-a", 10000, 9901),
        ("demo-b.yaml", "demo-b", 10001, 9902),
    ] {
        let config = envoy::load_repo_config(file).unwrap();
        let port = |v: &serde_yaml_ng::Value| v["socket_address"]["port_value"].as_u64();
        assert_eq!(port(&config["admin"]["address"]), Some(admin), "{file}");
        assert_eq!(
            config["admin"]["address"]["socket_address"]["address"].as_str(),
            Some("127.0.0.1")
        );
        let listeners = &config["static_resources"]["listeners"];
        assert_eq!(port(&listeners[0]["address"]), Some(listener), "{file}");
        let cluster = &config["static_resources"]["clusters"][0];
        assert_eq!(cluster["name"].as_str(), Some(CONTROL_PLANE_CLUSTER));
        let endpoint =
            &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"];
        assert_eq!(port(endpoint), Some(50051), "{file}");
        let protocol = &cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
        assert!(
            protocol["explicit_http_config"]["http2_protocol_options"].is_mapping(),
            "{file}: the control-plane cluster must speak HTTP/2"
        );

        let hcm = &listeners[0]["filter_chains"][0]["filters"][0]["typed_config"];
        let filters = hcm["http_filters"].as_sequence().unwrap();
        assert_eq!(
            filters[0]["name"].as_str(),
            Some("envoy.filters.http.wasm"),
            "{file}"
        );
        assert_eq!(
            filters.last().unwrap()["name"].as_str(),
            Some("envoy.filters.http.router")
        );
        let plugin = &filters[0]["typed_config"]["config"];
        assert_eq!(
            plugin["failure_policy"].as_str(),
            Some("FAIL_RELOAD"),
            "{file}"
        );
        assert_eq!(plugin["vm_config"]["vm_id"].as_str(), Some("sluice"));
        assert_eq!(
            plugin["vm_config"]["runtime"].as_str(),
            Some("envoy.wasm.runtime.v8")
        );
        assert_eq!(
            plugin["vm_config"]["code"]["local"]["filename"].as_str(),
            Some(paths::DEFAULT_WASM),
            "{file}: the demo loads the wasm relative to the repo root"
        );

        let json = &envoy::plugin_configurations(&config).unwrap()[0];
        assert_eq!(json["proxy_id"], proxy_id);
        assert_eq!(json["control_plane_cluster"], CONTROL_PLANE_CLUSTER);
        assert_eq!(
            json["bucket_key"],
            serde_json::json!([{"source": "header", "name": "x-tenant", "default": "anonymous"}])
        );
    }
}
