//! The monitoring examples in envoy/monitoring/ parse, and every metric they query
//! exists: filter metrics (job "envoy") as Envoy's /stats/prometheus names
//! them with the stats_tags of envoy/demo-a.yaml, control-plane metrics
//! (job "sluice-control-plane") as GET /metrics exposes them.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use serde_json::Value;
use sluice_agent::metrics::{Counter, Gauge};
use sluice_control_plane::fleet::StreamId;
use sluice_control_plane::serve::control_loop::step;
use sluice_control_plane::{AppState, Config, Controller, Settings, router};
use sluice_proto::v1::{BucketCount, Report};
use tower::ServiceExt;

fn envoy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../envoy")
}

fn monitoring_dir() -> PathBuf {
    envoy_dir().join("monitoring")
}

fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml_ng::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// The filter's stats as /stats/prometheus shows them: the `key=value`
/// segments the stats_tags cut out, then dots as underscores.
fn filter_metrics() -> BTreeSet<String> {
    let bootstrap = yaml(&envoy_dir().join("demo-a.yaml"));
    let tags: Vec<String> = bootstrap["stats_config"]["stats_tags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tag| tag["tag_name"].as_str().unwrap().to_owned())
        .collect();
    assert!(!tags.is_empty());
    let names = Counter::ALL
        .iter()
        .map(|c| c.name())
        .chain(Gauge::ALL.iter().map(|g| g.name()));
    names
        .map(|name| {
            name.split('.')
                .filter(|segment| {
                    !segment
                        .split_once('=')
                        .is_some_and(|(key, _)| tags.iter().any(|t| t == key))
                })
                .collect::<Vec<_>>()
                .join("_")
                .replace('=', "_")
        })
        .collect()
}

/// Sample names of the control plane's /metrics with a proxy connected and
/// one control interval done, so that every family has series.
async fn control_plane_metrics() -> BTreeSet<String> {
    let config = Config::from_yaml("limits:\n  - bucket: acme\n    limit_rps: 10\n", "t").unwrap();
    let state = AppState::new(Settings::from_config(&config, None));
    state
        .fleet()
        .connect_in_zone("envoy-a", 1, "zone-a", StreamId(1));
    let report = Report {
        sequence: 0,
        window_ms: 1000,
        directive_age_ms: Some(250),
        upstream: Vec::new(),
        buckets: vec![BucketCount {
            bucket: "acme".to_owned(),
            offered: 100,
            admitted: 100,
            ..Default::default()
        }],
    };
    state
        .fleet()
        .report("envoy-a", StreamId(1), &report)
        .unwrap();
    // What a gRPC stream registers while it is open.
    let open = state
        .metrics()
        .proxy_connected("envoy-a", StreamId(1), true);
    open.report_received(report.directive_age_ms);
    step(&state, &mut Controller::default());
    let response = router(state)
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// Every `sluice_*` metric in a PromQL expression with the `job` its
/// selector names (None if it names none).
fn selectors(expr: &str) -> Vec<(String, Option<String>)> {
    let chars: Vec<char> = expr.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            // Skip string literals (label values).
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += 1;
            }
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let ident: String = chars[start..i].iter().collect();
            if ident.starts_with("sluice_") || ident == "up" {
                let mut job = None;
                if chars.get(i) == Some(&'{') {
                    let end = chars[i..].iter().position(|&c| c == '}').unwrap() + i;
                    let matchers: String = chars[i + 1..end].iter().collect();
                    job = matchers.split(',').find_map(|m| {
                        let (key, value) = m.split_once('=')?;
                        (key.trim() == "job").then(|| value.trim().trim_matches('"').to_owned())
                    });
                    i = end + 1;
                }
                found.push((ident, job));
            }
        } else {
            i += 1;
        }
    }
    found
}

fn check_expressions(
    source: &str,
    exprs: &[String],
    filter: &BTreeSet<String>,
    cp: &BTreeSet<String>,
) -> usize {
    let mut checked = 0;
    for expr in exprs {
        for (metric, job) in selectors(expr) {
            match job.as_deref() {
                Some("envoy") if metric != "up" => assert!(
                    filter.contains(&metric),
                    "{source}: {metric} is not a filter metric ({filter:?}) in {expr}"
                ),
                Some("sluice-control-plane") if metric != "up" => assert!(
                    cp.contains(&metric),
                    "{source}: {metric} is not a control-plane metric ({cp:?}) in {expr}"
                ),
                Some("envoy" | "sluice-control-plane") => {}
                other => panic!("{source}: {metric} selects job {other:?} in {expr}"),
            }
            checked += 1;
        }
    }
    checked
}

#[test]
fn selector_parsing() {
    assert_eq!(
        selectors(r#"sum(rate(sluice_a{job="envoy", result="x_y"}[5m])) / sluice_b > 1"#),
        vec![
            ("sluice_a".to_owned(), Some("envoy".to_owned())),
            ("sluice_b".to_owned(), None)
        ]
    );
    let filter = filter_metrics();
    assert!(filter.contains("sluice_decisions"), "{filter:?}");
    assert!(filter.contains("sluice_directive_age_ms"), "{filter:?}");
}

#[tokio::test]
async fn alert_rules_parse_and_query_real_metrics() {
    let rules = yaml(&monitoring_dir().join("prometheus-alerts.yaml"));
    let mut exprs = Vec::new();
    let mut alerts = BTreeSet::new();
    for group in rules["groups"].as_array().unwrap() {
        assert!(group["name"].is_string());
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["alert"].as_str().unwrap();
            assert!(rule["labels"]["severity"].is_string(), "{name}");
            assert!(rule["annotations"]["summary"].is_string(), "{name}");
            exprs.push(rule["expr"].as_str().unwrap().to_owned());
            alerts.insert(name.to_owned());
        }
    }
    for gate in [
        "SluiceShadowDropShareHigh",
        "SluiceDirectivesStale",
        "SluiceControlPlaneDown",
        "SluiceReportsFailing",
    ] {
        assert!(alerts.contains(gate), "missing {gate}");
    }
    let checked = check_expressions(
        "prometheus-alerts.yaml",
        &exprs,
        &filter_metrics(),
        &control_plane_metrics().await,
    );
    assert!(checked >= exprs.len());

    let scrape = yaml(&monitoring_dir().join("prometheus-scrape.yaml"));
    let jobs: BTreeSet<&str> = scrape["scrape_configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|job| job["job_name"].as_str().unwrap())
        .collect();
    assert_eq!(jobs, BTreeSet::from(["envoy", "sluice-control-plane"]));
}

#[tokio::test]
async fn grafana_dashboard_parses_and_queries_real_metrics() {
    let path = monitoring_dir().join("grafana-dashboard.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(dashboard["title"].is_string());
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| panel["targets"].as_array().unwrap().iter())
        .map(|target| target["expr"].as_str().unwrap().to_owned())
        .collect();
    assert!(exprs.len() >= 10);
    let checked = check_expressions(
        "grafana-dashboard.json",
        &exprs,
        &filter_metrics(),
        &control_plane_metrics().await,
    );
    assert!(checked >= exprs.len());
}
