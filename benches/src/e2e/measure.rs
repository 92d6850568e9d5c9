//! Process CPU time from `/proc`, and facts about the machine for the report.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// User plus system CPU time of process `pid` so far (all its threads).
pub fn cpu_time(pid: u32, ticks_per_second: u64) -> Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    // The command name (field 2) is parenthesised and may hold spaces: the
    // numeric fields start after its closing parenthesis, at field 3.
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .with_context(|| format!("{path}: no command name"))?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are fields 14 and 15, i.e. indexes 11 and 12 here.
    let ticks = |index: usize| -> Result<u64> {
        fields
            .get(index)
            .with_context(|| format!("{path}: too few fields"))?
            .parse::<u64>()
            .with_context(|| format!("{path}: field {} is not a number", index + 3))
    };
    let total = ticks(11)?.saturating_add(ticks(12)?);
    Ok(Duration::from_nanos(
        total.saturating_mul(1_000_000_000) / ticks_per_second.max(1),
    ))
}

/// Clock ticks per second, the unit of `/proc/<pid>/stat` times.
pub fn ticks_per_second() -> Result<u64> {
    let text = command_output("getconf", &["CLK_TCK"])?;
    text.trim()
        .parse()
        .with_context(|| format!("getconf CLK_TCK printed {text:?}"))
}

/// Resident set size of process `pid` (`VmRSS` in `/proc/<pid>/status`), bytes.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .with_context(|| format!("{path}: no VmRSS line"))?
        .parse::<u64>()
        .with_context(|| format!("{path}: VmRSS is not a number"))?;
    Ok(kib.saturating_mul(1024))
}

/// Facts printed at the top of the report.
#[derive(Debug, Clone)]
pub struct Machine {
    /// Online CPUs (`nproc`).
    pub cpus: String,
    /// `model name` from `/proc/cpuinfo`.
    pub cpu_model: String,
    /// `envoy --version`.
    pub envoy_version: String,
    /// UTC date and time of the run.
    pub date: String,
}

impl Machine {
    /// Gathers the facts; what cannot be read is reported as `unknown`.
    pub fn probe(envoy: &Path) -> Self {
        let unknown = |_| "unknown".to_owned();
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find(|line| line.starts_with("model name"))
                    .and_then(|line| line.split_once(':'))
                    .map(|(_, model)| model.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        let envoy_version = command_output(&envoy.display().to_string(), &["--version"])
            .map(|text| {
                text.split_once("version:")
                    .map_or(text.as_str(), |(_, version)| version)
                    .trim()
                    .to_owned()
            })
            .unwrap_or_else(unknown);
        Self {
            cpus: command_output("nproc", &[])
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(unknown),
            cpu_model,
            envoy_version,
            date: command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(unknown),
        }
    }
}

fn command_output(program: &str, args: &[&str]) -> Result<String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {program}"))?;
    if !output.status.success() {
        bail!("{program} exited with {}", output.status);
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
