//! Checks that keep deploy/ true: every manifest validates against the
//! Kubernetes API's schemas (the `kubernetes-validate` package) or its
//! CRD's schema (deploy/schemas/), strictly; every kustomization lists
//! files that exist and every manifest is in one; the limits ConfigMap
//! passes `sluice check-config`; every WasmPlugin's `pluginConfig` and
//! every EnvoyExtensionPolicy's wasm `config` passes the filter's own
//! validation, and its `dynamicModule` config the native module's; the
//! control plane's flags are flags `sluice serve` accepts.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use serde::Deserialize;
use serde_json::Value as Json;
use sluice_agent::config::FilterConfig;
use sluice_control_plane::cli::{Cli, Command as SluiceCommand};
use sluice_integration_tests::certs::{self, DevCerts};
use sluice_integration_tests::paths;
use sluice_native_filter::config::NativeConfig;

fn deploy_dir() -> PathBuf {
    paths::from_root("deploy").unwrap()
}

/// Every YAML file under deploy/, relative to it.
fn yaml_files() -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![deploy_dir()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                found.push(path.strip_prefix(deploy_dir()).unwrap().to_path_buf());
            }
        }
    }
    found.sort();
    found
}

/// Every document of every manifest (kustomizations left out), as JSON,
/// with the file it came from.
fn documents() -> Vec<(PathBuf, Json)> {
    let mut docs = Vec::new();
    for file in yaml_files() {
        if file.file_name().is_some_and(|n| n == "kustomization.yaml") {
            continue;
        }
        let text = std::fs::read_to_string(deploy_dir().join(&file)).unwrap();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let value = serde_yaml_ng::Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            if !value.is_null() {
                docs.push((file.clone(), serde_json::to_value(value).unwrap()));
            }
        }
    }
    docs
}

