//! The high-availability demo: three control-plane replicas sharing one
//! Redis, two Envoys listing all three (`envoy/replicas.yaml`), and load at
//! 4× a fleet limit. Halfway through, the leader replica is killed with
//! SIGKILL; every second the demo prints the fleet's admitted rate and
//! which replica leads, so you can watch the limit hold through it.
//!
//! Run it with `just demo-ha`. Everything runs on ephemeral loopback ports
//! under a temporary directory, removed at the end.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Parser;
use sluice_integration_tests::load::{Counts, LoadPlan, LoadRun, StreamSpec, TimeBase, Window};
use sluice_integration_tests::paths;
use sluice_integration_tests::replicas::{ReplicaSet, ReplicaSetOptions, leading};

const LIMIT_RPS: f64 = 150.0;
const LIMITS: &str = "limits:\n  - bucket: acme\n    limit_rps: 150\n";

/// Watch three replicas keep one limit while the leader dies.
#[derive(Debug, Parser)]
#[command(name = "demo-ha")]
struct Args {
    /// How long to send load, in seconds (the leader dies halfway).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(6..=600))]
    duration: u64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("demo-ha: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<()> {
    // Fail early, with the hint of how to build, if something is missing.
    paths::sluice_bin()?;
    paths::sluice_wasm()?;
    paths::redis_server()?;
    let mut options = ReplicaSetOptions::new(LIMITS, 3, 2);
    options.control_interval_ms = 500;
    println!("starting Redis, 3 control-plane replicas and 2 Envoys …");
    let mut set = ReplicaSet::start(options).await?;
    let duration = Duration::from_secs(args.duration);
    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("A", &set.url(0)?, "acme", 450.0),
            StreamSpec::new("B", &set.url(1)?, "acme", 150.0),
        ],
        duration,
    ))?;
    println!(
        "offering 600 rps (450 through Envoy A, 150 through B) against a fleet limit of \
         {LIMIT_RPS} rps; the leader is killed at {} s\n",
        args.duration / 2
    );
    println!("   t(s)   admitted rps   leader");
    let kill_at = duration / 2;
    let mut killed: Option<usize> = None;
    let mut next = Duration::from_secs(1);
    while next <= duration {
        tokio::time::sleep(next.saturating_sub(load.elapsed())).await;
        let window = Window {
            from: next.saturating_sub(Duration::from_secs(1)),
            to: next,
        };
        let admitted = Counts::of(&load.snapshot(), window, TimeBase::Done, |_| true).ok;
        let leader = current_leader(&set, killed).await;
        let leader = leader.map_or_else(
            || "none (lease expiring)".to_owned(),
            |(i, f)| format!("r{i} (fence {f})"),
        );
        println!("  {:>5} {:>14}   {leader}", next.as_secs(), admitted);
        if killed.is_none()
            && next >= kill_at
            && let Some((index, _)) = current_leader(&set, None).await
            && let Some(replica) = set.replicas.get_mut(index)
        {
            // Which streams move depends on where the Envoys' streams
            // landed, so say how many the leader held.
            let envoys = set.envoys.len();
            let held = match replica.admin().proxies().await {
                Ok(proxies) if proxies.connected > 0 => format!(
                    "it held {} of the {envoys} Envoys' streams, which move to the others",
                    proxies.connected
                ),
                Ok(_) => format!("it held none of the {envoys} Envoys' streams"),
                Err(_) => "its streams move to the others".to_owned(),
            };
            replica.kill()?;
            killed = Some(index);
            println!("         -- SIGKILL r{index}, the leader ({held}) --");
        }
        next += Duration::from_secs(1);
    }
    load.stop();
    let result = load.finish().await?;
    let whole = Window {
        from: Duration::ZERO,
        to: duration,
    };
    let counts = result.tenant_counts(whole, "acme");
    println!(
        "\n{} requests, {} admitted, {} answered 429, {} failed",
        counts.sent, counts.ok, counts.limited, counts.errors
    );
    if counts.errors > 0 || counts.server_errors > 0 {
        set.print_logs();
        bail!("requests failed");
    }
    Ok(())
}

/// The replica that leads, skipping `killed`.
async fn current_leader(set: &ReplicaSet, killed: Option<usize>) -> Option<(usize, u64)> {
    for (index, replica) in set.replicas.iter().enumerate() {
        if Some(index) == killed {
            continue;
        }
        if let Ok(Some(fence)) = leading(replica.admin()).await {
            return Some((index, fence));
        }
    }
    None
}
