//! The filter's metrics in Envoy's `/stats/prometheus`: decision counters with
//! `result` and `reason` tags that add up exactly to what the client saw,
//! reports sent, and a fresh directive-age gauge.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use sluice_integration_tests::envoy::Envoy;
use sluice_integration_tests::fleet::{DataPlane, Fleet, FleetOptions};
use sluice_integration_tests::load::{LoadPlan, LoadRun, StreamSpec, Window};
use sluice_integration_tests::prometheus::Exposition;

const LIMITS: &str = r#"
limits:
  - bucket: "limited"
    limit_rps: 50
"#;

/// The Prometheus page ([`Envoy::prometheus`]).
async fn prometheus(envoy: &Envoy) -> String {
    envoy.prometheus().await.unwrap()
}

/// Only the filter's lines, for failure messages.
fn sluice_lines(page: &str) -> String {
    page.lines()
        .filter(|line| line.starts_with("sluice_") || line.starts_with("# TYPE sluice_"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_shows_tagged_decisions_that_match_the_responses() {
    prometheus_shows_tagged_decisions_that_match_the_responses_on(DataPlane::Wasm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_prometheus_shows_tagged_decisions_that_match_the_responses() {
    prometheus_shows_tagged_decisions_that_match_the_responses_on(DataPlane::Native).await;
}

async fn prometheus_shows_tagged_decisions_that_match_the_responses_on(data_plane: DataPlane) {
    let fleet = Fleet::start(FleetOptions::new(LIMITS, 1).with_data_plane(data_plane))
        .await
        .unwrap();
    let envoy = &fleet.envoys[0];
    let url = fleet.url(0).unwrap();
    // An upper bound: the load stops once the page is read during it.
    let duration = Duration::from_secs(5);
    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("free", &url, "free", 50.0),
            StreamSpec::new("limited", &url, "limited", 200.0),
        ],
        duration,
    ))
    .unwrap();

    // While the control plane keeps adjusting the limited bucket's ratio it
    // pushes a batch every few control intervals, so the newest is young.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = prometheus(envoy).await;
    // What follows compares counts, whatever the load's length.
    load.stop();
    let result = load.finish().await.unwrap();

    let whole = Window::secs(0.0, 3600.0);
    let mut responses = result.tenant_counts(whole, "free");
    let limited = result.tenant_counts(whole, "limited");
    let summary = format!("{}{}", result.summary(whole), sluice_lines(&during));
    for counts in [&responses, &limited] {
        assert_eq!(
            counts.errors, 0,
            "a request without a response may or may not have been counted\n{summary}"
        );
    }
    responses.ok += limited.ok;
    responses.limited += limited.limited;
    responses.server_errors += limited.server_errors;
    responses.other_status += limited.other_status;
    let answered =
        responses.ok + responses.limited + responses.server_errors + responses.other_status;
    assert!(limited.limited > 0, "no 429 at 4x the limit\n{summary}");

    // Every type line names the tag-stripped metric.
    let samples = Exposition::parse(&during).unwrap();
    for (name, kind) in [
        ("sluice_decisions", "counter"),
        ("sluice_reports_sent", "counter"),
        ("sluice_reports_failed", "counter"),
        ("sluice_directive_batches", "counter"),
        ("sluice_directives_rejected", "counter"),
        ("sluice_directive_age_ms", "gauge"),
        ("sluice_directive_buckets", "gauge"),
    ] {
        assert_eq!(
            samples.kind(name),
            Some(kind),
            "no {kind} {name}\n{summary}"
        );
    }
    let age = samples
        .value("sluice_directive_age_ms", &[])
        .expect("no directive age");
    // 0 when the last batch arrived in the millisecond of the last flush.
    assert!(
        (0.0..3000.0).contains(&age),
        "directive age {age} ms during load\n{summary}"
    );
    assert_eq!(
        samples.value("sluice_directive_buckets", &[]),
        Some(1.0),
        "{summary}"
    );

    // Counts reach Envoy on the tick after the request: wait for the last
    // ones, then require exact agreement with what the client saw.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let (page, pass, drop) = loop {
        let page = prometheus(envoy).await;
        let samples = Exposition::parse(&page).unwrap();
        let pass = samples.value("sluice_decisions", &[("result", "pass")]);
        let drop = samples.value(
            "sluice_decisions",
            &[("result", "drop"), ("reason", "cluster_overload")],
        );
        let done = pass.unwrap_or(0.0) + drop.unwrap_or(0.0) >= answered as f64;
        if done || tokio::time::Instant::now() >= deadline {
            break (page, pass, drop);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let summary = format!("{}{}", result.summary(whole), sluice_lines(&page));
    println!("{summary}");
    let pass = pass.expect("no sluice_decisions{result=\"pass\"}") as u64;
    let drop =
        drop.expect("no sluice_decisions{result=\"drop\",reason=\"cluster_overload\"}") as u64;
    assert_eq!(
        pass + drop,
        answered,
        "decisions must add up to the responses\n{summary}"
    );
    assert_eq!(drop, responses.limited, "drops must be the 429s\n{summary}");
    assert_eq!(pass, responses.ok, "passes must be the 200s\n{summary}");

    let samples = Exposition::parse(&page).unwrap();
    let reports = samples.value("sluice_reports_sent", &[]).unwrap_or(0.0);
    assert!(reports > 0.0, "no report counted\n{summary}");
    let batches = samples
        .value("sluice_directive_batches", &[])
        .unwrap_or(0.0);
    assert!(batches > 0.0, "no directive batch counted\n{summary}");
    assert_eq!(
        samples.value("sluice_directives_rejected", &[]),
        Some(0.0),
        "{summary}"
    );
}