/// Runs scripts/validate-manifests.py on `paths`; returns (success, output).
fn validate(paths_to_check: &[&Path]) -> (bool, String) {
    let output = Command::new("python3")
        .arg(paths::from_root("scripts/validate-manifests.py").unwrap())
        .arg("--schemas")
        .arg(deploy_dir().join("schemas"))
        .args(paths_to_check)
        .env("PYTHONPATH", paths::kubernetes_validate().unwrap())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[test]
fn every_manifest_validates_against_its_schema() {
    let dirs: Vec<PathBuf> = [
        "base",
        "control-plane",
        "istio",
        "envoy-gateway",
        "examples",
    ]
    .iter()
    .map(|d| deploy_dir().join(d))
    .collect();
    let refs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
    let (ok, output) = validate(&refs);
    println!("{output}");
    assert!(ok, "{output}");
    let checked = documents().len();
    assert!(
        output.contains(&format!("{checked} passed")) || output.contains(" passed, 0 failed"),
        "{output}"
    );
    for kind in [
        "Deployment",
        "WasmPlugin",
        "EnvoyExtensionPolicy",
        "EnvoyProxy",
        "DestinationRule",
    ] {
        assert!(
            output.contains(&format!("({kind} ")),
            "no {kind} validated:\n{output}"
        );
    }
}

#[test]
fn the_validator_refuses_a_misspelt_field() {
    let dir = tempfile::tempdir().unwrap();
    let deployment = std::fs::read_to_string(deploy_dir().join("control-plane/deployment.yaml"))
        .unwrap()
        .replace("  replicas: 3", "  replica: 3");
    std::fs::write(dir.path().join("deployment.yaml"), deployment).unwrap();
    let plugin = std::fs::read_to_string(deploy_dir().join("istio/wasmplugin-sidecars.yaml"))
        .unwrap()
        .replace("  pluginConfig:", "  pluginConfg:");
    std::fs::write(dir.path().join("wasmplugin.yaml"), plugin).unwrap();
    let (ok, output) = validate(&[dir.path()]);
    assert!(!ok, "{output}");
    assert!(output.contains("replica"), "{output}");
    assert!(output.contains("pluginConfg"), "{output}");
}

#[test]
fn every_manifest_is_in_a_kustomization_that_lists_only_existing_files() {
    let mut listed = BTreeSet::new();
    for file in yaml_files() {
        if file.file_name().is_none_or(|n| n != "kustomization.yaml") {
            continue;
        }
        let dir = file.parent().unwrap().to_path_buf();
        let text = std::fs::read_to_string(deploy_dir().join(&file)).unwrap();
        let doc: Json =
            serde_json::to_value(serde_yaml_ng::from_str::<serde_yaml_ng::Value>(&text).unwrap())
                .unwrap();
        for entry in doc["resources"].as_array().unwrap() {
            let entry = entry.as_str().unwrap();
            let target = deploy_dir().join(&dir).join(entry);
            assert!(
                target.is_file() || target.join("kustomization.yaml").is_file(),
                "{}: {entry} does not exist",
                file.display()
            );
            listed.insert(dir.join(entry));
        }
    }
    for file in yaml_files() {
        if file.file_name().is_some_and(|n| n == "kustomization.yaml") {
            continue;
        }
        assert!(
            listed.contains(&file),
            "{} is in no kustomization.yaml",
            file.display()
        );
    }
}

#[test]
fn the_limits_configmap_passes_check_config() {
    let limits = sluice_integration_tests::sidecars::deploy_limits_yaml().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.yaml");
    std::fs::write(&path, limits).unwrap();
    let output = Command::new(paths::sluice_bin().unwrap())
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "sluice check-config refused the ConfigMap's limits.yaml: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn every_filter_configuration_passes_the_filters_validation() {
    let dir = tempfile::tempdir().unwrap();
    let certs = DevCerts::generate(dir.path()).unwrap();
    let mut checked = 0;
    for (file, doc) in documents() {
        let where_ = format!(
            "{} ({} {})",
            file.display(),
            doc["kind"],
            doc["metadata"]["name"]
        );
        match doc["kind"].as_str().unwrap() {
            "WasmPlugin" => {
                let config = serde_json::to_vec(&doc["spec"]["pluginConfig"]).unwrap();
                FilterConfig::from_json(&config).unwrap_or_else(|e| panic!("{where_}: {e}"));
                checked += 1;
            }
            "EnvoyExtensionPolicy" => {
                for wasm in doc["spec"]["wasm"].as_array().into_iter().flatten() {
                    let config = serde_json::to_vec(&wasm["config"]).unwrap();
                    FilterConfig::from_json(&config).unwrap_or_else(|e| panic!("{where_}: {e}"));
                    checked += 1;
                }
                for module in doc["spec"]["dynamicModule"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    let mut config = module["config"].clone();
                    // The module reads its TLS files when Envoy loads the
                    // configuration: the same fields, pointed at real files.
                    if let Some(tls) = config.get_mut("control_plane_tls") {
                        for (field, name) in [
                            ("ca_file", certs::CA),
                            ("cert_file", certs::CLIENT_CERT),
                            ("key_file", certs::CLIENT_KEY),
                        ] {
                            if tls.get(field).is_some() {
                                tls[field] = Json::String(certs.path(name).display().to_string());
                            }
                        }
                    }
                    let bytes = serde_json::to_vec(&config).unwrap();
                    NativeConfig::parse(&bytes).unwrap_or_else(|e| panic!("{where_}: {e}"));
                    checked += 1;
                }
            }
            _ => {}
        }
    }
    // Three WasmPlugins, one native and two wasm Envoy Gateway extensions
    // (the Gateway's and the LLM route's).
    assert_eq!(checked, 6);
}

#[test]
fn a_bad_plugin_config_is_caught() {
    let config = br#"{"control_plane_cluster": "x", "report_interval_ms": 1}"#;
    assert!(FilterConfig::from_json(config).is_err());
}

/// The arguments of the container running the control plane, with
/// Kubernetes' `$(VAR)` references filled in.
fn serve_args(doc: &Json) -> Option<Vec<String>> {
    let containers = doc["spec"]["template"]["spec"]["containers"].as_array()?;
    let container = containers.iter().find(|c| c["name"] == "sluice")?;
    let args = container["args"].as_array()?;
    Some(
        args.iter()
            .map(|a| {
                a.as_str()
                    .unwrap()
                    .replace("$(POD_NAME)", "sluice-7f9c-abcde")
            })
            .collect(),
    )
}

#[test]
fn the_control_planes_flags_are_flags_sluice_serve_accepts() {
    let mut deployments = 0;
    for (file, doc) in documents() {
        if doc["kind"] != "Deployment" {
            continue;
        }
        let args =
            serve_args(&doc).unwrap_or_else(|| panic!("{}: no sluice container", file.display()));
        let argv = std::iter::once("sluice".to_owned()).chain(args.clone());
        let cli = Cli::try_parse_from(argv)
            .unwrap_or_else(|e| panic!("{}: sluice refuses {args:?}:\n{e}", file.display()));
        assert!(
            matches!(cli.command, SluiceCommand::Serve(_)),
            "{}: not `sluice serve`",
            file.display()
        );
        deployments += 1;
    }
    assert_eq!(deployments, 2, "the plain and the Istio Deployment");
    // The check can fail: a misspelt flag is refused.
    assert!(
        Cli::try_parse_from(["sluice", "serve", "--config=x", "--grpc-listn=0.0.0.0:1"]).is_err()
    );
}
