//! OCI images built without a container runtime, the same bytes from the
//! same inputs: tar entries in a fixed order with fixed owners, modes and
//! mtimes, gzip without a name or timestamp, JSON with sorted keys and no
//! creation time. `just images` writes them as OCI image layouts
//! (`oci-layout`, `index.json`, `blobs/sha256/…`), which `skopeo copy
//! oci:DIR docker://REGISTRY/NAME` pushes.
//!
//! - The filter: one `tar+gzip` layer holding `plugin.wasm`, the layout the
//!   Istio agent's fetcher accepts as an OCI image (the last layer a
//!   tar.gz with `plugin.wasm`; istio/istio `pkg/wasm/imagefetcher.go`)
//!   and Envoy Gateway's `code.type: Image` fetches alike. Istio checks a
//!   WasmPlugin's `sha256` against the manifest digest for `oci://` URLs.
//! - The control plane: one layer with the static `sluice` binary, run as
//!   user 65532 (no shell, nothing else in the image), with OCI
//!   annotations (source, version, licence) on the manifest and as labels.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail};
use flate2::Compression;
use flate2::write::GzEncoder;
use serde_json::{Value as Json, json};
use sha2::{Digest, Sha256};

/// `application/vnd.oci.image.manifest.v1+json`.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// `application/vnd.oci.image.index.v1+json`.
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
/// `application/vnd.oci.image.config.v1+json`.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
/// `application/vnd.oci.image.layer.v1.tar+gzip`: the layer type Istio's
/// fetcher takes `plugin.wasm` from.
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The file Istio's and Envoy Gateway's fetchers look for in the layer.
pub const PLUGIN_FILE: &str = "plugin.wasm";
/// Where the control plane's binary is in its image.
pub const SLUICE_PATH: &str = "usr/local/bin/sluice";
/// The control plane image's user and group: not root, no login.
pub const NONROOT: u64 = 65532;
/// The source repository, in the images' annotations.
pub const SOURCE: &str = "https://github.com/sluice-rs/sluice";
/// The licence, in the images' annotations.
pub const LICENSE: &str = "Apache-2.0";

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A blob of an image: its bytes, media type and digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// The media type a descriptor gives it.
    pub media_type: String,
    /// The bytes.
    pub bytes: Vec<u8>,
}

impl Blob {
    /// A blob of `media_type`.
    pub fn new(media_type: &str, bytes: Vec<u8>) -> Self {
        Self {
            media_type: media_type.to_owned(),
            bytes,
        }
    }

    /// `sha256:<hex>`.
    pub fn digest(&self) -> String {
        digest(&self.bytes)
    }

    /// Its OCI descriptor.
    pub fn descriptor(&self) -> Json {
        json!({
            "mediaType": self.media_type,
            "digest": self.digest(),
            "size": self.bytes.len(),
        })
    }
}

/// One file or directory of a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Relative path, no leading `/`; directories end with `/`.
    pub path: String,
    /// Unix permission bits.
    pub mode: u32,
    /// Owner and group.
    pub owner: u64,
    /// The file's bytes (empty for a directory).
    pub bytes: Vec<u8>,
}

impl Entry {
    /// A root-owned directory.
    pub fn dir(path: &str) -> Self {
        Self {
            path: format!("{}/", path.trim_end_matches('/')),
            mode: 0o755,
            owner: 0,
            bytes: Vec::new(),
        }
    }

    /// A root-owned file.
    pub fn file(path: &str, mode: u32, bytes: Vec<u8>) -> Self {
        Self {
            path: path.to_owned(),
            mode,
            owner: 0,
            bytes,
        }
    }
}

/// A layer: its compressed blob and the digest of the uncompressed tar
/// (the config's `diff_id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// The `tar+gzip` blob.
    pub blob: Blob,
    /// `sha256:<hex>` of the tar.
    pub diff_id: String,
}

/// A reproducible `tar+gzip` layer of `entries` (sorted by path; mtime 0;
/// numeric owners only).
pub fn layer(mut entries: Vec<Entry>) -> Result<Layer> {
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    let mut builder = tar::Builder::new(Vec::new());
    builder.mode(tar::HeaderMode::Deterministic);
    for entry in &entries {
        let mut header = tar::Header::new_ustar();
        let is_dir = entry.path.ends_with('/');
        header.set_entry_type(if is_dir {
            tar::EntryType::Directory
        } else {
            tar::EntryType::Regular
        });
        header.set_mode(entry.mode);
        header.set_uid(entry.owner);
        header.set_gid(entry.owner);
        header.set_mtime(0);
        header.set_size(entry.bytes.len() as u64);
        builder
            .append_data(&mut header, &entry.path, entry.bytes.as_slice())
            .with_context(|| format!("cannot add {} to the layer", entry.path))?;
    }
    let tar = builder.into_inner().context("cannot finish the tar")?;
    let diff_id = digest(&tar);
    // No file name, mtime 0, OS "unknown": the same tar gives the same gzip.
    let mut gzip = flate2::GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::new(), Compression::default());
    gzip.write_all(&tar).context("cannot compress the layer")?;
    let compressed: Vec<u8> = GzEncoder::finish(gzip).context("cannot compress the layer")?;
    Ok(Layer {
        blob: Blob::new(LAYER_MEDIA_TYPE, compressed),
        diff_id,
    })
}

