//! Envoys that use their own `rate_limit_quota` filter with the control
//! plane as RLQS server: `envoy/rlqs.yaml` pointed at a control plane.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context, Result};
use serde_yaml_ng::Value;

use crate::envoy::{self, Envoy, EnvoyOptions, Rewrite};

/// `envoy/rlqs.yaml` with ephemeral ports, the control plane at `grpc`,
/// and `proxy_id` sent as the stream's `x-sluice-proxy-id`.
pub fn config(grpc: SocketAddr, proxy_id: &str) -> Result<Value> {
    let mut config = envoy::load_repo_config("rlqs.yaml")?;
    let rewrite = Rewrite {
        ephemeral_ports: true,
        control_plane: Some(grpc),
        ..Rewrite::default()
    };
    envoy::rewrite(&mut config, &rewrite)?;
    let mut named = 0;
    envoy::visit_mappings(&mut config, &mut |mapping| {
        if mapping.get("key").and_then(Value::as_str) == Some("x-sluice-proxy-id") {
            mapping.insert("value".into(), proxy_id.into());
            named += 1;
        }
    });
    anyhow::ensure!(
        named == 1,
        "rlqs.yaml names x-sluice-proxy-id once, found {named}"
    );
    Ok(config)
}

/// Starts an RLQS Envoy named `name` (two workers) with `proxy_id`.
pub async fn start(grpc: SocketAddr, proxy_id: &str, name: &str, dir: &Path) -> Result<Envoy> {
    let config = config(grpc, proxy_id)?;
    Envoy::start(&config, &EnvoyOptions::new(name, dir))
        .await
        .with_context(|| format!("cannot start RLQS Envoy {name}"))
}
