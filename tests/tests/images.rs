//! The images `just images` builds, through a real registry: built twice
//! they are the same bytes; pushed with skopeo to Debian's docker-registry
//! on loopback and pulled back by digest over the registry API, they have
//! the media types and layer contents Istio's fetcher accepts
//! (istio/istio `pkg/wasm/imagefetcher.go`: the last layer a
//! `tar+gzip` holding `plugin.wasm`, a module starting with `\0asm`, the
//! manifest digest as the WasmPlugin's `sha256`), and the control plane's
//! image runs its binary as a non-root user with nothing else in it.
//!
//! Under `just test` the control-plane image wraps the debug binary;
//! `just test-images` runs this test on `just images`'s static one and
//! also checks it is static (`SLUICE_IMAGE_STATIC=1`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value as Json;
use sluice_integration_tests::oci::{self, LAYER_MEDIA_TYPE, MANIFEST_MEDIA_TYPE};
use sluice_integration_tests::paths;
use sluice_integration_tests::registry::Registry;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The control-plane binary the image wraps: `SLUICE_IMAGE_BIN`, else the
/// debug build.
fn control_plane_binary() -> PathBuf {
    std::env::var_os("SLUICE_IMAGE_BIN")
        .map(|path| paths::from_root(PathBuf::from(path)).unwrap())
        .unwrap_or_else(|| paths::sluice_bin().unwrap())
}

fn expect_static() -> bool {
    std::env::var("SLUICE_IMAGE_STATIC").is_ok_and(|v| v == "1")
}

/// Runs the `images` binary into `out`; returns what it printed.
fn build_images(out: &Path, native: Option<&Path>) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_images"));
    command
        .arg("--wasm")
        .arg(paths::sluice_wasm().unwrap())
        .arg("--sluice")
        .arg(control_plane_binary())
        .arg("--out")
        .arg(out)
        .arg("--version")
        .arg(VERSION);
    if !expect_static() {
        command.arg("--allow-dynamic");
    }
    if let Some(native) = native {
        command.arg("--native").arg(native);
    }
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "images failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Every file under `dir`, by relative path.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut found = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(next) = stack.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let name = path.strip_prefix(dir).unwrap().display().to_string();
                found.insert(name, std::fs::read(&path).unwrap());
            }
        }
    }
    found
}

/// The digest printed for `artifact` (`sluice-filter`, `sluice`, …).
fn printed_digest(printed: &str, artifact: &str) -> String {
    printed
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{artifact}  ")))
        .unwrap_or_else(|| panic!("no digest printed for {artifact}:\n{printed}"))
        .trim()
        .to_owned()
}

