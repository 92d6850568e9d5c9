//! The Sluice demo: one control plane, two Envoys, and uneven load above the
//! limit, printed once per control interval so you can watch the fleet
//! converge to the limit.
//!
//! Run it with `just demo` (which builds first). It uses the repository's
//! `envoy/demo-a.yaml`, `envoy/demo-b.yaml` and
//! `control-plane/examples/limits.yaml` as they are, on fixed ports:
//! Envoys 127.0.0.1:10000 / 10001 (admin 9901 / 9902), control plane gRPC
//! 127.0.0.1:50051 and admin 127.0.0.1:8080. Logs go to `.demo/`.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use sluice_integration_tests::control_plane::{BucketsReply, ControlPlane, ControlPlaneOptions};
use sluice_integration_tests::envoy::Envoy;
use sluice_integration_tests::fleet::{ControlPlaneTarget, EnvoySpec};
use sluice_integration_tests::load::{
    Counts, LoadPlan, LoadResult, LoadRun, Sample, StreamSpec, TimeBase, Window, rate,
};
use sluice_integration_tests::paths;

/// The bucket the example limits file limits (to 200 rps).
const LIMITED_TENANT: &str = "acme";
/// A tenant the example limits file does not name.
const OTHER_TENANT: &str = "globex";
const LIMITS_FILE: &str = "control-plane/examples/limits.yaml";
const LOG_DIR: &str = ".demo";
const GRPC: ([u8; 4], u16) = ([127, 0, 0, 1], 50051);
const ADMIN: ([u8; 4], u16) = ([127, 0, 0, 1], 8080);
/// (name, config, listener port, admin port)
const ENVOYS: [(&str, &str, u16, u16); 2] = [
    ("envoy-a", "envoy/demo-a.yaml", 10000, 9901),
    ("envoy-b", "envoy/demo-b.yaml", 10001, 9902),
];

