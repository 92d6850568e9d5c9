//! The token budget demo: one control plane holding a budget of LLM tokens
//! per second, three Envoys with uneven load (60/30/10), three tenants
//! with weights 2:1:1, and the fake LLM upstream streaming completions
//! whose token counts are drawn log-normally (median 500, p99 8,000).
//! Printed once per second: what the clients were admitted, per tenant,
//! against the budget and the tenants' fair shares, and what the control
//! plane saw.
//!
//! Run it with `just demo-tokens` (which builds first). Every process
//! listens on a free loopback port; their logs are kept in a temporary
//! directory that is printed at the start.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use sluice_integration_tests::fleet::DataPlane;
use sluice_integration_tests::token_fleet::{
    BUCKET, Completion, TokenFleet, TokenFleetOptions, TokenLoad, TokenStream, admitted_tokens,
    offered_tokens, requests_with_status,
};

/// Tenants and their weights in the budget's fair share.
const TENANTS: [(&str, f64); 3] = [("gold", 2.0), ("silver", 1.0), ("bronze", 1.0)];
/// How the offered tokens split between the tenants.
const TENANT_DEMAND: [f64; 3] = [0.5, 0.3, 0.2];
/// How the offered tokens split between the Envoys.
const ENVOY_SKEW: [f64; 3] = [0.6, 0.3, 0.1];

