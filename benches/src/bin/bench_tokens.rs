//! How closely a fleet holds a token budget, in real Envoy.
//!
//! ```text
//! bench_tokens [--seconds S] [--warmup S] [--data-plane wasm|native|both] [--workers N]
//!              [--constant-estimate TOKENS] [--control-interval-ms MS] [--output FILE|-]
//! ```
//!
//! Three Envoys (`ENVOY_BIN`, the filter `SLUICE_WASM` or the native
//! module `SLUICE_NATIVE_MODULE`) in front of the fake LLM upstream, the
//! real control plane (`SLUICE_BIN`) holding a budget of 20,000 tokens a
//! second for one bucket, three tenants weighted 2:1:1 offering 50/30/20 %
//! of the demand. Each request draws its output tokens from a log-normal
//! distribution (median 500, p99 8,000) and names them as its estimate;
//! the Envoys (two workers each, `--workers`) get 60/30/10 % of the load
//! (Poisson arrivals).
//!
//! Two runs per filter setting:
//! - **steady**: 3x the budget offered for `--seconds`; after `--warmup`,
//!   the admitted tokens (answered 200, by when the stream ended) per 1 s
//!   and per 10 s window against the budget (also counted by when each
//!   request was sent, i.e. decided), and each tenant's against its fair
//!   share;
//! - **step**: 0.5x the budget for 15 s, then 3x for 15 s: the admitted
//!   tokens in the first 1 s and the first 10 s after the step.
//!
//! Filter settings: the defaults (a budget's ratio applied by the coin,
//! the allowance engaged only when the control plane is lost) and the
//! allowance engaged always.
//!
//! `--constant-estimate N` makes the route's estimate the constant `N`
//! instead of each request's own count (an operator's guess): the budget
//! is then held by how far the charges run from the estimates, which the
//! control plane learns over its first tens of seconds (give the warm-up
//! time for it). Its table has a section of its own in the output file.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use serde_json::json;
use sluice_benches::e2e::report;
use sluice_benches::tokens::{
    BUDGET, FAIR_SHARES, RunArgs, TENANTS, check_answers, fleet_options, percent, spread, streams,
    within,
};
use sluice_integration_tests::fleet::DataPlane;
use sluice_integration_tests::paths;
use sluice_integration_tests::token_fleet::{
    Estimate, TokenFleet, TokenLoad, admitted_tokens, admitted_tokens_by_decision, offered_tokens,
};

/// The step run: seconds before and after the step.
const STEP_BEFORE_S: u64 = 15;
const STEP_AFTER_S: u64 = 15;

/// How closely a fleet holds a token budget, in real Envoy.
#[derive(Debug, Parser)]
#[command(name = "bench_tokens")]
struct Options {
    /// Seconds of the steady run (at least --warmup + 10).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(20..=3600))]
    seconds: u64,
    /// Every request's estimate, in tokens, instead of its own count.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    constant_estimate: Option<u64>,
    /// The control plane's `--control-interval-ms` (its default if not
    /// given).
    #[arg(long, value_parser = clap::value_parser!(u64).range(50..=60_000))]
    control_interval_ms: Option<u64>,
    #[command(flatten)]
    run: RunArgs,
}

