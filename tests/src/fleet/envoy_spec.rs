//! One Envoy of a test, described before it starts: its config (a repo
//! file rewritten for the test, or one generated elsewhere), the data
//! plane, the filter keys, its upstream, edits and process options.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Map as JsonMap, Value as Json, json};
use serde_yaml_ng::Value;

use crate::certs::{self, DevCerts};
use crate::envoy::{self, Envoy, EnvoyOptions, Rewrite};
use crate::paths;

/// Which build of the Sluice filter an Envoy runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DataPlane {
    /// The proxy-wasm filter (`demo-a.yaml`, `demo-b.yaml`).
    #[default]
    Wasm,
    /// The dynamic module (`native-module.yaml`), same configuration.
    Native,
}

impl DataPlane {
    /// The repo config of Envoy `index` of a fleet: `demo-a.yaml` and
    /// `demo-b.yaml` alternating, or `native-module.yaml`.
    pub fn demo_config(self, index: usize) -> &'static str {
        match self {
            Self::Native => "native-module.yaml",
            Self::Wasm if index.is_multiple_of(2) => "demo-a.yaml",
            Self::Wasm => "demo-b.yaml",
        }
    }
}

/// Where an Envoy's control plane is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlPlaneTarget {
    /// One address (a control plane, or a port nobody listens on).
    One(SocketAddr),
    /// Replicas, in order: the `sluice_control_plane` cluster gets one
    /// endpoint each, the native module one `control_plane_uri` each.
    Replicas(Vec<SocketAddr>),
    /// The config names no control plane (Envoy's own filters only).
    None,
}

/// A change to the config after the rewrite.
type Edit = Arc<dyn Fn(&mut Value) -> Result<()> + Send + Sync>;

/// Where the config comes from.
#[derive(Debug, Clone)]
pub enum EnvoyConfig {
    /// `envoy/<file>`, rewritten for the test (ephemeral ports, the
    /// control plane, the built filter, the filter keys).
    Repo(String),
    /// A config built elsewhere (a sidecar's bootstrap, a gateway's
    /// translation), started as it is.
    Generated(Value),
    /// A config file started as it is, in place (relative paths in it
    /// taken from the workspace root): no rewrite, no edit.
    File(PathBuf),
}

/// How to build and start one Envoy.
#[derive(Clone)]
pub struct EnvoySpec {
    /// Its name: log, config and admin-address files, messages.
    pub name: String,
    /// Its config.
    pub config: EnvoyConfig,
    /// The Sluice filter the config runs; `None`: the config has none
    /// (only ports and the control-plane cluster are rewritten).
    pub data_plane: Option<DataPlane>,
    /// Keys set in the filter's JSON configuration.
    pub filter: JsonMap<String, Json>,
    /// Route admitted requests to this server instead of answering them in
    /// Envoy ([`envoy::route_to_upstream`]).
    pub upstream: Option<SocketAddr>,
    /// `--concurrency`, `-l`, the access-log flush interval.
    pub concurrency: u32,
    /// `-l` log level.
    pub log_level: String,
    /// `--file-flush-interval-msec`; `None` keeps Envoy's.
    pub file_flush_interval: Option<Duration>,
    edits: Vec<Edit>,
}

impl fmt::Debug for EnvoySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnvoySpec")
            .field("name", &self.name)
            .field("config", &self.config)
            .field("data_plane", &self.data_plane)
            .field("filter", &self.filter)
            .field("upstream", &self.upstream)
            .field("concurrency", &self.concurrency)
            .field("log_level", &self.log_level)
            .field("file_flush_interval", &self.file_flush_interval)
            .field("edits", &self.edits.len())
            .finish()
    }
}

impl EnvoySpec {
    /// Envoy `name` on `envoy/<file>` with the wasm filter, two workers,
    /// `info` logs.
    pub fn repo(name: &str, file: &str) -> Self {
        Self {
            name: name.to_owned(),
            config: EnvoyConfig::Repo(file.to_owned()),
            data_plane: Some(DataPlane::Wasm),
            filter: JsonMap::new(),
            upstream: None,
            concurrency: 2,
            log_level: "info".to_owned(),
            file_flush_interval: None,
            edits: Vec::new(),
        }
    }

    /// Envoy `name` on `demo-a.yaml` (wasm) or `native-module.yaml`.
    pub fn demo(name: &str, data_plane: DataPlane) -> Self {
        Self::repo(name, data_plane.demo_config(0)).data_plane(data_plane)
    }

    /// Envoy `name` on a config generated elsewhere, as it is.
    pub fn generated(name: &str, config: Value) -> Self {
        Self {
            config: EnvoyConfig::Generated(config),
            data_plane: None,
            ..Self::repo(name, "")
        }
    }

