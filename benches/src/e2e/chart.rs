//! CPU per request per variant as an SVG bar chart: the median of each
//! variant's total CPU (Envoy, plus the stand-in service of variants 6, 8
//! and 9, stacked), with a whisker from the smallest to the largest round.

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

/// The chart's file name, written next to `BENCHMARKS.md` (which links it).
pub use super::report::CHART_FILE_NAME as FILE_NAME;
use super::report::Summary;

const ENVOY: RGBColor = RGBColor(70, 110, 170);
const SERVICE: RGBColor = RGBColor(220, 130, 50);

/// Writes the chart of `summaries` (in table order) to `path`.
pub fn write(path: &Path, summaries: &[Summary]) -> Result<()> {
    let top = summaries
        .iter()
        .map(|s| s.total_cpu_us.max)
        .fold(0.0_f64, f64::max)
        .max(1.0)
        * 1.15;
    let count = summaries.len().max(1);
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("chart: {e}"))?;
    let labels: Vec<String> = summaries
        .iter()
        .map(|s| short_label(s.variant.label()))
        .collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "CPU per request (median, min–max over rounds)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(70)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..count as f64, 0.0..top)
        .map_err(|e| anyhow!("chart: {e}"))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(count * 2 + 1)
        .x_label_formatter(&|x| {
            // Label only the centre of each bar.
            let index = (x - 0.5).round();
            if (x - 0.5 - index).abs() < 1e-6 && index >= 0.0 {
                labels.get(index as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("CPU µs per request")
        .draw()
        .map_err(|e| anyhow!("chart: {e}"))?;

    for (i, s) in summaries.iter().enumerate() {
        let left = i as f64 + 0.2;
        let right = i as f64 + 0.8;
        let centre = i as f64 + 0.5;
        let service = s.service_cpu_us.map_or(0.0, |r| r.median);
        let envoy = s.total_cpu_us.median - service;
        let mut bars = vec![Rectangle::new(
            [(left, 0.0), (right, envoy)],
            ENVOY.filled(),
        )];
        if service > 0.0 {
            bars.push(Rectangle::new(
                [(left, envoy), (right, s.total_cpu_us.median)],
                SERVICE.filled(),
            ));
        }
        chart.draw_series(bars).map_err(|e| anyhow!("chart: {e}"))?;
        let whisker = vec![
            PathElement::new(
                vec![(centre, s.total_cpu_us.min), (centre, s.total_cpu_us.max)],
                BLACK.stroke_width(2),
            ),
            PathElement::new(
                vec![
                    (centre - 0.08, s.total_cpu_us.min),
                    (centre + 0.08, s.total_cpu_us.min),
                ],
                BLACK.stroke_width(2),
            ),
            PathElement::new(
                vec![
                    (centre - 0.08, s.total_cpu_us.max),
                    (centre + 0.08, s.total_cpu_us.max),
                ],
                BLACK.stroke_width(2),
            ),
        ];
        chart
            .draw_series(whisker)
            .map_err(|e| anyhow!("chart: {e}"))?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("{:.1}", s.total_cpu_us.median),
                (left, s.total_cpu_us.max + top * 0.02),
                ("sans-serif", 14),
            )))
            .map_err(|e| anyhow!("chart: {e}"))?;
    }
    chart
        .draw_series(std::iter::once(Rectangle::new(
            [(0.0, 0.0), (0.0, 0.0)],
            ENVOY.filled(),
        )))
        .map_err(|e| anyhow!("chart: {e}"))?
        .label("Envoy")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], ENVOY.filled()));
    chart
        .draw_series(std::iter::once(Rectangle::new(
            [(0.0, 0.0), (0.0, 0.0)],
            SERVICE.filled(),
        )))
        .map_err(|e| anyhow!("chart: {e}"))?
        .label("stand-in service (rate limit service in 6, upstream in 8 and 9)")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], SERVICE.filled()));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow!("chart: {e}"))?;
    root.present().map_err(|e| anyhow!("chart: {e}"))?;
    Ok(())
}

/// "4. + Sluice, directive present, no drops" → "4. Sluice".
fn short_label(label: &str) -> String {
    let (number, rest) = label.split_once(' ').unwrap_or(("", label));
    let rest = rest.trim_start_matches("+ ");
    let name = rest.split(',').next().unwrap_or(rest);
    format!("{number} {name}")
}

#[cfg(test)]
mod tests {
    use super::super::client::LoadOutcome;
    use super::super::config::Variant;
    use super::super::report::{Run, Summary};
    use super::*;

    #[test]
    fn writes_an_svg_with_every_variant() {
        let outcome = LoadOutcome {
            latencies_us: vec![100; 10],
            ok: 10,
            elapsed: std::time::Duration::from_millis(1),
            ..LoadOutcome::default()
        };
        let summaries: Vec<Summary> = Variant::ALL
            .iter()
            .map(|&variant| {
                let service = (variant == Variant::GlobalRateLimit).then_some(200.0);
                Summary::of(variant, &[Run::new(outcome.clone(), 150.0, service)])
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        write(&path, &summaries).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.contains("6. global ratelimit"), "{svg}");
        assert!(svg.contains("stand-in service"), "{svg}");
    }

    #[test]
    fn short_labels_keep_number_and_name() {
        assert_eq!(
            short_label("4. + Sluice, directive present, no drops"),
            "4. Sluice"
        );
        assert_eq!(
            short_label("1. router only (direct_response)"),
            "1. router only (direct_response)"
        );
    }
}
