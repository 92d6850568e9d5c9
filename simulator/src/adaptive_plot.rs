//! Time series of an adaptive run: a CSV per variant and an SVG per
//! scenario with the upstream's capacity, each variant's limit and goodput
//! (1 s rates) above, and each variant's 1 s p99 against the target below.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use crate::adaptive::quantile;
use crate::chart::{COLOURS, GREY, legend, line, points, rates};
use crate::scenario::Scenario;
use crate::sim::{SLOT_MS, Trace, UpstreamTrace};

/// Slots in one second.
const PER_SECOND: usize = (1_000 / SLOT_MS) as usize;

/// The p99 latency of the responses of the second ending at each slot, in
/// milliseconds (0 without responses).
pub fn p99s(upstream: &UpstreamTrace) -> Vec<f64> {
    (0..upstream.latency_us.len())
        .map(|end| {
            let start = (end + 1).saturating_sub(PER_SECOND);
            let mut latencies: Vec<u64> = upstream
                .latency_us
                .get(start..=end)
                .unwrap_or(&[])
                .iter()
                .flatten()
                .copied()
                .collect();
            quantile(&mut latencies, 0.99).map_or(0.0, |p99| p99 / 1_000.0)
        })
        .collect()
}

/// The time series CSV of one adaptive run:
/// `time_s,capacity_rps,limit_rps,admitted_rps,goodput_rps,errors_rps,p99_ms`
/// (the first adaptive bucket's limit and admitted rate; the upstream's
/// answers over every bucket).
pub fn series_csv(scenario: &Scenario, trace: &Trace) -> String {
    let mut out =
        String::from("time_s,capacity_rps,limit_rps,admitted_rps,goodput_rps,errors_rps,p99_ms\n");
    let bucket = scenario
        .buckets
        .iter()
        .zip(&trace.buckets)
        .find_map(|(spec, bucket)| spec.adaptive.is_some().then_some(bucket));
    let (Some(bucket), Some(upstream)) = (bucket, trace.upstream.as_ref()) else {
        return out;
    };
    let admitted = rates(&bucket.admitted);
    let goodput = rates(&upstream.ok);
    let errors = rates(&upstream.errors);
    let p99 = p99s(upstream);
    for slot in 0..admitted.len() {
        let value = |series: &[f64]| series.get(slot).copied().unwrap_or(0.0);
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{}",
            ((slot as u64 + 1) * SLOT_MS) as f64 / 1_000.0,
            value(&upstream.capacity_rps),
            value(&bucket.limit_rps),
            value(&admitted),
            value(&goodput),
            value(&errors),
            value(&p99),
        );
    }
    out
}

/// Draws `path`: capacity, limits and goodput above; p99s and the target
/// below.
pub fn draw(path: &Path, scenario: &Scenario, runs: &[(&str, Trace)]) -> Result<(), String> {
    let Some((spec_index, spec)) = scenario
        .buckets
        .iter()
        .enumerate()
        .find(|(_, bucket)| bucket.adaptive.is_some())
    else {
        return Ok(());
    };
    let Some(adaptive) = spec.adaptive.as_ref() else {
        return Ok(());
    };
    let target = adaptive.target_p99_ms.unwrap_or(0.0);
    let seconds = scenario.duration_ms as f64 / 1_000.0;
    let top_rps = adaptive.max_rps.max(spec.limit_rps) * 1.1;
    let root = SVGBackend::new(path, (960, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (upper, lower) = root.split_vertically(400);
    let mut rates_chart = ChartBuilder::on(&upper)
        .caption(
            format!(
                "{}: bucket {} offered {:.0} rps, limit adaptive in {:.0}..{:.0}",
                scenario.name,
                spec.name,
                spec.load.rps_at(0),
                adaptive.min_rps,
                adaptive.max_rps
            ),
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..seconds, 0.0..top_rps)
        .map_err(|e| e.to_string())?;
    rates_chart
        .configure_mesh()
        .y_desc("requests/s")
        .draw()
        .map_err(|e| e.to_string())?;
    if let Some((_, trace)) = runs.first()
        && let Some(upstream) = &trace.upstream
    {
        let capacity = points(&upstream.capacity_rps);
        let label = "upstream capacity".to_owned();
        line(&mut rates_chart, capacity, GREY.stroke_width(2), label)?;
    }
    for ((variant, trace), colour) in runs.iter().zip(COLOURS.iter().cycle()) {
        if let Some(bucket) = trace.buckets.get(spec_index) {
            let limit = points(&bucket.limit_rps);
            let label = format!("limit ({variant})");
            line(&mut rates_chart, limit, colour.mix(0.5).into(), label)?;
        }
        if let Some(upstream) = &trace.upstream {
            let goodput = points(&rates(&upstream.ok));
            let label = format!("goodput ({variant})");
            line(&mut rates_chart, goodput, colour.into(), label)?;
        }
    }
    legend(&mut rates_chart)?;

    let p99_series: Vec<(&str, Vec<f64>)> = runs
        .iter()
        .filter_map(|(variant, trace)| Some((*variant, p99s(trace.upstream.as_ref()?))))
        .collect();
    let top_ms = p99_series
        .iter()
        .flat_map(|(_, p99)| p99.iter().copied())
        .fold(target, f64::max)
        * 1.1;
    let mut latency_chart = ChartBuilder::on(&lower)
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..seconds, 0.0..top_ms.max(1.0))
        .map_err(|e| e.to_string())?;
    latency_chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("p99 over 1 s (ms)")
        .draw()
        .map_err(|e| e.to_string())?;
    let target_line = vec![(0.0, target), (seconds, target)];
    line(
        &mut latency_chart,
        target_line,
        GREY.stroke_width(2),
        "target".to_owned(),
    )?;
    for ((variant, p99), colour) in p99_series.iter().zip(COLOURS.iter().cycle()) {
        line(
            &mut latency_chart,
            points(p99),
            colour.into(),
            format!("p99 ({variant})"),
        )?;
    }
    legend(&mut latency_chart)?;
    root.present().map_err(|e| e.to_string())
}
