//! End-to-end benchmark: what Sluice costs inside Envoy, against Envoy alone,
//! Envoy's `local_ratelimit`, an empty proxy-wasm filter and Envoy's global
//! `ratelimit` filter with a per-request gRPC rate limit service; in front
//! of a real upstream, what a 429 saves against a passing request; and
//! Envoy's own `rate_limit_quota` filter with Sluice as RLQS server, the
//! data plane without wasm; and a streamed LLM completion with and without
//! the filter's usage parser.
//!
//! ```text
//! bench_envoy [--quick] [--rounds N] [--requests N] [--concurrency N] [--variants SLUG,...] [--output FILE|-]
//! ```
//!
//! Finds Envoy and the filter like the integration tests (`ENVOY_BIN`,
//! `SLUICE_WASM`), the empty filter through `EMPTY_FILTER_WASM`, and the
//! stand-in services' binary (`bench_service`) next to its own executable,
//! the control plane (`SLUICE_BIN`, default `target/debug/sluice`).
//! Writes the results into their own section of `BENCHMARKS.md` at the
//! workspace root (the rest of the file is kept) and the CPU chart
//! ([`chart::FILE_NAME`]) next to it, unless `--output -`.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_benches::e2e::chart;
use sluice_benches::e2e::client::{self, BUCKET};
use sluice_benches::e2e::config::{self, Services, Variant};
use sluice_benches::e2e::directives::DirectiveServer;
use sluice_benches::e2e::measure::{self, Machine};
use sluice_benches::e2e::report::{self, Run, Setup, Summary};
use sluice_benches::e2e::service::{Service, ServiceProcess};
use sluice_integration_tests::control_plane::{ControlPlane, ControlPlaneOptions};
use sluice_integration_tests::envoy::{Envoy, EnvoyOptions};
use sluice_integration_tests::paths;

/// How long Envoy's filter gets to open its stream and receive the directive.
const DIRECTIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Worker VMs pick up new directives on a 100 ms tick; wait a few ticks.
const DIRECTIVE_SETTLE: Duration = Duration::from_millis(400);
/// A streamed completion is dozens of events and tens of milliseconds of
/// the upstream's pacing: its variants send this fraction of the requests,
/// still hundreds of ms of Envoy CPU a run, so a whole run stays in
/// minutes.
const STREAMS_PER_REQUEST: usize = 10;

#[derive(Debug, Clone)]
struct Options {
    rounds: usize,
    requests: usize,
    warmup: usize,
    concurrency: usize,
    output: String,
    /// The variants to run, in [`Variant::ALL`]'s order.
    variants: Vec<Variant>,
}

impl Options {
    /// The unmeasured and measured requests of a run of `variant`.
    fn requests_of(&self, variant: Variant) -> (usize, usize) {
        if variant.streams_completions() {
            (
                (self.warmup / STREAMS_PER_REQUEST).max(100),
                (self.requests / STREAMS_PER_REQUEST).max(100),
            )
        } else {
            (self.warmup, self.requests)
        }
    }