/// Watch three Envoys hold one token budget.
#[derive(Debug, Parser)]
#[command(name = "demo-tokens")]
struct Args {
    /// How long to send load, in seconds.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(5..=600))]
    duration: u64,
    /// The budget, tokens per second fleet-wide.
    #[arg(long, default_value_t = 20_000.0)]
    budget: f64,
    /// Offered tokens as a multiple of the budget.
    #[arg(long, default_value_t = 3.0)]
    offered: f64,
    /// Run the native module instead of the wasm filter.
    #[arg(long)]
    native: bool,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("demo-tokens: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<()> {
    if !(args.budget.is_finite() && (100.0..=1_000_000.0).contains(&args.budget)) {
        bail!(
            "--budget must be between 100 and 1000000 tokens/s, got {}",
            args.budget
        );
    }
    if !(args.offered.is_finite() && (0.1..=10.0).contains(&args.offered)) {
        bail!("--offered must be between 0.1 and 10, got {}", args.offered);
    }
    let mut options = TokenFleetOptions::new(args.budget, ENVOY_SKEW.len());
    options.tenants = TENANTS.iter().map(|(t, w)| ((*t).to_owned(), *w)).collect();
    if args.native {
        options.data_plane = DataPlane::Native;
    }
    println!(
        "Starting the fake LLM upstream, a control plane with a budget of {:.0} tokens/s for bucket \"{BUCKET}\", \
         and {} Envoys ...",
        args.budget,
        ENVOY_SKEW.len()
    );
    let fleet = TokenFleet::start(options)
        .await
        .context("the token fleet did not start")?;
    println!("Logs: {}", fleet.fleet.dir().display());

    let offered = args.budget * args.offered;
    let mut streams = Vec::new();
    for (envoy, skew) in ENVOY_SKEW.iter().enumerate() {
        for ((tenant, _), demand) in TENANTS.iter().zip(TENANT_DEMAND) {
            streams.push(TokenStream::steady(envoy, tenant, offered * skew * demand));
        }
    }
    let shares = fair_shares(args.budget, offered);
    println!(
        "\nOffering {offered:.0} tokens/s ({:.1}x the budget) of streamed chat completions for {} s: \
         Envoys 60/30/10 %, tenants gold/silver/bronze 50/30/20 % of the demand, weights 2:1:1.\n\
         Fair shares of the budget: gold {:.0}, silver {:.0}, bronze {:.0} tokens/s.\n\
         Every second: tokens offered and admitted (from the responses, by when each stream ended), per tenant, \
         429s, and the control plane's view of the bucket (GET /v1/buckets: its drop ratio and the charged \
         tokens/s the filters reported).\n",
        args.offered, args.duration, shares[0], shares[1], shares[2],
    );
    println!(
        "{:>5}  {:>8} {:>9} {:>7}  {:>6} {:>6} {:>6}  {:>5}  {:>5} {:>8}",
        "t(s)",
        "offered",
        "admitted",
        "budget",
        "gold",
        "silver",
        "bronze",
        "429s",
        "drop",
        "charged"
    );
    let load = TokenLoad::start(&fleet, streams, Duration::from_secs(args.duration), 7)?;
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.tick().await;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut interrupted = false;
    loop {
        tokio::select! {
            _ = &mut ctrl_c => { interrupted = true; break; }
            _ = ticker.tick() => {}
        }
        let now = load.elapsed();
        let from = now.saturating_sub(Duration::from_secs(1));
        print_second(&fleet, &load, &load.completions(), from, now, args.budget).await;
        if now >= Duration::from_secs(args.duration) {
            break;
        }
    }
    let streams = load.streams.clone();
    let completions = if interrupted {
        load.completions()
    } else {
        load.finish().await
    };
    print_summary(&streams, &completions, args.duration, args.budget, &shares);
    if interrupted {
        println!("Interrupted.");
    }
    println!("Stopping the Envoys and the control plane ...");
    drop(fleet);
    println!("Done.");
    Ok(())
}

/// The tenants' weighted max-min fair shares of `budget` when they offer
/// [`TENANT_DEMAND`] of `offered`: tenants that want less than their
/// weighted part of what is left get what they want; the rest split it by
/// weight (water-filling).
fn fair_shares(budget: f64, offered: f64) -> [f64; 3] {
    let mut shares = [0.0; 3];
    let mut open = [true; 3];
    let mut left = budget;
    loop {
        let weight: f64 = TENANTS
            .iter()
            .zip(open)
            .filter(|(_, open)| *open)
            .map(|((_, w), _)| w)
            .sum();
        // One level for this round, so the order of the tenants does not
        // matter.
        let level = left / weight;
        let mut any_satisfied = false;
        for (((_, w), demand), (share, open)) in TENANTS
            .iter()
            .zip(TENANT_DEMAND)
            .zip(shares.iter_mut().zip(open.iter_mut()))
        {
            let demand = demand * offered;
            if *open && demand <= level * w {
                *share = demand;
                *open = false;
                left -= demand;
                any_satisfied = true;
            }
        }
        if !any_satisfied {
            for ((_, w), (share, open)) in TENANTS.iter().zip(shares.iter_mut().zip(open)) {
                if open {
                    *share = level * w;
                }
            }
            return shares;
        }
        if !open.contains(&true) {
            return shares;
        }
    }
}

async fn print_second(
    fleet: &TokenFleet,
    load: &TokenLoad,
    completions: &[Completion],
    from: Duration,
    to: Duration,
    budget: f64,
) {
    let seconds = (to - from).as_secs_f64().max(1e-3);
    let per_s = |tokens: u64| tokens as f64 / seconds;
    let tenant = |name: &str| {
        let name = name.to_owned();
        let streams = load.streams.clone();
        move |i: usize| streams.get(i).is_some_and(|s| s.tenant == name)
    };
    let buckets = fleet.fleet.control_plane.admin().buckets().await.ok();
    let bucket = buckets.as_ref().and_then(|b| b.bucket(BUCKET));
    let drop = bucket.map_or_else(|| "?".to_owned(), |b| format!("{:.2}", b.drop_ratio));
    let charged = bucket
        .and_then(|b| b.cost.as_ref())
        .map_or_else(|| "?".to_owned(), |c| format!("{:.0}", c.charged_per_s));
    println!(
        "{:>5.0}  {:>8.0} {:>9.0} {:>7.0}  {:>6.0} {:>6.0} {:>6.0}  {:>5}  {:>5} {:>8}",
        to.as_secs_f64(),
        per_s(offered_tokens(completions, from, to, |_| true)),
        per_s(admitted_tokens(completions, from, to, |_| true)),
        budget,
        per_s(admitted_tokens(completions, from, to, tenant("gold"))),
        per_s(admitted_tokens(completions, from, to, tenant("silver"))),
        per_s(admitted_tokens(completions, from, to, tenant("bronze"))),
        requests_with_status(completions, from, to, 429, |_| true),
        drop,
        charged,
    );
}

fn print_summary(
    streams: &[TokenStream],
    completions: &[Completion],
    duration_s: u64,
    budget: f64,
    shares: &[f64; 3],
) {
    // The second half of the run, at most its last 20 s: after the
    // control plane has seen the load.
    let end = duration_s as f64;
    let from = (end / 2.0).max(end - 20.0);
    let (from_d, to_d) = (Duration::from_secs_f64(from), Duration::from_secs_f64(end));
    let seconds = end - from;
    if seconds < 2.0 {
        println!("\nToo short a run for a summary.");
        return;
    }
    let admitted = admitted_tokens(completions, from_d, to_d, |_| true) as f64 / seconds;
    println!(
        "\nSummary over {from:.0}s..{end:.0}s: admitted {admitted:.0} tokens/s against a budget of {budget:.0} \
         ({:+.1} %)",
        (admitted / budget - 1.0) * 100.0
    );
    for ((tenant, _), share) in TENANTS.iter().zip(shares) {
        let got = admitted_tokens(completions, from_d, to_d, |s| {
            streams.get(s).is_some_and(|s| s.tenant == *tenant)
        }) as f64
            / seconds;
        println!(
            "  {tenant:<7} admitted {got:>7.0} tokens/s, fair share {:>7.0} ({:+.1} %)",
            share,
            (got / share - 1.0) * 100.0
        );
    }
}
