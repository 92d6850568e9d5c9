//! Presenting [`Metrics`]: an aligned table for the terminal and CSV for
//! the study's notebooks.

use std::fmt::Write as _;

use super::metrics::Metrics;

/// One scenario's result, as shown in a table row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Scenario name.
    pub scenario: String,
    /// Controller and decision it ran with.
    pub variant: String,
    /// Seed it ran with.
    pub seed: u64,
    /// Its metrics.
    pub metrics: Metrics,
}

const HEADERS: [&str; 10] = [
    "scenario",
    "variant",
    "err p95 1s",
    "err p95 10s",
    "overshoot",
    "converge",
    "util",
    "osc/min",
    "batches",
    "adm<=off",
];

fn percent(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{:.1}%", v * 100.0))
}

fn cells(row: &Row) -> [String; 10] {
    let metrics = &row.metrics;
    let convergence = if metrics.convergence_ms.is_empty() {
        "-".to_owned()
    } else {
        metrics
            .worst_convergence_ms()
            .map_or_else(|| "n/c".to_owned(), |ms| format!("{ms} ms"))
    };
    [
        row.scenario.clone(),
        row.variant.clone(),
        percent(metrics.error_p95_1s),
        percent(metrics.error_p95_10s),
        metrics
            .peak_overshoot_pct
            .map_or_else(|| "-".to_owned(), |pct| format!("{pct:+.1}%")),
        convergence,
        metrics
            .utilisation
            .map_or_else(|| "-".to_owned(), |u| format!("{u:.3}")),
        metrics
            .oscillations_per_min
            .map_or_else(|| "-".to_owned(), |o| format!("{o:.1}")),
        metrics.batches_pushed.to_string(),
        if metrics.admitted_within_offered {
            "yes"
        } else {
            "NO"
        }
        .to_owned(),
    ]
}

/// A fixed-width table, one line per row, with a header.
pub fn table(rows: &[Row]) -> String {
    let body: Vec<[String; 10]> = rows.iter().map(cells).collect();
    let mut widths = HEADERS.map(str::len);
    for line in &body {
        for (width, cell) in widths.iter_mut().zip(line) {
            *width = (*width).max(cell.len());
        }
    }
    let mut out = String::new();
    let header = HEADERS.map(str::to_owned);
    for line in std::iter::once(&header).chain(&body) {
        let mut text = String::new();
        for (index, (cell, width)) in line.iter().zip(widths).enumerate() {
            // Names are text, left-aligned; every other column is a number.
            if index == 0 {
                let _ = write!(text, "{cell:<width$}");
            } else if index == 1 {
                let _ = write!(text, "  {cell:<width$}");
            } else {
                let _ = write!(text, "  {cell:>width$}");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

fn csv_number(value: Option<f64>) -> String {
    value.map_or_else(String::new, |v| format!("{v}"))
}

/// CSV with a header line; missing values are empty fields, convergence is
/// the worst over the scenario's disturbances.
pub fn csv(rows: &[Row]) -> String {
    let mut out = String::from(
        "scenario,variant,seed,error_p95_1s,error_p95_10s,peak_overshoot_pct,convergence_ms,\
         disturbances,utilisation,oscillations_per_min,batches_pushed,admitted_within_offered\n",
    );
    for row in rows {
        let metrics = &row.metrics;
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{}",
            row.scenario,
            row.variant,
            row.seed,
            csv_number(metrics.error_p95_1s),
            csv_number(metrics.error_p95_10s),
            csv_number(metrics.peak_overshoot_pct),
            metrics
                .worst_convergence_ms()
                .map_or_else(String::new, |ms| ms.to_string()),
            metrics.convergence_ms.len(),
            csv_number(metrics.utilisation),
            csv_number(metrics.oscillations_per_min),
            metrics.batches_pushed,
            metrics.admitted_within_offered,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Row {
        Row {
            scenario: "steady".to_owned(),
            variant: "baseline".to_owned(),
            seed: 7,
            metrics: Metrics {
                error_p95_1s: Some(0.05),
                error_p95_10s: None,
                peak_overshoot_pct: None,
                convergence_ms: vec![Some(1_200), None],
                utilisation: Some(0.99),
                oscillations_per_min: Some(12.0),
                admitted_within_offered: true,
                batches_pushed: 3,
            },
        }
    }

    #[test]
    fn table_has_header_and_row() {
        let text = table(&[row()]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("scenario"));
        assert!(lines[1].contains("5.0%"), "{text}");
        assert!(lines[1].contains("n/c"), "{text}");
    }

    #[test]
    fn csv_leaves_missing_values_empty() {
        let text = csv(&[row()]);
        assert_eq!(
            text.lines().nth(1).unwrap(),
            "steady,baseline,7,0.05,,,,2,0.99,12,3,true"
        );
    }
}