    fn parse() -> Result<Self> {
        let mut options = Self {
            // /proc CPU times tick every 10 ms: 100k requests at ~15 µs make
            // the quantisation error under 1%.
            rounds: 5,
            requests: 100_000,
            warmup: 5_000,
            concurrency: 16,
            output: "BENCHMARKS.md".to_owned(),
            variants: Variant::ALL.to_vec(),
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value =
                |name: &str| args.next().with_context(|| format!("{name} needs a value"));
            match arg.as_str() {
                "--quick" => {
                    options.rounds = 3;
                    options.requests = 20_000;
                    options.warmup = 2_000;
                }
                "--rounds" => options.rounds = value("--rounds")?.parse()?,
                "--requests" => options.requests = value("--requests")?.parse()?,
                "--concurrency" => options.concurrency = value("--concurrency")?.parse()?,
                "--output" => options.output = value("--output")?,
                "--variants" => {
                    let slugs = value("--variants")?;
                    let wanted: Vec<&str> = slugs.split(',').map(str::trim).collect();
                    if let Some(unknown) = wanted
                        .iter()
                        .find(|slug| !Variant::ALL.iter().any(|v| v.slug() == **slug))
                    {
                        bail!(
                            "unknown variant {unknown:?}; the variants are {}",
                            slugs_of_all()
                        );
                    }
                    options.variants = Variant::ALL
                        .into_iter()
                        .filter(|v| wanted.contains(&v.slug()))
                        .collect();
                }
                "-h" | "--help" => {
                    println!(
                        "bench_envoy [--quick] [--rounds N] [--requests N] \
                         [--concurrency N] [--variants SLUG,...] [--output FILE|-]\n\
                         variants: {}",
                        slugs_of_all()
                    );
                    std::process::exit(0);
                }
                other => bail!("unknown argument {other:?} (try --help)"),
            }
        }
        // Bounded, so a typo cannot keep Envoy busy for hours.
        if !(1..=20).contains(&options.rounds)
            || !(100..=1_000_000).contains(&options.requests)
            || !(1..=256).contains(&options.concurrency)
        {
            bail!("--rounds 1..=20, --requests 100..=1000000, --concurrency 1..=256");
        }
        // BENCHMARKS.md holds every variant of one run.
        if options.variants.len() < Variant::ALL.len() && options.output != "-" {
            bail!("--variants runs a subset: add --output - (BENCHMARKS.md keeps whole runs)");
        }
        Ok(options)
    }
}

fn slugs_of_all() -> String {
    Variant::ALL.map(Variant::slug).join(", ")
}

// One thread: the load client and the stand-in control plane share one
// core, leaving the other to Envoy's single worker.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    sluice_benches::exit::run_to_exit("bench_envoy", run()).await
}

async fn run() -> Result<()> {
    let options = Options::parse()?;
    let envoy_bin = paths::envoy_bin()?;
    paths::sluice_wasm()?;
    let empty_wasm = config::empty_wasm()?;
    let ticks = measure::ticks_per_second()?;
    let server = DirectiveServer::start().await?;
    let work = tempfile::tempdir().context("cannot create a work directory")?;
    let rls = ServiceProcess::start(Service::RateLimit, work.path()).await?;
    // The real control plane, as RLQS server of variant 10 (a limit so high
    // its token bucket never runs dry) and rate limit service of variant 11
    // (a quota never exhausted).
    let quota_dir = work.path().join("quotas");
    std::fs::create_dir_all(&quota_dir)?;
    std::fs::write(
        quota_dir.join("bench.yaml"),
        "domain: bench\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n",
    )?;
    let control_plane = ControlPlane::start(
        ControlPlaneOptions::new(
            &format!("limits:\n  - bucket: \"{BUCKET}\"\n    limit_rps: 1000000000\n"),
            work.path(),
        )
        .control_interval_ms(200)
        .args(["--quotas".to_owned(), quota_dir.display().to_string()]),
    )
    .await?;
    let upstream = ServiceProcess::start(Service::Upstream, work.path()).await?;
    let llm = ServiceProcess::start(Service::Llm, work.path()).await?;

    let variants = options.variants.clone();
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); variants.len()];
    for round in 0..options.rounds {
        // Rotate the order so no variant always runs first or last.
        for step in 0..variants.len() {
            let index = (round + step) % variants.len();
            let Some(&variant) = variants.get(index) else {
                continue;
            };
            let bench = Bench {
                options: &options,
                server: &server,
                rls: &rls,
                upstream: &upstream,
                llm: &llm,
                control_plane: &control_plane,
                work: work.path(),
                empty_wasm: &empty_wasm,
                ticks,
            };
            let result = bench.run(variant, round).await?;
            eprintln!(
                "round {} {:<21} {:>8.0} req/s {:>6.1} µs CPU/req (service {:>4.1}) p50 {:>5.0} µs p99 {:>5.0} µs 429 {:.3}",
                round + 1,
                variant.slug(),
                result.throughput,
                result.cpu_us,
                result.service_cpu_us.unwrap_or(0.0),
                result.p50_us,
                result.p99_us,
                result.limited_share
            );
            if let Some(slot) = runs.get_mut(index) {
                slot.push(result);
            }
        }
    }

    let summaries: Vec<Summary> = variants
        .iter()
        .zip(&runs)
        .map(|(variant, runs)| Summary::of(*variant, runs))
        .collect();
    println!("{}", report::table(&summaries));
    if options.output != "-" {
        let setup = Setup {
            machine: Machine::probe(&envoy_bin),
            rounds: options.rounds,
            requests: options.requests,
            warmup: options.warmup,
            concurrency: options.concurrency,
            command: std::iter::once("bench_envoy".to_owned())
                .chain(std::env::args().skip(1))
                .collect::<Vec<_>>()
                .join(" "),
        };
        let path = paths::from_root(&options.output)?;
        let existing = std::fs::read_to_string(&path).ok();
        let text =
            report::replace_section(existing.as_deref(), &report::markdown(&setup, &summaries));
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
        let svg = path.with_file_name(chart::FILE_NAME);
        chart::write(&svg, &summaries)?;
        eprintln!("wrote {}", svg.display());
    }
    Ok(())
}