/// Serializes JSON with sorted keys and no whitespace.
fn canonical(value: &Json) -> Result<Vec<u8>> {
    // serde_json's maps are sorted (no `preserve_order`), so this is stable.
    serde_json::to_vec(value).context("cannot serialize JSON")
}

/// A built image: its manifest, config and layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The image manifest blob.
    pub manifest: Blob,
    /// The config blob.
    pub config: Blob,
    /// The layers, in order.
    pub layers: Vec<Layer>,
}

impl Image {
    /// The manifest digest: what a registry, `@sha256:` references and
    /// Istio's WasmPlugin `sha256` name.
    pub fn digest(&self) -> String {
        self.manifest.digest()
    }

    /// Writes the image as an OCI image layout in `dir` (replacing one),
    /// tagged `tag`.
    pub fn write_layout(&self, dir: &Path, tag: &str) -> Result<()> {
        if dir.exists() {
            std::fs::remove_dir_all(dir)
                .with_context(|| format!("cannot remove {}", dir.display()))?;
        }
        let blobs = dir.join("blobs").join("sha256");
        std::fs::create_dir_all(&blobs)
            .with_context(|| format!("cannot create {}", blobs.display()))?;
        let all = std::iter::once(&self.manifest)
            .chain(std::iter::once(&self.config))
            .chain(self.layers.iter().map(|layer| &layer.blob));
        for blob in all {
            let name = blob.digest().trim_start_matches("sha256:").to_owned();
            std::fs::write(blobs.join(name), &blob.bytes).context("cannot write a blob")?;
        }
        std::fs::write(
            dir.join("oci-layout"),
            canonical(&json!({"imageLayoutVersion": "1.0.0"}))?,
        )
        .context("cannot write oci-layout")?;
        let mut descriptor = self.manifest.descriptor();
        if let Some(fields) = descriptor.as_object_mut() {
            fields.insert(
                "annotations".into(),
                json!({"org.opencontainers.image.ref.name": tag}),
            );
        }
        let index = json!({
            "schemaVersion": 2,
            "mediaType": INDEX_MEDIA_TYPE,
            "manifests": [descriptor],
        });
        std::fs::write(dir.join("index.json"), canonical(&index)?)
            .context("cannot write index.json")?;
        Ok(())
    }
}

/// The annotations of every image: where it comes from, its version and
/// licence.
pub fn annotations(title: &str, description: &str, version: &str) -> BTreeMap<String, String> {
    [
        ("org.opencontainers.image.title", title),
        ("org.opencontainers.image.description", description),
        ("org.opencontainers.image.version", version),
        ("org.opencontainers.image.source", SOURCE),
        ("org.opencontainers.image.url", SOURCE),
        ("org.opencontainers.image.licenses", LICENSE),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

fn image(
    layers: Vec<Layer>,
    runtime: Json,
    annotations: &BTreeMap<String, String>,
) -> Result<Image> {
    let diff_ids: Vec<&str> = layers.iter().map(|l| l.diff_id.as_str()).collect();
    let mut runtime = runtime;
    if let Some(fields) = runtime.as_object_mut() {
        fields.insert("Labels".into(), json!(annotations));
    }
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": runtime,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": "just images", "comment": "built without a container runtime"}],
    });
    let config = Blob::new(CONFIG_MEDIA_TYPE, canonical(&config)?);
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": config.descriptor(),
        "layers": layers.iter().map(|l| l.blob.descriptor()).collect::<Vec<_>>(),
        "annotations": annotations,
    });
    Ok(Image {
        manifest: Blob::new(MANIFEST_MEDIA_TYPE, canonical(&manifest)?),
        config,
        layers,
    })
}

/// The filter's image: `plugin.wasm` in one layer.
pub fn filter_image(wasm: &[u8], version: &str) -> Result<Image> {
    if !wasm.starts_with(b"\0asm") {
        bail!("the filter module does not start with \\0asm");
    }
    let layer = layer(vec![Entry::file(PLUGIN_FILE, 0o644, wasm.to_vec())])?;
    image(
        vec![layer],
        json!({}),
        &annotations(
            "sluice-filter",
            "Sluice's proxy-wasm filter for Envoy, Istio (WasmPlugin) and Envoy Gateway",
            version,
        ),
    )
}

