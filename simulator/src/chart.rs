//! What the plots share: 1 s rates of per-slot counts, the colours, and
//! drawing a labelled line and a legend on a chart of seconds against a
//! value.

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::sim::SLOT_MS;

/// Slots in the 1 s window the rates are averaged over.
const RATE_SLOTS: usize = (1_000 / SLOT_MS) as usize;

/// 1 s trailing rates, one per slot (shorter at the start).
pub fn rates(counts: &[u64]) -> Vec<f64> {
    (0..counts.len())
        .map(|end| {
            let start = (end + 1).saturating_sub(RATE_SLOTS);
            let window = counts.get(start..=end).unwrap_or(&[]);
            let seconds = (window.len() as u64 * SLOT_MS) as f64 / 1000.0;
            window.iter().sum::<u64>() as f64 / seconds.max(f64::MIN_POSITIVE)
        })
        .collect()
}

/// The colour of limits, capacities and targets.
pub const GREY: RGBColor = RGBColor(127, 127, 127);

/// One colour per variant, in run order.
pub const COLOURS: [RGBColor; 4] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

/// A chart of the plots: seconds against a value.
pub type Chart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// The rate plot every scenario draws: `title` over seconds `0..seconds`
/// against `0..top` in `unit`/s, the `offered` rate in black and the
/// `limit` as a grey line across, each labelled; `y_labels` is the width
/// of the value axis' labels.
pub fn rate_chart<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    title: String,
    (seconds, top, y_labels): (f64, f64, u32),
    unit: &str,
    (offered_label, offered): (&str, &[f64]),
    (limit_label, limit): (&str, f64),
) -> Result<Chart<'a, 'b>, String> {
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(y_labels)
        .build_cartesian_2d(0.0..seconds, 0.0..top)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc(format!("{unit}/s"))
        .draw()
        .map_err(|e| e.to_string())?;
    line(
        &mut chart,
        points(offered),
        BLACK.into(),
        offered_label.to_owned(),
    )?;
    line(
        &mut chart,
        vec![(0.0, limit), (seconds, limit)],
        GREY.stroke_width(2),
        limit_label.to_owned(),
    )?;
    Ok(chart)
}

/// Draws one labelled line on `chart`.
pub fn line(
    chart: &mut Chart<'_, '_>,
    points: Vec<(f64, f64)>,
    style: ShapeStyle,
    label: String,
) -> Result<(), String> {
    chart
        .draw_series(LineSeries::new(points, style))
        .map_err(|e| e.to_string())?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    Ok(())
}

/// Draws `chart`'s legend in its upper right corner.
pub fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>) -> Result<(), String> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| e.to_string())
}

/// The points of per-slot `values`, at each slot's end in seconds.
pub fn points(values: &[f64]) -> Vec<(f64, f64)> {
    values
        .iter()
        .enumerate()
        .map(|(slot, v)| (((slot as u64 + 1) * SLOT_MS) as f64 / 1000.0, *v))
        .collect()
}