struct Bench<'a> {
    options: &'a Options,
    server: &'a DirectiveServer,
    rls: &'a ServiceProcess,
    upstream: &'a ServiceProcess,
    llm: &'a ServiceProcess,
    control_plane: &'a ControlPlane,
    work: &'a std::path::Path,
    empty_wasm: &'a std::path::Path,
    ticks: u64,
}

/// Longest wait for the filter's charge counters to show the streams.
const CHARGES_TIMEOUT: Duration = Duration::from_secs(10);

/// Checks that the filter of a streamed-completion variant did what the
/// variant says: with a cost rule, at least `requests` streams charged
/// from its source (the body: every stream's usage read) and none from
/// another; without one, no charge at all. Read after the measurement, so
/// its admin calls are not counted.
async fn check_charges(envoy: &Envoy, variant: Variant, requests: usize) -> Result<()> {
    let requests = u64::try_from(requests)?;
    let charges = |stats: &str, source: &str| -> u64 {
        let suffix = format!("sluice.source={source}.charges");
        stats
            .lines()
            .filter_map(|line| line.split_once(": "))
            .filter(|(name, _)| name.ends_with(&suffix))
            .filter_map(|(_, value)| value.trim().parse::<u64>().ok())
            .sum()
    };
    const SOURCES: [&str; 5] = ["body", "metadata", "header", "trailer", "estimate"];
    let expected = variant.charge_source();
    sluice_integration_tests::wait::until(
        &format!("every stream to be charged from {expected:?}"),
        CHARGES_TIMEOUT,
        Duration::from_millis(100),
        || async {
            let stats = envoy.stats("sluice.source=").await?;
            let elsewhere: u64 = SOURCES
                .iter()
                .filter(|source| Some(**source) != expected)
                .map(|source| charges(&stats, source))
                .sum();
            if elsewhere > 0 {
                bail!("{elsewhere} charges from sources other than {expected:?}:\n{stats}");
            }
            Ok(expected
                .is_none_or(|source| charges(&stats, source) >= requests)
                .then_some(()))
        },
    )
    .await
}

/// Longest wait for the first RLQS assignment of a variant-10 Envoy.
const RLQS_ASSIGNMENT_TIMEOUT: Duration = Duration::from_secs(20);

