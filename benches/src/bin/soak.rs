//! Soak test of the control plane: the real `sluice serve` (release build,
//! `SLUICE_BIN`) with N simulated proxy streams (default 1,000) each
//! reporting B buckets (default 1,000) every 500 ms, for a given duration
//! (default 10 minutes).
//!
//! ```text
//! soak [--duration SECONDS] [--streams N] [--buckets N] [--output FILE|-]
//!      [--replicas N [--store redis://HOST:PORT]]
//! ```
//!
//! With `--replicas N` (N > 1) the control plane runs as N replicas
//! sharing one Redis (a `redis-server` the soak starts, unless `--store`
//! names one); the streams are split evenly over the replicas, and Redis's
//! CPU and commands per second are reported too.
//!
//! A tenth of the buckets are over their limit with a load that swings
//! ±20% over a minute, so their drop ratios change every control interval
//! and deltas are pushed to every stream all the time; the rest stay under
//! their limit. Control-plane RSS is sampled from `/proc` every 5 s. Fails
//! on any stream error, rejected stream or report, report sequence gap,
//! resynchronisation snapshot (a stream that fell behind), or RSS growth
//! over 10% after warm-up.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use sluice_benches::e2e::measure::{self, Machine};
use sluice_benches::e2e::report;
use sluice_benches::fleet::stats;
use sluice_benches::fleet::stream::{Fleet, FleetCounters, FleetSpec, LoadFn};
use sluice_integration_tests::control_plane::{ControlPlane, ControlPlaneOptions};
use sluice_integration_tests::paths;
use sluice_integration_tests::prometheus::Exposition;
use sluice_integration_tests::redis::RedisServer;

const SAMPLE_EVERY: Duration = Duration::from_secs(5);
const REPORT_INTERVAL: Duration = Duration::from_millis(500);
/// RSS may grow at most this much from the end of warm-up to the end.
const MAX_GROWTH: f64 = 0.10;

/// Soak the control plane with simulated proxies.
#[derive(Debug, Parser)]
#[command(name = "soak")]
struct Options {
    /// Seconds to run.
    #[arg(long = "duration", value_name = "SECONDS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(30..=86_400))]
    duration_s: u64,
    /// Simulated proxy streams (at least --replicas).
    #[arg(long, default_value_t = 1000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=5000))]
    streams: usize,
    /// Buckets each stream reports.
    #[arg(long, default_value_t = 1000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(10..=100_000))]
    buckets: usize,
    /// The file whose section is replaced, or `-` to print only.
    #[arg(long, default_value = "BENCHMARKS.md")]
    output: String,
    /// Control-plane replicas sharing one store.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=16))]
    replicas: usize,
    /// The replicas' Redis, `redis://HOST:PORT` (default, with two
    /// replicas or more: a `redis-server` the soak starts).
    #[arg(long)]
    store: Option<String>,
}

impl Options {
    fn parse_checked() -> Result<Self> {
        let options = Self::parse();
        if options.streams < options.replicas {
            bail!("--streams must be at least --replicas");
        }
        Ok(options)
    }

    fn duration(&self) -> Duration {
        Duration::from_secs(self.duration_s)
    }

    /// The first fifth of the run, at most a minute.
    fn warmup(&self) -> Duration {
        (self.duration() / 5).min(Duration::from_secs(60))
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    sluice_benches::exit::run_to_exit("soak", run()).await
}

/// Hot buckets: over the limit, load swinging over a minute.
fn is_hot(bucket: usize) -> bool {
    bucket.is_multiple_of(10)
}

fn limits_yaml(streams: usize) -> String {
    // Each stream offers 10 (hot) or 1 (cold) requests per 500 ms window:
    // 20 or 2 requests/s per stream. Hot buckets get half their mean load.
    let hot_limit = streams * 10;
    format!(
        "limits:\n  - pattern: \"hot-*\"\n    limit_rps: {hot_limit}\n  \
         - pattern: \"cold-*\"\n    limit_rps: {}\n",
        streams * 100
    )
}

/// One RSS sample.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    rss: u64,
}

