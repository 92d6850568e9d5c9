//! Presenting [`RunMetrics`]: an aligned table for the terminal and CSV for
//! the study's notebooks.

use std::fmt::Write as _;

use crate::adaptive::{AdaptiveMetrics, Phase};
use crate::budget::{BudgetMetrics, StepOvershoot, Windows};
use crate::metrics::{RunMetrics, TenantShare};

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
    pub metrics: RunMetrics,
}

const HEADERS: [&str; 11] = [
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
    "fair err",
];

fn percent(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{:.1}%", v * 100.0))
}

fn cells(row: &Row) -> [String; 11] {
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
        percent(metrics.worst_tenant_error()),
    ]
}

/// A fixed-width table, one line per row, with a header.
pub fn table(rows: &[Row]) -> String {
    let body: Vec<[String; 11]> = rows.iter().map(cells).collect();
    aligned(&HEADERS, &body)
}

/// Lines of cells under a header: the first two columns (names) left-aligned,
/// the others (numbers) right-aligned.
fn aligned<const N: usize>(headers: &[&str; N], body: &[[String; N]]) -> String {
    let mut widths = headers.map(str::len);
    for line in body {
        for (width, cell) in widths.iter_mut().zip(line) {
            *width = (*width).max(cell.len());
        }
    }
    let mut out = String::new();
    let header = headers.map(str::to_owned);
    for line in std::iter::once(&header).chain(body) {
        let mut text = String::new();
        for (index, (cell, width)) in line.iter().zip(widths).enumerate() {
            // Names are text, left-aligned; every other column is a number.
            if index == 0 {
                let _ = write!(text, "{cell:<width$}");
            } else if index < NAME_COLUMNS {
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

/// Leading columns of every table that hold names, not numbers.
const NAME_COLUMNS: usize = 2;

const TENANT_HEADERS: [&str; 8] = [
    "scenario",
    "variant",
    "tenant",
    "weight",
    "offered",
    "fair share",
    "admitted",
    "vs share",
];

fn tenant_cells(row: &Row, share: &TenantShare) -> [String; 8] {
    [
        row.scenario.clone(),
        row.variant.clone(),
        format!("{}/{}", share.bucket, share.tenant),
        format!("{}", share.weight),
        format!("{:.1}", share.offered_rps),
        format!("{:.1}", share.fair_share_rps),
        format!("{:.1}", share.admitted_rps),
        share
            .error()
            .map_or_else(|| "-".to_owned(), |e| format!("{:+.1}%", e * 100.0)),
    ]
}

/// Per tenant of the scenarios that have tenants: offered, weighted max-min
/// fair share and admitted rates (steady state); empty when none has.
pub fn tenant_table(rows: &[Row]) -> String {
    let body: Vec<[String; 8]> = rows
        .iter()
        .flat_map(|row| row.metrics.tenants.iter().map(|s| tenant_cells(row, s)))
        .collect();
    if body.is_empty() {
        return String::new();
    }
    aligned(&TENANT_HEADERS, &body)
}

/// The tenant rows as CSV with a header line.
pub fn tenant_csv(rows: &[Row]) -> String {
    let mut out = String::from(
        "scenario,variant,seed,bucket,tenant,weight,offered_rps,fair_share_rps,admitted_rps\n",
    );
    for row in rows {
        for share in &row.metrics.tenants {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{}",
                row.scenario,
                row.variant,
                row.seed,
                share.bucket,
                share.tenant,
                share.weight,
                share.offered_rps,
                share.fair_share_rps,
                share.admitted_rps,
            );
        }
    }
    out
}

/// One adaptive scenario's result.
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveRow {
    /// Scenario name.
    pub scenario: String,
    /// Controller and decision it ran with.
    pub variant: String,
    /// Seed it ran with.
    pub seed: u64,
    /// Its metrics.
    pub metrics: AdaptiveMetrics,
}

const ADAPTIVE_HEADERS: [&str; 10] = [
    "scenario",
    "variant",
    "phase",
    "capacity",
    "adapt",
    "limit/cap",
    "low..high",
    "goodput",
    "p99",
    "5xx",
];

fn phase_cells(row: &AdaptiveRow, phase: &Phase) -> [String; 10] {
    [
        row.scenario.clone(),
        row.variant.clone(),
        format!("{}-{} s", phase.from_ms / 1_000, phase.to_ms / 1_000),
        format!("{:.0}", phase.capacity_rps),
        phase.adapt_ms.map_or_else(
            || "never".to_owned(),
            |ms| format!("{:.1} s", ms as f64 / 1e3),
        ),
        format!("{:.3}", phase.limit_ratio),
        format!(
            "{:.2}..{:.2}",
            phase.limit_low_ratio, phase.limit_high_ratio
        ),
        format!("{:.3}", phase.goodput_ratio),
        format!("{:.0} ms", phase.p99_ms),
        format!("{:.2}%", phase.error_ratio * 100.0),
    ]
}

/// Per phase of each adaptive run's upstream capacity: the time its limit
/// took to come within 10 % of the capacity, then over the phase's second
/// half the limit's mean and range and the goodput (over the capacity), the
/// p99 and the 5xx share; a line per run with its totals. Empty when no
/// scenario was adaptive.
pub fn adaptive_table(rows: &[AdaptiveRow]) -> String {
    let body: Vec<[String; 10]> = rows
        .iter()
        .flat_map(|row| row.metrics.phases.iter().map(|p| phase_cells(row, p)))
        .collect();
    if body.is_empty() {
        return String::new();
    }
    let mut out = aligned(&ADAPTIVE_HEADERS, &body);
    for row in rows {
        let metrics = &row.metrics;
        let _ = writeln!(
            out,
            "{} {}: goodput {:.3} of the capacity over the run, p99 within {:.0} ms in {:.0}% \
             of its seconds, limit {:.0}..{:.0} rps (bounds {:.0}..{:.0})",
            row.scenario,
            row.variant,
            metrics.goodput_ratio,
            metrics.target_p99_ms,
            metrics.seconds_within_target * 100.0,
            metrics.limit_low_rps,
            metrics.limit_high_rps,
            metrics.min_rps,
            metrics.max_rps,
        );
    }
    out
}

/// The adaptive rows as CSV, a line per phase, with a header line.
pub fn adaptive_csv(rows: &[AdaptiveRow]) -> String {
    let mut out = String::from(
        "scenario,variant,seed,from_ms,to_ms,capacity_rps,adapt_ms,limit_ratio,\
         limit_low_ratio,limit_high_ratio,goodput_ratio,p99_ms,error_ratio\n",
    );
    for row in rows {
        for phase in &row.metrics.phases {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{},{},{},{}",
                row.scenario,
                row.variant,
                row.seed,
                phase.from_ms,
                phase.to_ms,
                phase.capacity_rps,
                phase.adapt_ms.map_or_else(String::new, |ms| ms.to_string()),
                phase.limit_ratio,
                phase.limit_low_ratio,
                phase.limit_high_ratio,
                phase.goodput_ratio,
                phase.p99_ms,
                phase.error_ratio,
            );
        }
    }
    out
}

/// One budget scenario's result.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetRow {
    /// Scenario name.
    pub scenario: String,
    /// Controller and decision it ran with.
    pub variant: String,
    /// Seed it ran with.
    pub seed: u64,
    /// Its metrics.
    pub metrics: BudgetMetrics,
}

fn signed(value: f64) -> String {
    format!("{:+.1} %", value * 100.0)
}

fn within(windows: &Windows) -> String {
    windows.fraction().map_or_else(
        || "-".to_owned(),
        |f| format!("{:.0} % ({}/{})", f * 100.0, windows.within, windows.count),
    )
}

/// The budget runs as markdown: per run the steady span's offered,
/// admitted and charged rates against the budget and the first 1 s and
/// 10 s after the load step; the consecutive 10 s and 1 s windows within
/// ±5 % and ±10 % and their RMS errors, of the cost charged (by stream
/// end) and of the estimates admitted (by decision); then each tenant's
/// charged rate against its fair share. Empty without budget runs.
pub fn budget_table(rows: &[BudgetRow]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "| scenario | variant | budget | steady span | offered | admitted (estimates) | charged | \
         charged vs budget | step: first 1 s admitted | first 10 s admitted | first 10 s charged |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for row in rows {
        let m = &row.metrics;
        let step = |value: fn(&StepOvershoot) -> f64| {
            m.step
                .as_ref()
                .map_or_else(|| "-".to_owned(), |s| signed(value(s)))
        };
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} {}/s | {}-{} s | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} |",
            row.scenario,
            row.variant,
            m.budget_per_s,
            m.unit,
            m.steady_ms.0 / 1_000,
            m.steady_ms.1 / 1_000,
            m.offered_per_s,
            m.admitted_per_s,
            m.charged_per_s,
            signed(m.charged_per_s / m.budget_per_s - 1.0),
            step(|s| s.admitted_1s),
            step(|s| s.admitted_10s),
            step(|s| s.charged_10s),
        );
    }
    out.push_str(
        "\n| scenario | variant | windows of | 10 s within ±5 % | RMS 10 s | 1 s within ±10 % | \
         RMS 1 s |\n\
         | --- | --- | --- | ---: | ---: | ---: | ---: |\n",
    );
    for row in rows {
        let m = &row.metrics;
        for (counted, ten, one) in [
            ("cost charged, by stream end", &m.windows_10s, &m.windows_1s),
            (
                "estimates admitted, by decision",
                &m.admitted_10s,
                &m.admitted_1s,
            ),
        ] {
            let _ = writeln!(
                out,
                "| {} | {} | {counted} | {} | {:.1} % | {} | {:.1} % |",
                row.scenario,
                row.variant,
                within(ten),
                ten.rms * 100.0,
                within(one),
                one.rms * 100.0,
            );
        }
    }
    out.push_str(
        "\n| scenario | variant | tenant | weight | offered | fair share | charged | vs share |\n\
         | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for row in rows {
        for tenant in &row.metrics.tenants {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {} |",
                row.scenario,
                row.variant,
                tenant.tenant,
                tenant.weight,
                tenant.offered_per_s,
                tenant.fair_share_per_s,
                tenant.charged_per_s,
                tenant.error().map_or_else(|| "-".to_owned(), signed),
            );
        }
    }
    out.push('\n');
    for row in rows {
        let m = &row.metrics;
        let _ = writeln!(
            out,
            "{} {}: {} streams charged {} {}, {} of them their estimate (no usage read); \
             the reports carried {:.0}; the controller pushed {} directives in {} batches \
             ({:.1} directives a second).",
            row.scenario,
            row.variant,
            m.charges,
            m.charged_total,
            m.unit,
            m.charged_estimate,
            m.charged_reported,
            m.directives_pushed,
            m.batches_pushed,
            per_second(m.directives_pushed, m.run_s),
        );
    }
    out
}

