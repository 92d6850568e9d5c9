//! Time series of a run: a CSV per variant and an SVG plot per scenario of
//! offered, admitted and limit over time (first bucket; for `zipf` the
//! busiest), as 1 s rates sampled every [`SLOT_MS`].

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use crate::chart::{COLOURS, legend, line, points, rate_chart, rates};
use crate::scenario::Scenario;
use crate::sim::{SLOT_MS, Trace};
use crate::{adaptive_plot, budget_plot};

/// Why the files could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// Writing a CSV failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// Drawing the SVG failed.
    #[error("cannot draw {path}: {message}")]
    Draw {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
}

/// The time series CSV of one run: `time_s,bucket,limit_rps,offered_rps,admitted_rps`.
pub fn series_csv(scenario: &Scenario, trace: &Trace) -> String {
    let mut out = String::from("time_s,bucket,limit_rps,offered_rps,admitted_rps\n");
    for (spec, bucket) in scenario.buckets.iter().zip(&trace.buckets) {
        let offered = rates(&bucket.offered);
        let admitted = rates(&bucket.admitted);
        for (slot, (o, a)) in offered.iter().zip(&admitted).enumerate() {
            let time = ((slot as u64 + 1) * SLOT_MS) as f64 / 1000.0;
            let _ = writeln!(out, "{time},{},{},{o},{a}", bucket.name, spec.limit_rps);
        }
    }
    out
}

/// Writes `NAME-VARIANT.csv` for every run and `NAME.svg` with all of them
/// (an adaptive scenario's as [`adaptive_plot`] draws them, a budget
/// scenario's as [`budget_plot`] does).
pub fn write(dir: &Path, scenario: &Scenario, runs: &[(&str, Trace)]) -> Result<(), PlotError> {
    let adaptive = scenario.upstream.is_some();
    let budget = scenario.costs.is_some();
    for (variant, trace) in runs {
        let path = dir.join(format!("{}-{variant}.csv", scenario.name));
        let series = if budget {
            budget_plot::series_csv(scenario, trace)
        } else if adaptive {
            adaptive_plot::series_csv(scenario, trace)
        } else {
            series_csv(scenario, trace)
        };
        std::fs::write(&path, series).map_err(|source| PlotError::Io {
            path: path.display().to_string(),
            source,
        })?;
    }
    let path = dir.join(format!("{}.svg", scenario.name));
    let drawn = if budget {
        budget_plot::draw(&path, scenario, runs)
    } else if adaptive {
        adaptive_plot::draw(&path, scenario, runs)
    } else {
        draw(&path, scenario, runs)
    };
    drawn.map_err(|message| PlotError::Draw {
        path: path.display().to_string(),
        message,
    })
}

fn draw(path: &Path, scenario: &Scenario, runs: &[(&str, Trace)]) -> Result<(), String> {
    let (Some(spec), Some((_, first))) = (scenario.buckets.first(), runs.first()) else {
        return Ok(());
    };
    let Some(bucket) = first.buckets.first() else {
        return Ok(());
    };
    let offered = rates(&bucket.offered);
    let seconds = scenario.duration_ms as f64 / 1000.0;
    let top = offered.iter().copied().fold(spec.limit_rps, f64::max) * 1.15;

    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let title = format!(
        "{}: bucket {}, 1 s rates (limit {} rps)",
        scenario.name, bucket.name, spec.limit_rps
    );
    let mut chart = rate_chart(
        &root,
        title,
        (seconds, top, 60),
        "requests",
        ("offered", &offered),
        ("limit", spec.limit_rps),
    )?;
    for ((variant, trace), colour) in runs.iter().zip(COLOURS.iter().cycle()) {
        let Some(bucket) = trace.buckets.first() else {
            continue;
        };
        let admitted = points(&rates(&bucket.admitted));
        line(
            &mut chart,
            admitted,
            colour.into(),
            format!("admitted ({variant})"),
        )?;
    }
    legend(&mut chart)?;
    root.present().map_err(|e| e.to_string())
}

#[cfg(test)]
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;
    use crate::scenario;
    use crate::sim::{Variant, run_variant};

    #[test]
    fn trailing_rates() {
        let rates = rates(&[10; 20]);
        assert_eq!(rates[0], 100.0);
        assert_eq!(rates[19], 100.0);
    }

    #[test]
    fn writes_csv_and_svg() {
        let scenario = scenario::by_name("step-2x").unwrap().truncated(3_000);
        let trace = run_variant(&scenario, 1, Variant::BASELINE).unwrap();
        let dir = std::env::temp_dir().join(format!("sluice-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write(&dir, &scenario, &[("baseline", trace)]).unwrap();
        let csv = std::fs::read_to_string(dir.join("step-2x-baseline.csv")).unwrap();
        assert_eq!(csv.lines().count(), 31, "header and 30 slots");
        let svg = std::fs::read_to_string(dir.join("step-2x.svg")).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..40]);
        assert!(svg.contains("admitted (baseline)"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