/// Pulls `name@digest` and checks what every fetcher checks: the
/// manifest's media type and digest, then returns it with its layers.
async fn pull(registry: &Registry, name: &str, digest: &str) -> (Json, Vec<Vec<u8>>, Json) {
    let pulled = registry.manifest(name, digest).await.unwrap();
    assert_eq!(pulled.content_type, MANIFEST_MEDIA_TYPE, "{name}");
    assert_eq!(pulled.digest_header, digest, "{name}");
    assert_eq!(oci::digest(&pulled.bytes), digest, "{name}");
    let manifest: Json = serde_json::from_slice(&pulled.bytes).unwrap();
    assert_eq!(manifest["schemaVersion"], 2);
    assert_eq!(manifest["mediaType"], MANIFEST_MEDIA_TYPE);
    assert_eq!(manifest["config"]["mediaType"], oci::CONFIG_MEDIA_TYPE);
    let config_digest = manifest["config"]["digest"].as_str().unwrap();
    let config: Json =
        serde_json::from_slice(&registry.blob(name, config_digest).await.unwrap()).unwrap();
    let mut layers = Vec::new();
    for layer in manifest["layers"].as_array().unwrap() {
        assert_eq!(layer["mediaType"], LAYER_MEDIA_TYPE, "{name}");
        let blob = registry
            .blob(name, layer["digest"].as_str().unwrap())
            .await
            .unwrap();
        assert_eq!(blob.len() as u64, layer["size"].as_u64().unwrap());
        layers.push(blob);
    }
    for (key, value) in [
        ("org.opencontainers.image.source", oci::SOURCE),
        ("org.opencontainers.image.version", VERSION),
        ("org.opencontainers.image.licenses", oci::LICENSE),
    ] {
        assert_eq!(manifest["annotations"][key], value, "{name}: {key}");
        assert_eq!(config["config"]["Labels"][key], value, "{name}: {key}");
    }
    assert!(config.get("created").is_none(), "no timestamp: {config}");
    (manifest, layers, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_are_reproducible_and_round_trip_through_a_registry_by_digest() {
    let dir = tempfile::tempdir().unwrap();
    let native = paths::native_module().ok();
    let first = build_images(&dir.path().join("a"), native.as_deref());
    let second = build_images(&dir.path().join("b"), native.as_deref());
    assert_eq!(first, second.replace("/b/", "/a/"));
    let (a, b) = (files(&dir.path().join("a")), files(&dir.path().join("b")));
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "{first}"
    );
    for (name, bytes) in &a {
        assert!(bytes == &b[name], "{name} differs between two builds");
    }
    println!("{first}");

    let out = dir.path().join("a");
    let filter_digest = printed_digest(&first, "sluice-filter");
    let control_plane_digest = printed_digest(&first, "sluice");

    let registry = Registry::start(dir.path()).await.unwrap();
    registry
        .push(&out.join("sluice-filter"), VERSION, "sluice-filter")
        .unwrap();
    registry
        .push(&out.join("sluice"), VERSION, "sluice")
        .unwrap();
    // The registry names the pushed images by the digests printed.
    assert_eq!(
        registry.inspect_digest("sluice-filter", VERSION).unwrap(),
        filter_digest
    );
    assert_eq!(
        registry.inspect_digest("sluice", VERSION).unwrap(),
        control_plane_digest
    );

    // The filter, as Istio's fetcher reads it: the last layer's plugin.wasm.
    let wasm = std::fs::read(paths::sluice_wasm().unwrap()).unwrap();
    let (_, layers, _) = pull(&registry, "sluice-filter", &filter_digest).await;
    let last = layers.last().unwrap();
    let entries = oci::read_layer(last).unwrap();
    let plugin = &entries
        .get(oci::PLUGIN_FILE)
        .unwrap_or_else(|| panic!("no plugin.wasm in {:?}", entries.keys()))
        .2;
    assert!(plugin.starts_with(b"\0asm"));
    assert!(plugin == &wasm, "plugin.wasm is not the built module");

    // The control plane: the binary, a non-root user, no shell.
    let binary = std::fs::read(control_plane_binary()).unwrap();
    let (_, layers, config) = pull(&registry, "sluice", &control_plane_digest).await;
    assert_eq!(layers.len(), 1);
    let entries = oci::read_layer(&layers[0]).unwrap();
    let (mode, owner, bytes) = &entries[oci::SLUICE_PATH];
    assert_eq!((*mode, *owner), (0o755, 0));
    assert!(bytes == &binary, "the image's sluice is not the binary");
    for shell in ["bin/sh", "bin/bash", "usr/bin/sh", "bin/busybox"] {
        assert!(!entries.contains_key(shell), "{shell} in the image");
    }
    let user = config["config"]["User"].as_str().unwrap();
    assert!(
        !user.is_empty() && !user.starts_with("0") && user != "root",
        "User {user}"
    );
    assert_eq!(
        config["config"]["Entrypoint"][0],
        format!("/{}", oci::SLUICE_PATH)
    );
    if expect_static() {
        assert!(
            oci::is_static_elf(&binary),
            "the image's binary is not static"
        );
    }

    // The native module and its sha256, for Envoy Gateway's allow-list.
    if let Some(native) = native {
        let sum = std::fs::read_to_string(out.join("libsluice_native.so.sha256")).unwrap();
        let bytes = std::fs::read(native).unwrap();
        assert_eq!(
            sum,
            format!(
                "{}  libsluice_native.so\n",
                oci::digest(&bytes).trim_start_matches("sha256:")
            )
        );
    }
}
