//! `just images`: the three release artifacts, built without a container
//! runtime and the same bytes from the same sources ([`oci`]):
//!
//! - `OUT/sluice-filter/`: the wasm filter as an OCI image layout (the
//!   layer Istio's and Envoy Gateway's fetchers read `plugin.wasm` from);
//! - `OUT/sluice/`: the control plane as an OCI image layout (the static
//!   binary, a non-root user, no shell);
//! - `OUT/libsluice_native.so` and `OUT/libsluice_native.so.sha256`: the
//!   native module for Envoy Gateway's dynamic-module allow-list.
//!
//! Prints each digest and how to push it.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Parser;
use sluice_integration_tests::oci;

/// Build the images.
#[derive(Debug, Parser)]
struct Args {
    /// The filter module (`just build-wasm`).
    #[arg(long)]
    wasm: PathBuf,
    /// The control-plane binary: static (musl) for the image.
    #[arg(long)]
    sluice: PathBuf,
    /// The native module (`just build-native`); none: no native artifact.
    #[arg(long)]
    native: Option<PathBuf>,
    /// Where to write them.
    #[arg(long, default_value = "target/images")]
    out: PathBuf,
    /// The version in the tags and annotations.
    #[arg(long, default_value = env!("CARGO_PKG_VERSION"))]
    version: String,
    /// Accept a dynamically linked control-plane binary (tests only: it
    /// would not run in the image).
    #[arg(long)]
    allow_dynamic: bool,
}

fn read(path: &PathBuf) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

fn main() -> Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;

    let filter = oci::filter_image(&read(&args.wasm)?, &args.version)?;
    let filter_dir = args.out.join("sluice-filter");
    filter.write_layout(&filter_dir, &args.version)?;

    let binary = read(&args.sluice)?;
    if !args.allow_dynamic && !oci::is_static_elf(&binary) {
        bail!(
            "{} is dynamically linked; the image has no C library (build it for x86_64-unknown-linux-musl)",
            args.sluice.display()
        );
    }
    let control_plane = oci::control_plane_image(&binary, &args.version)?;
    let control_plane_dir = args.out.join("sluice");
    control_plane.write_layout(&control_plane_dir, &args.version)?;

    let version = &args.version;
    println!("sluice-filter  {}", filter.digest());
    println!("  OCI layout: {}", filter_dir.display());
    println!(
        "  WasmPlugin / EnvoyExtensionPolicy sha256: {}",
        filter.digest().trim_start_matches("sha256:")
    );
    println!(
        "  push: skopeo copy oci:{}:{version} docker://REGISTRY/sluice-filter:{version}",
        filter_dir.display()
    );
    println!("sluice  {}", control_plane.digest());
    println!("  OCI layout: {}", control_plane_dir.display());
    println!(
        "  push: skopeo copy oci:{}:{version} docker://REGISTRY/sluice:{version}",
        control_plane_dir.display()
    );

    if let Some(native) = &args.native {
        let bytes = read(native)?;
        let target = args.out.join("libsluice_native.so");
        std::fs::write(&target, &bytes)
            .with_context(|| format!("cannot write {}", target.display()))?;
        let sum = oci::digest(&bytes);
        let hex = sum.trim_start_matches("sha256:");
        std::fs::write(
            args.out.join("libsluice_native.so.sha256"),
            format!("{hex}  libsluice_native.so\n"),
        )
        .context("cannot write the native module's sha256")?;
        println!("libsluice_native.so  {sum}");
        println!("  file: {}", target.display());
        println!("  EnvoyProxy dynamicModules[].source.remote.sha256: {hex}");
    }
    Ok(())
}
