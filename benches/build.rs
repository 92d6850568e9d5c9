//! Compiles the wire-compatible subset of Envoy's rate limit service API
//! (`proto/envoy/...`) into OUT_DIR without a system `protoc`, for the
//! end-to-end benchmark's stand-in rate limit service.

use std::error::Error;
use std::path::PathBuf;

const PROTOS: [&str; 2] = [
    "proto/envoy/service/ratelimit/v3/rls.proto",
    "proto/envoy/extensions/common/ratelimit/v3/ratelimit.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .out_dir(out_dir)
        .compile_fds(descriptors)?;
    Ok(())
}
