//! Istio sidecars without Istio: an xDS server that plays istiod
//! ([`crate::xds`]), the control plane with deploy/'s limits, and Envoys
//! configured as sidecars of pods in one namespace, each fed one of
//! deploy/'s WasmPlugins through ECDS exactly as istiod builds it
//! ([`crate::mesh`]), the pods labelled as its selector says.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use envoy_types::pb::google::protobuf::Any;
use serde_json::Value as Json;

use crate::fleet::{EnvoySpec, Fleet, FleetOptions};
use crate::mesh::{ProxyKind, Sidecar, WasmPlugin};
use crate::paths;
use crate::xds::{EXTENSION_CONFIG_TYPE, XdsServer, to_any};

/// The WasmPlugin of the sidecars, in deploy/.
pub const SIDECAR_PLUGIN: &str = "istio/wasmplugin-sidecars.yaml";
/// How long an Envoy gets to acknowledge a pushed configuration.
const ACK_TIMEOUT: Duration = Duration::from_secs(15);

/// The limits file of deploy/'s ConfigMap.
pub fn deploy_limits_yaml() -> Result<String> {
    let path = paths::from_root("deploy/base/configmap-limits.yaml")?;
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text)?;
    value
        .get("data")
        .and_then(|data| data.get("limits.yaml"))
        .and_then(serde_yaml_ng::Value::as_str)
        .map(str::to_owned)
        .context("the ConfigMap has no data.limits.yaml")
}

/// How to start the sidecars.
#[derive(Debug, Clone)]
pub struct SidecarOptions {
    /// The pods, one Envoy each, in namespace `shop`.
    pub pods: Vec<String>,
    /// Also deliver a second wasm plugin with no `vm_id` (the do-nothing
    /// filter, as istiod would deliver another WasmPlugin), before Sluice
    /// in the chain.
    pub other_plugin: bool,
    /// Fields set in the WasmPlugin's `pluginConfig` (shorter intervals
    /// for tests), as a user would edit it.
    pub plugin_patch: serde_json::Map<String, Json>,
    /// `--control-interval-ms` (the ConfigMap's otherwise).
    pub control_interval_ms: Option<u64>,
    /// Envoy worker threads.
    pub concurrency: u32,
    /// The WasmPlugin, under deploy/ ([`SIDECAR_PLUGIN`] by default).
    pub plugin: String,
    /// The pods' application, which their inbound routes forward to;
    /// `None`: the sidecars answer 200 themselves.
    pub app: Option<SocketAddr>,
    /// The pods are gateways of the plugin's namespace (node id
    /// `router~…`), not sidecars.
    pub gateways: bool,
}

impl SidecarOptions {
    /// `pods` sidecars, Sluice alone, the ConfigMap's control interval.
    pub fn new(pods: &[&str]) -> Self {
        Self {
            pods: pods.iter().map(|pod| (*pod).to_owned()).collect(),
            other_plugin: false,
            plugin_patch: serde_json::Map::new(),
            control_interval_ms: None,
            concurrency: 2,
            plugin: SIDECAR_PLUGIN.to_owned(),
            app: None,
            gateways: false,
        }
    }
}

/// A running mesh; dropping it stops everything.
#[derive(Debug)]
pub struct SidecarMesh {
    /// The control plane and the Envoys, in the order of
    /// [`SidecarOptions::pods`] (first: they stop before the xDS server;
    /// on a failed test their files stay).
    pub fleet: Fleet,
    /// Their sidecar identities.
    pub sidecars: Vec<Sidecar>,
    /// The xDS server playing istiod.
    pub xds: XdsServer,
    /// The Sluice WasmPlugin as last pushed.
    pub plugin: WasmPlugin,
    other: Option<(String, Any)>,
}

/// The namespace of the sidecars, for a plugin in Istio's root namespace.
pub const NAMESPACE: &str = "shop";
/// Istio's root namespace.
const ISTIO_ROOT_NAMESPACE: &str = "istio-system";

