//! A guard for a child process.
//!
//! stdout and stderr go to one log file. On drop the child gets SIGTERM, then
//! SIGKILL after a grace period, so no process outlives its test, also when the
//! test panics. If the thread is panicking (a failed assertion), the guard
//! prints the tail of the log first, so the failure shows what the process said.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long a child gets between SIGTERM and SIGKILL.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3);
/// How much of a log is printed when a test fails.
const LOG_TAIL_BYTES: u64 = 16 * 1024;

/// A running child process that is stopped when the guard is dropped.
#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    child: Child,
    log_path: PathBuf,
    grace: Duration,
    exit: Option<ExitStatus>,
}

impl ChildGuard {
    /// Spawns `command` with stdin closed and stdout/stderr written to `log_path` (truncated first).
    pub fn spawn(name: &str, mut command: Command, log_path: &Path) -> Result<Self> {
        let log = File::options()
            .create(true)
            .write(true)
            .truncate(true)
            .open(log_path)
            .with_context(|| format!("{name}: cannot open log file {}", log_path.display()))?;
        let log_err = log
            .try_clone()
            .with_context(|| format!("{name}: cannot duplicate the log file handle"))?;
        command
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        let child = command
            .spawn()
            .with_context(|| format!("{name}: cannot start {:?}", command.get_program()))?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log_path: log_path.to_path_buf(),
            grace: DEFAULT_GRACE,
            exit: None,
        })
    }

    /// The name given at spawn, used in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Where stdout and stderr go.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Changes the SIGTERM → SIGKILL grace period.
    pub fn set_grace(&mut self, grace: Duration) {
        self.grace = grace;
    }

    /// `Some(status)` once the child has exited.
    pub fn try_exit_status(&mut self) -> Result<Option<ExitStatus>> {
        if self.exit.is_none() {
            self.exit = self
                .child
                .try_wait()
                .with_context(|| format!("{}: cannot poll the process", self.name))?;
        }
        Ok(self.exit)
    }

    /// Whether the child is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.try_exit_status(), Ok(None))
    }

    /// SIGTERM, then SIGKILL if it is still running after the grace period.
    pub fn terminate(&mut self) -> Result<ExitStatus> {
        self.stop_with(Signal::SIGTERM, self.grace)
    }

    /// SIGKILL at once (a crash, as far as its peers can tell).
    pub fn kill(&mut self) -> Result<ExitStatus> {
        self.stop_with(Signal::SIGKILL, Duration::ZERO)
    }

    /// The last `LOG_TAIL_BYTES` of the log (lossy UTF-8).
    pub fn log_tail(&self) -> String {
        read_tail(&self.log_path, LOG_TAIL_BYTES)
            .unwrap_or_else(|err| format!("<cannot read {}: {err}>", self.log_path.display()))
    }

    /// Prints the log tail to stderr with a header naming the process.
    pub fn print_log(&self) {
        eprintln!(
            "----- {} (pid {}) log: {} -----\n{}\n----- end of {} log -----",
            self.name,
            self.child.id(),
            self.log_path.display(),
            self.log_tail(),
            self.name
        );
    }

    fn stop_with(&mut self, signal: Signal, grace: Duration) -> Result<ExitStatus> {
        if let Some(status) = self.try_exit_status()? {
            return Ok(status);
        }
        let pid = Pid::from_raw(
            i32::try_from(self.child.id())
                .with_context(|| format!("{}: pid out of range", self.name))?,
        );
        // ESRCH (already gone) is fine: the wait below collects it.
        let _ = kill(pid, signal);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(status) = self.try_exit_status()? {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(status) = self.try_exit_status()? {
            return Ok(status);
        }
        let _ = self.child.kill();
        let status = self
            .child
            .wait()
            .with_context(|| format!("{}: cannot wait for the process", self.name))?;
        self.exit = Some(status);
        Ok(status)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_log();
        }
        if let Err(err) = self.terminate() {
            eprintln!("{}: cleanup failed: {err:#}", self.name);
        }
    }
}

/// The last `max_bytes` of a file, as lossy UTF-8.
pub fn read_tail(path: &Path, max_bytes: u64) -> std::io::Result<String> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let start = len.saturating_sub(max_bytes);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if start > 0 {
        Ok(format!("[... {start} earlier bytes omitted ...]\n{text}"))
    } else {
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut command = Command::new("sh");
        command.arg("-c").arg(script);
        command
    }

    #[test]
    fn output_goes_to_the_log_file() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("echo.log");
        let mut guard = ChildGuard::spawn("echo", sh("echo out; echo err >&2"), &log).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while guard.is_running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let tail = guard.log_tail();
        assert!(tail.contains("out") && tail.contains("err"), "{tail}");
    }

    #[test]
    fn terminate_stops_a_sleeping_process() {
        let dir = tempfile::tempdir().unwrap();
        let mut guard =
            ChildGuard::spawn("sleeper", sh("exec sleep 30"), &dir.path().join("s.log")).unwrap();
        assert!(guard.is_running());
        let started = Instant::now();
        let status = guard.terminate().unwrap();
        assert!(!status.success());
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(!guard.is_running());
    }

    #[test]
    fn sigkill_follows_when_sigterm_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let mut guard = ChildGuard::spawn(
            "stubborn",
            sh("trap '' TERM; echo ready; while true; do sleep 0.05; done"),
            &dir.path().join("t.log"),
        )
        .unwrap();
        // Let the shell install its trap before signalling.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !guard.log_tail().contains("ready") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        guard.set_grace(Duration::from_millis(200));
        let status = guard.terminate().unwrap();
        assert!(!status.success());
    }

    #[test]
    fn read_tail_keeps_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.log");
        std::fs::write(&path, "a".repeat(100) + "THE END").unwrap();
        let tail = read_tail(&path, 10).unwrap();
        assert!(tail.ends_with("aaaTHE END"), "{tail}");
        assert!(tail.contains("earlier bytes omitted"), "{tail}");
    }
}
