//! Time series of a budget run: a CSV per variant and an SVG of the cost
//! offered, admitted and charged against the budget, as 1 s rates sampled
//! every [`SLOT_MS`].

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use crate::chart::{COLOURS, legend, line, points, rate_chart, rates};
use crate::scenario::Scenario;
use crate::sim::{SLOT_MS, Trace};

/// The time series CSV of one run:
/// `time_s,budget_per_s,offered_per_s,admitted_per_s,charged_per_s`.
pub fn series_csv(scenario: &Scenario, trace: &Trace) -> String {
    let mut out = String::from("time_s,budget_per_s,offered_per_s,admitted_per_s,charged_per_s\n");
    let (Some(spec), Some(cost)) = (
        scenario.buckets.first(),
        trace.buckets.first().and_then(|b| b.cost.as_ref()),
    ) else {
        return out;
    };
    let offered = rates(&cost.offered);
    let admitted = rates(&cost.admitted);
    let charged = rates(&cost.charged);
    for (slot, ((o, a), c)) in offered.iter().zip(&admitted).zip(&charged).enumerate() {
        let time = ((slot as u64 + 1) * SLOT_MS) as f64 / 1000.0;
        let _ = writeln!(out, "{time},{},{o},{a},{c}", spec.limit_rps);
    }
    out
}

/// Draws the offered cost, the budget and each run's charged cost.
pub fn draw(path: &Path, scenario: &Scenario, runs: &[(&str, Trace)]) -> Result<(), String> {
    let (Some(spec), Some(costs)) = (scenario.buckets.first(), scenario.costs.as_ref()) else {
        return Ok(());
    };
    let Some(cost) = runs
        .first()
        .and_then(|(_, trace)| trace.buckets.first())
        .and_then(|bucket| bucket.cost.as_ref())
    else {
        return Ok(());
    };
    let offered = rates(&cost.offered);
    let seconds = scenario.duration_ms as f64 / 1000.0;
    let top = offered.iter().copied().fold(spec.limit_rps, f64::max) * 1.15;

    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let title = format!(
        "{}: bucket {}, 1 s rates (budget {} {}/s)",
        scenario.name, spec.name, spec.limit_rps, costs.unit
    );
    let unit = costs.unit.as_str();
    let mut chart = rate_chart(
        &root,
        title,
        (seconds, top, 70),
        unit,
        ("offered (estimates)", &offered),
        ("budget", spec.limit_rps),
    )?;
    for ((variant, trace), colour) in runs.iter().zip(COLOURS.iter().cycle()) {
        let Some(cost) = trace.buckets.first().and_then(|b| b.cost.as_ref()) else {
            continue;
        };
        line(
            &mut chart,
            points(&rates(&cost.charged)),
            colour.into(),
            format!("charged ({variant})"),
        )?;
    }
    legend(&mut chart)?;
    root.present().map_err(|e| e.to_string())
}
