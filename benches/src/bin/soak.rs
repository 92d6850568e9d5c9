//! Soak test of the control plane: the real `sluice serve` (release build,
//! `SLUICE_BIN`) with N simulated proxy streams (default 1,000) each
//! reporting B buckets (default 1,000) every 500 ms, for a given duration
//! (default 10 minutes).
//!
//! ```text
//! soak [--duration SECONDS] [--streams N] [--buckets N] [--output FILE|-]
//! ```
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
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sluice_benches::e2e::measure::{self, Machine};
use sluice_benches::e2e::report;
use sluice_benches::fleet::control_plane::ControlPlaneProcess;
use sluice_benches::fleet::stats;
use sluice_benches::fleet::stream::{Fleet, FleetSpec};
use sluice_integration_tests::paths;

const SAMPLE_EVERY: Duration = Duration::from_secs(5);
const REPORT_INTERVAL: Duration = Duration::from_millis(500);
/// RSS may grow at most this much from the end of warm-up to the end.
const MAX_GROWTH: f64 = 0.10;

#[derive(Debug)]
struct Options {
    duration: Duration,
    streams: usize,
    buckets: usize,
    output: String,
}

impl Options {
    fn parse() -> Result<Self> {
        let mut options = Self {
            duration: Duration::from_secs(600),
            streams: 1000,
            buckets: 1000,
            output: "BENCHMARKS.md".to_owned(),
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value =
                |name: &str| args.next().with_context(|| format!("{name} needs a value"));
            match arg.as_str() {
                "--duration" => {
                    options.duration = Duration::from_secs(value("--duration")?.parse()?);
                }
                "--streams" => options.streams = value("--streams")?.parse()?,
                "--buckets" => options.buckets = value("--buckets")?.parse()?,
                "--output" => options.output = value("--output")?,
                "-h" | "--help" => {
                    println!(
                        "soak [--duration SECONDS] [--streams N] [--buckets N] [--output FILE|-]"
                    );
                    std::process::exit(0);
                }
                other => bail!("unknown argument {other:?} (try --help)"),
            }
        }
        if !(30..=86_400).contains(&options.duration.as_secs())
            || !(1..=5000).contains(&options.streams)
            || !(10..=100_000).contains(&options.buckets)
        {
            bail!("--duration 30..=86400, --streams 1..=5000, --buckets 10..=100000");
        }
        Ok(options)
    }

    /// The first fifth of the run, at most a minute.
    fn warmup(&self) -> Duration {
        (self.duration / 5).min(Duration::from_secs(60))
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("soak: {err:#}");
            ExitCode::FAILURE
        }
    }
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

