//! The rate limit service (`sluice serve --quotas`) under load:
//! ShouldRateLimit calls per second, the control plane's CPU per call, and
//! p50/p99 latency seen by the client, for each quota algorithm, with the
//! counters in memory, in Redis (`--store`, a `redis-server` started
//! here: `REDIS_SERVER` or `scripts/ensure-redis.sh`) and in a Redis
//! Cluster of three masters with a replica each (`redis+cluster://`,
//! made here with `redis-cli --cluster create`).
//!
//! ```text
//! bench_rls [--rate N] [--seconds S] [--connections N] [--output FILE|-]
//! ```
//!
//! An open-loop client in this process sends `--rate` calls per second
//! (default 20,000) over `--connections` HTTP/2 connections (default 1)
//! for `--seconds` (default 5), once spread over each millisecond and once
//! in one burst a millisecond ([`ARRIVALS`]),
//! after a one-second warm-up, each call one descriptor `("tenant", t)` of
//! 1,000 tenants in turn, whose quota it never exhausts. The control plane
//! is `SLUICE_BIN` (the release build under `just bench-rls`), serving the
//! quotas on a listener of their own ([`SLUICE_RUNS`]); its CPU time
//! is read from `/proc` around the measured calls (Redis's too: every
//! node's, on the cluster). In the
//! same run, two reference points behind the same client: the minimal
//! always-OK service (the cost of the gRPC call alone) and Kuadrant's
//! `limitador` library in memory behind that same minimal service
//! ([`sluice_benches::limitador_rls`]), each a `bench_service` process.
//! Writes its section of BENCHMARKS.md unless `--output -`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice_benches::e2e::measure::{self, Machine};
use sluice_benches::e2e::report;
use sluice_benches::e2e::service::{Service, ServiceProcess};
use sluice_benches::fleet::stats;
use sluice_integration_tests::control_plane::{ControlPlane, ControlPlaneOptions};
use sluice_integration_tests::paths;
use sluice_integration_tests::redis::{RedisCluster, RedisServer};
use tokio::sync::Semaphore;

const QUOTAS: &str = "domain: bench\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n";
const TENANTS: usize = 1_000;
const MAX_IN_FLIGHT: usize = 1_024;
/// How calls arrive: spread over each millisecond (the pacing thread wakes
/// every 50 µs, about every 110 µs with the kernel's timer slack), as
/// Envoy's requests arrive, or in one burst per millisecond, as a timer
/// tick sends them.
const ARRIVALS: [(Duration, &str); 2] = [
    (Duration::from_micros(50), "spread"),
    (Duration::from_millis(1), "1 ms bursts"),
];

/// `sluice serve` as a quota service is advised to run: the rate limit
/// service on its own listener and thread (`--rls-listen`).
const OWN_LISTENER: &str = "sluice serve --quotas --rls-listen";
/// Each `sluice serve` measured: every algorithm on its own listener, and
/// the default one (envoyproxy/ratelimit's fixed window) on the gRPC
/// listener, on the control plane's runtime.
const SLUICE_RUNS: [(&str, &str); 4] = [
    (OWN_LISTENER, "fixed_window"),
    (OWN_LISTENER, "sliding_window"),
    (OWN_LISTENER, "gcra"),
    ("sluice serve --quotas (gRPC listener)", "fixed_window"),
];

struct Options {
    rate: u64,
    seconds: u64,
    connections: usize,
    output: String,
}

fn options() -> Result<Options> {
    let mut options = Options {
        rate: 20_000,
        seconds: 5,
        connections: 1,
        output: "BENCHMARKS.md".to_owned(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--rate" => options.rate = value("--rate")?.parse()?,
            "--seconds" => options.seconds = value("--seconds")?.parse()?,
            "--connections" => options.connections = value("--connections")?.parse()?,
            "--output" => options.output = value("--output")?,
            other => bail!(
                "unknown argument {other:?}: bench_rls [--rate N] [--seconds S] [--connections N] [--output FILE|-]"
            ),
        }
    }
    if !(100..=200_000).contains(&options.rate)
        || !(1..=60).contains(&options.seconds)
        || !(1..=64).contains(&options.connections)
    {
        bail!("--rate 100..=200000, --seconds 1..=60, --connections 1..=64");
    }
    Ok(options)
}

