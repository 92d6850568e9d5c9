//! A running fleet: its scratch directory, the control plane, the Envoys,
//! and the waits every fleet test starts with.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::certs::DevCerts;
use crate::control_plane::{ControlPlane, ControlPlaneOptions};
use crate::envoy::Envoy;
use crate::fleet::envoy_spec::{ControlPlaneTarget, EnvoySpec};
use crate::fleet::options::{FleetOptions, GrpcTls};
use crate::fleet::scratch::TestDir;

/// A running fleet. Dropping it stops every process.
#[derive(Debug)]
pub struct Fleet {
    /// Envoys, in start order (`envoy-a`, `envoy-b`, …, then those of
    /// [`Fleet::start_envoy`]).
    pub envoys: Vec<Envoy>,
    /// The control plane.
    pub control_plane: ControlPlane,
    /// The options it was started with.
    pub options: FleetOptions,
    /// The test CA's files under mutual TLS.
    pub certs: Option<DevCerts>,
    // Last, so it is removed after the processes writing into it are stopped.
    dir: TestDir,
}

impl Fleet {
    /// Starts the control plane, then the Envoys (each waited for until ready).
    pub async fn start(options: FleetOptions) -> Result<Self> {
        let dir = TestDir::new("sluice-it-", "test fleet")?;
        let certs = match options.grpc_tls {
            GrpcTls::Plaintext => None,
            GrpcTls::Mutual | GrpcTls::MutualOwnRules => {
                Some(DevCerts::generate(&dir.path().join("certs"))?)
            }
        };
        let control_plane =
            ControlPlane::start(control_plane_options(&options, dir.path(), certs.as_ref())?)
                .await?;
        let mut fleet = Self {
            envoys: Vec::with_capacity(options.envoys),
            control_plane,
            options,
            certs,
            dir,
        };
        for _ in 0..fleet.options.envoys {
            fleet.add_envoy().await?;
        }
        Ok(fleet)
    }

    /// Starts the next Envoy of the options ([`FleetOptions::envoy`]);
    /// returns its index.
    pub async fn add_envoy(&mut self) -> Result<usize> {
        let spec = self.envoy_spec(self.envoys.len());
        self.start_envoy(&spec).await
    }

    /// What [`Fleet::add_envoy`] would start as Envoy `index`, to change
    /// before [`Fleet::start_envoy`].
    pub fn envoy_spec(&self, index: usize) -> EnvoySpec {
        self.options.envoy(index, self.certs.as_ref())
    }

    /// Starts `spec` pointed at the control plane, with its files in the
    /// fleet's directory; returns its index in [`Fleet::envoys`].
    pub async fn start_envoy(&mut self, spec: &EnvoySpec) -> Result<usize> {
        let envoy = spec.start(self.dir.path(), &self.target()).await?;
        self.envoys.push(envoy);
        Ok(self.envoys.len() - 1)
    }

    /// Where the fleet's Envoys find the control plane.
    pub fn target(&self) -> ControlPlaneTarget {
        ControlPlaneTarget::One(self.control_plane.grpc_addr())
    }

    /// The test CA's files (under mutual TLS).
    pub fn certs(&self) -> Result<&DevCerts> {
        self.certs
            .as_ref()
            .context("the fleet does not run mutual TLS")
    }

    /// The `http://…` base URL of Envoy `index`.
    pub fn url(&self, index: usize) -> Result<String> {
        self.envoys
            .get(index)
            .map(Envoy::base_url)
            .with_context(|| format!("no Envoy #{index}"))
    }

    /// Where logs and generated configs are.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Waits until the control plane counts `proxies` open streams.
    pub async fn wait_connected(&self, proxies: usize, timeout: Duration) -> Result<()> {
        let admin = self.control_plane.admin();
        crate::wait::until(
            &format!("{proxies} proxies connected"),
            timeout,
            Duration::from_millis(50),
            || async move { Ok((admin.proxies().await?.connected >= proxies).then_some(())) },
        )
        .await
    }

    /// Prints every process's log tail (for failures reported without a panic).
    pub fn print_logs(&self) {
        self.control_plane.print_log();
        for envoy in &self.envoys {
            envoy.print_log();
        }
    }
}

/// The control plane of `options`, its files under `dir`: the limits, the
/// interval, mutual TLS with `certs`, the quota files, the arguments.
fn control_plane_options(
    options: &FleetOptions,
    dir: &Path,
    certs: Option<&DevCerts>,
) -> Result<ControlPlaneOptions> {
    let mut control_plane = ControlPlaneOptions::new(&options.limits_yaml, dir);
    if let Some(ms) = options.control_interval_ms {
        control_plane = control_plane.control_interval_ms(ms);
    }
    if let Some(certs) = certs {
        control_plane = control_plane.args(match options.grpc_tls {
            GrpcTls::MutualOwnRules => certs.tls_args(),
            GrpcTls::Plaintext | GrpcTls::Mutual => certs.serve_args(),
        });
    }
    control_plane = control_plane.args(options.control_plane_args.iter().cloned());
    if !options.quota_files.is_empty() {
        let quota_dir = dir.join("quotas");
        std::fs::create_dir_all(&quota_dir)
            .with_context(|| format!("cannot create {}", quota_dir.display()))?;
        for (name, yaml) in &options.quota_files {
            let file = quota_dir.join(name);
            std::fs::write(&file, yaml)
                .with_context(|| format!("cannot write {}", file.display()))?;
        }
        control_plane =
            control_plane.args(["--quotas".to_owned(), quota_dir.display().to_string()]);
    }
    Ok(control_plane)
}
