//! Plain-text tables of admin API replies.

use serde_json::Value;

use crate::config::overrides::unix_now;

/// Left-aligned columns separated by two spaces.
fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (cell, width) in cells.zip(&widths) {
            text.push_str(&format!("{cell:<width$}  "));
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// A JSON value as a cell: `-` for null or missing.
fn cell(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => "-".to_owned(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}

/// A number with `decimals` places ("-" when absent or not a number).
fn fixed(value: Option<&Value>, decimals: usize) -> String {
    match value.and_then(Value::as_f64) {
        Some(number) => format!("{number:.decimals$}"),
        None => "-".to_owned(),
    }
}

fn rows_of(items: Option<&Value>, columns: &[&str]) -> Vec<Vec<String>> {
    items
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .map(|item| columns.iter().map(|c| cell(item.get(*c))).collect())
                .collect()
        })
        .unwrap_or_default()
}

fn entries(map: Option<&Value>) -> Vec<(&String, &Value)> {
    map.and_then(Value::as_object)
        .map(|m| m.iter().collect())
        .unwrap_or_default()
}

fn remaining(expires_at: Option<&Value>) -> String {
    match expires_at.and_then(Value::as_u64) {
        Some(at) => format!("{}s", at.saturating_sub(unix_now())),
        None => "-".to_owned(),
    }
}

/// `GET /v1/buckets`: one row per bucket, then one per (bucket, tenant,
/// priority) cell with its fair share.
pub(crate) fn buckets(reply: &Value) -> String {
    let columns = [
        "bucket",
        "limit_rps",
        "offered_rps",
        "admitted_rps",
        "shadow_dropped_rps",
        "drop_ratio",
        "proxies_reporting",
        "floors_exceed_limit",
    ];
    let mut out = render(&columns, &rows_of(reply.get("buckets"), &columns));
    let cell_columns = [
        "tenant",
        "priority",
        "offered_rps",
        "admitted_rps",
        "share_rps",
        "drop_ratio",
        "reason",
        "balance",
        "quiet_s",
    ];
    let mut rows = Vec::new();
    for bucket in reply
        .get("buckets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for mut row in rows_of(bucket.get("cells"), &cell_columns) {
            row.insert(0, cell(bucket.get("bucket")));
            rows.push(row);
        }
    }
    if !rows.is_empty() {
        out.push('\n');
        let mut header = vec!["bucket"];
        header.extend(cell_columns);
        out.push_str(&render(&header, &rows));
    }
    for bucket in reply
        .get("buckets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(budget) = bucket.pointer("/cost/budget").filter(|b| b.is_object()) {
            let unit = cell(budget.get("unit"));
            out.push_str(&format!(
                "\n{}: a budget of {} {unit} per {}, its rates in {unit} per second; \
                 charged {}/s, charge factor {}\n",
                cell(bucket.get("bucket")),
                // f64's Display: 1200000, 0.5.
                budget
                    .get("amount")
                    .and_then(Value::as_f64)
                    .map_or_else(|| "-".to_owned(), |amount| amount.to_string()),
                cell(budget.get("per")),
                fixed(bucket.pointer("/cost/charged_per_s"), 1),
                fixed(bucket.pointer("/cost/charge_factor"), 2),
            ));
        }
        let uncosted = bucket
            .pointer("/cost/cells_without_cost")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        if uncosted > 0 {
            out.push_str(&format!(
                "\n{}: {uncosted} cell(s) of this budget have proxies offering requests \
                 but no cost (no cost rule of the filter applies there): those requests \
                 are not limited\n",
                cell(bucket.get("bucket"))
            ));
        }
    }
    out
}

/// `GET /v1/proxies`.
pub(super) fn proxies(reply: &Value) -> String {
    let columns = [
        "proxy_id",
        "zone",
        "connected",
        "since_last_report_ms",
        "directive_age_ms",
        "cells",
        "instance_id",
    ];
    render(&columns, &rows_of(reply.get("proxies"), &columns))
}