/// What one algorithm's run measured.
struct Measured {
    service: &'static str,
    arrivals: &'static str,
    store: &'static str,
    algorithm: &'static str,
    calls_per_s: f64,
    cpu_us_per_call: f64,
    /// Redis's CPU per call (on Redis only).
    redis_cpu_us_per_call: Option<f64>,
    p50_us: f64,
    p99_us: f64,
    skipped: u64,
    errors: u64,
}

// The client runs on one thread, as the reference servers do: with a
// worker thread per core its threads and the servers' (and Redis) took
// turns on two cores, and the whole machine stalled for 5-40 ms a few times
// a second, every service's p99 with it.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    sluice_benches::exit::run_to_exit("bench_rls", run()).await
}

async fn run() -> Result<()> {
    let options = options()?;
    let ticks = measure::ticks_per_second()?;
    let work = tempfile::tempdir()?;
    let quota_dir = work.path().join("quotas");
    std::fs::create_dir_all(&quota_dir)?;
    std::fs::write(quota_dir.join("bench.yaml"), QUOTAS)?;
    let redis = RedisServer::start(&work.path().join("single")).await?;
    let redis_url = redis.url();
    let cluster = RedisCluster::start(&work.path().join("cluster"), 3, 1).await?;
    let cluster_url = cluster.url();
    let stores: [(&'static str, Option<&str>, Vec<u32>); 3] = [
        ("memory", None, Vec::new()),
        ("redis", Some(redis_url.as_str()), vec![redis.pid()]),
        (
            "redis cluster (3 masters + 3 replicas)",
            Some(cluster_url.as_str()),
            cluster.nodes.iter().map(RedisServer::pid).collect(),
        ),
    ];
    let mut rows = Vec::new();
    for (store, url, redis_pids) in &stores {
        let (store, url) = (*store, *url);
        for (service, algorithm) in SLUICE_RUNS {
            let mut extra = vec![
                "--quotas".to_owned(),
                quota_dir.display().to_string(),
                "--quota-algorithm".to_owned(),
                algorithm.to_owned(),
            ];
            if service == OWN_LISTENER {
                extra.extend(["--rls-listen".to_owned(), "127.0.0.1:0".to_owned()]);
            }
            if let Some(url) = url {
                extra.extend(["--store".to_owned(), url.to_owned()]);
            }
            let name = format!("{store}-{algorithm}-{}", rows.len());
            let mut control_plane = ControlPlane::start(
                ControlPlaneOptions::new("limits: []\n", work.path())
                    .named(&name)
                    .log_level("warn")
                    .args(extra),
            )
            .await?;
            let rls = control_plane.rls_addr();
            for arrivals in ARRIVALS {
                rows.push(
                    measure_service(
                        (service, store, algorithm),
                        arrivals,
                        rls,
                        (control_plane.pid(), redis_pids),
                        &options,
                        ticks,
                    )
                    .await?,
                );
            }
            // Waited for off the runtime's one thread, which meanwhile
            // closes the client's connections: the server's graceful
            // shutdown waits for them.
            tokio::task::spawn_blocking(move || control_plane.shutdown()).await??;
        }
    }
    for (service, name, algorithm) in [
        (Service::RateLimit, "always OK (the gRPC call alone)", "–"),
        (Service::Limitador, "limitador 0.14 library", "fixed_window"),
    ] {
        let process = ServiceProcess::start(service, work.path()).await?;
        for arrivals in ARRIVALS {
            rows.push(
                measure_service(
                    (name, "memory", algorithm),
                    arrivals,
                    process.addr(),
                    (process.pid(), &[]),
                    &options,
                    ticks,
                )
                .await?,
            );
        }
    }
    let section = markdown(&options, &rows, &Machine::probe(&paths::sluice_bin()?));
    print!("{section}");
    if options.output != "-" {
        let path = paths::from_root(&options.output)?;
        let existing = std::fs::read_to_string(&path).ok();
        let text = report::replace_marked(existing.as_deref(), "bench_rls", &section);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Drives the service at `addr` for a second of warm-up, then for
/// `options.seconds`, reading the CPU time of the service and of Redis's
/// processes (none in memory) around the measured calls.
async fn measure_service(
    (service, store, algorithm): (&'static str, &'static str, &'static str),
    (pacing, arrivals): (Duration, &'static str),
    addr: std::net::SocketAddr,
    (pid, redis_pids): (u32, &[u32]),
    options: &Options,
    ticks: u64,
) -> Result<Measured> {
    let mut clients = Vec::new();
    for _ in 0..options.connections {
        clients.push(RateLimitServiceClient::connect(format!("http://{addr}")).await?);
    }
    drive(&clients, options.rate, Duration::from_secs(1), pacing).await;
    let cpu = |pid: Option<u32>| pid.map(|pid| measure::cpu_time(pid, ticks)).transpose();
    // Redis's CPU: every node's, summed (none in memory).
    let redis_cpu = || -> Result<Option<Duration>> {
        if redis_pids.is_empty() {
            return Ok(None);
        }
        let mut total = Duration::ZERO;
        for pid in redis_pids {
            total += measure::cpu_time(*pid, ticks)?;
        }
        Ok(Some(total))
    };
    let (before, redis_before) = (cpu(Some(pid))?, redis_cpu()?);
    let (mut latencies, skipped, errors, elapsed) = drive(
        &clients,
        options.rate,
        Duration::from_secs(options.seconds),
        pacing,
    )
    .await;
    let (after, redis_after) = (cpu(Some(pid))?, redis_cpu()?);
    let calls = latencies.len() as f64;
    let (p50, _, _) = stats::summary(&mut latencies);
    let p99 = stats::quantile(&latencies, 0.99);
    let per_call = |before: Option<Duration>, after: Option<Duration>| {
        Some(after?.saturating_sub(before?).as_secs_f64() * 1e6 / calls.max(1.0))
    };
    let row = Measured {
        service,
        arrivals,
        store,
        algorithm,
        calls_per_s: calls / elapsed.as_secs_f64(),
        cpu_us_per_call: per_call(before, after).unwrap_or(0.0),
        redis_cpu_us_per_call: per_call(redis_before, redis_after),
        p50_us: p50,
        p99_us: p99,
        skipped,
        errors,
    };
    eprintln!(
        "{service}, {store}, {algorithm}, {arrivals}: {:.0} calls/s, {:.1} µs CPU/call (Redis {:.1}), p50 {:.0} µs, p99 {:.0} µs, skipped {skipped}, errors {errors}",
        row.calls_per_s,
        row.cpu_us_per_call,
        row.redis_cpu_us_per_call.unwrap_or(0.0),
        row.p50_us,
        row.p99_us
    );
    Ok(row)
}

/// Sends `rate` calls per second for `duration`; returns the latencies in
/// µs, the calls skipped because `MAX_IN_FLIGHT` were in flight, the
/// errors, and the time it took.
async fn drive(
    clients: &[RateLimitServiceClient<tonic::transport::Channel>],
    rate: u64,
    duration: Duration,
    pacing: Duration,
) -> (Vec<f64>, u64, u64, Duration) {
    let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<Option<f64>>();
    let total = rate * duration.as_millis() as u64 / 1_000;
    let runtime = tokio::runtime::Handle::current();
    let clients = clients.to_vec();
    // Calls leave from a thread of their own that wakes every `pacing`
    // and sends what is due ([`ARRIVALS`]).
    let pacer = std::thread::spawn(move || {
        let start = Instant::now();
        let mut skipped = 0_u64;
        let mut sent = 0_u64;
        while sent < total {
            std::thread::sleep(pacing);
            let due = (rate * start.elapsed().as_micros() as u64 / 1_000_000).min(total);
            while sent < due {
                let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                    skipped += 1;
                    sent += 1;
                    continue;
                };
                // `clients` holds at least one (`--connections 1..=64`).
                let Some(client) = clients.get(sent as usize % clients.len().max(1)) else {
                    return (skipped, start);
                };
                let mut client = client.clone();
                let sender = sender.clone();
                let tenant = format!("t{}", sent as usize % TENANTS);
                runtime.spawn(async move {
                    let request = RateLimitRequest {
                        domain: "bench".to_owned(),
                        descriptors: vec![RateLimitDescriptor {
                            entries: vec![Entry {
                                key: "tenant".to_owned(),
                                value: tenant,
                            }],
                            ..RateLimitDescriptor::default()
                        }],
                        hits_addend: 0,
                    };
                    let at = Instant::now();
                    let answer = client.should_rate_limit(request).await;
                    let _ = sender.send(answer.ok().map(|_| at.elapsed().as_secs_f64() * 1e6));
                    drop(permit);
                });
                sent += 1;
            }
        }
        (skipped, start)
    });
    let mut latencies = Vec::new();
    let mut errors = 0;
    while let Some(result) = receiver.recv().await {
        match result {
            Some(us) => latencies.push(us),
            None => errors += 1,
        }
    }
    match pacer.join() {
        Ok((skipped, start)) => (latencies, skipped, errors, start.elapsed()),
        // The pacing thread panicked: every call counts as skipped, so the
        // row shows a failed run rather than a rate.
        Err(_) => (latencies, total, errors, duration),
    }
}

fn markdown(options: &Options, rows: &[Measured], machine: &Machine) -> String {
    let mut text = String::from("## Rate limit service (exact quotas)\n\n");
    text.push_str(&format!(
        "`just bench-rls` (`bench_rls --connections {} --rate {} --seconds {}`, {}, {} CPUs, {}): an open-loop client on one runtime thread sends ShouldRateLimit calls (one descriptor, 1,000 tenants in turn, never over their quota) over {} HTTP/2 connection{} to `sluice serve --quotas`, which serves them on a listener and a thread of its own (`--rls-listen`; the default algorithm, envoyproxy/ratelimit's fixed window, also on the gRPC listener, on the control plane's multi-threaded runtime), counters in memory, then in a `redis-server` 7.0 on loopback (`--store redis://…`: one EVALSHA per call), then in a Redis Cluster of three masters with a replica each on loopback (`--store redis+cluster://…`, made by `redis-cli --cluster create`: one EVALSHA per call on the master of the descriptor's slot; Redis CPU is all six nodes', replication included); then, in the same run and with the same client, to two reference points on one thread each: a minimal service answering OK (the gRPC call alone) and Kuadrant's `limitador` library (in memory) behind that same minimal service. Each server's and Redis's CPU from `/proc`, latency at the client, which shares the machine with them. Each service twice: with the calls spread over each millisecond (a pacing thread that wakes every 50 µs, about every 110 µs with the kernel's timer slack, as Envoy's requests arrive) and in one burst a millisecond (twenty calls at once, as a 1 ms timer tick sends them).\n\n",
        options.connections, options.rate, options.seconds, machine.date, machine.cpus, machine.cpu_model, options.connections, if options.connections == 1 { "" } else { "s" }
    ));
    text.push_str("| service | store | algorithm | arrivals | calls/s | CPU µs/call | Redis CPU µs/call | p50 µs | p99 µs | skipped | errors |\n| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for row in rows {
        text.push_str(&format!(
            "| {} | {} | {} | {} | {:.0} | {:.1} | {} | {:.0} | {:.0} | {} | {} |\n",
            row.service,
            row.store,
            row.algorithm,
            row.arrivals,
            row.calls_per_s,
            row.cpu_us_per_call,
            row.redis_cpu_us_per_call
                .map_or_else(|| "–".to_owned(), |us| format!("{us:.1}")),
            row.p50_us,
            row.p99_us,
            row.skipped,
            row.errors
        ));
    }
    text.push('\n');
    text
}