impl Options {
    fn parse_checked() -> Result<Self> {
        let options = Self::parse();
        options.run.check(options.seconds)?;
        Ok(options)
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    sluice_benches::exit::run_to_exit("bench_tokens", run()).await
}

/// A filter setting under test.
struct Setting {
    name: &'static str,
    filter: serde_json::Value,
}

fn settings() -> Vec<Setting> {
    vec![
        Setting {
            name: "defaults (coin under a budget, allowance when lost)",
            filter: json!({}),
        },
        Setting {
            name: "allowance engaged always",
            filter: json!({"allowance": {"engage": "always"}}),
        },
    ]
}

/// What one steady run measured.
#[derive(Debug)]
struct Steady {
    /// Admitted over the budget, per 1 s window, minus 1.
    one_second: Vec<f64>,
    /// The same per 10 s window.
    ten_seconds: Vec<f64>,
    /// The same per 1 s window, the tokens counted by when each request
    /// was decided.
    one_second_by_decision: Vec<f64>,
    /// The same per 10 s window.
    ten_seconds_by_decision: Vec<f64>,
    /// Each tenant's admitted over its fair share, minus 1, over the
    /// measured span.
    tenants: Vec<f64>,
    /// Admitted over the budget, minus 1, over the measured span.
    overall: f64,
    /// Offered over the budget over the measured span.
    offered: f64,
}

/// Which instant puts an admitted request's tokens in a window.
#[derive(Debug, Clone, Copy)]
enum Counted {
    /// When its stream ended (what an upstream billing by the minute saw).
    ByStreamEnd,
    /// When it was sent, i.e. decided (what the filter's estimate counted).
    ByDecision,
}

/// What one step run measured: admitted over the budget, minus 1.
#[derive(Debug)]
struct Step {
    first_second: f64,
    first_ten_seconds: f64,
    peak_second: f64,
}

async fn run() -> Result<()> {
    let options = Options::parse_checked()?;
    let mut section = String::new();
    section.push_str(&header(&options));
    for data_plane in options.run.data_plane.data_planes() {
        for setting in settings() {
            eprintln!("== {data_plane:?}, {}: steady", setting.name);
            let steady = steady(&options, data_plane, &setting).await?;
            eprintln!("== {data_plane:?}, {}: step", setting.name);
            let step = step(&options, data_plane, &setting).await?;
            section.push_str(&row(data_plane, &setting, &steady, &step));
        }
    }
    section.push_str(FOOTER);
    println!("{section}");
    if options.run.output != "-" {
        let path = paths::from_root(&options.run.output)?;
        let marker = if options.constant_estimate.is_some() {
            "bench_tokens_constant_estimate"
        } else {
            "bench_tokens"
        };
        report::write_marked(&path, marker, &section)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// The benchmark's fleet for one data plane and filter setting.
async fn start_fleet(
    options: &Options,
    data_plane: DataPlane,
    setting: &Setting,
) -> Result<TokenFleet> {
    let mut fleet = fleet_options(data_plane, options.run.workers, setting.filter.clone());
    if let Some(tokens) = options.constant_estimate {
        fleet.estimate = Estimate::Constant(tokens);
    }
    fleet.control_interval_ms = options.control_interval_ms;
    TokenFleet::start(fleet).await
}

async fn steady(options: &Options, data_plane: DataPlane, setting: &Setting) -> Result<Steady> {
    let fleet = start_fleet(options, data_plane, setting).await?;
    let load = TokenLoad::start(
        &fleet,
        streams(3.0, None),
        Duration::from_secs(options.seconds),
        11,
    )?;
    let streams = load.streams.clone();
    let completions = load.finish().await;
    let secs = |s: u64| Duration::from_secs(s);
    let window = |from: u64, len: u64, count: Counted| {
        let (from, to) = (secs(from), secs(from + len));
        let tokens = match count {
            Counted::ByStreamEnd => admitted_tokens(&completions, from, to, |_| true),
            Counted::ByDecision => admitted_tokens_by_decision(&completions, from, to, |_| true),
        };
        tokens as f64 / (len as f64 * BUDGET) - 1.0
    };
    let windows = |len: u64, count: Counted| -> Vec<f64> {
        (options.run.warmup..options.seconds)
            .step_by(len as usize)
            .filter(|s| s + len <= options.seconds)
            .map(|s| window(s, len, count))
            .collect()
    };
    let span = (options.seconds - options.run.warmup) as f64;
    let (from, to) = (secs(options.run.warmup), secs(options.seconds));
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
    let overall = admitted_tokens(&completions, from, to, |_| true) as f64 / (span * BUDGET) - 1.0;
    let offered = offered_tokens(&completions, from, to, |_| true) as f64 / (span * BUDGET);
    check_answers(&completions)?;
    drop(fleet);
    Ok(Steady {
        one_second: windows(1, Counted::ByStreamEnd),
        ten_seconds: windows(10, Counted::ByStreamEnd),
        one_second_by_decision: windows(1, Counted::ByDecision),
        ten_seconds_by_decision: windows(10, Counted::ByDecision),
        tenants,
        overall,
        offered,
    })
}

async fn step(options: &Options, data_plane: DataPlane, setting: &Setting) -> Result<Step> {
    let fleet = start_fleet(options, data_plane, setting).await?;
    let at = Duration::from_secs(STEP_BEFORE_S);
    let load = TokenLoad::start(
        &fleet,
        streams(0.5, Some((at, 3.0))),
        Duration::from_secs(STEP_BEFORE_S + STEP_AFTER_S),
        13,
    )?;
    let completions = load.finish().await;
    let over = |from: Duration, len: u64| {
        admitted_tokens(&completions, from, from + Duration::from_secs(len), |_| {
            true
        }) as f64
            / (len as f64 * BUDGET)
            - 1.0
    };
    let peak_second = (0..STEP_AFTER_S)
        .map(|s| over(at + Duration::from_secs(s), 1))
        .fold(f64::MIN, f64::max);
    check_answers(&completions)?;
    drop(fleet);
    Ok(Step {
        first_second: over(at, 1),
        first_ten_seconds: over(at, 10),
        peak_second,
    })
}

fn header(options: &Options) -> String {
    let (title, estimate) = match options.constant_estimate {
        Some(tokens) => (
            format!(" with a constant estimate (`just bench-tokens --constant-estimate {tokens}`)"),
            format!(
                "every request estimated at a constant {tokens} tokens by the route (its actual tokens charged \
                 from the stream's usage)"
            ),
        ),
        None => (
            " (`just bench-tokens`)".to_owned(),
            "each request naming its tokens as its estimate".to_owned(),
        ),
    };
    let estimate = match options.control_interval_ms {
        Some(ms) => format!("{estimate}, the control plane deciding every {ms} ms"),
        None => estimate,
    };
    format!(
        "### Token budgets through real Envoy{title}\n\n\
         Three Envoys (60/30/10 % of the load, `--concurrency {}`), a budget of {BUDGET:.0} tokens/s for one bucket, three tenants \
         weighted 2:1:1 offering 50/30/20 % of the demand, streamed OpenAI-style completions from the fake LLM \
         upstream with output tokens drawn log-normally (median 500, p99 8,000; about {:.0} tokens a request on \
         average), {estimate}. Steady: 3x the budget for {} s, measured after \
         {} s; step: 0.5x for {STEP_BEFORE_S} s, then 3x. Admitted tokens are counted from the answers (200, by \
         when the stream ended; \"by decision\": by when the request was sent). Errors are admitted / budget - 1 \
         (tenants: / fair share - 1).\n\n\
         | data plane | filter setting | steady, whole span | 1 s windows | 10 s windows | by decision: 10 s windows (1 s) | tenants gold / silver / bronze | step: first 1 s / first 10 s / peak 1 s |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |\n",
        options.run.workers,
        sluice_integration_tests::llm_upstream::TokenDistribution::median_500_p99_8000().mean(),
        options.seconds,
        options.run.warmup,
    )
}

fn row(data_plane: DataPlane, setting: &Setting, steady: &Steady, step: &Step) -> String {
    let tenants: Vec<String> = steady.tenants.iter().map(|e| percent(*e)).collect();
    format!(
        "| {data_plane:?} | {} | {} (offered {:.2}x) | {} | {} | {} ({}) | {} | {} / {} / {} |\n",
        setting.name,
        percent(steady.overall),
        steady.offered,
        spread(&steady.one_second, 0.10),
        spread(&steady.ten_seconds, 0.05),
        spread(&steady.ten_seconds_by_decision, 0.05),
        within(&steady.one_second_by_decision, 0.10),
        tenants.join(" / "),
        percent(step.first_second),
        percent(step.first_ten_seconds),
        percent(step.peak_second),
    )
}

const FOOTER: &str = "\nA 1 s window holds about 20 admitted requests; with costs this heavy-tailed \
(E[C²]/E[C]² ≈ 4) the admitted tokens of a window vary by far more than its request count would \
suggest, so the 1 s spread is mostly the draws', not the controller's.\n\n";