/// The control plane's image: the `sluice` binary, run as a non-root
/// user, nothing else.
pub fn control_plane_image(binary: &[u8], version: &str) -> Result<Image> {
    if !binary.starts_with(b"\x7fELF") {
        bail!("the control plane binary is not an ELF executable");
    }
    let owner = format!("{NONROOT}");
    let passwd = format!("nonroot:x:{owner}:{owner}:nonroot:/:/sbin/nologin\n");
    let group = format!("nonroot:x:{owner}:\n");
    let layer = layer(vec![
        Entry::dir("etc"),
        Entry::file("etc/passwd", 0o644, passwd.into_bytes()),
        Entry::file("etc/group", 0o644, group.into_bytes()),
        Entry::dir("usr"),
        Entry::dir("usr/local"),
        Entry::dir("usr/local/bin"),
        Entry::file(SLUICE_PATH, 0o755, binary.to_vec()),
    ])?;
    image(
        vec![layer],
        json!({
            "User": format!("{NONROOT}:{NONROOT}"),
            "Entrypoint": [format!("/{SLUICE_PATH}")],
            "Cmd": ["serve", "--config", "/etc/sluice/limits/limits.yaml"],
            "WorkingDir": "/",
            "Env": ["PATH=/usr/local/bin"],
            "ExposedPorts": {"50051/tcp": {}, "8080/tcp": {}},
        }),
        &annotations(
            "sluice",
            "Sluice's control plane: fleet-wide rate limits for Envoy",
            version,
        ),
    )
}

/// Whether `elf` is a statically linked executable: an x86-64 ELF with no
/// program interpreter (`PT_INTERP`), so it runs in an image without a
/// C library.
pub fn is_static_elf(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let read_u16 = |at: usize| {
        elf.get(at..at + 2)
            .and_then(|b| b.try_into().ok())
            .map(u16::from_le_bytes)
    };
    let read_u32 = |at: usize| {
        elf.get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
    };
    let read_u64 = |at: usize| {
        elf.get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    // 64-bit, little-endian ELF only.
    if !elf.starts_with(b"\x7fELF\x02\x01") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) =
        (read_u64(0x20), read_u16(0x36), read_u16(0x38))
    else {
        return false;
    };
    let Ok(phoff) = usize::try_from(phoff) else {
        return false;
    };
    (0..usize::from(phnum))
        .all(|i| read_u32(phoff + i * usize::from(phentsize)).is_some_and(|kind| kind != PT_INTERP))
}

/// A layer's files: path to (mode, owner, bytes).
pub type LayerFiles = BTreeMap<String, (u32, u64, Vec<u8>)>;

/// The file entries of a `tar+gzip` layer.
pub fn read_layer(compressed: &[u8]) -> Result<LayerFiles> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(compressed));
    let mut files = BTreeMap::new();
    for entry in archive.entries().context("the layer is not a tar.gz")? {
        let mut entry = entry.context("a bad tar entry")?;
        let path = entry
            .path()
            .context("a bad tar path")?
            .display()
            .to_string();
        let mode = entry.header().mode().context("a bad mode")?;
        let owner = entry.header().uid().context("a bad uid")?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut bytes).context("cannot read an entry")?;
        files.insert(path, (mode, owner, bytes));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WASM: &[u8] = b"\0asm\x01\0\0\0";

    #[test]
    fn the_same_inputs_give_the_same_bytes() {
        let a = filter_image(WASM, "1.2.3").unwrap();
        let b = filter_image(WASM, "1.2.3").unwrap();
        assert_eq!(a, b);
        let c = filter_image(b"\0asm\x01\0\0\x01", "1.2.3").unwrap();
        assert_ne!(a.digest(), c.digest());
    }

    #[test]
    fn the_filter_layer_holds_plugin_wasm_alone() {
        let image = filter_image(WASM, "1.2.3").unwrap();
        assert_eq!(image.layers.len(), 1);
        let files = read_layer(&image.layers[0].blob.bytes).unwrap();
        assert_eq!(files.keys().collect::<Vec<_>>(), [PLUGIN_FILE]);
        assert_eq!(files[PLUGIN_FILE].2, WASM);
    }

    #[test]
    fn a_layout_is_written_with_every_blob() {
        let dir = tempfile::tempdir().unwrap();
        let image = control_plane_image(b"\x7fELF....", "1.2.3").unwrap();
        image.write_layout(dir.path(), "1.2.3").unwrap();
        let index: Json =
            serde_json::from_slice(&std::fs::read(dir.path().join("index.json")).unwrap()).unwrap();
        assert_eq!(index["manifests"][0]["digest"], image.digest());
        for blob in [&image.manifest, &image.config, &image.layers[0].blob] {
            let name = blob.digest().replace("sha256:", "");
            let bytes = std::fs::read(dir.path().join("blobs/sha256").join(name)).unwrap();
            assert_eq!(digest(&bytes), blob.digest());
        }
    }

    #[test]
    fn a_dynamic_executable_is_not_static() {
        let this = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(
            !is_static_elf(&this),
            "the test binary links glibc dynamically"
        );
        assert!(!is_static_elf(b"\x7fELF"));
    }

    #[test]
    fn bad_inputs_are_refused() {
        assert!(filter_image(b"not wasm", "1").is_err());
        assert!(control_plane_image(b"#!/bin/sh", "1").is_err());
    }
}
