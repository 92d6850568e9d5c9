//! The load of the token-budget benchmarks (`bench_tokens`,
//! `bench_tokens_vs_ratelimit`): the budget, the tenants, the Envoys'
//! skew, the streams offering a multiple of the budget, and the error
//! arithmetic of their reports.

use std::time::Duration;

use anyhow::{Result, bail};
use sluice_integration_tests::fleet::DataPlane;
use sluice_integration_tests::token_fleet::{Completion, TokenFleetOptions, TokenStream};

/// The budget, tokens per second.
pub const BUDGET: f64 = 20_000.0;
/// Tenants, their weights and their part of the demand.
pub const TENANTS: [(&str, f64, f64); 3] = [
    ("gold", 2.0, 0.5),
    ("silver", 1.0, 0.3),
    ("bronze", 1.0, 0.2),
];
/// Their fair shares of the budget at 3x (every tenant offers more than
/// its weighted share): 20,000 x 2/4, 1/4, 1/4.
pub const FAIR_SHARES: [f64; 3] = [10_000.0, 5_000.0, 5_000.0];
/// The Envoys' parts of the load.
pub const ENVOY_SKEW: [f64; 3] = [0.6, 0.3, 0.1];

/// `--data-plane` of the token benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DataPlaneChoice {
    /// The proxy-wasm filter.
    Wasm,
    /// The native dynamic module.
    Native,
    /// Each, one after the other.
    Both,
}

impl DataPlaneChoice {
    /// The data planes to run, in order.
    pub fn data_planes(self) -> Vec<DataPlane> {
        match self {
            Self::Wasm => vec![DataPlane::Wasm],
            Self::Native => vec![DataPlane::Native],
            Self::Both => vec![DataPlane::Wasm, DataPlane::Native],
        }
    }
}

/// The options both token benchmarks take besides their `--seconds`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Seconds not measured at a run's start.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=600))]
    pub warmup: u64,
    /// The data planes to run.
    #[arg(long = "data-plane", value_enum, default_value_t = DataPlaneChoice::Wasm)]
    pub data_plane: DataPlaneChoice,
    /// The file whose section is replaced, or `-` to print only.
    #[arg(long, default_value = "BENCHMARKS.md")]
    pub output: String,
    /// Worker threads of every Envoy: each runs its own agent, so each
    /// cell's credit and cap is split over them.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub workers: u32,
}

impl RunArgs {
    /// Whether a run of `seconds` measures at least 10 s after the warm-up.
    pub fn check(&self, seconds: u64) -> Result<()> {
        if seconds < self.warmup + 10 {
            bail!("--seconds must be at least --warmup + 10");
        }
        Ok(())
    }
}

/// The token fleet of the benchmarks: [`BUDGET`], one Envoy of `workers`
/// per part of [`ENVOY_SKEW`], the [`TENANTS`] weighted, `data_plane` with
/// `filter`'s extra keys.
pub fn fleet_options(
    data_plane: DataPlane,
    workers: u32,
    filter: serde_json::Value,
) -> TokenFleetOptions {
    let mut options = TokenFleetOptions::new(BUDGET, ENVOY_SKEW.len());
    options.workers = workers;
    options.tenants = TENANTS
        .iter()
        .map(|(t, w, _)| ((*t).to_owned(), *w))
        .collect();
    options.data_plane = data_plane;
    options.extra_filter = filter;
    options
}

/// The streams offering `multiple` x the budget, switching to `then` at
/// `step` if given.
pub fn streams(multiple: f64, then: Option<(Duration, f64)>) -> Vec<TokenStream> {
    let mut streams = Vec::new();
    for (envoy, skew) in ENVOY_SKEW.iter().enumerate() {
        for (tenant, _, demand) in TENANTS {
            let part = skew * demand * BUDGET;
            let mut stream = TokenStream::steady(envoy, tenant, part * multiple);
            if let Some((at, multiple)) = then {
                stream.tokens_per_s.push((at, part * multiple));
            }
            streams.push(stream);
        }
    }
    streams
}

/// Every request was answered 200 or 429: anything else means the setup,
/// not the limiter, is being measured.
pub fn check_answers(completions: &[Completion]) -> Result<()> {
    let other = completions
        .iter()
        .filter(|c| c.status != 200 && c.status != 429)
        .count();
    if other * 100 > completions.len() {
        bail!(
            "{other} of {} requests were answered neither 200 nor 429",
            completions.len()
        );
    }
    Ok(())
}

/// `x` as a signed percentage.
pub fn percent(x: f64) -> String {
    format!("{:+.1} %", x * 100.0)
}

/// The median and the largest of the absolute values, and the share
/// within `bound`.
pub fn spread(errors: &[f64], bound: f64) -> String {
    let mut abs: Vec<f64> = errors.iter().map(|e| e.abs()).collect();
    abs.sort_by(f64::total_cmp);
    let median = abs.get(abs.len() / 2).copied().unwrap_or_default();
    let max = abs.last().copied().unwrap_or_default();
    format!(
        "median {:.1} %, max {:.1} %, {}",
        median * 100.0,
        max * 100.0,
        within(errors, bound)
    )
}

/// How many of `errors` are within `bound`, of how many.
pub fn within(errors: &[f64], bound: f64) -> String {
    let count = errors.iter().filter(|e| e.abs() <= bound).count();
    format!("{count}/{} within ±{:.0} %", errors.len(), bound * 100.0)
}

/// The value at quantile `q` of `values` (nearest rank; 0 when empty).
pub fn quantile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    if values.is_empty() {
        return 0.0;
    }
    let rank = ((values.len() as f64 * q).ceil() as usize).clamp(1, values.len());
    values.get(rank - 1).copied().unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;

    #[test]
    fn the_streams_offer_the_multiple_in_the_skew() {
        let streams = streams(3.0, None);
        let total: f64 = streams.iter().map(|s| s.tokens_per_s[0].1).sum();
        assert!((total - 3.0 * BUDGET).abs() < 1e-6, "{total}");
        let first: f64 = streams
            .iter()
            .filter(|s| s.envoy == 0)
            .map(|s| s.tokens_per_s[0].1)
            .sum();
        assert!((first - 0.6 * 3.0 * BUDGET).abs() < 1e-6, "{first}");
    }

    #[test]
    fn within_counts_both_signs() {
        assert_eq!(within(&[0.1, -0.1, 0.11, -0.2], 0.1), "2/4 within ±10 %");
        assert_eq!(within(&[], 0.05), "0/0 within ±5 %");
    }

    #[test]
    fn quantile_is_nearest_rank() {
        let mut values: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(quantile(&mut values, 0.5), 50.0);
        assert_eq!(quantile(&mut values, 0.99), 99.0);
        assert_eq!(quantile(&mut [], 0.5), 0.0);
    }

    #[test]
    fn spread_counts_the_windows_within_the_bound() {
        assert_eq!(
            spread(&[0.05, -0.2, 0.01], 0.1),
            "median 5.0 %, max 20.0 %, 2/3 within ±10 %"
        );
    }
}
