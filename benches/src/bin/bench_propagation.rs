//! Directive propagation latency: from the control plane deciding a
//! directive to every proxy having it.
//!
//! ```text
//! bench_propagation [--streams N] [--events N] [--output FILE|-]
//! ```
//!
//! Two setups against the real control plane (`SLUICE_BIN`, loopback,
//! ephemeral ports), each driven by limit changes through the admin API: a
//! bucket with traffic gets `PUT /v1/limits/{bucket}` `{"limit_rps": 0}`
//! (the next control interval pushes drop ratio 1), then `DELETE` (drop
//! ratio 0), alternately.
//!
//! 1. N simulated filter streams (default 1,000) in this process: the
//!    latency of a stream is its receive time minus the batch's
//!    `issued_at_unix_ms` (same host clock); an event's latency is the
//!    largest over the N streams.
//! 2. One real Envoy with the built filter (`ENVOY_BIN`, `SLUICE_WASM`),
//!    probed every millisecond over one keep-alive connection: the latency
//!    is the receive time of the first answer that shows the new directive
//!    (the first 429, or the first 200 after the limit is lifted) minus
//!    `issued_at_unix_ms` of that batch, as one listening simulated stream
//!    received it.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::json;
use sluice_benches::e2e::measure::Machine;
use sluice_benches::e2e::report;
use sluice_benches::fleet::stats;
use sluice_benches::fleet::stream::{Fleet, FleetSpec, Received};
use sluice_integration_tests::control_plane::{ControlPlane, ControlPlaneOptions};
use sluice_integration_tests::envoy::{Envoy, EnvoyOptions, Rewrite, load_repo_config, rewrite};
use sluice_integration_tests::paths;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// The bucket whose limit the benchmark flips.
const BUCKET: &str = "propagation";
/// The target: p99 of "every proxy has it" at or under this.
const TARGET_P99_MS: f64 = 50.0;
/// Longest wait for one directive to reach everyone.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the real Envoy is probed.
const PROBE_INTERVAL: Duration = Duration::from_millis(1);
/// The control plane's limits file: nothing limited at first.
const LIMITS: &str = "limits: []\n";

/// How long a directive takes from the control plane into Envoy.
#[derive(Debug, Parser)]
#[command(name = "bench_propagation")]
struct Options {
    /// Simulated proxy streams beside the real Envoy.
    #[arg(long, default_value_t = 1000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=5000))]
    streams: usize,
    /// Directive changes measured.
    #[arg(long, default_value_t = 20, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..=200))]
    events: usize,
    /// The file whose section is replaced, or `-` to print only.
    #[arg(long, default_value = "BENCHMARKS.md")]
    output: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    sluice_benches::exit::run_to_exit("bench_propagation", run()).await
}

/// Latencies of one setup, milliseconds.
#[derive(Debug, Default)]
struct Latencies {
    /// Per event: the slowest proxy.
    per_event_max: Vec<f64>,
    /// Every (proxy, event).
    all: Vec<f64>,
}