/// The shared store of a replicated soak: one the soak started, or one
/// named by `--store`.
struct Store {
    url: String,
    /// The server the soak started (for its CPU time), if it did.
    server: Option<RedisServer>,
}

impl Store {
    async fn open(options: &Options, dir: &std::path::Path) -> Result<Option<Self>> {
        if options.replicas < 2 && options.store.is_none() {
            return Ok(None);
        }
        Ok(Some(match &options.store {
            Some(url) => Self {
                url: url.clone(),
                server: None,
            },
            None => {
                let server = RedisServer::start(dir).await?;
                Self {
                    url: server.url(),
                    server: Some(server),
                }
            }
        }))
    }

    /// Commands Redis has processed since it started (`INFO stats`).
    async fn commands(&self) -> Result<u64> {
        let client = redis::Client::open(self.url.as_str())?;
        let mut connection = client.get_multiplexed_async_connection().await?;
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut connection)
            .await?;
        info.lines()
            .find_map(|line| line.strip_prefix("total_commands_processed:"))
            .and_then(|n| n.trim().parse().ok())
            .context("INFO stats has no total_commands_processed")
    }
}

/// CPU time of every process in `pids`.
fn cpu_of(pids: &[u32], ticks: u64) -> Result<Duration> {
    pids.iter()
        .map(|&pid| measure::cpu_time(pid, ticks))
        .sum::<Result<Duration>>()
}

