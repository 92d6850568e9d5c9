//! The stand-in services (`bench_service`) as child processes, so their CPU
//! time is read from `/proc` apart from Envoy's.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_integration_tests::process::ChildGuard;

use super::measure;

/// How long a service gets to write its ready file.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Which stand-in service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// Envoy's rate limit service API, answering OK (variant 6).
    RateLimit,
    /// An HTTP/1.1 upstream answering `200 ok` (variants 8 and 9).
    Upstream,
    /// The harness's fake LLM provider, streaming chat completions of the
    /// size each request asks for (variants 14 to 21).
    Llm,
    /// Kuadrant's `limitador` library behind the same rate limit service
    /// (`bench_rls`'s reference point).
    Limitador,
}

impl Service {
    fn arg(self) -> &'static str {
        match self {
            Service::RateLimit => "rls",
            Service::Upstream => "upstream",
            Service::Llm => "llm",
            Service::Limitador => "limitador",
        }
    }
}

/// A running `bench_service`; stopped on drop.
#[derive(Debug)]
pub struct ServiceProcess {
    guard: ChildGuard,
    addr: SocketAddr,
}

impl ServiceProcess {
    /// Starts `bench_service` (found next to the current executable) with
    /// its log and ready file under `work_dir`.
    pub async fn start(service: Service, work_dir: &Path) -> Result<Self> {
        let binary = binary()?;
        let name = service.arg();
        let ready = work_dir.join(format!("{name}.ready"));
        let mut command = Command::new(&binary);
        command.arg(name).arg("--ready-file").arg(&ready);
        let log = work_dir.join(format!("{name}.log"));
        let mut guard = ChildGuard::spawn(name, command, &log)?;
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        let addr = loop {
            if let Ok(text) = std::fs::read_to_string(&ready)
                && let Ok(addr) = text.trim().parse::<SocketAddr>()
            {
                break addr;
            }
            if let Some(status) = guard.try_exit_status()? {
                guard.print_log();
                bail!("bench_service {name} exited with {status} during start-up");
            }
            if tokio::time::Instant::now() >= deadline {
                guard.print_log();
                bail!("bench_service {name} was not ready within {READY_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        Ok(Self { guard, addr })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// Its CPU time so far (user + system).
    pub fn cpu_time(&self, ticks_per_second: u64) -> Result<Duration> {
        measure::cpu_time(self.guard.pid(), ticks_per_second)
    }
}

/// `bench_service` in the directory of the running executable (cargo puts
/// every binary of the package there).
fn binary() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find the current executable")?;
    let path = exe
        .parent()
        .context("the current executable has no directory")?
        .join("bench_service");
    if !path.is_file() {
        bail!(
            "{} does not exist: build it with `cargo build --release -p sluice-benches --bins`",
            path.display()
        );
    }
    Ok(path)
}
