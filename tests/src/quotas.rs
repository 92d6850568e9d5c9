//! Exact quotas: Envoys with both layers of `envoy/quotas.yaml` (the Sluice
//! filter, then Envoy's `ratelimit` filter calling the control plane's rate
//! limit service), control planes serving a quota directory, and a client
//! of the rate limit service.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;

use crate::control_plane::{ControlPlane, ControlPlaneOptions};
use crate::envoy::Envoy;
use crate::fleet::{ControlPlaneTarget, EnvoySpec};

/// `OK` on the wire.
pub const OK: i32 = 1;
/// `OVER_LIMIT` on the wire.
pub const OVER_LIMIT: i32 = 2;

/// An Envoy from `envoy/quotas.yaml`, named and with the Sluice filter's
/// `proxy_id` as `proxy_id`.
pub fn envoy(proxy_id: &str) -> EnvoySpec {
    EnvoySpec::repo(proxy_id, "quotas.yaml").proxy_id(proxy_id)
}

/// Starts [`envoy`] pointed at the control plane at `grpc`.
pub async fn start(grpc: SocketAddr, proxy_id: &str, dir: &Path) -> Result<Envoy> {
    start_with(grpc, proxy_id, dir, |_| Ok(())).await
}

/// As [`start`], with `edit` applied to the configuration first (as
/// JSON), to set the `ratelimit` filter's options.
pub async fn start_with(
    grpc: SocketAddr,
    proxy_id: &str,
    dir: &Path,
    edit: impl FnOnce(&mut serde_json::Value) -> Result<()>,
) -> Result<Envoy> {
    let config = envoy(proxy_id).config(&ControlPlaneTarget::One(grpc))?;
    let mut as_json = serde_json::to_value(&config).context("the config as JSON")?;
    edit(&mut as_json)?;
    let config = serde_yaml_ng::to_value(&as_json).context("the config back from JSON")?;
    EnvoySpec::generated(proxy_id, config)
        .start(dir, &ControlPlaneTarget::None)
        .await
}

/// The typed config of the `envoy.filters.http.ratelimit` filter in an
/// Envoy configuration (as JSON), to edit.
pub fn ratelimit_filter(config: &mut serde_json::Value) -> Result<&mut serde_json::Value> {
    let listeners = config
        .pointer_mut("/static_resources/listeners")
        .and_then(serde_json::Value::as_array_mut)
        .context("no listeners")?;
    for listener in listeners {
        let Some(chains) = listener
            .get_mut("filter_chains")
            .and_then(serde_json::Value::as_array_mut)
        else {
            continue;
        };
        for chain in chains {
            let Some(filters) = chain
                .get_mut("filters")
                .and_then(serde_json::Value::as_array_mut)
            else {
                continue;
            };
            for filter in filters {
                let Some(http_filters) = filter
                    .pointer_mut("/typed_config/http_filters")
                    .and_then(serde_json::Value::as_array_mut)
                else {
                    continue;
                };
                for http_filter in http_filters {
                    if http_filter.get("name").and_then(serde_json::Value::as_str)
                        == Some("envoy.filters.http.ratelimit")
                    {
                        return http_filter
                            .get_mut("typed_config")
                            .context("the ratelimit filter has no typed_config");
                    }
                }
            }
        }
    }
    anyhow::bail!("no envoy.filters.http.ratelimit filter")
}

/// Where the quotas' counters live.
#[derive(Debug, Clone, Copy)]
pub enum Store<'a> {
    /// In the control plane's memory (no `--store`).
    Memory,
    /// In the Redis server (or Sentinel, or Cluster) at this URL
    /// (`--store URL`).
    Redis(&'a str),
}

/// Starts the control plane with `options` (limits file, interval) and
/// the quota configuration `quotas_yaml` (one domain, written to
/// `dir/quotas/api.yaml`), with `--quota-algorithm algorithm` when given,
/// its counters in `store`.
pub async fn control_plane(
    dir: &Path,
    options: ControlPlaneOptions,
    quotas_yaml: &str,
    algorithm: Option<&str>,
    store: Store<'_>,
) -> Result<ControlPlane> {
    let mut options = options;
    if let Some(algorithm) = algorithm {
        options = options.args(["--quota-algorithm".to_owned(), algorithm.to_owned()]);
    }
    control_plane_with_files(dir, options, &[("api.yaml", quotas_yaml)], store)
        .await
        .map(|(control_plane, _)| control_plane)
}

/// Starts the control plane with `options` serving the quota directory
/// `dir/quotas` holding `files` (`(name, YAML)`), its counters in `store`;
/// the control plane and the directory.
pub async fn control_plane_with_files(
    dir: &Path,
    options: ControlPlaneOptions,
    files: &[(&str, &str)],
    store: Store<'_>,
) -> Result<(ControlPlane, PathBuf)> {
    let quota_dir = dir.join("quotas");
    std::fs::create_dir_all(&quota_dir)
        .with_context(|| format!("cannot create {}", quota_dir.display()))?;
    for (name, yaml) in files {
        let file = quota_dir.join(name);
        std::fs::write(&file, yaml).with_context(|| format!("cannot write {}", file.display()))?;
    }
    let mut args = vec!["--quotas".to_owned(), quota_dir.display().to_string()];
    if let Store::Redis(url) = store {
        args.extend(["--store".to_owned(), url.to_owned()]);
    }
    let control_plane = ControlPlane::start(options.args(args)).await?;
    Ok((control_plane, quota_dir))
}

/// A descriptor of `(key, value)` entries.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

/// A request of one hit per descriptor.
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

/// A client of the rate limit service on one HTTP/2 connection.
#[derive(Debug, Clone)]
pub struct RlsClient {
    client: RateLimitServiceClient<Channel>,
}

impl RlsClient {
    /// Connects to the service at `addr`.
    pub async fn connect(addr: SocketAddr) -> Result<Self> {
        let client = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .with_context(|| format!("cannot connect to the rate limit service at {addr}"))?;
        Ok(Self { client })
    }

    /// `ShouldRateLimit(request)`.
    pub async fn call(
        &mut self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.client
            .should_rate_limit(request)
            .await
            .map(tonic::Response::into_inner)
    }

    /// One hit for each descriptor (`[(key, value), …]`) of `domain`.
    pub async fn ask(
        &mut self,
        domain: &str,
        descriptors: &[&[(&str, &str)]],
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.call(request(
            domain,
            descriptors.iter().map(|d| descriptor(d)).collect(),
        ))
        .await
    }
}