/// `POST /v1/whatif`: one row per bucket, tenant and priority, then a
/// line per adaptive limit (where it went) and one on CRITICAL drops.
pub(crate) fn whatif(reply: &Value) -> String {
    let columns = [
        "bucket",
        "limit_rps",
        "tenant",
        "priority",
        "offered_rps",
        "admitted_rps",
        "would_admit_rps",
        "would_drop_rps",
    ];
    let rate = |value: Option<&Value>| match value.and_then(Value::as_f64) {
        Some(rate) => format!("{rate:.1}"),
        None => cell(value),
    };
    let mut rows = Vec::new();
    let buckets = reply.get("buckets").and_then(Value::as_array);
    for bucket in buckets.into_iter().flatten() {
        let cells = bucket.get("cells").and_then(Value::as_array);
        for item in cells.into_iter().flatten() {
            rows.push(vec![
                cell(bucket.get("bucket")),
                rate(bucket.get("limit_rps")),
                cell(item.get("tenant")),
                cell(item.get("priority")),
                rate(item.get("offered_rps")),
                rate(item.get("admitted_rps")),
                rate(item.get("would_admit_rps")),
                rate(item.get("would_drop_rps")),
            ]);
        }
    }
    let mut out = render(&columns, &rows);
    for bucket in buckets.into_iter().flatten() {
        if let Some(path) = bucket.get("adaptive").filter(|path| path.is_object()) {
            out.push_str(&format!(
                "{}: adaptive limit {} -> {} rps (between {} and {})\n",
                cell(bucket.get("bucket")),
                rate(path.get("first_rps")),
                rate(path.get("last_rps")),
                rate(path.get("min_rps")),
                rate(path.get("max_rps")),
            ));
        }
    }
    let seconds = reply.get("seconds").and_then(Value::as_f64).unwrap_or(0.0);
    out.push_str(&format!("replayed {seconds:.0} s of fleet traffic\n"));
    if reply.get("critical_dropped") == Some(&Value::Bool(true)) {
        out.push_str("WARNING: CRITICAL traffic would have been dropped\n");
    }
    out
}

/// `GET /v1/quotas/{domain}`.
pub(crate) fn quota(reply: &Value) -> String {
    let columns = [
        "key",
        "name",
        "requests_per_unit",
        "unit",
        "used",
        "remaining",
        "reset_ms",
        "shadow_mode",
    ];
    render(
        &columns,
        &[columns.iter().map(|c| cell(reply.get(*c))).collect()],
    )
}

/// `GET /v1/adaptive`.
pub(crate) fn adaptive(reply: &Value) -> String {
    let columns = [
        "bucket",
        "limit_rps",
        "min_rps",
        "max_rps",
        "algorithm",
        "p99_ms",
        "error_ratio",
        "reason",
    ];
    render(&columns, &rows_of(reply.get("buckets"), &columns))
}

/// `GET /v1/limits`.
pub(crate) fn limits(reply: &Value) -> String {
    let overrides = reply.get("overrides");
    let mut rows = vec![vec![
        "default".to_owned(),
        "*".to_owned(),
        limit_cell(reply.get("default_limit_rps"), reply.get("default_budget")),
        "-".to_owned(),
    ]];
    for rule in reply
        .get("limits")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (kind, key) = match (
            rule.get("bucket"),
            rule.get("pattern"),
            rule.get("aggregate_pattern"),
        ) {
            (Some(bucket), _, _) => ("bucket", cell(Some(bucket))),
            (None, None, Some(aggregate)) => ("aggregate_pattern", cell(Some(aggregate))),
            (None, pattern, _) => ("pattern", cell(pattern)),
        };
        let overridden = (kind == "bucket")
            .then(|| overrides.and_then(|o| o.get(&key)))
            .flatten();
        let until = overridden.map_or("-".to_owned(), |o| {
            format!("override, {} left", remaining(o.get("expires_at_unix_s")))
        });
        rows.push(vec![
            kind.to_owned(),
            key,
            limit_cell(rule.get("limit_rps"), rule.get("budget")),
            until,
        ]);
    }
    render(&["kind", "key", "limit_rps", "note"], &rows)
}

/// A limit's cell: the rate, or a budget as `1200000 tokens/minute`.
fn limit_cell(rps: Option<&Value>, budget: Option<&Value>) -> String {
    match budget.filter(|b| b.is_object()) {
        Some(budget) => format!(
            "{} {}/{}",
            budget
                .get("amount")
                .and_then(Value::as_f64)
                .map_or_else(|| "?".to_owned(), |amount| amount.to_string()),
            budget.get("unit").and_then(Value::as_str).unwrap_or("?"),
            budget.get("per").and_then(Value::as_str).unwrap_or("?"),
        ),
        None => cell(rps),
    }
}