impl SidecarMesh {
    /// Starts the xDS server, the control plane and the sidecars, and
    /// waits until every sidecar runs the pushed plugins.
    pub async fn start(options: SidecarOptions) -> Result<Self> {
        let fleet = Fleet::start(
            FleetOptions::control_plane_only(&deploy_limits_yaml()?)
                .control_interval_ms(options.control_interval_ms),
        )
        .await?;
        let xds = XdsServer::start().await?;
        let mut plugin = WasmPlugin::from_repo(&options.plugin)?;
        if let Some(config) = plugin.plugin_config.as_object_mut() {
            config.extend(options.plugin_patch.clone());
        }
        let other = if options.other_plugin {
            let other = WasmPlugin::from_manifest(
                "apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\n\
                 metadata: {name: headers, namespace: shop}\n\
                 spec: {url: file:///empty.wasm, pluginName: headers}\n",
            )?;
            let resource = other.extension_config(&paths::empty_filter_wasm()?)?;
            Some((resource.name.clone(), to_any(&resource)))
        } else {
            None
        };
        let mut mesh = Self {
            fleet,
            sidecars: Vec::new(),
            xds,
            plugin,
            other,
        };
        let version = mesh.publish()?;
        let mut extensions = Vec::new();
        if let Some((name, _)) = &mesh.other {
            extensions.push(name.clone());
        }
        extensions.push(mesh.plugin.resource_name());
        for pod in &options.pods {
            // A plugin in Istio's root namespace applies to sidecars in any
            // namespace; one elsewhere, to that namespace's. Gateways run
            // in the plugin's namespace. The pods carry its selector's
            // labels.
            let namespace = if mesh.plugin.namespace == ISTIO_ROOT_NAMESPACE && !options.gateways {
                NAMESPACE
            } else {
                &mesh.plugin.namespace
            };
            let mut sidecar = Sidecar::new(pod, namespace);
            if options.gateways {
                sidecar.kind = ProxyKind::Gateway;
            }
            sidecar.labels.extend(mesh.plugin.selector.clone());
            sidecar.app = options.app;
            let config = sidecar.bootstrap(
                mesh.xds.addr(),
                mesh.fleet.control_plane.grpc_addr(),
                &extensions,
            )?;
            let spec = EnvoySpec::generated(pod, config).concurrency(options.concurrency);
            mesh.fleet.start_envoy(&spec).await?;
            mesh.xds
                .wait_for_ack(
                    &sidecar.node_id(),
                    EXTENSION_CONFIG_TYPE,
                    version,
                    ACK_TIMEOUT,
                )
                .await?;
            mesh.sidecars.push(sidecar);
        }
        Ok(mesh)
    }

    /// Sets the xDS server's ECDS resources to the current plugins.
    fn publish(&self) -> Result<u64> {
        let wasm = paths::sluice_wasm()?;
        let sluice = self.plugin.extension_config(&wasm)?;
        let mut resources = vec![(sluice.name.clone(), to_any(&sluice))];
        if let Some(other) = &self.other {
            resources.push(other.clone());
        }
        Ok(self.xds.set(EXTENSION_CONFIG_TYPE, resources))
    }

    /// Pushes a new `pluginConfig` (the next resource version, as after
    /// `kubectl apply`) through ECDS and waits until every sidecar
    /// acknowledged it.
    pub async fn push_plugin_config(&mut self, plugin_config: Json) -> Result<u64> {
        self.plugin = self.plugin.updated(plugin_config);
        let version = self.publish()?;
        for sidecar in &self.sidecars {
            self.xds
                .wait_for_ack(
                    &sidecar.node_id(),
                    EXTENSION_CONFIG_TYPE,
                    version,
                    ACK_TIMEOUT,
                )
                .await?;
        }
        Ok(version)
    }

    /// The `http://…` base URL of sidecar `index`.
    pub fn url(&self, index: usize) -> Result<String> {
        self.fleet.url(index)
    }

    /// Where logs and configs are.
    pub fn dir(&self) -> &Path {
        self.fleet.dir()
    }

    /// Prints every process's log tail.
    pub fn print_logs(&self) {
        self.fleet.print_logs();
    }
}
