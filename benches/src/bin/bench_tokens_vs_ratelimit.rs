//! Sluice's token budget beside the two-call pattern, in one run through
//! real Envoy.
//!
//! ```text
//! bench_tokens_vs_ratelimit [--seconds S] [--warmup S] [--data-plane wasm|native] [--output FILE|-]
//! ```
//!
//! The same load against each (three Envoys at 60/30/10 % of 3x a budget
//! of 20,000 tokens a second, streamed completions from the fake LLM
//! upstream, output tokens log-normal with median 500 and p99 8,000,
//! three tenants; see `bench_tokens`), one after the other:
//!
//! - **Sluice**: the control plane's budget and the filter's cost rule
//!   (`token_fleet`), no call per request;
//! - **two-call**: Envoy's `ratelimit` filter of `envoy/llm-tokens.yaml`
//!   alone, a check with `hits_addend: 0` before each request and the
//!   response's tokens charged when its stream ends
//!   (`apply_on_stream_done`), against the control plane's rate limit
//!   service (`sluice serve --quotas DIR`) counting on a real
//!   `redis-server`, one per-second quota of the budget (`two_call`).
//!
//! For each: admitted tokens (answered 200, by when the stream ended)
//! against the budget over the measured span and per 1 s and 10 s window,
//! per tenant against its weighted share, the CPU per request of the
//! Envoys, the control plane and Redis (`/proc`, as `bench_envoy` reads
//! it), the client's p50/p99 latency, and the gRPC calls the Envoys made
//! to the control plane per request. Finds Envoy, the filter and the
//! control plane as `bench_tokens` does, Redis as the tests do
//! (`REDIS_SERVER`).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Parser;
use serde_json::json;
use sluice_benches::e2e::measure::{self, Machine};
use sluice_benches::e2e::report;
use sluice_benches::tokens::{
    BUDGET, FAIR_SHARES, RunArgs, TENANTS, check_answers, fleet_options, percent, quantile, spread,
    streams,
};
use sluice_integration_tests::control_plane::sample;
use sluice_integration_tests::envoy::counter_total;
use sluice_integration_tests::fleet::DataPlane;
use sluice_integration_tests::paths;
use sluice_integration_tests::prometheus::Exposition;
use sluice_integration_tests::token_fleet::{
    Completion, TokenFleet, TokenLoad, admitted_tokens, offered_tokens,
};
use sluice_integration_tests::two_call::TwoCallFleet;

/// The section's name in `BENCHMARKS.md`.
const SECTION: &str = "bench_tokens_vs_ratelimit";
/// The load's seed: the same requests, in the same order, for both.
const SEED: u64 = 17;
/// How long each fleet's CPU is read idle before the load: what the
/// processes use without requests (timers, stats, the filter's ticks and
/// reports) is subtracted to give the CPU per request.
const IDLE: Duration = Duration::from_secs(5);

/// Sluice's token budget beside the two-call pattern, in real Envoy.
#[derive(Debug, Parser)]
#[command(name = "bench_tokens_vs_ratelimit")]
struct Options {
    /// Seconds of each side's run (at least --warmup + 10; bounded: two
    /// runs of this length, plus start-up).
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u64).range(20..=600))]
    seconds: u64,
    #[command(flatten)]
    run: RunArgs,
}

impl Options {
    fn parse_checked() -> Result<Self> {
        let options = Self::parse();
        options.run.check(options.seconds)?;
        Ok(options)
    }