async fn run() -> Result<()> {
    let options = Options::parse();
    let work = tempfile::tempdir().context("cannot create a work directory")?;
    let simulated = simulated(&options, work.path()).await?;
    let envoy = real_envoy(&options, work.path()).await?;
    let section = markdown(&options, simulated, envoy)?;
    println!("{section}");
    if options.output != "-" {
        let path = paths::from_root(&options.output)?;
        report::write_marked(&path, "bench_propagation", &section)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Flips the limit: even events set it to 0 (drop ratio 1), odd ones lift it.
async fn flip(cp: &ControlPlane, event: usize) -> Result<f64> {
    if event.is_multiple_of(2) {
        cp.admin().put_limit(BUCKET, 0.0).await?;
        Ok(1.0)
    } else {
        cp.admin().delete_limit(BUCKET).await?;
        Ok(0.0)
    }
}

fn spec(streams: usize, prefix: &str, report: bool) -> FleetSpec {
    FleetSpec {
        streams,
        proxy_prefix: prefix.to_owned(),
        buckets: Arc::new(if report {
            vec![BUCKET.to_owned()]
        } else {
            Vec::new()
        }),
        report_interval: Duration::from_millis(250),
        load: Arc::new(|_, _| 25),
        watch: Some(BUCKET.to_owned()),
    }
}

/// Waits until `events` yields `want` on the watched bucket for every one of
/// `streams` streams (or, with `streams` = 1, the one listener); a stream's
/// first batch (its snapshot) counts only with `snapshots`.
async fn wait_all(
    events: &mut mpsc::UnboundedReceiver<Received>,
    streams: usize,
    want: f64,
    snapshots: bool,
) -> Result<Vec<Received>> {
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
    let mut seen = HashSet::new();
    let mut got = Vec::with_capacity(streams);
    while seen.len() < streams {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .with_context(|| {
                format!(
                    "only {} of {streams} streams received drop ratio {want} within {EVENT_TIMEOUT:?}",
                    seen.len()
                )
            })?
            .context("every stream ended")?;
        if (snapshots || !event.first) && event.watched == Some(want) && seen.insert(event.stream) {
            got.push(event);
        }
    }
    Ok(got)
}

async fn simulated(options: &Options, work: &std::path::Path) -> Result<Latencies> {
    let cp = ControlPlane::start(
        ControlPlaneOptions::new(LIMITS, work)
            .named("sluice-simulated")
            .log_level("warn"),
    )
    .await?;
    let (fleet, mut events) = Fleet::start(&spec(options.streams, "sim", true), cp.grpc_addr());
    let result = async {
        // The bucket is new: its first directive (ratio 0) reaches everyone.
        wait_all(&mut events, options.streams, 0.0, true).await?;
        eprintln!("{} simulated streams connected", fleet.connected());
        let mut latencies = Latencies::default();
        for event in 0..options.events {
            let want = flip(&cp, event).await?;
            let got = wait_all(&mut events, options.streams, want, false).await?;
            let mut all: Vec<f64> = got.iter().map(Received::latency_ms).collect();
            let (p50, _, max) = stats::summary(&mut all);
            eprintln!(
                "simulated event {event}: p50 {p50:.1} ms, last of {} {max:.1} ms",
                all.len()
            );
            latencies.per_event_max.push(max);
            latencies.all.extend(all);
            if fleet.errors() > 0 {
                bail!("{} simulated streams failed", fleet.errors());
            }
        }
        Ok(latencies)
    }
    .await;
    fleet.stop().await?;
    result
}

/// One probe answer: when it came back and its status.
struct Probe {
    received_unix_us: u64,
    status: u16,
}

async fn real_envoy(options: &Options, work: &std::path::Path) -> Result<Latencies> {
    let cp = ControlPlane::start(
        ControlPlaneOptions::new(LIMITS, work)
            .named("sluice-envoy")
            .log_level("warn"),
    )
    .await?;
    let mut config = load_repo_config("demo-a.yaml")?;
    let rw = Rewrite::for_test(cp.grpc_addr(), json!({"proxy_id": "propagation-envoy"}))?;
    rewrite(&mut config, &rw)?;
    let mut envoy_options = EnvoyOptions::new("propagation-envoy", work);
    envoy_options.log_level = "warn".to_owned();
    let mut envoy = Envoy::start(&config, &envoy_options).await?;
    let (listener, mut events) = Fleet::start(&spec(1, "listener", false), cp.grpc_addr());
    let (probes_tx, mut probes) = mpsc::unbounded_channel();
    let prober = tokio::spawn(probe(envoy.listener_addr(), probes_tx));
    let result = async {
        wait_all(&mut events, 1, 0.0, true).await?;
        let mut latencies = Latencies::default();
        for event in 0..options.events {
            // Forget answers from before the change.
            while probes.try_recv().is_ok() {}
            let want = flip(&cp, event).await?;
            let want_status = if want > 0.5 { 429 } else { 200 };
            let batch = wait_all(&mut events, 1, want, false).await?;
            let issued_at_us = batch.first().map_or(0, |b| b.issued_at_unix_ms * 1000);
            let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
            let effect = loop {
                let answer = tokio::time::timeout_at(deadline, probes.recv())
                    .await
                    .context("the directive did not take effect in Envoy in time")?
                    .context("the prober stopped")?;
                if answer.status == want_status {
                    break answer.received_unix_us;
                }
            };
            let ms = (effect as f64 - issued_at_us as f64) / 1000.0;
            eprintln!("envoy event {event}: status {want_status} after {ms:.1} ms");
            latencies.per_event_max.push(ms);
            latencies.all.push(ms);
        }
        Ok(latencies)
    }
    .await;
    prober.abort();
    listener.stop().await?;
    if result.is_err() {
        envoy.print_log();
        cp.print_log();
    }
    envoy.stop()?;
    result
}

/// Sends a GET for the bucket every [`PROBE_INTERVAL`] over one keep-alive
/// connection, forwarding each answer.
async fn probe(addr: SocketAddr, answers: mpsc::UnboundedSender<Probe>) -> Result<()> {
    let stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    stream.set_nodelay(true)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let driver = tokio::spawn(conn);
    let mut ticker = tokio::time::interval(PROBE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let request = hyper::Request::get("/")
            .header(hyper::header::HOST, "bench.local")
            .header("x-tenant", BUCKET)
            .body(Empty::<Bytes>::new())?;
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        response.into_body().collect().await?;
        let received_unix_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        if answers
            .send(Probe {
                received_unix_us,
                status,
            })
            .is_err()
        {
            break;
        }
    }
    driver.abort();
    Ok(())
}

fn markdown(options: &Options, mut simulated: Latencies, mut envoy: Latencies) -> Result<String> {
    let machine = Machine::probe(&paths::envoy_bin()?);
    let (sim_p50, sim_p99, sim_max) = stats::summary(&mut simulated.all);
    let (sim_ev_p50, sim_ev_p99, sim_ev_max) = stats::summary(&mut simulated.per_event_max);
    let (env_p50, env_p99, env_max) = stats::summary(&mut envoy.all);
    let verdict = |p99: f64| {
        if p99 <= TARGET_P99_MS {
            "meets"
        } else {
            "misses"
        }
    };
    Ok(format!(
        "## Directive propagation\n\n\
         From the control plane deciding a directive (the `issued_at_unix_ms` it \
         stamps on the batch when the control loop publishes it) to the proxies \
         having it, on one host (one clock), loopback, the real control plane \
         (`sluice serve`, release build, default 500 ms control interval). Each \
         event flips one bucket's limit through the admin API (`PUT \
         /v1/limits/{{bucket}}` with limit 0, then `DELETE`, alternately); the \
         flip itself waits for the next control interval, which is not counted: \
         the clock starts when the control plane decides. `issued_at` has 1 ms \
         resolution (truncated), so every figure may read up to 1 ms high.\n\n\
         - **{streams} simulated proxies**: {streams} filter streams \
         (`sluice.v1.DirectiveService/Stream`, each its own tonic client and \
         HTTP/2 connection, reporting the bucket every 250 ms) in one process; a \
         stream has the directive when it has decoded the batch. This includes \
         the fan-out inside the control plane, the gRPC encoding and loopback \
         transfer, and the client's decoding, all on the same 2 cores.\n\
         - **1 real Envoy** (`--concurrency 2`, the built filter, `envoy/demo-a.yaml`) \
         probed with one request every millisecond: it has the directive when the \
         first answer shows it (the first 429 after the limit is set to 0, the \
         first 200 after it is lifted); the time is that answer's arrival at the \
         prober. This includes everything above plus Envoy's gRPC client, the \
         leader VM writing shared data, the worker VM picking it up on its next \
         20 ms directive poll unless it is the leader, and up to 1 ms of probe spacing.\n\n\
         | proxies | events | p50 ms | p99 ms | max ms | target p99 <= {target} ms |\n\
         | --- | ---: | ---: | ---: | ---: | --- |\n\
         | {streams} simulated, every (proxy, event) | {events} | {sim_p50:.1} | {sim_p99:.1} | {sim_max:.1} | {v1} |\n\
         | {streams} simulated, slowest proxy per event (all {streams} have it) | {events} | {sim_ev_p50:.1} | {sim_ev_p99:.1} | {sim_ev_max:.1} | {v2} |\n\
         | 1 real Envoy, first answer showing it | {events} | {env_p50:.1} | {env_p99:.1} | {env_max:.1} | {v3} |\n\n\
         - Machine: {cpus} CPUs, {model}; Envoy {envoy_version}\n\
         - Date: {date}\n\
         - Reproduce: `just bench-propagation` (about a minute)\n\n",
        streams = options.streams,
        events = options.events,
        target = TARGET_P99_MS,
        v1 = verdict(sim_p99),
        v2 = verdict(sim_ev_p99),
        v3 = verdict(env_p99),
        cpus = machine.cpus,
        model = machine.cpu_model,
        envoy_version = machine.envoy_version,
        date = machine.date,
    ))
}
