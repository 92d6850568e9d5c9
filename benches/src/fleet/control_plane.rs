//! `sluice serve` as a child process whose pid is known, so its memory and
//! CPU can be sampled from `/proc`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_integration_tests::control_plane::{AdminClient, ReadyFile, parse_ready};
use sluice_integration_tests::paths;
use sluice_integration_tests::process::ChildGuard;

/// How long `sluice serve` gets to write its ready file.
const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// A running control plane; stopped on drop.
#[derive(Debug)]
pub struct ControlPlaneProcess {
    guard: ChildGuard,
    addrs: ReadyFile,
    admin: AdminClient,
}

impl ControlPlaneProcess {
    /// Writes `limits_yaml` and starts `$SLUICE_BIN serve` on loopback
    /// ephemeral ports, files under `work_dir`, logging at `warn`.
    pub async fn start(work_dir: &Path, name: &str, limits_yaml: &str) -> Result<Self> {
        Self::start_with(work_dir, name, limits_yaml, &[]).await
    }

    /// [`Self::start`] with more `serve` arguments.
    pub async fn start_with(
        work_dir: &Path,
        name: &str,
        limits_yaml: &str,
        extra: &[String],
    ) -> Result<Self> {
        let limits = work_dir.join(format!("{name}-limits.yaml"));
        std::fs::write(&limits, limits_yaml)
            .with_context(|| format!("cannot write {}", limits.display()))?;
        let ready = work_dir.join(format!("{name}.ready.json"));
        let mut command = Command::new(paths::sluice_bin()?);
        command
            .arg("serve")
            .arg("--config")
            .arg(&limits)
            .arg("--grpc-listen")
            .arg("127.0.0.1:0")
            .arg("--admin-listen")
            .arg("127.0.0.1:0")
            .arg("--ready-file")
            .arg(&ready)
            .args(extra)
            .env("RUST_LOG", "warn");
        let mut guard = ChildGuard::spawn(name, command, &work_dir.join(format!("{name}.log")))?;
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        let addrs = loop {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                break parse_ready(&text)?;
            }
            if let Some(status) = guard.try_exit_status()? {
                guard.print_log();
                bail!("{name} exited with {status} before it was ready");
            }
            if tokio::time::Instant::now() >= deadline {
                guard.print_log();
                bail!("{name} was not ready within {READY_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        Ok(Self {
            guard,
            admin: AdminClient::new(addrs.admin)?,
            addrs,
        })
    }

    /// The bound gRPC and admin addresses.
    pub fn addrs(&self) -> ReadyFile {
        self.addrs
    }

    /// A client for its admin API.
    pub fn admin(&self) -> &AdminClient {
        &self.admin
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        self.guard.is_running()
    }

    /// Prints its log tail.
    pub fn print_log(&self) {
        self.guard.print_log();
    }

    /// `GET /metrics` as text.
    pub async fn metrics(&self) -> Result<String> {
        let url = format!("http://{}/metrics", self.addrs.admin);
        let response = reqwest::get(&url)
            .await
            .with_context(|| format!("GET {url}"))?;
        if !response.status().is_success() {
            bail!("GET {url}: HTTP {}", response.status());
        }
        response.text().await.with_context(|| format!("GET {url}"))
    }

    /// SIGTERM, then SIGKILL after the grace period; fails unless it exited 0.
    pub fn shutdown(&mut self) -> Result<()> {
        let status = self.guard.terminate()?;
        if !status.success() {
            self.guard.print_log();
            bail!("{}: exited with {status} after SIGTERM", self.guard.name());
        }
        Ok(())
    }
}