    /// The one data plane of Sluice's side.
    fn data_plane(&self) -> Result<DataPlane> {
        match self.run.data_plane.data_planes()[..] {
            [one] => Ok(one),
            _ => bail!("--data-plane: one of wasm or native"),
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    sluice_benches::exit::run_to_exit("bench_tokens_vs_ratelimit", run()).await
}

async fn run() -> Result<()> {
    let options = Options::parse_checked()?;
    let data_plane = options.data_plane()?;
    let envoy_bin = paths::envoy_bin()?;
    let ticks = measure::ticks_per_second()?;

    eprintln!("== Sluice's token budget ({data_plane:?})");
    let sluice = {
        let fleet =
            TokenFleet::start(fleet_options(data_plane, options.run.workers, json!({}))).await?;
        let measured = measure_run(&options, &fleet, None, ticks).await;
        if measured.is_err() {
            fleet.fleet.print_logs();
        }
        measured?
    };
    eprintln!("{sluice:#?}");

    eprintln!("== two-call: Envoy's ratelimit filter, the rate limit service on Redis");
    let two_call = {
        let fleet =
            TwoCallFleet::start(fleet_options(data_plane, options.run.workers, json!({}))).await?;
        let measured = measure_run(&options, &fleet.tokens, Some(fleet.redis.pid()), ticks).await;
        if measured.is_err() {
            fleet.print_logs();
        }
        measured?
    };
    eprintln!("{two_call:#?}");

    let section = section(&options, &Machine::probe(&envoy_bin), &sluice, &two_call);
    println!("{section}");
    if options.run.output != "-" {
        let path = paths::from_root(&options.run.output)?;
        report::write_marked(&path, SECTION, &section)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// What one side measured.
#[derive(Debug)]
struct Measured {
    /// Admitted over the budget, minus 1, over the measured span.
    overall: f64,
    /// Offered over the budget over the measured span.
    offered: f64,
    /// Admitted over the budget, minus 1, per 1 s window.
    one_second: Vec<f64>,
    /// The same per 10 s window.
    ten_seconds: Vec<f64>,
    /// Each tenant's admitted over its weighted share, minus 1.
    tenants: Vec<f64>,
    /// Requests answered 200 or 429 over the whole run.
    answered: u64,
    /// Of the measured span's answers, the share refused.
    refused_share: f64,
    /// CPU µs per answered request over what the process used idle: the
    /// Envoys together, the control plane, Redis (when there is one).
    envoy_cpu_us: f64,
    control_plane_cpu_us: f64,
    redis_cpu_us: Option<f64>,
    /// The Envoys' net CPU (as `envoy_cpu_us`) per 1,000 tokens admitted:
    /// most of a request's cost is proxying its stream, and the two sides
    /// admit different numbers of streams.
    envoy_cpu_us_per_k_tokens: f64,
    /// CPU idle and under load, ms a second: the Envoys (all three), the
    /// control plane.
    envoy_idle_ms_per_s: f64,
    envoy_load_ms_per_s: f64,
    control_plane_idle_ms_per_s: f64,
    control_plane_load_ms_per_s: f64,
    /// Tokens the quota counted (its `total_hits`) over the tokens the
    /// client saw admitted, the whole run; `None` without a quota.
    charged_to_admitted: Option<f64>,
    /// Client latency, sent to the end of the stream, ms: p50, p99 of
    /// admitted requests; p50, p99 of refused ones.
    admitted_ms: (f64, f64),
    refused_ms: (f64, f64),
    /// gRPC requests the Envoys opened to the control plane (rate limit
    /// service calls; the filter's streams) per answered request.
    grpc_calls_per_request: f64,
    /// Reports the control plane received from filters per answered
    /// request.
    reports_per_request: f64,
    /// Checks the `ratelimit` filter let through because the service
    /// failed or was late (`failure_mode_deny: false`).
    failure_mode_allowed: u64,
}

/// Counters read from the processes before and after the load.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    envoy_cpu: Duration,
    control_plane_cpu: Duration,
    redis_cpu: Option<Duration>,
    grpc_calls: u64,
    reports: f64,
    quota_hits: f64,
    failure_mode_allowed: u64,
}

async fn snapshot(fleet: &TokenFleet, redis: Option<u32>, ticks: u64) -> Result<Snapshot> {
    let mut envoy_cpu = Duration::ZERO;
    let mut grpc_calls = 0;
    let mut failure_mode_allowed = 0;
    for envoy in &fleet.fleet.envoys {
        envoy_cpu += measure::cpu_time(envoy.pid(), ticks)?;
        let stats = envoy
            .stats("sluice_control_plane.upstream_rq_total|ratelimit")
            .await?;
        grpc_calls += counter_total(&stats, "cluster.sluice_control_plane.upstream_rq_total");
        failure_mode_allowed += counter_total(&stats, ".ratelimit.failure_mode_allowed");
    }
    let control_plane = &fleet.fleet.control_plane;
    let metrics = control_plane.admin().metrics().await?;
    Ok(Snapshot {
        envoy_cpu,
        control_plane_cpu: measure::cpu_time(control_plane.pid(), ticks)?,
        redis_cpu: redis.map(|pid| measure::cpu_time(pid, ticks)).transpose()?,
        grpc_calls,
        reports: sample(&metrics, "sluice_reports_received_total"),
        quota_hits: Exposition::parse(&metrics)
            .map(|page| page.total("sluice_quota_total_hits_total"))
            .unwrap_or(0.0),
        failure_mode_allowed,
    })
}

async fn measure_run(
    options: &Options,
    fleet: &TokenFleet,
    redis: Option<u32>,
    ticks: u64,
) -> Result<Measured> {
    let idle_from = snapshot(fleet, redis, ticks).await?;
    tokio::time::sleep(IDLE).await;
    let before = snapshot(fleet, redis, ticks).await?;
    let started = std::time::Instant::now();
    let load = TokenLoad::start(
        fleet,
        streams(3.0, None),
        Duration::from_secs(options.seconds),
        SEED,
    )?;
    let streams = load.streams.clone();
    let completions = load.finish().await;
    let after = snapshot(fleet, redis, ticks).await?;
    let elapsed = started.elapsed().as_secs_f64();
    check_answers(&completions)?;
    // CPU used idle over IDLE, scaled to the load's length.
    let idle = |from: Duration, to: Duration| {
        to.saturating_sub(from)
            .mul_f64(elapsed / IDLE.as_secs_f64())
    };

    let secs = Duration::from_secs;
    let window = |from: u64, len: u64| {
        admitted_tokens(&completions, secs(from), secs(from + len), |_| true) as f64
            / (len as f64 * BUDGET)
            - 1.0
    };
    let (from, to) = (secs(options.run.warmup), secs(options.seconds));
    let span = (options.seconds - options.run.warmup) as f64;
    let tenants = TENANTS
        .iter()
        .zip(FAIR_SHARES)
        .map(|((tenant, _, _), share)| {
            admitted_tokens(&completions, from, to, |i| {
                streams.get(i).is_some_and(|s| s.tenant == *tenant)
            }) as f64
                / (span * share)
                - 1.0
        })
        .collect();
    let answered = completions
        .iter()
        .filter(|c| c.status == 200 || c.status == 429)
        .count() as u64;
    let per_request = |used: Duration, idle: Duration| {
        used.saturating_sub(idle).as_secs_f64() * 1e6 / answered.max(1) as f64
    };
    let admitted_all = admitted_tokens(&completions, Duration::ZERO, Duration::MAX, |_| true);
    let measured: Vec<&Completion> = completions
        .iter()
        .filter(|c| c.sent >= from && c.sent < to)
        .collect();
    let latency = |status: u16| {
        let mut ms: Vec<f64> = measured
            .iter()
            .filter(|c| c.status == status)
            .map(|c| c.ended.saturating_sub(c.sent).as_secs_f64() * 1e3)
            .collect();
        (quantile(&mut ms, 0.5), quantile(&mut ms, 0.99))
    };
    let refused = measured.iter().filter(|c| c.status == 429).count();
    Ok(Measured {
        overall: admitted_tokens(&completions, from, to, |_| true) as f64 / (span * BUDGET) - 1.0,
        offered: offered_tokens(&completions, from, to, |_| true) as f64 / (span * BUDGET),
        one_second: (options.run.warmup..options.seconds)
            .map(|s| window(s, 1))
            .collect(),
        ten_seconds: (options.run.warmup..options.seconds)
            .step_by(10)
            .filter(|s| s + 10 <= options.seconds)
            .map(|s| window(s, 10))
            .collect(),
        tenants,
        answered,
        refused_share: refused as f64 / measured.len().max(1) as f64,
        envoy_cpu_us: per_request(
            after.envoy_cpu.saturating_sub(before.envoy_cpu),
            idle(idle_from.envoy_cpu, before.envoy_cpu),
        ),
        control_plane_cpu_us: per_request(
            after
                .control_plane_cpu
                .saturating_sub(before.control_plane_cpu),
            idle(idle_from.control_plane_cpu, before.control_plane_cpu),
        ),
        redis_cpu_us: match (idle_from.redis_cpu, before.redis_cpu, after.redis_cpu) {
            (Some(idle_from), Some(before), Some(after)) => Some(per_request(
                after.saturating_sub(before),
                idle(idle_from, before),
            )),
            _ => None,
        },
        envoy_cpu_us_per_k_tokens: after
            .envoy_cpu
            .saturating_sub(before.envoy_cpu)
            .saturating_sub(idle(idle_from.envoy_cpu, before.envoy_cpu))
            .as_secs_f64()
            * 1e9
            / admitted_all.max(1) as f64,
        envoy_idle_ms_per_s: ms_per_s(idle_from.envoy_cpu, before.envoy_cpu, IDLE.as_secs_f64()),
        envoy_load_ms_per_s: ms_per_s(before.envoy_cpu, after.envoy_cpu, elapsed),
        control_plane_idle_ms_per_s: ms_per_s(
            idle_from.control_plane_cpu,
            before.control_plane_cpu,
            IDLE.as_secs_f64(),
        ),
        control_plane_load_ms_per_s: ms_per_s(
            before.control_plane_cpu,
            after.control_plane_cpu,
            elapsed,
        ),
        charged_to_admitted: (redis.is_some() && admitted_all > 0)
            .then(|| (after.quota_hits - before.quota_hits) / admitted_all as f64),
        admitted_ms: latency(200),
        refused_ms: latency(429),
        grpc_calls_per_request: after.grpc_calls.saturating_sub(before.grpc_calls) as f64
            / answered.max(1) as f64,
        reports_per_request: (after.reports - before.reports).max(0.0) / answered.max(1) as f64,
        failure_mode_allowed: after
            .failure_mode_allowed
            .saturating_sub(before.failure_mode_allowed),
    })
}

/// CPU used from `from` to `to` over `seconds`, ms a second.
fn ms_per_s(from: Duration, to: Duration, seconds: f64) -> f64 {
    to.saturating_sub(from).as_secs_f64() * 1e3 / seconds.max(1e-9)
}

/// The largest overshoot of `errors` (0 when none is over).
fn worst_over(errors: &[f64]) -> f64 {
    errors.iter().copied().fold(0.0, f64::max)
}

fn section(options: &Options, machine: &Machine, sluice: &Measured, two_call: &Measured) -> String {
    let command = std::iter::once("bench_tokens_vs_ratelimit".to_owned())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ");
    let mut out = format!(
        "### Token budget against the two-call pattern (`just bench-tokens-vs-ratelimit`)\n\n\
         The same load, one after the other in one run: three Envoys (60/30/10 % of the load, \
         `--concurrency {workers}`), 3x a budget of {BUDGET:.0} tokens/s offered for {seconds} s (measured after {warmup} s) in \
         streamed OpenAI-style completions from the fake LLM upstream, output tokens log-normal (median 500, \
         p99 8,000), three tenants offering 50/30/20 % of the demand, the same seeded requests at the same \
         instants on both sides.\n\n\
         - **Sluice**: the control plane's budget of {BUDGET:.0} tokens/s (tenants weighted 2:1:1) and the \
         {data_plane:?} filter's cost rule (the request's tokens as its estimate, the usage parsed from the \
         stream as its charge), the filter's defaults; no call per request.\n\
         - **two-call**: Envoy's `ratelimit` filter of `envoy/llm-tokens.yaml` alone (check-then-charge: \
         `hits_addend: 0` before the request, `completion_tokens` from `sse_to_metadata` charged with \
         `apply_on_stream_done`, `failure_mode_deny: false`, timeout 0.1 s), against the control plane's rate \
         limit service on `redis-server`: one quota of {BUDGET:.0} tokens a second shared by every tenant.\n\n\
         Admitted tokens are counted by the client (answered 200, by when the stream ended); errors are \
         admitted / budget - 1 (tenants: / weighted share - 1). CPU is `utime + stime` from `/proc` over the \
         whole run less what the process used idle (read for {idle} s before the load, scaled to the run), per \
         answered request (200 or 429); latency is from the request's scheduled send to the end \
         of its stream. gRPC calls are the Envoys' `cluster.sluice_control_plane.upstream_rq_total`; reports \
         are the control plane's `sluice_reports_received_total`.\n\n\
         - Machine: {cpus} CPUs, {model} (shared with other work: compare the columns, not runs)\n\
         - Envoy: {envoy}\n\
         - Date: {date}\n\
         - Command: `{command}` (`just bench-tokens-vs-ratelimit`, about two minutes)\n\n\
         | | Sluice token budget | two-call (ratelimit filter + rate limit service on Redis) |\n\
         | --- | --- | --- |\n",
        seconds = options.seconds,
        warmup = options.run.warmup,
        workers = options.run.workers,
        idle = IDLE.as_secs(),
        data_plane = options.run.data_plane,
        cpus = machine.cpus,
        model = machine.cpu_model,
        envoy = machine.envoy_version,
        date = machine.date,
    );
    let mut row = |name: &str, cell: &dyn Fn(&Measured) -> String| {
        out.push_str(&format!(
            "| {name} | {} | {} |\n",
            cell(sluice),
            cell(two_call)
        ));
    };
    row("admitted vs budget, measured span", &|m| {
        format!("{} (offered {:.2}x)", percent(m.overall), m.offered)
    });
    row("1 s windows: error", &|m| spread(&m.one_second, 0.10));
    row("1 s windows: worst overshoot", &|m| {
        percent(worst_over(&m.one_second))
    });
    row("10 s windows: error", &|m| spread(&m.ten_seconds, 0.05));
    row("tenants gold / silver / bronze vs 2:1:1 shares", &|m| {
        m.tenants
            .iter()
            .map(|e| percent(*e))
            .collect::<Vec<_>>()
            .join(" / ")
    });
    row("requests answered (share refused)", &|m| {
        format!("{} ({:.0} % 429)", m.answered, m.refused_share * 100.0)
    });
    row("Envoy CPU per request over idle (3 Envoys)", &|m| {
        format!("{:.0} µs", m.envoy_cpu_us)
    });
    row("Envoy CPU over idle per 1,000 admitted tokens", &|m| {
        format!("{:.0} µs", m.envoy_cpu_us_per_k_tokens)
    });
    row("Envoy CPU idle / under load (3 Envoys)", &|m| {
        format!(
            "{:.0} / {:.0} ms/s",
            m.envoy_idle_ms_per_s, m.envoy_load_ms_per_s
        )
    });
    row("control plane CPU idle / under load", &|m| {
        format!(
            "{:.1} / {:.1} ms/s",
            m.control_plane_idle_ms_per_s, m.control_plane_load_ms_per_s
        )
    });
    row("control plane CPU per request over idle", &|m| {
        format!("{:.1} µs", m.control_plane_cpu_us)
    });
    row("Redis CPU per request over idle", &|m| {
        m.redis_cpu_us
            .map_or_else(|| "–".to_owned(), |us| format!("{us:.1} µs"))
    });
    row("latency p50 / p99, admitted (to the stream's end)", &|m| {
        format!("{:.1} / {:.1} ms", m.admitted_ms.0, m.admitted_ms.1)
    });
    row("latency p50 / p99, refused", &|m| {
        format!("{:.1} / {:.1} ms", m.refused_ms.0, m.refused_ms.1)
    });
    row(
        "gRPC calls to the control plane per request (rate limit service calls, filter streams)",
        &|m| format!("{:.3}", m.grpc_calls_per_request),
    );
    row("reports to the control plane per request", &|m| {
        format!("{:.3}", m.reports_per_request)
    });
    row("tokens the quota counted / tokens admitted", &|m| {
        m.charged_to_admitted
            .map_or_else(|| "–".to_owned(), |r| format!("{r:.3}"))
    });
    row("checks let through on a service failure", &|m| {
        m.failure_mode_allowed.to_string()
    });
    out.push('\n');
    out
}