/// `GET /v1/tenants`.
pub(crate) fn tenants(reply: &Value) -> String {
    let overrides = reply.get("overrides");
    let rows: Vec<Vec<String>> = entries(reply.get("tenants"))
        .into_iter()
        .map(|(name, policy)| {
            let note = overrides
                .and_then(|o| o.get(name))
                .map_or("-".to_owned(), |o| {
                    format!("override, {} left", remaining(o.get("expires_at_unix_s")))
                });
            vec![
                name.clone(),
                cell(policy.get("weight")),
                cell(policy.get("burst")),
                cell(policy.get("min_floor_rps")),
                note,
            ]
        })
        .collect();
    render(
        &["tenant", "weight", "burst", "min_floor_rps", "note"],
        &rows,
    )
}

/// `GET /v1/modes` and every modes write.
pub(crate) fn modes(reply: &Value) -> String {
    let mut out = format!(
        "default: {}\nkill_switch: {}\ncanary_fraction: {}\n",
        cell(reply.get("default")),
        cell(reply.get("kill_switch")),
        cell(reply.get("canary_fraction")),
    );
    let rows: Vec<Vec<String>> = entries(reply.get("buckets"))
        .into_iter()
        .map(|(bucket, mode)| vec![bucket.clone(), cell(Some(mode))])
        .collect();
    if !rows.is_empty() {
        out.push('\n');
        out.push_str(&render(&["bucket", "mode"], &rows));
    }
    out
}

/// `GET /v1/overrides`.
pub(crate) fn overrides(reply: &Value) -> String {
    let mut rows = Vec::new();
    for (kind, field) in [("limit", "limits"), ("tenant", "tenants")] {
        for (name, over) in entries(reply.get(field)) {
            let values: Vec<String> = over
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(key, _)| *key != "expires_at_unix_s")
                .map(|(key, value)| match key.as_str() {
                    "budget" => format!("budget={}", limit_cell(None, Some(value))),
                    _ => format!("{key}={value}"),
                })
                .collect();
            rows.push(vec![
                kind.to_owned(),
                name.clone(),
                values.join(" "),
                remaining(over.get("expires_at_unix_s")),
            ]);
        }
    }
    render(&["kind", "target", "values", "remaining"], &rows)
}

