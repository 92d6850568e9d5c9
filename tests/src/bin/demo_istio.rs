//! `just demo-istio`: Sluice delivered the way Istio delivers it, without a
//! cluster. An xDS server plays istiod and serves deploy/istio's WasmPlugin
//! over ECDS exactly as istiod builds it (no vm_id, `pluginConfig` as JSON,
//! root id = `pluginName`); two Envoys run as sidecars of two pods of
//! namespace `shop` and reach the control plane (deploy/'s limits file)
//! through the cluster Istio names
//! `outbound|50051||sluice.sluice-system.svc.cluster.local`. Uneven load
//! above the `acme` limit; one line a second shows the fleet hold it.
//! Everything runs on ephemeral loopback ports and stops on its own.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Parser;
use sluice_integration_tests::load::{
    Counts, LoadPlan, LoadRun, StreamSpec, TimeBase, Window, rate,
};
use sluice_integration_tests::mesh::ISTIO_CONTROL_PLANE_CLUSTER;
use sluice_integration_tests::sidecars::{SIDECAR_PLUGIN, SidecarMesh, SidecarOptions};

/// The bucket deploy/'s ConfigMap limits to 200 rps.
const LIMITED: &str = "acme";
/// A tenant it does not limit.
const OTHER: &str = "globex";

/// Watch two Istio-style sidecars share one global rate limit.
#[derive(Debug, Parser)]
#[command(name = "demo-istio")]
struct Args {
    /// How long to send load, in seconds.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(5..=600))]
    duration: u64,
    /// Requests per second offered for tenant "acme", split 3:1 between the sidecars.
    #[arg(long, default_value_t = 600.0)]
    rps: f64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("demo-istio: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<()> {
    if !(args.rps.is_finite() && (4.0..=5000.0).contains(&args.rps)) {
        bail!("--rps must be between 4 and 5000, got {}", args.rps);
    }
    println!("Starting an xDS server (as istiod), the control plane and two sidecars ...");
    let mesh =
        SidecarMesh::start(SidecarOptions::new(&["checkout-7d9f-a", "checkout-7d9f-b"])).await?;
    println!(
        "  WasmPlugin deploy/{SIDECAR_PLUGIN} served over ECDS as {}\n  \
         root_id {:?}, no vm_id, control plane through {ISTIO_CONTROL_PLANE_CLUSTER}",
        mesh.plugin.resource_name(),
        mesh.plugin.plugin_name,
    );
    for (sidecar, envoy) in mesh.sidecars.iter().zip(&mesh.fleet.envoys) {
        println!("  {} listening on {}", sidecar.node_id(), envoy.base_url());
    }
    println!("  logs and configs: {}\n", mesh.dir().display());

    let a = args.rps * 0.75;
    let b = args.rps - a;
    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("A/acme", &mesh.url(0)?, LIMITED, a),
            StreamSpec::new("B/acme", &mesh.url(1)?, LIMITED, b),
            StreamSpec::new("A/globex", &mesh.url(0)?, OTHER, 25.0),
        ],
        Duration::from_secs(args.duration),
    ))?;
    println!(
        "Sending {:.0} rps for \"{LIMITED}\" ({a:.0} to sidecar A, {b:.0} to B), 25 rps for \"{OTHER}\" (no limit), for {} s.",
        args.rps, args.duration
    );
    println!(
        "{:>6}  {:>8} {:>9} {:>15}  {:>6} {:>6}  {:>13}",
        "t(s)", "offered", "admitted", "A / B admitted", "limit", "drop", "globex ok/sent"
    );
    let admin = mesh.fleet.control_plane.admin().clone();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let now = load.elapsed();
        let window = Window {
            from: now.saturating_sub(Duration::from_secs(1)),
            to: now,
        };
        let samples = load.snapshot();
        let streams = load.streams();
        let of = |label: &str| {
            Counts::of(&samples, window, TimeBase::Done, |s| {
                streams
                    .get(s.stream)
                    .is_some_and(|spec| spec.label.starts_with(label))
            })
        };
        let (fleet_a, fleet_b, other) = (of("A/acme"), of("B/acme"), of("A/globex"));
        let buckets = admin.buckets().await.ok();
        let bucket = buckets.as_ref().and_then(|r| r.bucket(LIMITED));
        println!(
            "{:>6.1}  {:>8.0} {:>9.0} {:>15}  {:>6} {:>6}  {:>13}",
            now.as_secs_f64(),
            rate(fleet_a.offered() + fleet_b.offered(), window),
            rate(fleet_a.ok + fleet_b.ok, window),
            format!(
                "{:.0} / {:.0}",
                rate(fleet_a.ok, window),
                rate(fleet_b.ok, window)
            ),
            bucket
                .and_then(|b| b.limit_rps)
                .map_or("?".to_owned(), |l| format!("{l:.0}")),
            bucket.map_or("?".to_owned(), |b| format!("{:.2}", b.drop_ratio)),
            format!("{}/{}", other.ok, other.sent),
        );
        if now >= Duration::from_secs(args.duration) {
            break;
        }
    }
    load.stop();
    let result = load.finish().await?;
    let half = args.duration as f64 / 2.0;
    let window = Window::secs(half, args.duration as f64);
    println!(
        "\nSecond half: the sidecars admitted {:.1} rps of \"{LIMITED}\" (limit 200).",
        result.admitted_rps(window, LIMITED)
    );
    let proxies = admin.proxies().await?;
    println!("Proxies the control plane knows (their Envoy node ids, no proxy_id configured):");
    for proxy in &proxies.proxies {
        println!("  {} connected={}", proxy.proxy_id, proxy.connected);
    }
    Ok(())
}