fn per_second(count: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        count as f64 / seconds
    } else {
        0.0
    }
}

/// The budget rows as CSV with a header line.
pub fn budget_csv(rows: &[BudgetRow]) -> String {
    let mut out = String::from(
        "scenario,variant,seed,budget_per_s,offered_per_s,admitted_per_s,charged_per_s,\
         windows_10s_within,windows_10s,rms_10s,windows_1s_within,windows_1s,rms_1s,\
         admitted_10s_within,admitted_10s_rms,admitted_1s_within,admitted_1s_rms,\
         step_admitted_1s,step_admitted_10s,step_charged_10s\n",
    );
    for row in rows {
        let m = &row.metrics;
        let step = |value: fn(&StepOvershoot) -> f64| {
            m.step
                .as_ref()
                .map_or_else(String::new, |s| value(s).to_string())
        };
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            row.scenario,
            row.variant,
            row.seed,
            m.budget_per_s,
            m.offered_per_s,
            m.admitted_per_s,
            m.charged_per_s,
            m.windows_10s.within,
            m.windows_10s.count,
            m.windows_10s.rms,
            m.windows_1s.within,
            m.windows_1s.count,
            m.windows_1s.rms,
            m.admitted_10s.within,
            m.admitted_10s.rms,
            m.admitted_1s.within,
            m.admitted_1s.rms,
            step(|s| s.admitted_1s),
            step(|s| s.admitted_10s),
            step(|s| s.charged_10s),
        );
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
         disturbances,utilisation,oscillations_per_min,batches_pushed,admitted_within_offered,\
         tenant_share_error_max\n",
    );
    for row in rows {
        let metrics = &row.metrics;
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{}",
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
            csv_number(metrics.worst_tenant_error()),
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
            metrics: RunMetrics {
                error_p95_1s: Some(0.05),
                error_p95_10s: None,
                peak_overshoot_pct: None,
                convergence_ms: vec![Some(1_200), None],
                utilisation: Some(0.99),
                oscillations_per_min: Some(12.0),
                admitted_within_offered: true,
                batches_pushed: 3,
                tenants: Vec::new(),
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
            "steady,baseline,7,0.05,,,,2,0.99,12,3,true,"
        );
        assert!(tenant_csv(&[row()]).lines().nth(1).is_none());
        assert_eq!(tenant_table(&[row()]), "");
    }

    #[test]
    fn tenants_are_listed_against_their_fair_share() {
        let mut row = row();
        row.metrics.tenants = vec![TenantShare {
            bucket: "acme".to_owned(),
            tenant: "gold".to_owned(),
            weight: 4.0,
            offered_rps: 900.0,
            fair_share_rps: 800.0,
            admitted_rps: 820.0,
        }];
        assert!(
            table(&[row.clone()])
                .lines()
                .nth(1)
                .unwrap()
                .ends_with("2.5%")
        );
        let text = tenant_table(&[row.clone()]);
        let line: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(
            line,
            [
                "steady",
                "baseline",
                "acme/gold",
                "4",
                "900.0",
                "800.0",
                "820.0",
                "+2.5%"
            ]
        );
        assert_eq!(
            tenant_csv(&[row]).lines().nth(1).unwrap(),
            "steady,baseline,7,acme,gold,4,900,800,820"
        );
    }
}