    /// Envoy `name` on the config file at `path`, as it is.
    pub fn file(name: &str, path: &Path) -> Self {
        Self {
            config: EnvoyConfig::File(path.to_path_buf()),
            data_plane: None,
            ..Self::repo(name, "")
        }
    }

    /// `envoy/demo-mtls.yaml` pointed at `certs`; without `client_cert`
    /// Envoy offers no client certificate.
    pub fn mutual_tls(name: &str, certs: &DevCerts, client_cert: bool) -> Self {
        let certs = certs.clone();
        let mut spec = Self::repo(name, "demo-mtls.yaml").edit(move |config| {
            anyhow::ensure!(
                certs::point_config_at(config, &certs) == 3,
                "demo-mtls.yaml names three certificate files"
            );
            Ok(())
        });
        if !client_cert {
            spec = spec.edit(|config| {
                config
                    .get_mut("static_resources")
                    .and_then(|v| v.get_mut("clusters"))
                    .and_then(|v| v.get_mut(0))
                    .and_then(|v| v.get_mut("transport_socket"))
                    .and_then(|v| v.get_mut("typed_config"))
                    .and_then(|v| v.get_mut("common_tls_context"))
                    .and_then(Value::as_mapping_mut)
                    .and_then(|context| context.remove("tls_certificates"))
                    .context("demo-mtls.yaml's first cluster has no client certificate")
                    .map(drop)
            });
        }
        spec
    }

    /// Sets the data plane (`None`: the config has no Sluice filter).
    #[must_use]
    pub fn data_plane(mut self, data_plane: impl Into<Option<DataPlane>>) -> Self {
        self.data_plane = data_plane.into();
        self
    }

    /// Sets the filter's `proxy_id`.
    #[must_use]
    pub fn proxy_id(self, proxy_id: &str) -> Self {
        self.filter(json!({ "proxy_id": proxy_id }))
    }

    /// Sets keys of the filter's configuration (a JSON object; anything
    /// else is ignored).
    #[must_use]
    pub fn filter(mut self, keys: Json) -> Self {
        if let Json::Object(keys) = keys {
            self.filter.extend(keys);
        }
        self
    }

    /// Routes admitted requests to `upstream`.
    #[must_use]
    pub fn upstream(mut self, upstream: SocketAddr) -> Self {
        self.upstream = Some(upstream);
        self
    }

    /// Sets `--concurrency`.
    #[must_use]
    pub fn concurrency(mut self, workers: u32) -> Self {
        self.concurrency = workers;
        self
    }

    /// Sets the log level.
    #[must_use]
    pub fn log_level(mut self, level: &str) -> Self {
        level.clone_into(&mut self.log_level);
        self
    }

    /// Sets how often Envoy writes file access logs out.
    #[must_use]
    pub fn file_flush_interval(mut self, interval: Duration) -> Self {
        self.file_flush_interval = Some(interval);
        self
    }

    /// Adds a change made to the config after the rewrite (and after the
    /// upstream's route), in the order added.
    #[must_use]
    pub fn edit(mut self, edit: impl Fn(&mut Value) -> Result<()> + Send + Sync + 'static) -> Self {
        self.edits.push(Arc::new(edit));
        self
    }

    /// Adds a change made to the config as JSON (for `serde_json`'s
    /// pointers), after the YAML edits added before it.
    #[must_use]
    pub fn edit_json(self, edit: impl Fn(&mut Json) -> Result<()> + Send + Sync + 'static) -> Self {
        self.edit(move |config| {
            let mut as_json = serde_json::to_value(&*config).context("the config as JSON")?;
            edit(&mut as_json)?;
            *config = serde_yaml_ng::to_value(&as_json).context("the config back from JSON")?;
            Ok(())
        })
    }

    /// The config this spec starts, pointed at `target`.
    pub fn config(&self, target: &ControlPlaneTarget) -> Result<Value> {
        let mut config = match &self.config {
            EnvoyConfig::Generated(config) if self.filter.is_empty() => config.clone(),
            EnvoyConfig::Generated(_) => {
                bail!("{}: filter keys for a generated config", self.name)
            }
            EnvoyConfig::File(path) => envoy::load_config(path)?,
            EnvoyConfig::Repo(file) => {
                let mut config = envoy::load_repo_config(file)?;
                envoy::rewrite(&mut config, &self.rewrite(target)?)
                    .with_context(|| format!("cannot rewrite envoy/{file}"))?;
                config
            }
        };
        if let Some(upstream) = self.upstream {
            envoy::route_to_upstream(&mut config, upstream)?;
        }
        for edit in &self.edits {
            edit(&mut config)?;
        }
        Ok(config)
    }

