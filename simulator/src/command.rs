//! `sluice-simulate`: its arguments, and the run that prints the table.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use crate::sim::Variant;
use crate::{adaptive, budget, metrics, plot, report, scenario, sim};

/// `sluice-simulate`: a traffic scenario through the real controller and
/// the filter's agents on a simulated clock, and its accuracy metrics.
#[derive(Debug, Parser)]
#[command(name = "sluice-simulate", version, about)]
pub struct SimulateArgs {
    /// Scenario to run, or `all` (every one but the token budget, whose
    /// table is its own: `token-budget`).
    #[arg(long, value_name = "NAME", value_parser = parse_scenario)]
    pub scenario: String,
    /// Seed for arrivals and coin flips; the same seed gives the same result.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
    /// Also write the metrics as CSV to this file.
    #[arg(long, value_name = "PATH")]
    pub csv: Option<PathBuf>,
    /// Controller and decision to run: `baseline` (proportional ratio,
    /// coin flips), `improved` (the default of `serve` and the filter's
    /// recommended settings), `credit`, `tracking-coin`, or `compare`
    /// (baseline and improved side by side).
    #[arg(long, value_name = "NAME", default_value = "compare", value_parser = parse_variant)]
    pub variant: String,
    /// Write per-scenario time series (`NAME-VARIANT.csv`) and plots
    /// (`NAME.svg`: offered, admitted and limit over time) into this folder,
    /// and `tenants.csv` (each tenant's offered, fair-share and admitted
    /// rates) when a scenario has tenants.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Worker threads (VMs) per simulated Envoy, each running the filter's
    /// agent; requests go over a few client connections, each on one worker
    /// and replaced after a while, as Envoy balances connections.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_workers)]
    pub workers: u32,
}

fn parse_workers(value: &str) -> Result<u32, String> {
    value
        .parse::<u32>()
        .ok()
        .filter(|n| (1..=64).contains(n))
        .ok_or_else(|| "expected a number of workers from 1 to 64".to_owned())
}

fn parse_variant(value: &str) -> Result<String, String> {
    if value == "compare" || Variant::by_name(value).is_some() {
        Ok(value.to_owned())
    } else {
        let names: Vec<&str> = Variant::ALL.iter().map(|v| v.name).collect();
        Err(format!(
            "unknown variant; one of: compare, {}",
            names.join(", ")
        ))
    }
}

fn parse_scenario(value: &str) -> Result<String, String> {
    if value == "all" || scenario::NAMES.contains(&value) || scenario::BUDGET_NAMES.contains(&value)
    {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "unknown scenario; one of: all, {}, {}",
            scenario::NAMES.join(", "),
            scenario::BUDGET_NAMES.join(", ")
        ))
    }
}

/// Runs the scenarios and prints one table row each.
pub fn run(args: &SimulateArgs) -> ExitCode {
    let scenarios = if args.scenario == "all" {
        scenario::all()
    } else {
        scenario::by_name(&args.scenario).into_iter().collect()
    };
    let variants: Vec<Variant> = match Variant::by_name(&args.variant) {
        Some(variant) => vec![variant],
        None => vec![Variant::BASELINE, Variant::IMPROVED],
    };
    if let Some(dir) = &args.out
        && let Err(err) = std::fs::create_dir_all(dir)
    {
        eprintln!("sluice-simulate: cannot create {}: {err}", dir.display());
        return ExitCode::FAILURE;
    }
    let workers = args.workers as usize;
    let mut rows = Vec::with_capacity(scenarios.len() * variants.len());
    let mut adaptive_rows = Vec::new();
    let mut budget_rows = Vec::new();
    for scenario in &scenarios {
        let mut traces = Vec::new();
        for &variant in &variants {
            let trace = match sim::run_workers(scenario, args.seed, variant, workers) {
                Ok(trace) => trace,
                Err(err) => {
                    eprintln!("sluice-simulate: scenario {}: {err}", scenario.name);
                    return ExitCode::FAILURE;
                }
            };
            // A budget run is measured in its cost unit, an adaptive run
            // against its upstream's capacity, not against a fixed limit.
            if let Some(metrics) = budget::compute(scenario, &trace) {
                budget_rows.push(report::BudgetRow {
                    scenario: scenario.name.to_owned(),
                    variant: variant.name.to_owned(),
                    seed: args.seed,
                    metrics,
                });
            } else if let Some(metrics) = adaptive::compute(scenario, &trace) {
                adaptive_rows.push(report::AdaptiveRow {
                    scenario: scenario.name.to_owned(),
                    variant: variant.name.to_owned(),
                    seed: args.seed,
                    metrics,
                });
            } else {
                rows.push(report::Row {
                    scenario: scenario.name.to_owned(),
                    variant: variant.name.to_owned(),
                    seed: args.seed,
                    metrics: metrics::compute(scenario, &trace),
                });
            }
            traces.push((variant.name, trace));
        }
        if let Some(dir) = &args.out
            && let Err(err) = plot::write(dir, scenario, &traces)
        {
            eprintln!("sluice-simulate: scenario {}: {err}", scenario.name);
            return ExitCode::FAILURE;
        }
    }
    if !rows.is_empty() {
        print!("{}", report::table(&rows));
    }
    let tenants = report::tenant_table(&rows);
    if !tenants.is_empty() {
        print!("\n{tenants}");
        if let Some(dir) = &args.out {
            let path = dir.join("tenants.csv");
            if let Err(err) = std::fs::write(&path, report::tenant_csv(&rows)) {
                eprintln!("sluice-simulate: cannot write {}: {err}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    let adaptive = report::adaptive_table(&adaptive_rows);
    if !adaptive.is_empty() {
        if !rows.is_empty() {
            println!();
        }
        print!("{adaptive}");
        if let Some(dir) = &args.out {
            let path = dir.join("adaptive.csv");
            if let Err(err) = std::fs::write(&path, report::adaptive_csv(&adaptive_rows)) {
                eprintln!("sluice-simulate: cannot write {}: {err}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    let budgets = report::budget_table(&budget_rows);
    if !budgets.is_empty() {
        if !rows.is_empty() || !adaptive_rows.is_empty() {
            println!();
        }
        print!("{budgets}");
        if let Some(dir) = &args.out {
            let path = dir.join("budget.csv");
            if let Err(err) = std::fs::write(&path, report::budget_csv(&budget_rows)) {
                eprintln!("sluice-simulate: cannot write {}: {err}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(path) = &args.csv
        && let Err(err) = std::fs::write(path, report::csv(&rows))
    {
        eprintln!("sluice-simulate: cannot write {}: {err}", path.display());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn simulate_arguments() {
        let args = SimulateArgs::try_parse_from(["sluice-simulate", "--scenario", "all"]).unwrap();
        assert_eq!(args.scenario, "all");
        assert_eq!(args.seed, 1);
        assert!(args.csv.is_none());
        let err =
            SimulateArgs::try_parse_from(["sluice-simulate", "--scenario", "nope"]).unwrap_err();
        assert!(err.to_string().contains("unknown scenario"), "{err}");
        let args = SimulateArgs::try_parse_from(["sluice-simulate", "--scenario", "token-budget"])
            .unwrap();
        assert_eq!(args.scenario, "token-budget");
    }
}
