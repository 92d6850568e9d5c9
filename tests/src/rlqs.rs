//! Envoys that use their own `rate_limit_quota` filter with the control
//! plane as RLQS server: `envoy/rlqs.yaml` pointed at a control plane.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context, Result};
use serde_yaml_ng::Value;

use crate::envoy::{self, Envoy, EnvoyOptions, Rewrite};

/// `envoy/rlqs.yaml` with ephemeral ports, the control plane at `grpc`,
/// `proxy_id` sent as the stream's `x-sluice-proxy-id`, and the fallback
/// for expired assignments at `fallback_rps` per bucket id.
pub fn config(grpc: SocketAddr, proxy_id: &str, fallback_rps: u32) -> Result<Value> {
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
    let mut fallbacks = 0;
    envoy::visit_mappings(&mut config, &mut |mapping| {
        if let Some(bucket) = mapping
            .get_mut("fallback_rate_limit")
            .and_then(|f| f.get_mut("token_bucket"))
            .and_then(Value::as_mapping_mut)
        {
            bucket.insert("tokens_per_fill".into(), fallback_rps.into());
            fallbacks += 1;
        }
    });
    anyhow::ensure!(
        fallbacks == 1,
        "rlqs.yaml has one fallback token bucket, found {fallbacks}"
    );
    Ok(config)
}

/// The fallback of [`start`]: generous enough never to bind in a test that
/// does not stop the control plane.
pub const DEFAULT_FALLBACK_RPS: u32 = 10_000;

/// Starts an RLQS Envoy named `name` (two workers) with `proxy_id`.
pub async fn start(grpc: SocketAddr, proxy_id: &str, name: &str, dir: &Path) -> Result<Envoy> {
    start_with_fallback(grpc, proxy_id, name, dir, DEFAULT_FALLBACK_RPS).await
}

/// [`start`] with the fallback for expired assignments at `fallback_rps`.
pub async fn start_with_fallback(
    grpc: SocketAddr,
    proxy_id: &str,
    name: &str,
    dir: &Path,
    fallback_rps: u32,
) -> Result<Envoy> {
    let config = config(grpc, proxy_id, fallback_rps)?;
    let mut options = EnvoyOptions::new(name, dir);
    if let Ok(level) = std::env::var("SLUICE_RLQS_ENVOY_LOG") {
        options.log_level = level;
    }
    Envoy::start(&config, &options)
        .await
        .with_context(|| format!("cannot start RLQS Envoy {name}"))
}
