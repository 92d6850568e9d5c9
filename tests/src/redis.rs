//! A real `redis-server` on an ephemeral loopback port, for the shared
//! store: no persistence, its files in the test's folder, stopped with the
//! test (its log printed when the test fails), and killable and
//! restartable on the same port for outage tests; optionally TLS-only with
//! a password.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::certs::{self, DevCerts};
use crate::paths;
use crate::process::ChildGuard;

/// How long a start may take before it counts as failed.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Ports tried before giving up (another process may take a free port
/// between the probe and Redis's bind).
const PORT_ATTEMPTS: u32 = 5;

/// A running `redis-server`.
#[derive(Debug)]
pub struct RedisServer {
    guard: ChildGuard,
    binary: PathBuf,
    dir: PathBuf,
    port: u16,
    starts: u32,
    /// TLS and password settings, kept for restarts.
    extra: Extra,
}

/// What a server adds to the plain-text default.
#[derive(Debug, Clone, Default)]
struct Extra {
    /// Arguments after the common ones.
    args: Vec<String>,
    /// The port speaks TLS (readiness is read from the log, not a PING).
    tls: bool,
}

impl RedisServer {
    /// Starts one with its files (and log) in `dir`, on a free port.
    pub async fn start(dir: &Path) -> Result<Self> {
        Self::start_with(dir, Extra::default()).await
    }

    /// Starts one that speaks only TLS with `certs`' server certificate
    /// (clients need not present one) and requires `password`.
    pub async fn start_tls(dir: &Path, certs: &DevCerts, password: &str) -> Result<Self> {
        Self::start_tls_with(dir, certs, password, false).await
    }

    /// As [`Self::start_tls`], and clients must present a certificate
    /// `certs`' CA signed (`tls-auth-clients yes`).
    pub async fn start_mtls(dir: &Path, certs: &DevCerts, password: &str) -> Result<Self> {
        Self::start_tls_with(dir, certs, password, true).await
    }

    async fn start_tls_with(
        dir: &Path,
        certs: &DevCerts,
        password: &str,
        client_certs: bool,
    ) -> Result<Self> {
        let file = |name| certs.path(name).display().to_string();
        let args = vec![
            "--tls-cert-file".to_owned(),
            file(certs::SERVER_CERT),
            "--tls-key-file".to_owned(),
            file(certs::SERVER_KEY),
            "--tls-ca-cert-file".to_owned(),
            file(certs::CA),
            "--tls-auth-clients".to_owned(),
            if client_certs { "yes" } else { "no" }.to_owned(),
            "--requirepass".to_owned(),
            password.to_owned(),
        ];
        Self::start_with(dir, Extra { args, tls: true }).await
    }

    async fn start_with(dir: &Path, extra: Extra) -> Result<Self> {
        let binary = paths::redis_server()?;
        let dir = dir.join("redis");
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let mut last_error = None;
        for attempt in 1..=PORT_ATTEMPTS {
            let port = free_port()?;
            match spawn(&binary, &dir, port, attempt, &extra).await {
                Ok(guard) => {
                    return Ok(Self {
                        guard,
                        binary,
                        dir,
                        port,
                        starts: attempt,
                        extra,
                    });
                }
                Err(err) => last_error = Some(err),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("redis-server did not start")))
    }

    /// `redis://127.0.0.1:PORT/0`, or `rediss://localhost:PORT/0` for TLS
    /// (the name on the test certificate).
    pub fn url(&self) -> String {
        if self.extra.tls {
            format!("rediss://localhost:{}/0", self.port)
        } else {
            format!("redis://127.0.0.1:{}/0", self.port)
        }
    }

    /// The current process's id (for CPU accounting in benchmarks).
    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// SIGKILL: the store vanishes mid-flight, as a crash would.
    pub fn kill(&mut self) -> Result<()> {
        self.guard.kill().map(drop)
    }

    /// SIGSTOP: the server holds its connections but answers nothing (a
    /// stalled store); [`Self::resume`] undoes it.
    pub fn pause(&self) -> Result<()> {
        self.signal(Signal::SIGSTOP)
    }

    /// SIGCONT after [`Self::pause`].
    pub fn resume(&self) -> Result<()> {
        self.signal(Signal::SIGCONT)
    }

    fn signal(&self, signal: Signal) -> Result<()> {
        let pid = i32::try_from(self.guard.pid()).context("pid out of range")?;
        kill(Pid::from_raw(pid), signal).with_context(|| format!("cannot send {signal} to Redis"))
    }

    /// Starts a new, empty server on the same port (after [`Self::kill`]).
    pub async fn restart(&mut self) -> Result<()> {
        self.guard.kill()?;
        self.starts += 1;
        // The port may take a moment to be free again.
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match spawn(&self.binary, &self.dir, self.port, self.starts, &self.extra).await {
                Ok(guard) => {
                    self.guard = guard;
                    return Ok(());
                }
                Err(err) if Instant::now() > deadline => return Err(err),
                Err(_) => {
                    self.starts += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Prints the current process's log tail.
    pub fn print_log(&self) {
        self.guard.print_log();
    }
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind a loopback port")?;
    Ok(listener.local_addr()?.port())
}

async fn spawn(
    binary: &Path,
    dir: &Path,
    port: u16,
    start: u32,
    extra: &Extra,
) -> Result<ChildGuard> {
    let mut command = Command::new(binary);
    if extra.tls {
        command.args(["--port", "0", "--tls-port", &port.to_string()]);
    } else {
        command.args(["--port", &port.to_string()]);
    }
    command
        .args(&extra.args)
        .args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .arg("--dir")
        .arg(dir);
    let log = dir.join(format!("redis-{start}.log"));
    let mut guard = ChildGuard::spawn(&format!("redis-server:{port}"), command, &log)?;
    guard.set_grace(Duration::from_secs(1));
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if !guard.is_running() {
            bail!(
                "redis-server on port {port} exited at start:\n{}",
                guard.log_tail()
            );
        }
        let ready = if extra.tls {
            guard.log_tail().contains("Ready to accept connections")
        } else {
            ping(port)
        };
        if ready {
            return Ok(guard);
        }
        if Instant::now() > deadline {
            bail!(
                "redis-server on port {port} did not answer PING within {START_TIMEOUT:?}:\n{}",
                guard.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An inline `PING` (Redis's plain-text command form) answered `+PONG`.
fn ping(port: u16) -> bool {
    let attempt = || -> std::io::Result<bool> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
        stream.set_read_timeout(Some(Duration::from_millis(500)))?;
        stream.write_all(b"PING\r\n")?;
        let mut answer = [0_u8; 7];
        stream.read_exact(&mut answer)?;
        Ok(&answer == b"+PONG\r\n")
    };
    attempt().unwrap_or(false)
}