impl Bench<'_> {
    /// RLQS assignments the control plane has sent so far.
    async fn assignments_sent(&self) -> Result<f64> {
        let url = format!("http://{}/metrics", self.control_plane.admin_addr());
        let text = reqwest::get(&url).await?.text().await?;
        Ok(text
            .lines()
            .find_map(|line| {
                line.strip_prefix("sluice_rlqs_bucket_actions_sent_total ")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0.0))
    }

    /// Starts Envoy for `variant`, warms it up, measures, stops it.
    async fn run(&self, variant: Variant, round: usize) -> Result<Run> {
        let name = format!("{}-r{round}", variant.slug());
        let epoch = u64::try_from(round + 1)?;
        self.server
            .set_directive(epoch, BUCKET, variant.drop_ratio());
        let pushed_before = self.server.pushed();
        let services = Services {
            rls: self.rls.addr(),
            upstream: self.upstream.addr(),
            llm: self.llm.addr(),
            rlqs: self.control_plane.grpc_addr(),
        };
        let assignments_before = self.assignments_sent().await?;
        let config = config::envoy_config(variant, self.server.addr(), services, self.empty_wasm)?;
        let mut options = EnvoyOptions::new(&name, self.work);
        options.concurrency = 1;
        options.log_level = "warn".to_owned();
        let mut envoy = Envoy::start(&config, &options).await?;
        let addr = envoy.listener_addr();

        if variant.drop_ratio().is_some() {
            let deadline = tokio::time::Instant::now() + DIRECTIVE_TIMEOUT;
            while self.server.pushed() == pushed_before {
                if tokio::time::Instant::now() >= deadline {
                    envoy.print_log();
                    bail!("{name}: the filter did not connect to the directive server");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(DIRECTIVE_SETTLE).await;
        }

        let ask = variant.ask();
        let (warmup, requests) = self.options.requests_of(variant);
        let mut warm = client::run(addr, warmup, self.options.concurrency, ask).await?;
        if variant == Variant::RateLimitQuota {
            // Envoy reports every 5 s; the assignment follows the first
            // report with traffic. Keep traffic flowing until it is there.
            let deadline = tokio::time::Instant::now() + RLQS_ASSIGNMENT_TIMEOUT;
            while self.assignments_sent().await? <= assignments_before {
                if tokio::time::Instant::now() >= deadline {
                    envoy.print_log();
                    self.control_plane.print_log();
                    bail!("{name}: no RLQS assignment within {RLQS_ASSIGNMENT_TIMEOUT:?}");
                }
                warm = client::run(addr, warmup, self.options.concurrency, ask).await?;
            }
        }
        if variant.drop_ratio() == Some(0.5) {
            let share = warm.limited as f64 / warm.latencies_us.len().max(1) as f64;
            if !(0.3..=0.7).contains(&share) {
                bail!("{name}: {share:.2} of warm-up requests dropped, expected about 0.5");
            }
        }

        let pid = envoy.pid();
        // The service whose CPU belongs to this variant's requests.
        let service = match variant {
            Variant::GlobalRateLimit => Some(self.rls.pid()),
            Variant::UpstreamRouter | Variant::UpstreamSluiceHalf => Some(self.upstream.pid()),
            Variant::SluiceRateLimitService => Some(self.control_plane.pid()),
            _ if variant.streams_completions() => Some(self.llm.pid()),
            _ => None,
        };
        let service_before = service
            .map(|pid| measure::cpu_time(pid, self.ticks))
            .transpose()?;
        let before = measure::cpu_time(pid, self.ticks)?;
        let outcome = client::run(addr, requests, self.options.concurrency, ask).await?;
        let after = measure::cpu_time(pid, self.ticks)?;
        let service_after = service
            .map(|pid| measure::cpu_time(pid, self.ticks))
            .transpose()?;
        if variant.streams_completions()
            && let Err(err) = check_charges(&envoy, variant, requests).await
        {
            envoy.print_log();
            bail!("{name}: {err:#}");
        }
        envoy.stop()?;
        if outcome.other > 0 {
            bail!("{name}: {} answers were neither 200 nor 429", outcome.other);
        }
        let cpu_us = after.saturating_sub(before).as_secs_f64() * 1e6;
        let service_cpu_us = match (service_before, service_after) {
            (Some(before), Some(after)) => {
                let used = after.saturating_sub(before).as_secs_f64() * 1e6;
                if used == 0.0 {
                    bail!("{name}: the stand-in service used no CPU: was it called?");
                }
                Some(used)
            }
            _ => None,
        };
        Ok(Run::new(outcome, cpu_us, service_cpu_us))
    }
}