/// Watch two Envoys share one global rate limit.
#[derive(Debug, Parser)]
#[command(name = "demo")]
struct Args {
    /// How long to send load, in seconds.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=600))]
    duration: u64,
    /// Requests per second offered for tenant "acme", split 3:1 between Envoy A and B.
    #[arg(long, default_value_t = 600.0)]
    rps: f64,
    /// Requests per second per Envoy for tenant "globex", which has no limit of its own.
    #[arg(long, default_value_t = 25.0)]
    other_rps: f64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("demo: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<()> {
    if !(args.rps.is_finite() && args.rps >= 4.0 && args.rps <= 5000.0) {
        bail!("--rps must be between 4 and 5000, got {}", args.rps);
    }
    if !(args.other_rps.is_finite() && args.other_rps >= 0.0 && args.other_rps <= 1000.0) {
        bail!(
            "--other-rps must be between 0 and 1000, got {}",
            args.other_rps
        );
    }
    let root = paths::workspace_root()?;
    std::env::set_current_dir(&root).with_context(|| format!("cannot cd to {}", root.display()))?;
    preflight()?;
    let log_dir = root.join(LOG_DIR);
    std::fs::create_dir_all(&log_dir)
        .with_context(|| format!("cannot create {}", log_dir.display()))?;

    println!(
        "Starting the control plane (gRPC {}, admin {}) ...",
        addr(GRPC),
        addr(ADMIN)
    );
    // The control plane writes admin changes back to its limits file: give
    // it a copy, so the example in the repository stays as it is.
    let limits = log_dir.join("limits.yaml");
    std::fs::copy(root.join(LIMITS_FILE), &limits)
        .with_context(|| format!("cannot copy {LIMITS_FILE} to {}", limits.display()))?;
    let control_plane = ControlPlane::start(
        ControlPlaneOptions::new("", &log_dir)
            .limits_file(&limits)
            .listen(addr(GRPC), addr(ADMIN)),
    )
    .await
    .context("the control plane did not start")?;
    let mut envoys = Vec::new();
    for (name, config, port, admin) in ENVOYS {
        println!(
            "Starting {name}: {config} (listener 127.0.0.1:{port}, admin 127.0.0.1:{admin}) ..."
        );
        // The repository's config as it is: its fixed ports are the
        // demo's, and it dials the control plane's.
        let envoy = EnvoySpec::file(name, Path::new(config))
            .start(&log_dir, &ControlPlaneTarget::None)
            .await
            .with_context(|| format!("{name} did not start"))?;
        envoys.push(envoy);
    }
    let admin = control_plane.admin().clone();
    let initial = admin.buckets().await.context("GET /v1/buckets failed")?;
    let interval = Duration::from_millis(initial.control_interval_ms.max(100));

    let acme_a = args.rps * 0.75;
    let acme_b = args.rps - acme_a;
    let mut streams = vec![
        StreamSpec::new("A/acme", &envoys_url(&envoys, 0)?, LIMITED_TENANT, acme_a),
        StreamSpec::new("B/acme", &envoys_url(&envoys, 1)?, LIMITED_TENANT, acme_b),
    ];
    if args.other_rps > 0.0 {
        streams.push(StreamSpec::new(
            "A/globex",
            &envoys_url(&envoys, 0)?,
            OTHER_TENANT,
            args.other_rps,
        ));
        streams.push(StreamSpec::new(
            "B/globex",
            &envoys_url(&envoys, 1)?,
            OTHER_TENANT,
            args.other_rps,
        ));
    }
    println!(
        "\nSending {:.0} rps for tenant \"{LIMITED_TENANT}\" ({acme_a:.0} to A, {acme_b:.0} to B) and {:.0} rps per Envoy \
         for \"{OTHER_TENANT}\" for {} s.\nEvery {} ms (one control interval): what the clients saw, and what the \
         control plane decided.\n  offered, admitted, A / B: counted from the responses (rps); limit, drop, cp-offer: the control plane's \
         GET /v1/buckets ('?' until the first report reaches it).\nLogs: {LOG_DIR}/. Ctrl-C stops.\n",
        args.rps,
        args.other_rps,
        args.duration,
        interval.as_millis(),
    );
    println!(
        "{:>6}  {:>8} {:>9} {:>15}  {:>6} {:>6} {:>9}  {:>14}",
        "t(s)",
        "offered",
        "admitted",
        "A / B admitted",
        "limit",
        "drop",
        "cp-offer",
        "globex ok/sent"
    );

    let load = LoadRun::start(LoadPlan::new(streams, Duration::from_secs(args.duration)))?;
    let (interrupted, last_seen) =
        report_until_done(&load, &admin, interval, Duration::from_secs(args.duration)).await;
    load.stop();
    let result = load.finish().await?;
    // After Ctrl-C the control plane may be gone already (it got the SIGINT too).
    let buckets = admin.buckets().await.ok().or(last_seen);
    print_summary(&result, &buckets, args.duration);
    if interrupted {
        println!("Interrupted.");
    }

    println!("Stopping Envoys and the control plane ...");
    for envoy in &mut envoys {
        envoy.stop()?;
    }
    let mut control_plane = control_plane;
    control_plane.shutdown()?;
    println!("Done. Logs are in {LOG_DIR}/.");
    Ok(())
}

/// Prints one line per interval until the load ends. Returns whether Ctrl-C
/// came first, and the last reply of the control plane.
async fn report_until_done(
    load: &LoadRun,
    admin: &sluice_integration_tests::control_plane::AdminClient,
    interval: Duration,
    duration: Duration,
) -> (bool, Option<BucketsReply>) {
    let mut ticker = tokio::time::interval(interval);
    ticker.tick().await;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut last_seen = None;
    loop {
        tokio::select! {
            _ = &mut ctrl_c => return (true, last_seen),
            _ = ticker.tick() => {}
        }
        let now = load.elapsed();
        let buckets = admin.buckets().await.ok();
        print_line(
            load.streams(),
            &load.snapshot(),
            now,
            interval,
            buckets.as_ref(),
        );
        if buckets.is_some() {
            last_seen = buckets;
        }
        if now >= duration {
            return (false, last_seen);
        }
    }
}

fn print_line(
    streams: &[StreamSpec],
    samples: &[Sample],
    now: Duration,
    interval: Duration,
    buckets: Option<&BucketsReply>,
) {
    let window = Window {
        from: now.saturating_sub(interval),
        to: now,
    };
    let of = |keep: &dyn Fn(&StreamSpec) -> bool| {
        Counts::of(samples, window, TimeBase::Done, |s| {
            streams.get(s.stream).is_some_and(keep)
        })
    };
    let acme = of(&|s| s.tenant.as_deref() == Some(LIMITED_TENANT));
    let a = of(&|s| s.label == "A/acme");
    let b = of(&|s| s.label == "B/acme");
    let other = of(&|s| s.tenant.as_deref() == Some(OTHER_TENANT));
    let bucket = buckets.and_then(|r| r.bucket(LIMITED_TENANT));
    let limit = bucket.map_or_else(
        || "?".to_owned(),
        |b| b.limit_rps.map_or("none".to_owned(), |l| format!("{l:.0}")),
    );
    let drop = bucket.map_or_else(|| "?".to_owned(), |b| format!("{:.2}", b.drop_ratio));
    let cp_offered = match (buckets, bucket) {
        (None, _) => "down".to_owned(),
        (Some(_), None) => "-".to_owned(),
        (Some(_), Some(b)) => format!("{:.0}", b.offered_rps),
    };
    println!(
        "{:>6.1}  {:>8.0} {:>9.0} {:>15}  {:>6} {:>6} {:>9}  {:>14}",
        now.as_secs_f64(),
        rate(acme.offered(), window),
        rate(acme.ok, window),
        format!("{:.0} / {:.0}", rate(a.ok, window), rate(b.ok, window)),
        limit,
        drop,
        cp_offered,
        format!("{}/{}", other.ok, other.sent),
    );
}

fn print_summary(result: &LoadResult, buckets: &Option<BucketsReply>, duration_s: u64) {
    let end = result
        .samples
        .iter()
        .map(|s| s.sent_at)
        .max()
        .unwrap_or_default();
    let from = (end.as_secs_f64() / 2.0).max(end.as_secs_f64() - 10.0);
    let window = Window::secs(from, end.as_secs_f64());
    if window.len_secs() < 1.0 {
        println!("\nToo short a run for a summary.");
        return;
    }
    let acme = result.tenant_counts(window, LIMITED_TENANT);
    let other = result.tenant_counts(window, OTHER_TENANT);
    let limit = match buckets.as_ref().map(|r| r.bucket(LIMITED_TENANT)) {
        None => "unknown: the control plane did not answer".to_owned(),
        Some(None) => "unknown: the control plane has no report for it".to_owned(),
        Some(Some(bucket)) => bucket
            .limit_rps
            .map_or("none".to_owned(), |l| format!("{l:.0} rps")),
    };
    println!(
        "\nSummary over {:.1}s..{:.1}s of {duration_s} s:\n  {LIMITED_TENANT}: offered {:.0} rps, admitted {:.0} rps \
         (limit {limit}); {} of {} requests got 429 (all with Retry-After: {})\n  {OTHER_TENANT}: {} of {} requests \
         got 200",
        window.from.as_secs_f64(),
        window.to.as_secs_f64(),
        rate(acme.offered(), window),
        rate(acme.ok, window),
        acme.limited,
        acme.sent,
        if acme.limited_with_retry_after == acme.limited {
            "yes"
        } else {
            "no"
        },
        other.ok,
        other.sent,
    );
}

fn envoys_url(envoys: &[Envoy], index: usize) -> Result<String> {
    envoys
        .get(index)
        .map(Envoy::base_url)
        .context("an Envoy is missing")
}

fn addr((ip, port): ([u8; 4], u16)) -> SocketAddr {
    SocketAddr::from((ip, port))
}

/// Checks the binaries, files and ports before starting anything.
fn preflight() -> Result<()> {
    paths::envoy_bin()?;
    paths::sluice_bin()?;
    paths::sluice_wasm()?;
    // The demo configs load the .wasm by this relative path, whatever SLUICE_WASM says.
    if !Path::new(paths::DEFAULT_WASM).is_file() {
        bail!("{} does not exist: run `just build`", paths::DEFAULT_WASM);
    }
    if !Path::new(LIMITS_FILE).is_file() {
        bail!("{LIMITS_FILE} does not exist");
    }
    let mut ports = vec![
        ("control plane gRPC", addr(GRPC)),
        ("control plane admin", addr(ADMIN)),
    ];
    for (name, _, port, admin) in ENVOYS {
        ports.push((name, SocketAddr::from(([127, 0, 0, 1], port))));
        ports.push((name, SocketAddr::from(([127, 0, 0, 1], admin))));
    }
    for (what, addr) in ports {
        if let Err(err) = TcpListener::bind(addr) {
            bail!(
                "port {addr} (for {what}) is busy: {err}. Stop whatever listens there \
                 (`ss -ltnp 'sport = :{}'` shows it), e.g. a previous demo, and try again",
                addr.port()
            );
        }
    }
    Ok(())
}
