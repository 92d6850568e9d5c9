//! Envoys with both layers of `envoy/quotas.yaml` (the Sluice filter, then
//! Envoy's `ratelimit` filter calling the control plane's rate limit
//! service).

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;

use crate::control_plane::ControlPlane;
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

/// Where the quotas' counters live.
#[derive(Debug, Clone, Copy)]
pub enum Store<'a> {
    /// In the control plane's memory (no `--store`).
    Memory,
    /// In the Redis server at this URL (`--store URL`).
    Redis(&'a str),
}

/// Starts the control plane with `options` (limits file, interval) and
/// the quota configuration `quotas_yaml` (one domain, written to
/// `dir/quotas/api.yaml`), with `--quota-algorithm algorithm` when given,
/// its counters in `store`.
pub async fn control_plane(
    dir: &Path,
    options: crate::control_plane::ControlPlaneOptions,
    quotas_yaml: &str,
    algorithm: Option<&str>,
    store: Store<'_>,
) -> Result<ControlPlane> {
    let quota_dir = dir.join("quotas");
    std::fs::create_dir_all(&quota_dir)
        .with_context(|| format!("cannot create {}", quota_dir.display()))?;
    let file = quota_dir.join("api.yaml");
    std::fs::write(&file, quotas_yaml)
        .with_context(|| format!("cannot write {}", file.display()))?;
    let mut args = vec!["--quotas".to_owned(), quota_dir.display().to_string()];
    if let Some(algorithm) = algorithm {
        args.extend(["--quota-algorithm".to_owned(), algorithm.to_owned()]);
    }
    if let Store::Redis(url) = store {
        args.extend(["--store".to_owned(), url.to_owned()]);
    }
    ControlPlane::start(options.args(args)).await
}
