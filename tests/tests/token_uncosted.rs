//! A budget whose routes lack a cost rule, in real Envoy 1.40 for the
//! wasm filter and the native module: the filter reports the bucket's
//! requests but no cost, so the control plane has nothing to steer. It
//! must say so rather than show nothing: `/v1/buckets` lists the budget
//! with its request rate and `cost.cells_without_cost`,
//! `sluice_budget_cells_without_cost` counts the cell, and the log warns
//! with its bucket. Nothing is dropped meanwhile (no directive stands).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde_json::json;
use sluice_integration_tests::fleet::DataPlane;
use sluice_integration_tests::prometheus::Exposition;
use sluice_integration_tests::token_fleet::{BUCKET, TokenFleet, TokenFleetOptions, completion};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wasm_filter_without_a_cost_rule_is_shown_under_a_budget() {
    shown_under_a_budget(DataPlane::Wasm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_module_without_a_cost_rule_is_shown_under_a_budget() {
    shown_under_a_budget(DataPlane::Native).await;
}

async fn shown_under_a_budget(data_plane: DataPlane) {
    let mut options = TokenFleetOptions::new(1_000.0, 1);
    options.data_plane = data_plane;
    // The operator's mistake: the budget's bucket, no cost rule.
    options.extra_filter = json!({"cost_rules": []});
    let fleet = TokenFleet::start(options).await.unwrap();
    let url = format!("{}/v1/chat/completions", fleet.fleet.url(0).unwrap());

    // Requests of 400 tokens at 20 a second: 8x the budget, were it
    // counted.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, other) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let sender = {
        let (stop, ok, other, url) = (stop.clone(), ok.clone(), other.clone(), url.clone());
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            while !stop.load(Ordering::Relaxed) {
                let sent = completion(&client, &url, "default", 400, 400).send().await;
                let counter = match sent {
                    Ok(response) if response.status() == 200 => {
                        let _ = response.bytes().await;
                        &ok
                    }
                    _ => &other,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    let admin = fleet.fleet.control_plane.admin();
    let listed = admin
        .wait_for_bucket(
            BUCKET,
            "the budget listed with a cell without cost",
            Duration::from_secs(20),
            Duration::from_millis(250),
            |bucket| {
                let cost = bucket.cost.as_ref()?;
                (cost.cells_without_cost == 1 && cost.offered_requests_rps > 0.0)
                    .then(|| bucket.clone())
            },
        )
        .await;
    let metrics = admin.metrics().await;
    stop.store(true, Ordering::Relaxed);
    sender.await.unwrap();
    let log = std::fs::read_to_string(fleet.fleet.control_plane.log_path()).unwrap_or_default();
    let (ok, other) = (ok.load(Ordering::Relaxed), other.load(Ordering::Relaxed));
    let warned = log.contains("whose proxies offer requests but no cost") && log.contains(BUCKET);
    let without_cost = metrics
        .as_ref()
        .ok()
        .and_then(|text| Exposition::parse(text).ok())
        .and_then(|m| m.value("sluice_budget_cells_without_cost", &[]));
    let fine = listed.is_ok() && without_cost == Some(1.0) && warned && other == 0 && ok > 0;
    if !fine {
        fleet.fleet.print_logs();
    }
    let bucket = listed.unwrap();
    assert!(bucket.cells.is_empty(), "{data_plane:?}: {bucket:?}");
    assert_eq!(bucket.drop_ratio, 0.0, "{data_plane:?}: {bucket:?}");
    assert_eq!(
        bucket.limit_rps,
        Some(1_000.0),
        "{data_plane:?}: {bucket:?}"
    );
    assert_eq!(without_cost, Some(1.0), "{data_plane:?}");
    assert!(warned, "{data_plane:?}: no warning naming {BUCKET}");
    assert_eq!(
        other, 0,
        "{data_plane:?}: {ok} answered 200, {other} otherwise"
    );
}
