//! `just certs`: writes a throw-away CA, a control-plane certificate and a
//! proxy client certificate (PEM) for `envoy/demo-mtls.yaml` to a directory
//! (default `.demo/certs`). For demos and tests only.

use std::path::PathBuf;

use sluice_integration_tests::certs::DevCerts;

fn main() -> anyhow::Result<()> {
    let dir = std::env::args_os()
        .nth(1)
        .map_or_else(|| PathBuf::from(".demo/certs"), PathBuf::from);
    let certs = DevCerts::generate(&dir)?;
    println!("wrote test certificates to {}", certs.dir().display());
    println!("serve with: sluice serve {}", certs.serve_args().join(" "));
    Ok(())
}