async fn run() -> Result<()> {
    let options = Options::parse()?;
    let work = tempfile::tempdir().context("cannot create a work directory")?;
    let mut cp =
        ControlPlaneProcess::start(work.path(), "sluice-soak", &limits_yaml(options.streams))
            .await?;
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
    let reports_per_minute = 60.0 / REPORT_INTERVAL.as_secs_f64();
    let spec = FleetSpec {
        streams: options.streams,
        proxy_prefix: "soak".to_owned(),
        buckets: Arc::new(buckets),
        report_interval: REPORT_INTERVAL,
        load: Arc::new(move |bucket, sequence| {
            if is_hot(bucket) {
                let phase = sequence as f64 / reports_per_minute * std::f64::consts::TAU;
                (10.0_f64 * (1.0 + 0.2 * phase.sin())).round() as u64
            } else {
                1
            }
        }),
        watch: None,
    };
    let started = Instant::now();
    let (fleet, mut events) = Fleet::start(&spec, cp.addrs().grpc);
    let mut samples = Vec::new();
    let mut latencies_ms: Vec<f64> = Vec::new();
    let mut deltas = 0_u64;
    let mut directives = 0_u64;
    let mut sample_at = tokio::time::Instant::now();
    let end = tokio::time::Instant::now() + options.duration;
    let cpu_before = measure::cpu_time(cp.pid(), ticks)?;
    let own_cpu_before = measure::cpu_time(std::process::id(), ticks)?;
    let outcome: Result<()> = async {
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(end) => break,
                () = tokio::time::sleep_until(sample_at) => {
                    if !cp.is_running() {
                        bail!("the control plane exited");
                    }
                    let rss = measure::rss_bytes(cp.pid())?;
                    let at = started.elapsed();
                    eprintln!(
                        "{:>4} s: RSS {:.1} MiB, {} streams, {} reports, {} batches, {} errors",
                        at.as_secs(),
                        rss as f64 / 1048576.0,
                        fleet.connected(),
                        fleet.counters.reports.load(Ordering::Relaxed),
                        fleet.counters.batches.load(Ordering::Relaxed),
                        fleet.errors()
                    );
                    samples.push(Sample { at, rss });
                    sample_at += SAMPLE_EVERY;
                    if fleet.errors() > 0 {
                        bail!("{} simulated streams failed", fleet.errors());
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
    let cpu_after = measure::cpu_time(cp.pid(), ticks)?;
    let own_cpu_after = measure::cpu_time(std::process::id(), ticks)?;
    let metrics = cp.metrics().await;
    let fleet_counters = fleet.counters.clone();
    let stopped = fleet.stop().await;
    outcome?;
    stopped?;
    let metrics = metrics?;
    cp.shutdown()?;

    let errors = [
        ("sluice_streams_rejected_total", 0.0),
        ("sluice_reports_rejected_total", 0.0),
        ("sluice_report_sequence_gaps_total", 0.0),
    ];
    let mut failures: Vec<String> = errors
        .iter()
        .filter_map(|(name, allowed)| {
            let value = stats::metric(&metrics, name);
            (value > *allowed).then(|| format!("{name} = {value}"))
        })
        .collect();
    let snapshots = stats::metric(
        &metrics,
        "sluice_directive_batches_pushed_total{kind=\"snapshot\"}",
    );
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
    let histogram = stats::histogram(&metrics, "sluice_push_latency_seconds");
    let bound = |q: f64| {
        stats::histogram_quantile_bound(&histogram, q)
            .map_or_else(|| "–".to_owned(), |s| format!("<= {:.1}", s * 1000.0))
    };
    let ticks_histogram = stats::histogram(&metrics, "sluice_control_loop_tick_duration_seconds");
    let tick_bound = |q: f64| {
        stats::histogram_quantile_bound(&ticks_histogram, q)
            .map_or_else(|| "–".to_owned(), |s| format!("<= {:.1}", s * 1000.0))
    };
    let (lat_p50, lat_p99, lat_max) = stats::summary(&mut latencies_ms);
    let cpu_share =
        cpu_after.saturating_sub(cpu_before).as_secs_f64() / options.duration.as_secs_f64();
    let own_cpu_share =
        own_cpu_after.saturating_sub(own_cpu_before).as_secs_f64() / options.duration.as_secs_f64();
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
    let section = format!(
        "## Soak: control plane under 1,000 proxies\n\n\
         The real control plane (`sluice serve`, release build, 500 ms control \
         interval) with {streams} simulated proxy streams in one process (the \
         propagation benchmark's streams), each reporting {buckets} buckets every \
         500 ms ({entries} bucket counts per second in all), for {secs} s. One \
         bucket in ten is over its limit with a load that swings ±20% over a \
         minute, so about {hot} directives change every control interval and \
         are pushed to every stream; the others stay under their limit. RSS is \
         `VmRSS` from `/proc/<pid>/status` every {every} s; warm-up is the first \
         {warm} s.\n\n\
         | | value |\n| --- | ---: |\n\
         | errors (stream errors, rejected streams or reports, sequence gaps, resync snapshots) | {error_count} |\n\
         | reports sent | {reports} |\n\
         | delta batches received (all streams) | {deltas} ({directives} directives) |\n\
         | RSS after warm-up / peak / at the end | {rss_first:.1} / {rss_peak:.1} / {rss_last:.1} MiB |\n\
         | RSS growth after warm-up | {growth:+.1}% ({flat}) |\n\
         | control-plane CPU / simulated fleet's CPU (of 2 cores) | {cpu:.2} / {own_cpu:.2} cores |\n\
         | push latency, control plane (`sluice_push_latency_seconds`: publish to the stream's transport), p50 / p99 | {h50} / {h99} ms |\n\
         | control-loop tick (`sluice_control_loop_tick_duration_seconds`), p50 / p99 | {t50} / {t99} ms |\n\
         | push latency at the streams (`issued_at` to decoded, after warm-up), p50 / p99 / max | {lat_p50:.1} / {lat_p99:.1} / {lat_max:.1} ms |\n\n\
         | seconds | RSS MiB |\n| ---: | ---: |\n{rss_rows}\n\
         - Machine: {cpus} CPUs, {model}; date: {date}\n\
         - Reproduce: `just soak` (10 minutes) or `just soak 60`\n\n",
        streams = options.streams,
        buckets = options.buckets,
        entries = options.streams * options.buckets * 2,
        secs = options.duration.as_secs(),
        hot = options.buckets.div_ceil(10),
        every = SAMPLE_EVERY.as_secs(),
        warm = options.warmup().as_secs(),
        error_count = failures.len() as u64 + fleet_counters.errors.load(Ordering::Relaxed),
        reports = fleet_counters.reports.load(Ordering::Relaxed),
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
        report::write_marked(&path, "soak", &section)?;
        eprintln!("wrote {}", path.display());
    }
    if !failures.is_empty() {
        bail!("soak failed: {}", failures.join("; "));
    }
    Ok(())
}