async fn run() -> Result<()> {
    let options = Options::parse_checked()?;
    let work = tempfile::tempdir().context("cannot create a work directory")?;
    let store = Store::open(&options, work.path()).await?;
    let limits = limits_yaml(options.streams);
    let mut replicas = Vec::with_capacity(options.replicas);
    for index in 0..options.replicas {
        let extra = match &store {
            Some(store) => vec![
                "--store".to_owned(),
                store.url.clone(),
                "--replica-id".to_owned(),
                format!("r{index}"),
            ],
            None => Vec::new(),
        };
        replicas.push(
            ControlPlane::start(
                ControlPlaneOptions::new(&limits, work.path())
                    .named(&format!("sluice-soak-r{index}"))
                    .log_level("warn")
                    .args(extra),
            )
            .await?,
        );
    }
    let ticks = measure::ticks_per_second()?;
    let buckets: Vec<String> = (0..options.buckets)
        .map(|i| {
            if is_hot(i) {
                format!("hot-{i}")
            } else {
                format!("cold-{i}")
            }
        })
        .collect();
    let buckets = Arc::new(buckets);
    let reports_per_minute = 60.0 / REPORT_INTERVAL.as_secs_f64();
    let load: LoadFn = Arc::new(move |bucket, sequence| {
        if is_hot(bucket) {
            let phase = sequence as f64 / reports_per_minute * std::f64::consts::TAU;
            (10.0_f64 * (1.0 + 0.2 * phase.sin())).round() as u64
        } else {
            1
        }
    });
    let started = Instant::now();
    // The streams, split evenly over the replicas; their events merged.
    let (merged, mut events) = tokio::sync::mpsc::unbounded_channel();
    let mut fleets = Vec::with_capacity(replicas.len());
    let mut forwarders = tokio::task::JoinSet::new();
    for (index, replica) in replicas.iter().enumerate() {
        let streams = options.streams / options.replicas
            + usize::from(index < options.streams % options.replicas);
        let spec = FleetSpec {
            streams,
            proxy_prefix: format!("soak-r{index}"),
            buckets: Arc::clone(&buckets),
            report_interval: REPORT_INTERVAL,
            load: Arc::clone(&load),
            watch: None,
        };
        let (fleet, mut received) = Fleet::start(&spec, replica.grpc_addr());
        fleets.push(fleet);
        let merged = merged.clone();
        forwarders.spawn(async move {
            while let Some(event) = received.recv().await {
                if merged.send(event).is_err() {
                    break;
                }
            }
        });
    }
    drop(merged);
    let connected = |fleets: &[Fleet]| fleets.iter().map(Fleet::connected).sum::<u64>();
    let errors = |fleets: &[Fleet]| fleets.iter().map(Fleet::errors).sum::<u64>();
    let counter = |fleets: &[Fleet], pick: fn(&FleetCounters) -> &AtomicU64| {
        fleets
            .iter()
            .map(|f| pick(&f.counters).load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let mut samples = Vec::new();
    let mut latencies_ms: Vec<f64> = Vec::new();
    let mut deltas = 0_u64;
    let mut directives = 0_u64;
    let mut sample_at = tokio::time::Instant::now();
    let end = tokio::time::Instant::now() + options.duration();
    let replica_pids: Vec<u32> = replicas.iter().map(ControlPlane::pid).collect();
    let redis_pid = store
        .as_ref()
        .and_then(|s| s.server.as_ref())
        .map(RedisServer::pid);
    let cpu_before = cpu_of(&replica_pids, ticks)?;
    let redis_cpu_before = redis_pid
        .map(|pid| measure::cpu_time(pid, ticks))
        .transpose()?;
    let commands_before = match &store {
        Some(store) => Some(store.commands().await?),
        None => None,
    };
    let own_cpu_before = measure::cpu_time(std::process::id(), ticks)?;
    let outcome: Result<()> = async {
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(end) => break,
                () = tokio::time::sleep_until(sample_at) => {
                    if let Some(index) = replicas.iter_mut().position(|r| !r.is_running()) {
                        bail!("control-plane replica {index} exited");
                    }
                    let rss = replica_pids
                        .iter()
                        .map(|&pid| measure::rss_bytes(pid))
                        .sum::<Result<u64>>()?;
                    let at = started.elapsed();
                    eprintln!(
                        "{:>4} s: RSS {:.1} MiB, {} streams, {} reports, {} batches, {} errors",
                        at.as_secs(),
                        rss as f64 / 1048576.0,
                        connected(&fleets),
                        counter(&fleets, |c| &c.reports),
                        counter(&fleets, |c| &c.batches),
                        errors(&fleets)
                    );
                    samples.push(Sample { at, rss });
                    sample_at += SAMPLE_EVERY;
                    if errors(&fleets) > 0 {
                        bail!("{} simulated streams failed", errors(&fleets));
                    }
                }
                event = events.recv() => {
                    let Some(event) = event else { bail!("every stream ended") };
                    if !event.first {
                        deltas += 1;
                        directives += event.directives as u64;
                        if started.elapsed() >= options.warmup() {
                            latencies_ms.push(event.latency_ms());
                        }
                    }
                }
            }
        }
        Ok(())
    }
    .await;
    let cpu_after = cpu_of(&replica_pids, ticks)?;
    let redis_cpu_after = redis_pid
        .map(|pid| measure::cpu_time(pid, ticks))
        .transpose()?;
    let commands_after = match &store {
        Some(store) => Some(store.commands().await?),
        None => None,
    };
    let own_cpu_after = measure::cpu_time(std::process::id(), ticks)?;
    let mut metrics = Vec::with_capacity(replicas.len());
    for replica in &replicas {
        metrics.push(replica.admin().metrics().await);
    }
    let reports_sent = counter(&fleets, |c| &c.reports);
    let stream_errors = counter(&fleets, |c| &c.errors);
    let mut stopped = Ok(());
    for fleet in fleets {
        let result = fleet.stop().await;
        if stopped.is_ok() {
            stopped = result;
        }
    }
    forwarders.shutdown().await;
    outcome?;
    stopped?;
    let metrics = metrics.into_iter().collect::<Result<Vec<String>>>()?;
    for replica in &mut replicas {
        replica.shutdown()?;
    }

    let error_series = [
        "sluice_streams_rejected_total",
        "sluice_reports_rejected_total",
        "sluice_report_sequence_gaps_total",
        "sluice_store_failures_total{op=\"share\"}",
        "sluice_store_failures_total{op=\"lead\"}",
        "sluice_store_failures_total{op=\"publish\"}",
        "sluice_store_failures_total{op=\"follow\"}",
    ];
    let pages = metrics
        .iter()
        .map(|text| Exposition::parse(text))
        .collect::<Result<Vec<_>, _>>()?;
    let sum = |series: &str| pages.iter().map(|page| page.total(series)).sum::<f64>();
    let mut failures: Vec<String> = error_series
        .iter()
        .filter_map(|name| {
            let value = sum(name);
            (value > 0.0).then(|| format!("{name} = {value}"))
        })
        .collect();
    let snapshots = sum("sluice_directive_batches_pushed_total{kind=\"snapshot\"}");
    if snapshots > options.streams as f64 {
        failures.push(format!(
            "{snapshots} snapshots pushed for {} streams: some fell behind and were resynchronised",
            options.streams
        ));
    }
    let warm: Vec<Sample> = samples
        .iter()
        .copied()
        .filter(|s| s.at >= options.warmup())
        .collect();
    let (first, last) = match (warm.first(), warm.last()) {
        (Some(first), Some(last)) => (*first, *last),
        _ => bail!("no RSS sample after warm-up"),
    };
    let peak = warm.iter().map(|s| s.rss).max().unwrap_or(0);
    let growth = (last.rss as f64 - first.rss as f64) / first.rss.max(1) as f64;
    if growth > MAX_GROWTH {
        failures.push(format!(
            "RSS grew {:.1}% after warm-up (limit {:.0}%)",
            growth * 100.0,
            MAX_GROWTH * 100.0
        ));
    }
    // The slowest replica's bound: every replica pushes to its own streams.
    let worst_bound = |series: &str, q: f64| {
        pages
            .iter()
            .filter_map(|page| stats::histogram_quantile_bound(&page.histogram(series, &[]), q))
            .fold(None, |worst: Option<f64>, s| {
                Some(worst.map_or(s, |w| w.max(s)))
            })
            .map_or_else(|| "–".to_owned(), |s| format!("<= {:.1}", s * 1000.0))
    };
    let bound = |q: f64| worst_bound("sluice_push_latency_seconds", q);
    let tick_bound = |q: f64| worst_bound("sluice_control_loop_tick_duration_seconds", q);
    let (lat_p50, lat_p99, lat_max) = stats::summary(&mut latencies_ms);
    let seconds = options.duration().as_secs_f64();
    let cpu_share = cpu_after.saturating_sub(cpu_before).as_secs_f64() / seconds;
    let own_cpu_share = own_cpu_after.saturating_sub(own_cpu_before).as_secs_f64() / seconds;
    let mib = |bytes: u64| bytes as f64 / 1048576.0;
    let machine = Machine::probe(&paths::envoy_bin().unwrap_or_default());
    let mut rss_rows = String::new();
    let step = (samples.len() / 10).max(1);
    for sample in samples.iter().step_by(step).chain(samples.last()) {
        rss_rows.push_str(&format!(
            "| {} | {:.1} |\n",
            sample.at.as_secs(),
            mib(sample.rss)
        ));
    }
    let replicated = store.is_some();
    let redis_rows = if replicated {
        let redis_cpu = match (redis_cpu_before, redis_cpu_after) {
            (Some(before), Some(after)) => {
                format!(
                    "{:.2} cores",
                    after.saturating_sub(before).as_secs_f64() / seconds
                )
            }
            _ => "– (a store the soak did not start)".to_owned(),
        };
        let ops = match (commands_before, commands_after) {
            (Some(before), Some(after)) => {
                format!("{:.0}", after.saturating_sub(before) as f64 / seconds)
            }
            _ => "–".to_owned(),
        };
        format!("| Redis CPU | {redis_cpu} |\n| Redis commands per second | {ops} |\n")
    } else {
        String::new()
    };
    let (title, marker, setup) = if replicated {
        (
            format!(
                "## Soak: {} proxies over {} control-plane replicas on Redis",
                options.streams, options.replicas
            ),
            "soak-replicas",
            format!(
                "{} replicas of the real control plane (`sluice serve --store`, release \
                 build, 500 ms control interval; RSS and CPU below are their sums) \
                 sharing one Redis, the streams split evenly over them,",
                options.replicas
            ),
        )
    } else {
        (
            "## Soak: control plane under 1,000 proxies".to_owned(),
            "soak",
            "The real control plane (`sluice serve`, release build, 500 ms control \
             interval)"
                .to_owned(),
        )
    };
    let reproduce = if replicated {
        format!(
            "`just soak {} --replicas {} --streams {}`",
            options.duration().as_secs(),
            options.replicas,
            options.streams
        )
    } else {
        "`just soak` (10 minutes) or `just soak 60`".to_owned()
    };
    let section = format!(
        "{title}\n\n\
         {setup} with {streams} simulated proxy streams in one process (the \
         propagation benchmark's streams), each reporting {buckets} buckets every \
         500 ms ({entries} bucket counts per second in all), for {secs} s. One \
         bucket in ten is over its limit with a load that swings ±20% over a \
         minute, so about {hot} directives change every control interval and \
         are pushed to every stream; the others stay under their limit. RSS is \
         `VmRSS` from `/proc/<pid>/status` every {every} s; warm-up is the first \
         {warm} s.\n\n\
         | | value |\n| --- | ---: |\n\
         | errors (stream errors, rejected streams or reports, sequence gaps, resync snapshots, store failures) | {error_count} |\n\
         | reports sent | {reports} |\n\
         | delta batches received (all streams) | {deltas} ({directives} directives) |\n\
         | RSS after warm-up / peak / at the end | {rss_first:.1} / {rss_peak:.1} / {rss_last:.1} MiB |\n\
         | RSS growth after warm-up | {growth:+.1}% ({flat}) |\n\
         | control-plane CPU / simulated fleet's CPU (of 2 cores) | {cpu:.2} / {own_cpu:.2} cores |\n\
         {redis_rows}\
         | push latency, control plane (`sluice_push_latency_seconds`: publish to the stream's transport), p50 / p99 | {h50} / {h99} ms |\n\
         | control-loop tick (`sluice_control_loop_tick_duration_seconds`), p50 / p99 | {t50} / {t99} ms |\n\
         | push latency at the streams (`issued_at` to decoded, after warm-up), p50 / p99 / max | {lat_p50:.1} / {lat_p99:.1} / {lat_max:.1} ms |\n\n\
         | seconds | RSS MiB |\n| ---: | ---: |\n{rss_rows}\n\
         - Machine: {cpus} CPUs, {model}; date: {date}\n\
         - Reproduce: {reproduce}\n\n",
        streams = options.streams,
        buckets = options.buckets,
        entries = options.streams * options.buckets * 2,
        secs = options.duration().as_secs(),
        hot = options.buckets.div_ceil(10),
        every = SAMPLE_EVERY.as_secs(),
        warm = options.warmup().as_secs(),
        error_count = failures.len() as u64 + stream_errors,
        reports = reports_sent,
        rss_first = mib(first.rss),
        rss_peak = mib(peak),
        rss_last = mib(last.rss),
        growth = growth * 100.0,
        flat = if growth <= MAX_GROWTH {
            "flat"
        } else {
            "growing"
        },
        cpu = cpu_share,
        own_cpu = own_cpu_share,
        h50 = bound(0.5),
        h99 = bound(0.99),
        t50 = tick_bound(0.5),
        t99 = tick_bound(0.99),
        cpus = machine.cpus,
        model = machine.cpu_model,
        date = machine.date,
    );
    println!("{section}");
    if options.output != "-" {
        let path = paths::from_root(&options.output)?;
        report::write_marked(&path, marker, &section)?;
        eprintln!("wrote {}", path.display());
    }
    if !failures.is_empty() {
        bail!("soak failed: {}", failures.join("; "));
    }
    Ok(())
}
