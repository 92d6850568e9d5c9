//! A test fleet: one control plane and N Envoys built from the repo's demo
//! configs, everything on ephemeral loopback ports under one temp dir.

use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;

use crate::control_plane::{ControlPlane, ControlPlaneOptions};
use crate::envoy::{self, Envoy, EnvoyOptions, Rewrite};

/// Settings shared by the fleet.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// The control plane's limits file.
    pub limits_yaml: String,
    /// `--control-interval-ms`.
    pub control_interval_ms: u64,
    /// The filter's `report_interval_ms`.
    pub report_interval_ms: u64,
    /// How many Envoys (they use demo-a.yaml, demo-b.yaml, demo-a.yaml, …).
    pub envoys: usize,
    /// More filter configuration keys for every Envoy (a JSON object).
    pub filter: serde_json::Value,
    /// Proxy ids, by Envoy index; `test-<letter>` where absent.
    pub proxy_ids: Vec<String>,
    /// Worker threads of every Envoy (`--concurrency`).
    pub concurrency: u32,
    /// The wasm filter or the native module in every Envoy.
    pub data_plane: DataPlane,
    /// Route admitted requests to this server instead of answering them
    /// in Envoy ([`envoy::route_to_upstream`]).
    pub upstream: Option<std::net::SocketAddr>,
    /// More `sluice serve` arguments.
    pub control_plane_args: Vec<String>,
}

/// Which build of the Sluice filter the Envoys run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DataPlane {
    /// The proxy-wasm filter (`demo-a.yaml`, `demo-b.yaml`).
    #[default]
    Wasm,
    /// The dynamic module (`native-module.yaml`), same configuration.
    Native,
}

impl FleetOptions {
    /// `envoys` Envoys of two workers, 200 ms control interval, 100 ms
    /// report interval.
    pub fn new(limits_yaml: &str, envoys: usize) -> Self {
        Self {
            limits_yaml: limits_yaml.to_owned(),
            control_interval_ms: 200,
            report_interval_ms: 100,
            envoys,
            filter: json!({}),
            proxy_ids: Vec::new(),
            concurrency: 2,
            data_plane: DataPlane::Wasm,
            upstream: None,
            control_plane_args: Vec::new(),
        }
    }

    /// The same fleet with `data_plane` in every Envoy.
    pub fn with_data_plane(mut self, data_plane: DataPlane) -> Self {
        self.data_plane = data_plane;
        self
    }

    /// One control interval.
    pub fn control_interval(&self) -> Duration {
        Duration::from_millis(self.control_interval_ms)
    }
}

/// A running fleet. Dropping it stops every process.
#[derive(Debug)]
pub struct Fleet {
    /// Envoys, in start order (`envoy-a`, `envoy-b`, …).
    pub envoys: Vec<Envoy>,
    /// The control plane.
    pub control_plane: ControlPlane,
    /// The options it was started with.
    pub options: FleetOptions,
    // Last, so it is removed after the processes writing into it are stopped.
    dir: tempfile::TempDir,
}

impl Fleet {
    /// Starts the control plane, then the Envoys (each waited for until ready).
    pub async fn start(options: FleetOptions) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("sluice-it-")
            .tempdir()
            .context("cannot create a temp dir")?;
        let control_plane = ControlPlane::start(
            ControlPlaneOptions::new(&options.limits_yaml, dir.path())
                .control_interval_ms(options.control_interval_ms)
                .args(options.control_plane_args.clone()),
        )
        .await?;
        let mut fleet = Self {
            envoys: Vec::with_capacity(options.envoys),
            control_plane,
            options,
            dir,
        };
        for _ in 0..fleet.options.envoys {
            fleet.add_envoy().await?;
        }
        Ok(fleet)
    }

    /// Starts one more Envoy (the next letter, alternating demo-a.yaml and
    /// demo-b.yaml) pointed at the control plane; returns its index.
    pub async fn add_envoy(&mut self) -> Result<usize> {
        let index = self.envoys.len();
        let letter = char::from(b'a' + u8::try_from(index % 26).unwrap_or(0));
        let file = match self.options.data_plane {
            DataPlane::Native => "native-module.yaml",
            DataPlane::Wasm if index.is_multiple_of(2) => "demo-a.yaml",
            DataPlane::Wasm => "demo-b.yaml",
        };
        let mut config = envoy::load_repo_config(file)?;
        let proxy_id = self
            .options
            .proxy_ids
            .get(index)
            .cloned()
            .unwrap_or_else(|| format!("test-{letter}"));
        let mut patch = json!({
            "proxy_id": proxy_id,
            "report_interval_ms": self.options.report_interval_ms,
        });
        if let (Some(patch), Some(extra)) = (patch.as_object_mut(), self.options.filter.as_object())
        {
            patch.extend(extra.clone());
        }
        let rewrite = match self.options.data_plane {
            DataPlane::Wasm => Rewrite::for_test(self.control_plane.grpc_addr(), patch)?,
            DataPlane::Native => Rewrite::for_native(self.control_plane.grpc_addr(), patch)?,
        };
        envoy::rewrite(&mut config, &rewrite)?;
        if let Some(upstream) = self.options.upstream {
            envoy::route_to_upstream(&mut config, upstream)?;
        }
        let mut envoy_options = EnvoyOptions::new(&format!("envoy-{letter}"), self.dir.path());
        envoy_options.concurrency = self.options.concurrency;
        let envoy = Envoy::start(&config, &envoy_options).await?;
        self.envoys.push(envoy);
        Ok(index)
    }

    /// The `http://…` base URL of Envoy `index`.
    pub fn url(&self, index: usize) -> Result<String> {
        self.envoys
            .get(index)
            .map(Envoy::base_url)
            .with_context(|| format!("no Envoy #{index}"))
    }

    /// Where logs and generated configs are.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Prints every process's log tail (for failures reported without a panic).
    pub fn print_logs(&self) {
        self.control_plane.print_log();
        for envoy in &self.envoys {
            envoy.print_log();
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // On a failed test keep the logs and generated configs for a post-mortem
        // (the process guards print their log tails as they drop, after this).
        if std::thread::panicking() {
            self.dir.disable_cleanup(true);
            eprintln!("test fleet files kept in {}", self.dir.path().display());
        }
    }
}
