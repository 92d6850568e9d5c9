//! Envoys with both layers of `envoy/quotas.yaml` (the Sluice filter, then
//! Envoy's `ratelimit` filter calling the control plane's rate limit
//! service).

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;

use crate::envoy::{self, Envoy, EnvoyOptions, Rewrite};

/// Starts an Envoy from `envoy/quotas.yaml` pointed at the control plane
/// at `grpc`, with the Sluice filter's `proxy_id`.
pub async fn start(grpc: SocketAddr, proxy_id: &str, dir: &Path) -> Result<Envoy> {
    let mut config = envoy::load_repo_config("quotas.yaml")?;
    let rewrite = Rewrite::for_test(grpc, json!({ "proxy_id": proxy_id }))?;
    envoy::rewrite(&mut config, &rewrite)?;
    Envoy::start(&config, &EnvoyOptions::new(proxy_id, dir))
        .await
        .with_context(|| format!("cannot start Envoy {proxy_id}"))
}
