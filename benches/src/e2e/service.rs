//! The stand-in rate limit service (`rls_server`) as a child process, so its
//! CPU time is read from `/proc` apart from Envoy's.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_integration_tests::process::ChildGuard;

use super::measure;

/// How long the service gets to write its ready file.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A running `rls_server`; stopped on drop.
#[derive(Debug)]
pub struct RlsProcess {
    guard: ChildGuard,
    addr: SocketAddr,
}

impl RlsProcess {
    /// Starts `rls_server` (found next to the current executable) with its
    /// log and ready file under `work_dir`.
    pub async fn start(work_dir: &Path) -> Result<Self> {
        let binary = binary()?;
        let ready = work_dir.join("rls.ready");
        let mut command = Command::new(&binary);
        command.arg("--ready-file").arg(&ready);
        let mut guard = ChildGuard::spawn("rls_server", command, &work_dir.join("rls.log"))?;
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        let addr = loop {
            if let Ok(text) = std::fs::read_to_string(&ready)
                && let Ok(addr) = text.trim().parse::<SocketAddr>()
            {
                break addr;
            }
            if let Some(status) = guard.try_exit_status()? {
                guard.print_log();
                bail!("rls_server exited with {status} during start-up");
            }
            if tokio::time::Instant::now() >= deadline {
                guard.print_log();
                bail!("rls_server was not ready within {READY_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        Ok(Self { guard, addr })
    }

    /// Where it listens (gRPC, HTTP/2 cleartext).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its CPU time so far (user + system).
    pub fn cpu_time(&self, ticks_per_second: u64) -> Result<Duration> {
        measure::cpu_time(self.guard.pid(), ticks_per_second)
    }
}

/// `rls_server` in the directory of the running executable (cargo puts every
/// binary of the package there).
fn binary() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find the current executable")?;
    let path = exe
        .parent()
        .context("the current executable has no directory")?
        .join("rls_server");
    if !path.is_file() {
        bail!(
            "{} does not exist: build it with `cargo build --release -p sluice-benches --bins`",
            path.display()
        );
    }
    Ok(path)
}
