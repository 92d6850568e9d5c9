//! Compiles `sluice/v1/sluice.proto` into OUT_DIR without a system `protoc`:
//! `protox` parses the file in pure Rust and hands prost a descriptor set.

use std::error::Error;
use std::path::{Path, PathBuf};

use prost_types::FileDescriptorSet;

const PROTO: &str = "sluice/v1/sluice.proto";

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed={PROTO}");
    let descriptors = protox::compile([PROTO], ["."])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    compile(descriptors, &out_dir)
}

/// Messages and the tonic service, for the control plane.
#[cfg(feature = "grpc")]
fn compile(descriptors: FileDescriptorSet, out_dir: &Path) -> Result<(), Box<dyn Error>> {
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .out_dir(out_dir)
        .compile_fds(descriptors)?;
    Ok(())
}

/// Messages only, for the filter.
#[cfg(not(feature = "grpc"))]
fn compile(descriptors: FileDescriptorSet, out_dir: &Path) -> Result<(), Box<dyn Error>> {
    prost_build::Config::new()
        .out_dir(out_dir)
        .compile_fds(descriptors)?;
    Ok(())
}