/// Any other write: the reply, pretty-printed.
pub(crate) fn written(reply: &Value) -> String {
    let text = serde_json::to_string_pretty(reply).unwrap_or_else(|_| reply.to_string());
    format!("{text}\n")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn tables_line_up() {
        let text = buckets(&json!({"buckets": [
            {"bucket": "acme", "limit_rps": 200.0, "offered_rps": 600.0,
             "admitted_rps": 200.0, "drop_ratio": 0.5, "proxies_reporting": 2},
            {"bucket": "free-long-name", "limit_rps": null, "offered_rps": 1.0,
             "admitted_rps": 1.0, "drop_ratio": 0.0, "proxies_reporting": 1,
             "floors_exceed_limit": true},
        ]}));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("bucket          limit_rps"), "{text}");

        let text = buckets(&json!({"buckets": [{"bucket": "acme", "cells": [
            {"tenant": "gold", "priority": "high", "offered_rps": 10.0, "admitted_rps": 10.0,
             "share_rps": 12.5, "drop_ratio": 0.0, "reason": null},
            {"tenant": "silver", "priority": "high", "offered_rps": 0.0, "admitted_rps": 0.0,
             "share_rps": 5.0, "drop_ratio": 0.5, "reason": "tenant_share", "quiet_s": 1.5}]}]}));
        let rows: Vec<Vec<&str>> = text
            .lines()
            .rev()
            .take(2)
            .map(|line| line.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows[1],
            [
                "acme", "gold", "high", "10.0", "10.0", "12.5", "0.0", "-", "-", "-"
            ],
            "{text}"
        );
        assert_eq!(
            rows[0],
            [
                "acme",
                "silver",
                "high",
                "0.0",
                "0.0",
                "5.0",
                "0.5",
                "tenant_share",
                "-",
                "1.5"
            ],
            "{text}"
        );
        assert!(lines[1].starts_with("acme            200.0"), "{text}");
        assert!(lines[2].starts_with("free-long-name  -"), "{text}");
        assert!(lines[0].ends_with("floors_exceed_limit"), "{text}");
        assert!(lines[2].ends_with("true"), "{text}");
    }

    #[test]
    fn a_budget_whose_cells_count_no_cost_is_named_under_the_table() {
        let text = buckets(&json!({"buckets": [
            {"bucket": "chat", "limit_rps": 20000.0, "offered_rps": 60000.0, "cells": [],
             "cost": {"cells_without_cost": 0}},
            {"bucket": "llm", "limit_rps": 20000.0, "offered_rps": 0.0, "cells": [],
             "cost": {"cells_without_cost": 2, "offered_requests_rps": 600.0}},
        ]}));
        let named: Vec<&str> = text
            .lines()
            .filter(|line| line.contains("no cost"))
            .collect();
        assert_eq!(named.len(), 1, "{text}");
        assert!(named[0].starts_with("llm: 2 cell(s)"), "{text}");
    }

    #[test]
    fn a_budget_says_its_unit_under_the_table() {
        let text = buckets(&json!({"buckets": [
            {"bucket": "api", "limit_rps": 100.0, "offered_rps": 50.0, "cost": null},
            {"bucket": "llm", "limit_rps": 20000.0, "offered_rps": 60000.0,
             "cost": {"budget": {"amount": 1_200_000.0, "unit": "tokens", "per": "minute"},
                      "charged_per_s": 19876.54, "charge_factor": 1.034,
                      "cells_without_cost": 0}},
        ]}));
        let budgets: Vec<&str> = text.lines().filter(|l| l.contains("budget")).collect();
        assert_eq!(
            budgets,
            [
                "llm: a budget of 1200000 tokens per minute, its rates in tokens per second; \
                 charged 19876.5/s, charge factor 1.03"
            ],
            "{text}"
        );
    }

    #[test]
    fn whatif_says_where_an_adaptive_limit_went() {
        let text = whatif(
            &json!({"seconds": 20.0, "critical_dropped": false, "buckets": [
            {"bucket": "api", "limit_rps": 64.0,
             "adaptive": {"first_rps": 900.0, "min_rps": 64.0, "max_rps": 900.0, "last_rps": 64.0},
             "cells": [{"tenant": "", "priority": "bulk", "offered_rps": 300.0,
                        "admitted_rps": 300.0, "would_admit_rps": 80.0, "would_drop_rps": 220.0}]},
            {"bucket": "fixed", "limit_rps": 10.0, "cells": []}]}),
        );
        assert!(
            text.contains("api: adaptive limit 900.0 -> 64.0 rps (between 64.0 and 900.0)\n"),
            "{text}"
        );
        assert!(!text.contains("fixed: adaptive"), "{text}");
        assert!(text.ends_with("replayed 20 s of fleet traffic\n"), "{text}");
    }

    #[test]
    fn proxies_show_the_directive_age_or_a_dash() {
        let text = proxies(&json!({"connected": 2, "proxies": [
            {"proxy_id": "envoy-a", "zone": "eu-1", "connected": true,
             "since_last_report_ms": 120, "directive_age_ms": 340, "cells": 3,
             "instance_id": 7},
            {"proxy_id": "envoy-b", "zone": "", "connected": true,
             "since_last_report_ms": 80, "directive_age_ms": null, "cells": 0,
             "instance_id": 9},
        ]}));
        let rows: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows[0],
            [
                "proxy_id",
                "zone",
                "connected",
                "since_last_report_ms",
                "directive_age_ms",
                "cells",
                "instance_id"
            ]
        );
        assert_eq!(rows[1], ["envoy-a", "eu-1", "true", "120", "340", "3", "7"]);
        assert_eq!(rows[2], ["envoy-b", "true", "80", "-", "0", "9"], "{text}");
    }

    #[test]
    fn limits_name_each_rules_kind() {
        let budgets = limits(&json!({"default_limit_rps": null,
            "default_budget": {"amount": 100.0, "unit": "tokens", "per": "second"},
            "limits": [{"bucket": "llm",
                "budget": {"amount": 1200000.0, "unit": "tokens", "per": "minute"}}]}));
        assert!(budgets.contains("100 tokens/second"), "{budgets}");
        assert!(budgets.contains("1200000 tokens/minute"), "{budgets}");
        let text = limits(&json!({"default_limit_rps": null, "limits": [
            {"bucket": "acme", "limit_rps": 200.0},
            {"pattern": "free-*", "limit_rps": 50.0},
            {"aggregate_pattern": "trial-*", "limit_rps": 100.0},
        ], "overrides": {}}));
        let kinds: Vec<(&str, &str)> = text
            .lines()
            .skip(1)
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                Some((words.next()?, words.next()?))
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("default", "*"),
                ("bucket", "acme"),
                ("pattern", "free-*"),
                ("aggregate_pattern", "trial-*"),
            ],
            "{text}"
        );
    }

    #[test]
    fn modes_show_the_switches_and_buckets() {
        let text = modes(&json!({"default": "enforce", "buckets": {"b": "shadow"},
            "kill_switch": true, "canary_fraction": null}));
        assert_eq!(
            text,
            "default: enforce\nkill_switch: true\ncanary_fraction: -\n\nbucket  mode\nb       shadow\n"
        );
    }
}