    /// What [`envoy::rewrite`] changes in a repo config.
    fn rewrite(&self, target: &ControlPlaneTarget) -> Result<Rewrite> {
        let mut filter = self.filter.clone();
        let (control_plane, control_plane_replicas) = match (target, self.data_plane) {
            (ControlPlaneTarget::One(addr), _) => (Some(*addr), Vec::new()),
            // The module dials the replicas itself, one after the other.
            (ControlPlaneTarget::Replicas(addrs), Some(DataPlane::Native)) => {
                let uris: Vec<String> = addrs.iter().map(|a| format!("http://{a}")).collect();
                filter.insert("control_plane_uri".to_owned(), json!(uris));
                (None, Vec::new())
            }
            (ControlPlaneTarget::Replicas(addrs), _) => (None, addrs.clone()),
            (ControlPlaneTarget::None, _) => (None, Vec::new()),
        };
        let wasm = match self.data_plane {
            Some(DataPlane::Wasm) => Some(paths::sluice_wasm()?),
            Some(DataPlane::Native) => {
                paths::native_module()?;
                None
            }
            None if filter.is_empty() => None,
            None => bail!("{}: filter keys for a config without the filter", self.name),
        };
        Ok(Rewrite {
            ephemeral_ports: true,
            control_plane,
            control_plane_replicas,
            wasm,
            plugin_patch: filter,
        })
    }

    /// Writes the config under `dir` and starts Envoy on it (ready when
    /// this returns).
    pub async fn start(&self, dir: &Path, target: &ControlPlaneTarget) -> Result<Envoy> {
        let mut options = EnvoyOptions::new(&self.name, dir);
        options.concurrency = self.concurrency;
        options.log_level.clone_from(&self.log_level);
        options.file_flush_interval = self.file_flush_interval;
        let started = match &self.config {
            EnvoyConfig::File(path) => {
                if !self.filter.is_empty() || !self.edits.is_empty() || self.upstream.is_some() {
                    bail!("{}: {} is started as it is", self.name, path.display());
                }
                Envoy::start_file(path, &options).await
            }
            EnvoyConfig::Repo(_) | EnvoyConfig::Generated(_) => {
                Envoy::start(&self.config(target)?, &options).await
            }
        };
        started.with_context(|| format!("cannot start {}", self.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(ports: &[u16]) -> Vec<SocketAddr> {
        ports
            .iter()
            .map(|port| SocketAddr::from(([127, 0, 0, 1], *port)))
            .collect()
    }

    fn endpoint_ports(config: &Value) -> Vec<u64> {
        config["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|lb| {
                lb["endpoint"]["address"]["socket_address"]["port_value"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn a_config_without_the_filter_gets_ports_and_every_replica() {
        let spec = EnvoySpec::repo("r", "replicas.yaml").data_plane(None);
        let config = spec
            .config(&ControlPlaneTarget::Replicas(addrs(&[1001, 1002])))
            .unwrap();
        assert_eq!(endpoint_ports(&config), [1001, 1002]);
        assert_eq!(
            config["admin"]["address"]["socket_address"]["port_value"],
            Value::from(0)
        );
        let one = spec
            .config(&ControlPlaneTarget::One(addrs(&[1003])[0]))
            .unwrap();
        assert!(endpoint_ports(&one).iter().all(|port| *port == 1003));
    }

    #[test]
    fn edits_run_in_order_after_the_rewrite() {
        let config = EnvoySpec::repo("e", "replicas.yaml")
            .data_plane(None)
            .edit(|config| {
                config["admin"]["address"]["socket_address"]["port_value"] = Value::from(7);
                Ok(())
            })
            .edit_json(|config| {
                let port = config
                    .pointer_mut("/admin/address/socket_address/port_value")
                    .context("no admin port")?;
                *port = json!(port.as_u64().unwrap_or(0) + 1);
                Ok(())
            })
            .config(&ControlPlaneTarget::None)
            .unwrap();
        assert_eq!(
            config["admin"]["address"]["socket_address"]["port_value"],
            Value::from(8)
        );
    }

    #[test]
    fn filter_keys_without_a_filter_to_take_them_are_refused() {
        let none = EnvoySpec::repo("n", "rlqs.yaml")
            .data_plane(None)
            .proxy_id("x")
            .config(&ControlPlaneTarget::None)
            .unwrap_err();
        assert!(none.to_string().contains("without the filter"), "{none}");
        let generated = EnvoySpec::generated("g", Value::Null)
            .proxy_id("x")
            .config(&ControlPlaneTarget::None)
            .unwrap_err();
        assert!(
            generated.to_string().contains("generated config"),
            "{generated}"
        );
    }

    #[test]
    fn the_demo_configs_alternate() {
        assert_eq!(DataPlane::Wasm.demo_config(0), "demo-a.yaml");
        assert_eq!(DataPlane::Wasm.demo_config(1), "demo-b.yaml");
        assert_eq!(DataPlane::Wasm.demo_config(2), "demo-a.yaml");
        assert_eq!(DataPlane::Native.demo_config(1), "native-module.yaml");
    }
}
